"""devplug's one device-lock type: one piece of work at a time on each device, and no lock held over the others.

The engine holds a device for every operation on it (an Allocate, a PreStart, a release, the KEP's calls), from
the event loop, with ``async with locks.hold(ids, "allocate"):``; a driver holds its devices for its own work
(a hook's slow erase, its rescan loop's retry), from its threads, with ``with locks.hold(ids):`` or
:meth:`DeviceLocks.hold_free`, through :mod:`devplug.kit.devicelocks`. Both are this class, so the rules are the
same and written once:

* **per device**: holding some devices holds up only work on those devices;
* **in order, no deadlock**: a holder takes its devices one by one in sorted order, so two holders never wait for
  each other; a refused hold (its ``timeout`` over) gives back what it took (:class:`LockTimeout` names the busy
  devices and what holds them);
* **first come, first served**: a device let go passes straight to its longest waiter, so a holder arriving later
  never overtakes one waiting;
* **threads and tasks alike**: the table is guarded by a thread lock; ``with`` waits in the calling thread (never
  from the event loop's thread: it would stop the loop), ``async with`` in the calling task. One instance may be
  used both ways;
* **what holds a device** (``activity``), for refusals that name it; **a hook abandoned at its timeout** keeps the
  locks its caller hands it (:meth:`DeviceLocks.keep_until`) until the call really returns.

Not reentrant: holding a device a second time from the holder that holds it waits for ever (or its timeout).

It lives here, outside both the engine and the kit, because both use it and neither imports the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, overload

__all__ = ["DeviceLocks", "HeldLocks", "LockTimeout"]


class LockTimeout(TimeoutError):
    """The devices stayed locked longer than the caller was willing to wait; ``busy`` maps each to what holds it."""

    def __init__(self, busy: dict[str, str], message: str | None = None) -> None:
        self.busy = busy
        super().__init__(message or ", ".join(f"{d} ({what})" for d, what in sorted(busy.items())))


class _Waiter:
    """A holder waiting for one device; ``granted`` once the device was passed to it."""

    __slots__ = ("granted", "what")

    def __init__(self, what: str | None) -> None:
        self.what = what
        self.granted = False

    def wake(self) -> None:
        raise NotImplementedError


class _ThreadWaiter(_Waiter):
    __slots__ = ("event",)

    def __init__(self, what: str | None) -> None:
        super().__init__(what)
        self.event = threading.Event()

    def wake(self) -> None:
        self.event.set()


class _TaskWaiter(_Waiter):
    __slots__ = ("future", "loop")

    def __init__(self, what: str | None) -> None:
        super().__init__(what)
        self.loop = asyncio.get_running_loop()
        self.future: asyncio.Future[None] = self.loop.create_future()

    def wake(self) -> None:
        try:
            here = asyncio.get_running_loop() is self.loop
        except RuntimeError:  # let go in a thread without a loop
            here = False
        if here:
            self._settle()
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self.loop.call_soon_threadsafe(self._settle)

    def _settle(self) -> None:
        if not self.future.done():
            self.future.set_result(None)


W = TypeVar("W", bound=_Waiter)


@dataclass
class _Kept:
    """A device lock handed to a hook call still running; ``handed`` once its holder let go of it."""

    call: asyncio.Future[Any]
    handed: bool = False


def _nothing(device_ids: list[str]) -> None:
    pass


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class DeviceLocks:
    """A lock per device ID, taken by :meth:`hold` (``with`` or ``async with``) or :meth:`hold_free`; see the
    module docstring.

    ``on_kept_released`` is called (with the device IDs) when locks kept by an abandoned hook call are released.
    """

    def __init__(self, on_kept_released: Callable[[list[str]], None] = _nothing) -> None:
        self._mutex = threading.Lock()
        self._held: set[str] = set()
        #: The holders waiting for each held device, first come first.
        self._queues: dict[str, deque[_Waiter]] = {}
        #: What holds each locked device ("allocate", "release: post_stop", ...), when its holder said.
        self.activity: dict[str, str] = {}
        #: The devices whose locks an abandoned hook call keeps until it returns.
        self._kept: dict[str, _Kept] = {}
        self._on_kept_released = on_kept_released

    def __repr__(self) -> str:
        return f"<DeviceLocks {len(self._held)} device(s) held, {len(self._queues)} waited for>"

    # --- holding

    @overload
    def hold(self, device_ids: Iterable[str], what: str, timeout: float | None = None) -> HeldLocks: ...

    @overload
    def hold(self, device_ids: Iterable[str], *, timeout: float | None = None) -> HeldLocks: ...

    @overload
    def hold(self, device_ids: Iterable[str], timeout: float | None, /) -> HeldLocks: ...

    def hold(
        self, device_ids: Iterable[str], what: str | float | None = None, timeout: float | None = None
    ) -> HeldLocks:
        """Hold ``device_ids`` for a ``with`` block (waiting in this thread) or an ``async with`` block (as ``True``
        when that had to wait: other work ran meanwhile); ``what`` says what holds them (``activity``).

        :class:`LockTimeout` (a :class:`TimeoutError`) naming the busy devices when they are not all held within
        ``timeout`` seconds (``None``: wait as long as it takes); nothing is held then.
        """
        if what is not None and not isinstance(what, str):  # the kit's hold(ids, timeout), positionally
            what, timeout = None, what
        return HeldLocks(self, sorted(set(device_ids)), what, timeout)

    @contextmanager
    def hold_free(self, device_ids: Iterable[str]) -> Iterator[list[str]]:
        """Hold those of ``device_ids`` that no other work holds now, and give them (in order) to the ``with``
        body; the busy ones are left to the work that holds them. Never waits."""
        with self._mutex:
            free = [d for d in dict.fromkeys(device_ids) if d not in self._held]
            self._held.update(free)
        try:
            yield free
        finally:
            self._release(free)

    # --- what is held

    def busy(self) -> frozenset[str]:
        """The device IDs held now."""
        with self._mutex:
            return frozenset(self._held)

    def locked(self, device_id: str) -> bool:
        return device_id in self._held

    def set_activity(self, device_ids: Iterable[str], what: str) -> None:
        """Say what the holder of these (held) devices is doing now."""
        with self._mutex:
            for dev_id in device_ids:
                if dev_id in self._held:
                    self.activity[dev_id] = what

    # --- hook calls abandoned at their timeout

    def keep_until(self, device_ids: Iterable[str], call: asyncio.Future[Any], what: str) -> None:
        """Hand the locks of these held devices to ``call`` (a hook abandoned at its timeout, still running): they
        stay locked, described as ``what``, until it is done, whatever their holder does meanwhile."""
        with self._mutex:
            ids = [d for d in dict.fromkeys(device_ids) if d in self._held]
            for dev_id in ids:
                self._kept[dev_id] = _Kept(call)
                self.activity[dev_id] = what
        call.add_done_callback(lambda _: self._release_kept(ids, call))

    def kept(self) -> dict[str, str]:
        """The devices an abandoned hook call still keeps, with what keeps them."""
        if not self._kept:
            return {}
        with self._mutex:
            return {d: self.activity.get(d, "a hook still running") for d, k in self._kept.items() if not k.call.done()}

    def _release_kept(self, ids: list[str], call: asyncio.Future[Any]) -> None:
        released = []
        with self._mutex:
            for dev_id in ids:
                kept = self._kept.get(dev_id)
                if kept is None or kept.call is not call:
                    continue
                del self._kept[dev_id]
                if kept.handed:  # its holder let go: the lock is the call's to release
                    released.append(dev_id)
            woken = self._free(released)
        for waiter in woken:
            waiter.wake()
        if released:
            self._on_kept_released(released)

    # --- the table (each under the mutex)

    def _take_all(self, ids: list[str], what: str | None) -> bool:
        """Take every one of ``ids`` at once if none is held; False (nothing taken) otherwise."""
        with self._mutex:
            held = self._held
            if not held.isdisjoint(ids):
                return False
            held.update(ids)
            if what is not None:
                activity = self.activity
                for dev_id in ids:
                    activity[dev_id] = what
            return True

    def _claim(self, dev_id: str, what: str | None, make: Callable[[str | None], W]) -> W | None:
        """Take ``dev_id`` (None) if free, else queue a waiter for it and return that."""
        with self._mutex:
            if dev_id not in self._held:
                self._held.add(dev_id)
                if what is not None:
                    self.activity[dev_id] = what
                return None
            waiter = make(what)
            self._queues.setdefault(dev_id, deque()).append(waiter)
            return waiter

    def _leave(self, dev_id: str, waiter: _Waiter) -> bool:
        """The wait of ``waiter`` is over: True when it was given the device, else it leaves the queue."""
        with self._mutex:
            if waiter.granted:
                return True
            queue = self._queues[dev_id]
            queue.remove(waiter)
            if not queue:
                del self._queues[dev_id]
            return False

    def _busy(self, ids: list[str], taken: list[str], first: str) -> dict[str, str]:
        with self._mutex:
            busy = {d: self.activity.get(d, "busy") for d in ids if d not in taken and d in self._held}
            return busy or {first: self.activity.get(first, "busy")}

    def _release(self, ids: list[str]) -> None:
        with self._mutex:
            if not self._queues and not self._kept:  # the usual case: nobody waits, no hook kept any
                self._held.difference_update(ids)
                for dev_id in ids:
                    self.activity.pop(dev_id, None)
                return
            woken = self._free(ids)
        for waiter in woken:
            waiter.wake()

    def _free(self, ids: Iterable[str]) -> list[_Waiter]:
        """Let go of ``ids`` (the mutex held): each passes to its first waiter, whose ``wake`` is the caller's to
        call; those kept by a hook call still running stay locked until it returns."""
        woken = []
        kept = self._kept
        for dev_id in ids:
            if kept and (held := kept.get(dev_id)) is not None:
                if not held.call.done():
                    held.handed = True
                    continue
                del kept[dev_id]
            self.activity.pop(dev_id, None)
            queue = self._queues.get(dev_id)
            if not queue:
                self._held.discard(dev_id)
                continue
            waiter = queue.popleft()
            if not queue:
                del self._queues[dev_id]
            waiter.granted = True
            if waiter.what is not None:
                self.activity[dev_id] = waiter.what
            woken.append(waiter)
        return woken


class HeldLocks:
    """The locks of some devices, held for a ``with`` or ``async with`` block (:meth:`DeviceLocks.hold`).

    A class rather than a generator-based context manager: every Allocate takes one.
    """

    def __init__(self, locks: DeviceLocks, ids: list[str], what: str | None, timeout: float | None) -> None:
        self._locks = locks
        self._ids = ids
        self._what = what
        self._timeout = timeout
        self._taken: list[str] = []

    def __enter__(self) -> None:
        """Take the locks, waiting in this thread."""
        if self._locks._take_all(self._ids, self._what):
            self._taken.extend(self._ids)
            return
        deadline = self._deadline()
        steps = self._steps(_ThreadWaiter)
        try:
            for waiter in steps:
                waiter.event.wait(_remaining(deadline))
        except LockTimeout as exc:
            self.release()
            said = f"device(s) {', '.join(sorted(exc.busy))} still busy with other work after {self._timeout:g} s"
            raise LockTimeout(exc.busy, said) from None
        except BaseException:
            steps.close()  # settles the waiter the exception interrupted
            self.release()
            raise

    def __exit__(self, *exc: object) -> None:
        self.release()

    async def __aenter__(self) -> bool:
        """Take the locks; True when that had to wait (other coroutines may have run meanwhile)."""
        if self._locks._take_all(self._ids, self._what):  # the usual case: no wait, no task
            self._taken.extend(self._ids)
            return False
        deadline = self._deadline()
        steps = self._steps(_TaskWaiter)
        try:
            for waiter in steps:
                await asyncio.wait((waiter.future,), timeout=_remaining(deadline))
        except BaseException:
            steps.close()
            self.release()
            raise
        return True

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    def _deadline(self) -> float | None:
        return None if self._timeout is None else time.monotonic() + self._timeout

    def _steps(self, make: Callable[[str | None], W]) -> Generator[W, None, None]:
        """Take each lock in sorted order (so two holders never deadlock), yielding the waiter of each that is
        held by other work for the caller to wait on; :class:`LockTimeout` when that wait ended without it."""
        locks, taken = self._locks, self._taken
        for dev_id in self._ids:
            waiter = locks._claim(dev_id, self._what, make)
            if waiter is None:
                taken.append(dev_id)
                continue
            granted = False
            try:
                yield waiter
            finally:
                granted = locks._leave(dev_id, waiter)
                if granted:
                    taken.append(dev_id)
            if not granted:
                raise LockTimeout(locks._busy(self._ids, taken, dev_id))

    def release(self) -> None:
        """Release the locks taken (once); those handed to a hook call still running stay locked until it returns."""
        taken, self._taken = self._taken, []
        if taken:
            self._locks._release(taken)
