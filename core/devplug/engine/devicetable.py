"""The devices a resource advertises, their cached wire encoding, and change notification.

Three things decide what the kubelet sees for a device: the health the
driver reports, whether the engine withholds the device (it is being released
and the driver still holds it), and whether the whole resource is degraded (a
failing driver). Each device's ``ListAndWatchResponse`` entry is encoded once
and cached; a change re-encodes only the devices it touched, and the list is a
join of the cached entries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from devplug.api.convert import encode_device_entry, encode_list_and_watch
from devplug.types import Device, Health

__all__ = ["DeviceTable"]


class DeviceTable:
    """One resource's device table. Used from the event loop thread only."""

    def __init__(self) -> None:
        self._devices: dict[str, Device] = {}
        self._entries: dict[str, bytes] = {}
        self._withheld: frozenset[str] = frozenset()
        self._degraded: str | None = None
        self.version = 0
        self._encoded: tuple[int, bytes] = (-1, b"")
        self._waiter: asyncio.Future[None] | None = None
        #: How many ListAndWatch streams are sending this table (kept by the servicer).
        self.watchers = 0

    # --- reading

    def __len__(self) -> int:
        return len(self._devices)

    def __contains__(self, device_id: object) -> bool:
        return device_id in self._devices

    def reported(self, device_id: str) -> Device | None:
        """The device as the driver reports it, or ``None`` if unknown."""
        return self._devices.get(device_id)

    def advertised(self, device_id: str) -> Device | None:
        """The device as the kubelet sees it (withheld or degraded devices are unhealthy)."""
        dev = self._devices.get(device_id)
        return None if dev is None else self._effective(dev)

    def reported_devices(self) -> list[Device]:
        """Every device as the driver reports it."""
        return list(self._devices.values())

    def healthy_count(self) -> int:
        """How many devices are advertised healthy (without building the advertised list)."""
        if self._degraded is not None:
            return 0
        withheld = self._withheld
        return sum(1 for i, d in self._devices.items() if d.healthy and i not in withheld)

    @property
    def degraded(self) -> str | None:
        """Why the resource is degraded (every device advertised unhealthy), or ``None``."""
        return self._degraded

    @property
    def withheld(self) -> frozenset[str]:
        return self._withheld

    def encoded(self) -> bytes:
        """The current serialized ``ListAndWatchResponse``."""
        if self._encoded[0] != self.version:
            self._encoded = (self.version, encode_list_and_watch(self._entries.values()))
        return self._encoded[1]

    # --- changing

    def replace(self, devices: Iterable[Device]) -> None:
        """Replace every device (IDs must be unique; the driver facade checks that)."""
        new = {d.id: d for d in devices}
        if new == self._devices:
            return
        old = self._devices
        self._devices = new
        self._entries = {
            i: (self._entries[i] if old.get(i) == d and i in self._entries else self._encode(d)) for i, d in new.items()
        }
        self._bump()

    def update(self, changed: Iterable[Device] = (), removed: Iterable[str] = ()) -> None:
        """Add or replace ``changed`` devices, drop ``removed`` IDs."""
        touched = False
        for dev in changed:
            if self._devices.get(dev.id) != dev:
                self._devices[dev.id] = dev
                self._entries[dev.id] = self._encode(dev)
                touched = True
        for dev_id in removed:
            if self._devices.pop(dev_id, None) is not None:
                del self._entries[dev_id]
                touched = True
        if touched:
            self._bump()

    def set_health(self, health: dict[str, Health]) -> list[str]:
        """Apply health by device ID (unknown IDs ignored); returns the IDs that changed."""
        changed = [
            self._devices[i].with_health(h)
            for i, h in health.items()
            if i in self._devices and self._devices[i].health is not h
        ]
        self.update(changed)
        return [d.id for d in changed]

    def set_withheld(self, device_ids: Iterable[str]) -> None:
        """Advertise these devices unhealthy whatever the driver says (they are being released)."""
        new = frozenset(device_ids)
        if new == self._withheld:
            return
        flipped = new ^ self._withheld
        self._withheld = new
        self._reencode(flipped)

    def set_degraded(self, reason: str | None) -> None:
        """Advertise every device unhealthy (``reason``), or stop doing so (``None``)."""
        if reason == self._degraded:
            return
        was = self._degraded is not None
        self._degraded = reason
        if was != (reason is not None):
            self._reencode(self._devices)
        else:
            self._bump()

    def _reencode(self, device_ids: Iterable[str]) -> None:
        for dev_id in device_ids:
            dev = self._devices.get(dev_id)
            if dev is not None:
                self._entries[dev_id] = self._encode(dev)
        self._bump()

    def _effective(self, dev: Device) -> Device:
        if dev.healthy and (self._degraded is not None or dev.id in self._withheld):
            return dev.with_health(Health.UNHEALTHY)
        return dev

    def _encode(self, dev: Device) -> bytes:
        return encode_device_entry(self._effective(dev))

    def resend(self) -> bool:
        """Make every ListAndWatch stream send the list again, changed or not.

        The kubelet rewrites its checkpoint on every ListAndWatch message (see
        :mod:`devplug.engine.checkpointview`). Returns False when no stream is
        open, so nothing could be sent.
        """
        if self.watchers <= 0:
            return False
        self._bump()
        return True

    # --- waiting

    def _bump(self) -> None:
        self.version += 1
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        self._waiter = None

    def next_change(self, version: int) -> asyncio.Future[None]:
        """A future done once the table's version differs from ``version`` (shared by every waiter)."""
        if self.version != version:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        if self._waiter is None or self._waiter.done():
            self._waiter = asyncio.get_running_loop().create_future()
        return self._waiter
