"""Finding the installed drivers: entry points, distribution metadata, loading a driver class by name.

Drivers are classes published in the entry-point group ``devplug.drivers``;
the entry-point name is the name operators write in the config. Set
``DEVPLUG_DISABLE_DRIVERS=a,b`` to hide installed drivers. A class loads
only if it was built for this hook contract (:mod:`devplug.contract`) and
implements ``list_devices``; :class:`~devplug.errors.DriverLoadError` names
its distribution otherwise.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devplug import hookspecs
from devplug.contract import check_hook_contract
from devplug.errors import DriverLoadError, DriverNotFoundError
from devplug.hookspecs import HOOK_NAMES

__all__ = [
    "COMMAND_ENTRY_POINT_GROUP",
    "DISABLE_ENV",
    "ENTRY_POINT_GROUP",
    "DriverInfo",
    "EntryPoint",
    "driver_hook_names",
    "driver_names",
    "cli_extensions",
    "entry_point_group",
    "entry_points",
    "installed_drivers",
    "load_driver_class",
]

ENTRY_POINT_GROUP = "devplug.drivers"
#: The click commands other distributions add to ``devplug`` (the test kit's ``demo`` and ``kubelet``).
COMMAND_ENTRY_POINT_GROUP = "devplug.cli"
DISABLE_ENV = "DEVPLUG_DISABLE_DRIVERS"

log = logging.getLogger("devplug.drivers")


@dataclass(frozen=True)
class EntryPoint:
    """One entry point as a distribution declares it (``name = module:attr`` in its ``entry_points.txt``)."""

    name: str
    value: str

    def load(self) -> Any:
        """Import the module and return the attribute."""
        module, _, attr = self.value.partition(":")
        obj: Any = importlib.import_module(module.strip())
        for part in filter(None, attr.strip().split(".")):
            obj = getattr(obj, part)
        return obj


def _metadata_field(text: str, field: str) -> str:
    for line in text.splitlines():
        if not line.strip():
            break  # the headers end at the first blank line
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() == field:
            return value.strip()
    return "?"


def _metadata_headers(folder: Path) -> str | None:
    """The header lines of ``folder``'s METADATA (or PKG-INFO) up to ``Name`` and ``Version`` (or the first blank
    line); None when it has neither file.

    Only those lines are read: the other headers and the descriptions after them are most of the 0.6 MiB of
    METADATA in a venv of 116 distributions. With the folder listing below, a scan takes 8.5 ms of CPU instead
    of 14 (medians of 30, issue 42)."""
    for name in ("METADATA", "PKG-INFO"):
        try:
            with open(folder / name, encoding="utf-8", errors="replace") as file:
                lines: list[str] = []
                wanted = {"name", "version"}
                for line in file:
                    if not line.strip():
                        break
                    lines.append(line)
                    wanted.discard(line.partition(":")[0].strip().lower())
                    if not wanted:
                        break
                return "".join(lines)
        except OSError:
            continue
    return None


def _distributions(paths: Sequence[str] | None = None) -> Iterator[tuple[Path, str]]:
    """Each distribution's metadata folder on ``paths`` (``sys.path``), with its METADATA (or PKG-INFO) headers.

    ``os.scandir`` names are filtered before any :class:`~pathlib.Path` is made: a site-packages folder holds
    hundreds of entries, and a Path for each was about 4 ms of a scan (measured, issue 42)."""
    for entry in sys.path if paths is None else paths:
        folder = entry or "."
        try:
            with os.scandir(folder) as entries:
                names = sorted(e.name for e in entries if e.name.endswith((".dist-info", ".egg-info")))
        except OSError:
            continue
        for name in names:
            child = Path(folder, name)
            headers = _metadata_headers(child)
            if headers is not None:
                yield child, headers


def entry_points(group: str, paths: Sequence[str] | None = None) -> list[tuple[EntryPoint, str, str]]:
    """The entry points of ``group`` of every distribution on ``sys.path``: (entry point, distribution, version).

    Read from the distributions' ``entry_points.txt`` directly (what
    ``importlib.metadata`` does, without its imports, which cost the idle
    daemon about 2 MiB); the first distribution of a name on ``sys.path`` wins.
    """
    found: list[tuple[EntryPoint, str, str]] = []
    seen: set[str] = set()
    for folder, meta in _distributions(paths):
        dist = _metadata_field(meta, "name")
        key = dist.lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        try:
            text = (folder / "entry_points.txt").read_text()
        except OSError:
            continue
        try:
            entries = entry_point_group(text, group)
        except ValueError as exc:
            log.warning("ignoring %s/entry_points.txt: %s", folder, exc)
            continue
        if entries:
            version = _metadata_field(meta, "version")
            found.extend((EntryPoint(name, value), dist, version) for name, value in entries)
    return found


def cli_extensions() -> list[tuple[EntryPoint, str, str]]:
    """The entry points of :data:`COMMAND_ENTRY_POINT_GROUP`: (entry point, distribution, version)."""
    return entry_points(COMMAND_ENTRY_POINT_GROUP)


def entry_point_group(text: str, group: str) -> list[tuple[str, str]]:
    """The ``name = object reference`` lines of section ``[group]`` of an ``entry_points.txt`` (the INI form the
    entry points specification gives: ``#`` and ``;`` start comment lines, whitespace around ``=`` is dropped).

    Raises :class:`ValueError` naming the line when one is neither a section header, a comment nor
    ``name = value`` inside a section (configparser, which this replaces, costs the idle daemon 0.2 MiB).
    """
    section: str | None = None
    found: list[tuple[str, str]] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line[0] == "[" and line[-1] == "]":
            section = line[1:-1].strip()
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.strip() or section is None:
            raise ValueError(f"line {number} is not 'name = value' in a [section]: {raw.strip()!r}")
        if section == group:
            found.append((name.strip(), value.strip()))
    return found


@dataclass(frozen=True)
class DriverInfo:
    """An installed driver: its config name and the distribution that ships it."""

    name: str
    distribution: str
    version: str
    entry_point: EntryPoint

    def load(self, *, warn: bool = True) -> type:
        """Import the driver class and check it: the hook contract it was built for, then ``list_devices``.

        :class:`DriverLoadError` names the distribution on failure. ``warn=False`` leaves the warning about an
        undeclared contract unlogged, for a caller that shows it itself (``devplug drivers``).
        """
        try:
            cls = self.entry_point.load()
        except Exception as exc:
            raise DriverLoadError(
                f"driver {self.name!r} from {self.distribution} {self.version} failed to import "
                f"({self.entry_point.value}): {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(cls, type):
            raise DriverLoadError(
                f"driver {self.name!r} from {self.distribution} {self.version}: entry point "
                f"{self.entry_point.value} is not a class"
            )
        check_hook_contract(cls, self.name, self.distribution, self.version, warn=warn)
        if "list_devices" not in driver_hook_names(cls):
            raise DriverLoadError(
                f"driver {self.name!r} from {self.distribution} {self.version}: class {cls.__qualname__} "
                "does not implement the required hook list_devices"
            )
        return cls


def _disabled() -> set[str]:
    return {n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()}


def installed_drivers() -> dict[str, DriverInfo]:
    """Every driver installed in this environment and not disabled, by name."""
    found: dict[str, DriverInfo] = {}
    blocked = _disabled()
    for ep, dist, version in entry_points(ENTRY_POINT_GROUP):
        if ep.name in blocked or ep.name in found:
            continue
        found[ep.name] = DriverInfo(name=ep.name, distribution=dist, version=version, entry_point=ep)
    return dict(sorted(found.items()))


def driver_names(extra_paths: Sequence[str] = ()) -> list[str]:
    """The names of the drivers installed here, plus those declared under ``extra_paths``, less the disabled."""
    found = {ep.name for ep, _, _ in entry_points(ENTRY_POINT_GROUP)}
    if extra_paths:
        found.update(ep.name for ep, _, _ in entry_points(ENTRY_POINT_GROUP, extra_paths))
    return sorted(found - _disabled())


def load_driver_class(name: str, where: str = "", installed: Mapping[str, DriverInfo] | None = None) -> type:
    """The driver class called ``name``; :class:`DriverNotFoundError` lists the installed ones.

    ``installed``: :func:`installed_drivers` already read by the caller. A config of several resources reads the
    installed drivers once for all of them (each scan of ``sys.path`` costs the daemon's start about 8.5 ms of
    CPU, measured, issue 42)."""
    drivers = installed_drivers() if installed is None else installed
    info = drivers.get(name)
    if info is None:
        installed_names = ", ".join(drivers) or "none"
        prefix = f"{where}: " if where else ""
        raise DriverNotFoundError(
            f"{prefix}no driver named {name!r} is installed (installed: {installed_names}); "
            f"not installed? pip install devplug-{name}"
        )
    return info.load()


def driver_hook_names(cls: type) -> list[str]:
    """The hooks a driver class implements, in lifecycle order."""
    marker = f"{hookspecs.PROJECT_NAME}_impl"
    return [name for name in HOOK_NAMES if hasattr(getattr(cls, name, None), marker)]
