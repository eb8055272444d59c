"""What profiles mean over the base config: the merge, and which profiles cannot apply together.

The rules, applied to the base document's ``[resources]`` (the rest of the config is the base's, unchanged):

* a resource a profile names that the base does not have is **added**: the profile's table is the whole resource;
* a resource both have is **changed** key by key: each key the profile sets **overrides** the base's; a key whose
  value is a table (``options``, ``dra``) **replaces** the base's table whole (tables are not merged deeper, so
  what a node gets is what one table says); ``unset = ["key", ...]`` drops base keys (back to their defaults, e.g.
  ``unset = ["dra"]`` when a profile moves a DRA resource back to the device-plugin API);
* ``remove = ["name", ...]`` **drops** base resources;
* two profiles touching (changing, adding or removing) the same resource **conflict**: a node matching both gets
  neither, as a bad reload would be refused (see :func:`check_conflicts`).

Resources are named by their table key in the config (``[resources."<name>"]``), before any ``rename``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from devplug.config.profiles import UNSET, Profile, ProfileSet, quote_key
from devplug.errors import ConfigError

__all__ = ["check_conflicts", "check_references", "merge"]


def _where(source: str, profile: str, *keys: str) -> str:
    return f"{source}: " + ".".join(quote_key(k) for k in ("profiles", profile, *keys))


def check_references(profiles: ProfileSet) -> None:
    """Every name a profile removes, and every key it unsets, must exist in the base config."""
    base = profiles.document.get("resources", {})
    if not isinstance(base, dict):
        return  # the base config's own check says what is wrong with it
    for profile in profiles.profiles:
        for name in profile.remove:
            if name not in base:
                raise ConfigError(
                    f"{_where(profiles.source, profile.name, 'remove')}: {name!r} is not a resource of the base "
                    f"config; the base has: {', '.join(base) or 'none'}"
                )
        for name, table in profile.resources.items():
            unset = table.get(UNSET, [])
            if not unset:
                continue
            where = _where(profiles.source, profile.name, "resources", name, UNSET)
            if name not in base:
                raise ConfigError(f"{where}: {name!r} is not in the base config, so there is nothing to unset")
            missing = [key for key in unset if key not in base[name]]
            if missing:
                raise ConfigError(
                    f"{where}: the base table of {name!r} does not set {', '.join(missing)}; nothing to unset"
                )


def check_conflicts(profiles: Sequence[Profile], source: str, context: str = "") -> None:
    """:class:`ConfigError` when two of ``profiles`` touch the same resource (naming both and the resources);
    ``context`` starts the message after the file's name."""
    for i, first in enumerate(profiles):
        for second in profiles[i + 1 :]:
            shared = sorted(first.touches() & second.touches())
            if shared:
                raise ConfigError(
                    f'{source}: {context}profiles "{first.name}" and "{second.name}" conflict: both change '
                    f"{', '.join(quote_key(n) for n in shared)}; a node may match only one of them (change its "
                    "labels, or move the change into one profile)"
                )


def merge(profiles: ProfileSet, chosen: Sequence[Profile]) -> dict[str, Any]:
    """The config document the ``chosen`` profiles make of the base (see the module's rules); the base is not
    changed. The caller checked references and conflicts."""
    document = {key: copy.deepcopy(value) for key, value in profiles.document.items() if key != "profiles"}
    resources: dict[str, Any] = dict(document.get("resources") or {})
    for profile in chosen:
        for name in profile.remove:
            resources.pop(name, None)
        for name, table in profile.resources.items():
            resources[name] = _merge_resource(resources.get(name), table)
    document["resources"] = resources
    return document


def _merge_resource(base: Mapping[str, Any] | None, table: Mapping[str, Any]) -> dict[str, Any]:
    unset = set(table.get(UNSET, []))
    body = {key: copy.deepcopy(value) for key, value in table.items() if key != UNSET}
    if base is None:
        return body
    merged = {key: copy.deepcopy(value) for key, value in base.items() if key not in unset}
    merged.update(body)  # a key overrides; a table value replaces the base's table whole
    return merged
