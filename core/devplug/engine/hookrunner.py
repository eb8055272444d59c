"""Running a driver's blocking hooks without stalling the event loop, or the daemon's exit."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from devplug.engine.observer import NULL_OBSERVER, ResourceObserver
from devplug.engine.serial import SerialThread
from devplug.errors import DriverError, HookTimeoutError

__all__ = ["HookRunner", "RunningHook"]

T = TypeVar("T")

log = logging.getLogger("devplug.engine")


def _consume(future: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned hook's outcome so asyncio does not report it as never retrieved."""
    if not future.cancelled():
        future.exception()


@dataclass(frozen=True, eq=False)
class RunningHook:
    """A hook call that has not returned yet (in time, or at all)."""

    resource: str
    hook: str
    started: float  # time.monotonic()

    def describe(self) -> str:
        return f"[{self.resource}] driver hook {self.hook} (running for {time.monotonic() - self.started:.1f} s)"


class HookRunner:
    """Runs one resource's driver hooks in a thread of its own, one at a time, each under a timeout.

    A hook that does not return in time is abandoned: its thread is left to
    finish on its own and a fresh thread serves the next hook, so a hung driver
    never blocks its resource forever (nor, being in its own thread, any other
    resource). :meth:`running` tells which hooks have not returned, abandoned
    ones included, so shutdown can name them. Failures come out as
    :class:`DriverError` carrying the resource, the hook and the driver's message.
    """

    def __init__(self, resource_name: str, timeout: float, observer: ResourceObserver = NULL_OBSERVER) -> None:
        self.resource_name = resource_name
        self.timeout = timeout
        self.observer = observer
        self._thread = self._new_thread()
        self._lock = asyncio.Lock()
        self._running: set[RunningHook] = set()
        self._running_lock = threading.Lock()
        self._inline = False

    def run_inline(self) -> None:
        """Call hooks on the event loop itself, without the thread hop or the timeout.

        For drivers that declare their hooks never block (``nonblocking_hooks =
        True``): in-memory bookkeeping, no sysfs, no tools. A hook that blocks
        anyway stalls every resource, so the default stays the thread.
        """
        self._inline = True

    def _new_thread(self) -> SerialThread:
        return SerialThread(f"hooks[{self.resource_name}]")

    def running(self) -> list[RunningHook]:
        """The hook calls that have not returned, oldest first (abandoned ones included)."""
        with self._running_lock:
            return sorted(self._running, key=lambda h: h.started)

    def _tracked(self, hook: str, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        """``fn(*args)`` in the hook thread, listed in :meth:`running` meanwhile."""
        running = RunningHook(self.resource_name, hook, time.monotonic())
        with self._running_lock:
            self._running.add(running)
        try:
            return fn(*args)
        finally:
            with self._running_lock:
                self._running.discard(running)

    async def call(self, hook: str, fn: Callable[..., T], *args: Any, timeout: float | None = None) -> T:
        """Run ``fn(*args)`` (the hook called ``hook``) in the resource's hook thread and return its result."""
        limit = self.timeout if timeout is None else timeout
        self.observer.hook_called(hook)
        if self._inline:  # not listed in running(): nothing else runs on the loop until it returns
            try:
                return fn(*args)
            except Exception as exc:
                self._raise_failure(hook, exc)
        async with self._lock:
            future = asyncio.wrap_future(self._thread.submit(lambda: self._tracked(hook, fn, args)))
            try:
                done, _ = await asyncio.wait((future,), timeout=limit)
                if not done:
                    self.observer.hook_timed_out(hook)
                    self._abandon()
                    timeout_error = HookTimeoutError(
                        f"{self.resource_name}: driver hook {hook} did not return within {limit:g} s "
                        "(hook_timeout); its thread was abandoned"
                    )
                    timeout_error.hook = hook
                    timeout_error.reason = f"did not return within {limit:g} s (hook_timeout)"
                    timeout_error.still_running = future
                    future.add_done_callback(_consume)
                    raise timeout_error
                result: T = future.result()
                return result
            except asyncio.CancelledError:
                future.add_done_callback(_consume)
                raise
            except HookTimeoutError:
                raise
            except Exception as exc:
                self._raise_failure(hook, exc)

    async def outcome(self, hook: str, call: asyncio.Future[T]) -> T:
        """Wait for a hook call abandoned at its timeout (``HookTimeoutError.still_running``) to return; its result,
        or its failure raised as :meth:`call` raises it. Cancelling the wait leaves the call running."""
        await asyncio.wait((call,))
        try:
            return call.result()
        except Exception as exc:
            self._raise_failure(hook, exc)

    def _raise_failure(self, hook: str, exc: Exception) -> NoReturn:
        """Count a hook's failure and raise it as :meth:`_failure` words it (``exc`` itself when that is it)."""
        self.observer.hook_failed(hook)
        failure = self._failure(hook, exc)
        if failure is exc:
            raise exc
        raise failure from exc

    def _failure(self, hook: str, exc: Exception) -> Exception:
        """What a hook's exception becomes: a :class:`DriverError` naming the resource and hook, with the hook
        and the driver's own words kept apart (``hook``, ``reason``)."""
        if isinstance(exc, DriverError):
            if exc.hook is not None or str(exc).startswith(f"{self.resource_name}:"):
                return exc
            failure: DriverError = type(exc)(f"{self.resource_name}: {hook}: {exc}")
            reason = str(exc)
        else:
            log.error("[%s] driver hook %s raised %s", self.resource_name, hook, type(exc).__name__, exc_info=exc)
            reason = f"{type(exc).__name__}: {exc}"
            failure = DriverError(f"{self.resource_name}: driver hook {hook} failed: {reason}")
        failure.hook, failure.reason = hook, reason
        return failure

    def _abandon(self) -> None:
        self._thread.close()
        self._thread = self._new_thread()

    def close(self) -> None:
        """Let the hook thread go; a hook still running finishes in the background (see :meth:`running`)."""
        self._thread.close()
