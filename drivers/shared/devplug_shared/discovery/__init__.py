"""Discovery handlers: how a node finds the shared devices it can reach.

Handlers are classes published in the entry-point group ``devplug.discovery``
(this wheel ships ``static``, ``tcp`` and ``udev``); a third party adds one
(ONVIF, OPC UA) the way it adds a driver::

    [project.entry-points."devplug.discovery"]
    onvif = "devplug_onvif:OnvifDiscovery"

A handler class has an ``Options`` dataclass (checked like driver options, see
:mod:`devplug.options`), is built as ``Handler(options)``, and implements
:class:`DiscoveryHandler`: ``start(on_change)`` begins discovering and calls
``on_change(devices)`` with the full current list whenever it changes (from a
thread of its own), ``devices()`` answers the current list, ``stop()`` ends it.
A device that stops answering is reported with ``available=False`` (it is then
advertised unhealthy); one that appears is added.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from types import MappingProxyType
from typing import Any, Protocol

from devplug import ConfigError
from devplug.options import parse_options

__all__ = [
    "ENTRY_POINT_GROUP",
    "DiscoveredDevice",
    "DiscoveryHandler",
    "OnChange",
    "build_handler",
    "installed_handlers",
    "load_handler_class",
]

#: The entry-point group discovery handlers are published in.
ENTRY_POINT_GROUP = "devplug.discovery"


@dataclass(frozen=True)
class DiscoveredDevice:
    """One shared device a handler found.

    ``name`` is the device's cluster-wide name (its slots are ``<name>-<n>``);
    ``available`` false means it stopped answering; ``properties`` are handed
    to the container as environment variables (``address`` for tcp); ``devnode``
    is a local device node to pass into the container (udev).
    """

    name: str
    available: bool = True
    properties: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    devnode: str | None = None

    def __hash__(self) -> int:
        return hash((self.name, self.available, tuple(sorted(self.properties.items())), self.devnode))


#: The callback a handler calls with the full list of devices whenever it changes.
OnChange = Callable[[Sequence[DiscoveredDevice]], None]


class DiscoveryHandler(Protocol):
    """What the shared driver needs from a discovery handler."""

    def start(self, on_change: OnChange) -> None:
        """Begin discovering; call ``on_change`` with every device whenever the list changes."""

    def devices(self) -> Sequence[DiscoveredDevice]:
        """The devices known now (after ``start``)."""

    def stop(self) -> None:
        """Stop discovering (idempotent)."""


def installed_handlers() -> dict[str, metadata.EntryPoint]:
    """Every installed discovery handler, by entry-point name."""
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def load_handler_class(name: str, where: str) -> type:
    """The handler class published as ``name``; :class:`ConfigError` naming the installed ones otherwise."""
    found = installed_handlers()
    if name not in found:
        known = ", ".join(sorted(found)) or "none"
        raise ConfigError(
            f"{where}.handler: no discovery handler {name!r} is installed (installed: {known}; "
            f"handlers are published in the entry-point group {ENTRY_POINT_GROUP!r})"
        )
    ep = found[name]
    try:
        cls = ep.load()
    except Exception as exc:
        dist = ep.dist.name if ep.dist is not None else "?"
        raise ConfigError(f"{where}.handler: discovery handler {name!r} (from {dist}) failed to load: {exc}") from exc
    if not isinstance(cls, type):
        raise ConfigError(f"{where}.handler: discovery handler {name!r} ({ep.value}) is not a class")
    return cls


def build_handler(table: Mapping[str, Any], where: str) -> DiscoveryHandler:
    """Build the handler a ``discovery`` table names (``handler = "tcp"``) from the rest of the table."""
    rest = dict(table)
    name = rest.pop("handler", "static")
    if not isinstance(name, str):
        raise ConfigError(f"{where}.handler: expected a handler name, got {name!r}")
    cls = load_handler_class(name, where)
    options = parse_options(getattr(cls, "Options", None), rest, where)
    handler: DiscoveryHandler = cls(options) if options is not None else cls()
    return handler
