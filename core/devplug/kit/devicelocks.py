"""No two pieces of a driver's work on one device at once, and no lock held over the other devices.

The engine never calls two hooks on one device at once, and lets hooks on
different devices run side by side. A driver keeps that promise inside itself
when it also works on devices from a thread of its own (a rescan loop that
retries a failed erase, a watcher): :class:`DeviceLocks` holds devices by ID,
so a slow operation on one device (an erase, an unbind waiting for user space)
holds up only the work on that device::

    locks = DeviceLocks()

    @hookimpl
    def deallocate(self, device_ids, retry):
        with self.locks.hold(device_ids):           # waits only for work on these devices
            self.erase(device_ids)                  # slow, and no driver-wide lock held

    def retry_failed(self):                         # the rescan loop
        with self.locks.hold_free(self.failed()) as free:   # skips devices a hook is working on
            self.erase(free)

Take a driver-wide lock only around the driver's own shared state (its
tables, its records), never around slow device work.

A hold takes its devices one by one in sorted order (no deadlock between two
holders), a device let go passes to the holder that waited longest, and a hold
refused at its ``timeout`` gives back what it took. :class:`DeviceLocks` is
devplug's one device-lock type (defined in :mod:`devplug.devicelocks`): the
engine holds its devices with it too, from the event loop (``async with``).
"""

from __future__ import annotations

from devplug.devicelocks import DeviceLocks

__all__ = ["DeviceLocks"]
