"""Per-device serialization: one operation at a time on any device.

Allocate, PreStart, the KEP's PostStopContainer and Deallocate, and releases
found by the reconciler each hold the locks of every device they touch for
their whole run, so a Deallocate can never race an Allocate of the same device
and an Allocate waits for a release of its devices that is still running.
Locks are taken in sorted order, so two operations never deadlock. Each held
device also says what holds it (``activity``), for refusals that name it.

A driver hook abandoned at its ``hook_timeout`` may still be working on its
devices: the operation that called it hands their locks to the running call
(:meth:`DeviceLocks.keep_until`), so they stay locked, and no other hook
touches them, until the call really returns.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["DeviceLocks", "HeldLocks", "LockTimeout"]


class LockTimeout(Exception):
    """The devices stayed locked longer than the caller was willing to wait."""

    def __init__(self, busy: dict[str, str]) -> None:
        self.busy = busy
        super().__init__(", ".join(f"{d} ({what})" for d, what in sorted(busy.items())))


async def _acquire(lock: asyncio.Lock, timeout: float | None) -> bool:
    """Acquire ``lock`` within ``timeout`` seconds; never leaves it acquired when returning False."""
    if timeout is None:
        await lock.acquire()
        return True
    waiter = asyncio.ensure_future(lock.acquire())
    done, _ = await asyncio.wait((waiter,), timeout=timeout)
    if done:
        return True
    waiter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiter
    if waiter.done() and not waiter.cancelled():
        lock.release()  # acquired just as the time ran out
    return False


@dataclass
class _Kept:
    """A device lock handed to a hook call still running; ``handed`` once its holder let go of it."""

    call: asyncio.Future[Any]
    handed: bool = False


class DeviceLocks:
    """An :class:`asyncio.Lock` per device ID, created on first use. Event loop thread only.

    ``on_kept_released`` is called (with the device IDs) when locks kept by an abandoned hook call are released.
    """

    def __init__(self, on_kept_released: Callable[[list[str]], None] = lambda ids: None) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        #: How many holders wait for each device's lock (a lock no one holds or waits for is taken at once).
        self._waiting: dict[str, int] = {}
        #: What holds each locked device ("allocate", "release: post_stop", ...).
        self.activity: dict[str, str] = {}
        #: The devices whose locks an abandoned hook call keeps until it returns.
        self._kept: dict[str, _Kept] = {}
        self._on_kept_released = on_kept_released

    def keep_until(self, device_ids: Iterable[str], call: asyncio.Future[Any], what: str) -> None:
        """Hand the locks of these held devices to ``call`` (a hook abandoned at its timeout, still running): they
        stay locked, described as ``what``, until it is done, whatever their holder does meanwhile."""
        ids = [d for d in dict.fromkeys(device_ids) if self.locked(d)]
        for dev_id in ids:
            self._kept[dev_id] = _Kept(call)
            self.activity[dev_id] = what
        call.add_done_callback(lambda _: self._release_kept(ids, call))

    def kept(self) -> dict[str, str]:
        """The devices an abandoned hook call still keeps, with what keeps them."""
        return {d: self.activity.get(d, "a hook still running") for d, k in self._kept.items() if not k.call.done()}

    def _release_kept(self, ids: list[str], call: asyncio.Future[Any]) -> None:
        released = []
        for dev_id in ids:
            kept = self._kept.get(dev_id)
            if kept is None or kept.call is not call:
                continue
            del self._kept[dev_id]
            if kept.handed:  # its holder let go: the lock is the call's to release
                self.activity.pop(dev_id, None)
                self._locks[dev_id].release()
                released.append(dev_id)
        if released:
            self._on_kept_released(released)

    def locked(self, device_id: str) -> bool:
        lock = self._locks.get(device_id)
        return lock is not None and lock.locked()

    def hold(self, device_ids: Iterable[str], what: str, timeout: float | None = None) -> HeldLocks:
        """``async with``: hold every device's lock for the block; :class:`LockTimeout` after ``timeout``
        seconds."""
        return HeldLocks(self, sorted(set(device_ids)), what, timeout)

    def _lock(self, device_id: str) -> asyncio.Lock:
        """The device's lock, made on its first use."""
        lock = self._locks.get(device_id)
        if lock is None:
            lock = self._locks[device_id] = asyncio.Lock()
        return lock

    def _all_free(self, ids: list[str]) -> bool:
        for dev_id in ids:
            lock = self._locks.get(dev_id)
            if lock is not None and (lock.locked() or self._waiting.get(dev_id)):
                return False
        return True

    async def _take_in_order(self, ids: list[str], what: str, timeout: float | None, taken: list[str]) -> None:
        """Take each lock in sorted order (so two holders never deadlock), waiting for each in turn."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        for dev_id in ids:
            lock = self._lock(dev_id)
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            self._waiting[dev_id] = self._waiting.get(dev_id, 0) + 1
            try:
                acquired = await _acquire(lock, remaining)
            finally:
                left = self._waiting[dev_id] - 1
                if left:
                    self._waiting[dev_id] = left
                else:
                    del self._waiting[dev_id]
            if not acquired:
                busy = {d: self.activity.get(d, "busy") for d in ids if d not in taken and self.locked(d)}
                raise LockTimeout(busy or {dev_id: self.activity.get(dev_id, "busy")})
            taken.append(dev_id)
            self.activity[dev_id] = what

    def set_activity(self, device_ids: Iterable[str], what: str) -> None:
        """Say what the holder of these (held) devices is doing now."""
        for dev_id in device_ids:
            if self.locked(dev_id):
                self.activity[dev_id] = what


class HeldLocks:
    """The locks of some devices, held for an ``async with`` block (:meth:`DeviceLocks.hold`).

    A class rather than a generator-based context manager: every Allocate takes one.
    """

    def __init__(self, locks: DeviceLocks, ids: list[str], what: str, timeout: float | None) -> None:
        self._locks = locks
        self._ids = ids
        self._what = what
        self._timeout = timeout
        self._taken: list[str] = []

    async def __aenter__(self) -> bool:
        """Take the locks; True when that had to wait (other coroutines may have run meanwhile)."""
        locks, taken, what = self._locks, self._taken, self._what
        try:
            if locks._all_free(self._ids):  # the usual case: take them all without a wait or a task per device
                for dev_id in self._ids:
                    await locks._lock(dev_id).acquire()  # free, no waiter: no suspension
                    taken.append(dev_id)
                    locks.activity[dev_id] = what
                return False
            await locks._take_in_order(self._ids, what, self._timeout, taken)
            return True
        except BaseException:
            self.release()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        """Release the locks taken (once); those handed to a hook call still running stay locked until it returns."""
        locks = self._locks
        kept = locks._kept
        for dev_id in self._taken:
            if kept and (held := kept.get(dev_id)) is not None:
                if not held.call.done():
                    held.handed = True
                    continue
                del kept[dev_id]
            locks.activity.pop(dev_id, None)
            locks._locks[dev_id].release()
        self._taken.clear()
