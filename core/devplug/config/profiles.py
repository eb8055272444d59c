"""The ``[profiles]`` tables of the config: named changes to the base config's resources, checked for their shape.

::

    [profiles.fpga-regions]
    description = "FPGAs split into regions"     # optional, shown by check-config and status
    match_labels = { "feature.node.kubernetes.io/pci-1172.present" = "true" }   # optional selector
    remove = ["example.com/vf"]                  # resources of the base config this profile drops

    [profiles.fpga-regions.resources."example.com/fpga"]
    options = { mode = "regions" }               # replaces the base resource's options table

A profile's name is a DNS label (lowercase letters, digits, ``-``): it is written in a node label's value
(:data:`PROFILE_LABEL`), where several names are joined by :data:`NAME_SEPARATOR`. What the tables *mean* over the
base config (the merge) is :mod:`devplug.config.profilemerge`; whether the merged config is valid is the config's own
check, run per profile by :func:`devplug.profiles.compose.check_profiles`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devplug.errors import ConfigError

__all__ = [
    "MAX_LABEL_VALUE",
    "NAME_SEPARATOR",
    "PROFILE_LABEL",
    "Profile",
    "ProfileSet",
    "label_key_problem",
    "label_value_problem",
    "parse_profiles",
    "quote_key",
]

#: The node label naming the profiles a node wants (``devplug.io/profile=fpga-regions``).
PROFILE_LABEL = "devplug.io/profile"
#: Joins several profile names in the label's value (``fpga-regions.vf32``). A label value may hold only
#: alphanumerics, ``-``, ``_`` and ``.`` (apimachinery's ``IsLabelValue``): no comma, no space.
NAME_SEPARATOR = "."
#: The longest label value (``LabelValueMaxLength``), and so the longest profile name.
MAX_LABEL_VALUE = 63

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_PROFILE_KEYS = ("description", "match_labels", "remove", "resources")
#: A key of a profile's resource table that is not a resource key: the base keys it drops.
UNSET = "unset"


def quote_key(key: str) -> str:
    """A TOML key as the config's errors write it: quoted when it holds ``.`` or ``/``."""
    return f'"{key}"' if ("." in key or "/" in key) else key


