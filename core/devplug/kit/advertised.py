"""What a driver last told the engine about its devices, and pushes that carry only what changed.

A driver that looks at its devices again (a rescan, a health probe, the end
of a release) compares what it sees with what the engine was told, and pushes
a change only when there is one. :class:`AdvertisedDevices` keeps that view::

    self.advertised = AdvertisedDevices(ctx)              # in the start hook
    ...
    devices = self.scan()
    self.advertised.set(devices)                          # pushes the list if anything differs
    return self.advertised.set(devices, push=False)       # from list_devices: the engine takes the answer

A push is the whole list (``ctx.set_devices``) or, with ``whole=False``, the
devices that changed and the IDs that went (``ctx.update_devices``): cheaper
for large resources. A device's reason and topology count as changes, so a
new reason for an unhealthy device reaches ``devplug status``. Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from devplug.context import DriverContext
from devplug.types import Device

__all__ = ["AdvertisedDevices"]


class AdvertisedDevices:
    """The devices the engine knows from the driver (in the order given), pushed to ``ctx`` as they change."""

    def __init__(self, ctx: DriverContext, devices: Iterable[Device] = ()) -> None:
        self._ctx = ctx
        self._lock = threading.Lock()
        self._devices: Mapping[str, Device] = MappingProxyType({d.id: d for d in devices})

    @property
    def devices(self) -> Mapping[str, Device]:
        """The devices as last set, by ID (a read-only snapshot)."""
        return self._devices

    def set(self, devices: Iterable[Device], *, push: bool = True, whole: bool = True) -> list[Device]:
        """Remember ``devices`` as the engine's view; when ``push`` and they differ from it, push them (the whole
        list, or with ``whole=False`` only what changed). Returns them as a list."""
        listed = list(devices)
        fresh = {d.id: d for d in listed}
        with self._lock:
            old, self._devices = self._devices, MappingProxyType(fresh)
            if not push or (list(old.items()) == list(fresh.items())):
                return listed
            if whole:
                self._ctx.set_devices(listed)
                return listed
            changed = [d for d in listed if old.get(d.id) != d]
            removed = [i for i in old if i not in fresh]
            if changed or removed:
                self._ctx.update_devices(changed, removed)
        return listed
