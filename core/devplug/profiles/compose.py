"""The config a node runs: the base config with its profiles merged in, checked as any config is.

:func:`compose` makes it (errors name the file *and* the profiles: ``config.toml with profile "fpga-regions":
resources."example.com/fpga".options.mode: ...``); :func:`check_profiles` composes every profile of a config on its
own, which is what ``devplug check-config`` reports.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from devplug.config import Config, parse_config
from devplug.config.profilemerge import check_conflicts, merge
from devplug.config.profiles import Profile
from devplug.errors import ConfigError

__all__ = ["ProfileCheck", "check_pairs", "check_profiles", "compose", "describe_profiles"]


def describe_profiles(names: Sequence[str]) -> str:
    """``profile "a"`` or ``profiles "a", "b"``."""
    quoted = ", ".join(f'"{n}"' for n in names)
    return f"profile {quoted}" if len(names) == 1 else f"profiles {quoted}"


def compose(config: Config, names: Sequence[str]) -> Config:
    """``config`` (as loaded from its file: the base) with the profiles ``names`` applied, in that order;
    ``config`` itself for no names. :class:`ConfigError` naming the file, the profiles, the resource and the key
    when a name is unknown, two profiles conflict, or the merged config is invalid."""
    if not names:
        return config
    profiles = config.profiles
    chosen: list[Profile] = []
    for name in names:
        profile = profiles.get(name)
        if profile is None:
            raise ConfigError(
                f"{profiles.source}: no profile {name!r}; the config defines: {', '.join(profiles.names()) or 'none'}"
            )
        chosen.append(profile)
    check_conflicts(chosen, profiles.source)
    source = f"{profiles.source} with {describe_profiles(names)}"
    merged = parse_config(merge(profiles, chosen), source=source, base=profiles.base)
    return dataclasses.replace(merged, path=config.path, profiles=profiles, applied=tuple(names))


@dataclass(frozen=True)
class ProfileCheck:
    """One profile composed on its own over the base: the config it makes, or why it makes none."""

    profile: Profile
    config: Config | None
    error: ConfigError | None


def check_profiles(config: Config) -> list[ProfileCheck]:
    """Every profile of ``config`` composed on its own (each error caught and kept), in file order."""
    checks = []
    for profile in config.profiles.profiles:
        try:
            checks.append(ProfileCheck(profile, compose(config, [profile.name]), None))
        except ConfigError as exc:
            checks.append(ProfileCheck(profile, None, exc))
    return checks


def check_pairs(config: Config, valid: Sequence[Profile]) -> list[tuple[Profile, Profile, ConfigError]]:
    """The pairs of ``valid`` profiles (each fine on its own) that touch different resources yet make an invalid
    config together, with the error. The config's own checks across resources (two resources advertised under one
    name, sharing a CDI kind or a DRA driver name) each concern two resources, which two profiles at most touch, so
    pairs find every such clash; a driver's ``check_resources`` sees all of its resources at once and may object
    only to three or more profiles together, which the node's composition then refuses (and reports)."""
    clashes = []
    for i, first in enumerate(valid):
        for second in valid[i + 1 :]:
            if first.touches() & second.touches():
                continue  # a conflict: never applied together
            try:
                compose(config, [first.name, second.name])
            except ConfigError as exc:
                clashes.append((first, second, exc))
    return clashes
