"""The ``udev`` discovery handler: local devices matched by udev properties, through pyudev.

::

    discovery = { handler = "udev", subsystem = "tty", match = { ID_VENDOR_ID = "0403" },
                  name_property = "ID_SERIAL_SHORT" }

Every device of ``subsystem`` whose properties equal all of ``match`` is a
shared device named after its ``name_property`` (lowercased; characters other
than letters, digits, ``-`` and ``.`` become ``-``), so the same USB device seen
by several nodes (a hub switched between them, USB/IP) has the same slot IDs
everywhere. Its device node is passed into the container. A udev monitor
reports hot-plug at once: a removed device turns unavailable (its slots
unhealthy), an added one is advertised.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from devplug_shared.discovery import DiscoveredDevice, OnChange

__all__ = ["UdevDiscovery", "UdevOptions", "device_name"]

_BAD = re.compile(r"[^a-z0-9.-]+")


def device_name(value: str) -> str | None:
    """A udev property value as a shared device name, or ``None`` if nothing usable is left."""
    name = _BAD.sub("-", value.lower()).strip("-.")[:63].strip("-.")
    return name or None


@dataclass(frozen=True)
class UdevOptions:
    """``subsystem``: udev subsystem; ``match``: properties that must be equal; ``name_property``: the name."""

    subsystem: str
    match: dict[str, str] = field(default_factory=dict)
    name_property: str = "ID_SERIAL_SHORT"

    def __post_init__(self) -> None:
        if not self.subsystem:
            raise ValueError("subsystem: name the udev subsystem (e.g. 'tty', 'usb', 'video4linux')")


class UdevDiscovery:
    """Matches udev devices; a pyudev monitor thread keeps the list current."""

    Options: ClassVar[type[UdevOptions]] = UdevOptions

    def __init__(self, options: UdevOptions, *, context: Any = None) -> None:
        import pyudev

        self.options = options
        self._context = context if context is not None else pyudev.Context()
        self._known: dict[str, DiscoveredDevice] = {}
        self._lock = threading.Lock()
        self._observer: Any = None

    def _describe(self, device: Any) -> DiscoveredDevice | None:
        props = device.properties
        if any(props.get(key) != value for key, value in self.options.match.items()):
            return None
        raw = props.get(self.options.name_property)
        name = device_name(raw) if raw else None
        if name is None:
            return None
        return DiscoveredDevice(name, True, MappingProxyType({"udev_name": str(raw)}), device.device_node)

    def _scan(self, devices: Iterable[Any]) -> None:
        found = [d for d in (self._describe(dev) for dev in devices) if d is not None]
        with self._lock:
            for dev in found:
                self._known[dev.name] = dev

    def start(self, on_change: OnChange) -> None:
        """List matching devices now, then follow udev events in a monitor thread."""
        import pyudev

        self._scan(self._context.list_devices(subsystem=self.options.subsystem))
        monitor = pyudev.Monitor.from_netlink(self._context)
        monitor.filter_by(self.options.subsystem)

        def event(device: Any) -> None:
            action = device.action
            described = self._describe(device)
            if described is None:
                return
            with self._lock:
                if action == "remove":
                    self._known[described.name] = DiscoveredDevice(
                        described.name, False, described.properties, described.devnode
                    )
                else:
                    self._known[described.name] = described
            on_change(self.devices())

        self._observer = pyudev.MonitorObserver(monitor, callback=event, name="shared-udev-discovery")
        self._observer.start()

    def devices(self) -> Sequence[DiscoveredDevice]:
        """Every matching device seen since start; removed ones unavailable."""
        with self._lock:
            return sorted(self._known.values(), key=lambda d: d.name)

    def stop(self) -> None:
        """Stop the monitor thread."""
        observer, self._observer = self._observer, None
        if observer is not None:
            observer.stop()
