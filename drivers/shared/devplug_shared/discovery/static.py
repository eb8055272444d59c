"""The ``static`` discovery handler: the devices listed in the config, always available.

::

    discovery = { handler = "static", devices = ["cam-a", "cam-b"] }
    # or with properties handed to the container:
    discovery = { handler = "static", properties = { cam-a = { url = "rtsp://10.0.0.5/live" } } }
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar

from devplug_shared.discovery import DiscoveredDevice, OnChange
from devplug_shared.slots import check_device_name

__all__ = ["StaticDiscovery", "StaticOptions"]


@dataclass(frozen=True)
class StaticOptions:
    """``devices``: device names; ``properties``: per device, env vars for the container (adds the device)."""

    devices: list[str] = field(default_factory=list)
    properties: dict[str, dict[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for i, name in enumerate(self.devices):
            check_device_name(name, f"devices[{i}]")
        for name in self.properties:
            check_device_name(name, f"properties.{name}")
        if not self.devices and not self.properties:
            raise ValueError("devices: list at least one device (or give properties for one)")


class StaticDiscovery:
    """Devices named in the config; they never vanish."""

    Options: ClassVar[type[StaticOptions]] = StaticOptions

    def __init__(self, options: StaticOptions) -> None:
        names = list(dict.fromkeys([*options.devices, *options.properties]))
        self._devices = [
            DiscoveredDevice(name, True, MappingProxyType(dict(options.properties.get(name, {})))) for name in names
        ]

    def start(self, on_change: OnChange) -> None:
        """Nothing to watch: the list is fixed."""

    def devices(self) -> Sequence[DiscoveredDevice]:
        """The configured devices, all available."""
        return list(self._devices)

    def stop(self) -> None:
        """Nothing to stop."""
