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
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

__all__ = ["DeviceLocks"]


class DeviceLocks:
    """Devices held by the driver's work, by ID; thread-safe, all-or-nothing (no deadlock between two holders)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._held: set[str] = set()

    def busy(self) -> frozenset[str]:
        """The device IDs held now."""
        with self._cond:
            return frozenset(self._held)

    @contextmanager
    def hold(self, device_ids: Iterable[str], timeout: float | None = None) -> Iterator[None]:
        """Hold ``device_ids`` for the ``with`` body, once none of them is held by other work.

        :class:`TimeoutError` naming the busy devices when they are not free within ``timeout`` seconds
        (``None``: wait as long as it takes). Not reentrant: holding a device twice from one thread waits for ever.
        """
        wanted = set(device_ids)
        with self._cond:
            if not self._cond.wait_for(lambda: not wanted & self._held, timeout):
                busy = ", ".join(sorted(wanted & self._held))
                raise TimeoutError(f"device(s) {busy} still busy with other work after {timeout:g} s")
            self._held |= wanted
        try:
            yield
        finally:
            self._release(wanted)

    @contextmanager
    def hold_free(self, device_ids: Iterable[str]) -> Iterator[list[str]]:
        """Hold those of ``device_ids`` that no other work holds now, and give them (in order) to the ``with``
        body; the busy ones are left to the work that holds them. Never waits."""
        with self._cond:
            free = [d for d in dict.fromkeys(device_ids) if d not in self._held]
            self._held.update(free)
        try:
            yield free
        finally:
            self._release(set(free))

    def _release(self, device_ids: set[str]) -> None:
        with self._cond:
            self._held -= device_ids
            self._cond.notify_all()