def label_key_problem(key: str) -> str | None:
    """Why ``key`` is not a Kubernetes label key (apimachinery's ``IsLabelKey``), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or "/" in prefix or len(prefix) > 253 or not _SUBDOMAIN.match(prefix)):
        return f"the prefix {prefix!r} is not a DNS subdomain"
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        return "the name part must be 1 to 63 alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"
    return None


def label_value_problem(value: str) -> str | None:
    """Why ``value`` is not a Kubernetes label value (apimachinery's ``IsLabelValue``), or None."""
    if len(value) > MAX_LABEL_VALUE or not _LABEL_VALUE.match(value):
        return (
            f"a label value is empty or at most {MAX_LABEL_VALUE} alphanumerics, '-', '_' or '.', starting and "
            "ending with an alphanumeric"
        )
    return None


@dataclass(frozen=True)
class Profile:
    """One ``[profiles.<name>]`` table, its shape checked (not yet merged)."""

    name: str
    description: str = ""
    #: Label key -> value every one of which a node must have for the profile to apply without being named.
    match_labels: Mapping[str, str] = field(default_factory=dict)
    #: Configured names (table keys) of base resources the profile drops.
    remove: tuple[str, ...] = ()
    #: Configured name -> the profile's table for it (keys override; ``unset`` lists base keys to drop).
    resources: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def touches(self) -> frozenset[str]:
        """The resources (configured names) this profile changes, adds or removes."""
        return frozenset(self.remove) | frozenset(self.resources)


@dataclass(frozen=True)
class ProfileSet:
    """A config file's profiles, with what merging them needs: the base document (without ``[profiles]``), where
    relative paths are taken from, and the file's name for errors."""

    profiles: tuple[Profile, ...] = ()
    document: Mapping[str, Any] = field(default_factory=dict)
    base: Path | None = None
    source: str = "<config>"

    def names(self) -> tuple[str, ...]:
        """The profiles' names, in file order."""
        return tuple(p.name for p in self.profiles)

    def get(self, name: str) -> Profile | None:
        """The profile called ``name``, or None."""
        return next((p for p in self.profiles if p.name == name), None)


def _where(source: str, *keys: str) -> str:
    return f"{source}: " + ".".join(quote_key(k) for k in keys)


def _profile(name: str, table: Any, source: str) -> Profile:
    where = _where(source, "profiles", name)
    if not _NAME.match(name) or len(name) > MAX_LABEL_VALUE:
        raise ConfigError(
            f"{where}: {name!r} cannot name a profile: a profile's name goes into the node label {PROFILE_LABEL}, so "
            f"it is 1 to {MAX_LABEL_VALUE} lowercase letters, digits and '-', starting and ending with a letter or "
            f"digit (several are joined with {NAME_SEPARATOR!r} in the label)"
        )
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table, got {table!r}")
    for key in table:
        if key not in _PROFILE_KEYS:
            raise ConfigError(f"{where}.{quote_key(key)}: unknown key; a profile has: {', '.join(_PROFILE_KEYS)}")
    description = table.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(f"{where}.description: expected a string, got {description!r}")
    labels = table.get("match_labels", {})
    if not isinstance(labels, dict):
        raise ConfigError(f'{where}.match_labels: expected a table of node labels, like {{ "key" = "value" }}')
    for key, value in labels.items():
        problem = label_key_problem(key)
        if problem is not None:
            raise ConfigError(f"{where}.match_labels.{quote_key(key)}: not a node label key: {problem}")
        if not isinstance(value, str):
            raise ConfigError(
                f"{where}.match_labels.{quote_key(key)}: expected the label's value as a string, got {value!r}"
            )
        problem = label_value_problem(value)
        if problem is not None:
            raise ConfigError(f"{where}.match_labels.{quote_key(key)}: {value!r} is not a label value: {problem}")
    remove = table.get("remove", [])
    if not isinstance(remove, list) or not all(isinstance(r, str) and r for r in remove):
        raise ConfigError(f"{where}.remove: expected a list of resource names (as in [resources]), got {remove!r}")
    if len(set(remove)) != len(remove):
        raise ConfigError(f"{where}.remove: a resource is listed twice in {remove!r}")
    resources = table.get("resources", {})
    if not isinstance(resources, dict):
        raise ConfigError(f"{where}.resources: expected a table of resource tables, got {resources!r}")
    for resource, rtable in resources.items():
        rwhere = f"{where}.resources.{quote_key(resource)}"
        if not isinstance(rtable, dict):
            raise ConfigError(f"{rwhere}: expected a table, got {rtable!r}")
        if resource in remove:
            raise ConfigError(f"{rwhere}: the profile also removes this resource (remove = [...]); do one or the other")
        unset = rtable.get(UNSET, [])
        if not isinstance(unset, list) or not all(isinstance(k, str) for k in unset):
            raise ConfigError(f'{rwhere}.{UNSET}: expected a list of the base table\'s keys to drop, like ["dra"]')
        both = sorted(set(unset) & set(rtable))
        if both:
            raise ConfigError(f"{rwhere}.{UNSET}: {', '.join(both)} both set and unset; do one or the other")
    if not remove and not resources:
        raise ConfigError(f"{where}: changes nothing; give it resources tables or remove = [...]")
    return Profile(name, description, dict(labels), tuple(remove), {k: dict(v) for k, v in resources.items()})


def parse_profiles(data: Mapping[str, Any], source: str) -> tuple[Profile, ...]:
    """The ``[profiles]`` tables of a parsed config document, in file order; :class:`ConfigError` naming the file,
    profile and key for a malformed one. Whether a profile's resources are valid is checked when it is merged."""
    table = data.get("profiles", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{_where(source, 'profiles')}: expected a table of profiles, got {table!r}")
    return tuple(_profile(name, value, source) for name, value in table.items())
