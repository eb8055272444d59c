"""Which profiles apply to a node, from its labels.

A node gets, in this order:

1. the profiles its label :data:`~devplug.config.profiles.PROFILE_LABEL` names (``devplug.io/profile=fpga-regions``,
   several joined by ``.``: ``devplug.io/profile=fpga-regions.vf32``);
2. the profiles whose ``match_labels`` its labels all match (NFD's ``feature.node.kubernetes.io/...`` labels, say),
   in the config file's order.

A name the config has no profile for, or two chosen profiles that conflict, refuse the whole choice
(:class:`~devplug.errors.ConfigError`): the daemon then keeps the config it runs, as for a bad reload.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from devplug.config.profilemerge import check_conflicts
from devplug.config.profiles import NAME_SEPARATOR, PROFILE_LABEL, ProfileSet
from devplug.errors import ConfigError

__all__ = ["Selection", "select"]


@dataclass(frozen=True)
class Selection:
    """The profiles chosen for a node, and why each was."""

    names: tuple[str, ...] = ()
    #: (name, why) for each of :attr:`names`.
    reasons: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        """``a (why), b (why)``, or ``none (the base config)``."""
        return ", ".join(f"{name} ({why})" for name, why in self.reasons) or "none (the base config)"


def select(profiles: ProfileSet, labels: Mapping[str, str]) -> Selection:
    """The profiles for a node with ``labels``; :class:`ConfigError` for an unknown name or a conflict."""
    chosen: list[str] = []
    reasons: list[tuple[str, str]] = []
    value = labels.get(PROFILE_LABEL, "")
    if value:
        known = profiles.names()
        for name in value.split(NAME_SEPARATOR):
            if name not in known:
                raise ConfigError(
                    f"the node label {PROFILE_LABEL}={value} names profile {name!r}, which {profiles.source} does "
                    f"not define; it defines: {', '.join(known) or 'no profiles'}"
                )
            if name not in chosen:
                chosen.append(name)
                reasons.append((name, f"node label {PROFILE_LABEL}={value}"))
    for profile in profiles.profiles:
        if not profile.match_labels or profile.name in chosen:
            continue
        if all(labels.get(key) == want for key, want in profile.match_labels.items()):
            chosen.append(profile.name)
            matched = ", ".join(f"{key}={want}" for key, want in profile.match_labels.items())
            reasons.append((profile.name, f"match_labels {matched}"))
    found = [p for name in chosen if (p := profiles.get(name)) is not None]
    check_conflicts(found, profiles.source, f"the node's labels choose {', '.join(chosen)}, but ")
    return Selection(tuple(chosen), tuple(reasons))
