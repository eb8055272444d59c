"""Running a driver's blocking hooks without stalling the event loop."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from devplug.errors import DriverError, HookTimeoutError

T = TypeVar("T")

log = logging.getLogger("devplug.engine")


def _consume(future: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned hook's outcome so asyncio does not report it as never retrieved."""
    if not future.cancelled():
        future.exception()


class HookRunner:
    """Runs one resource's driver hooks in a thread of its own, one at a time, each under a timeout.

    A hook that does not return in time is abandoned: its thread is left to
    finish on its own and a fresh thread serves the next hook, so a hung driver
    never blocks its resource forever (nor, being in its own thread, any other
    resource). Failures come out as :class:`DriverError` carrying the resource,
    the hook and the driver's message.
    """

    def __init__(self, resource_name: str, timeout: float) -> None:
        self.resource_name = resource_name
        self.timeout = timeout
        self._executor = self._new_executor()
        self._lock = asyncio.Lock()

    def _new_executor(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"hooks[{self.resource_name}]")

    async def call(self, hook: str, fn: Callable[..., T], *args: Any, timeout: float | None = None) -> T:
        """Run ``fn(*args)`` (the hook called ``hook``) in the resource's hook thread and return its result."""
        limit = self.timeout if timeout is None else timeout
        async with self._lock:
            loop = asyncio.get_running_loop()
            future = loop.run_in_executor(self._executor, functools.partial(fn, *args))
            try:
                done, _ = await asyncio.wait((future,), timeout=limit)
                if not done:
                    self._abandon()
                    timeout_error = HookTimeoutError(
                        f"{self.resource_name}: driver hook {hook} did not return within {limit:g} s "
                        "(hook_timeout); its thread was abandoned"
                    )
                    timeout_error.still_running = future
                    future.add_done_callback(_consume)
                    raise timeout_error
                return future.result()
            except asyncio.CancelledError:
                future.add_done_callback(_consume)
                raise
            except HookTimeoutError:
                raise
            except DriverError as exc:
                if str(exc).startswith(f"{self.resource_name}:"):
                    raise
                raise type(exc)(f"{self.resource_name}: {hook}: {exc}") from exc
            except Exception as exc:
                log.error(
                    "[%s] driver hook %s raised %s",
                    self.resource_name,
                    hook,
                    type(exc).__name__,
                    exc_info=exc,
                )
                raise DriverError(
                    f"{self.resource_name}: driver hook {hook} failed: {type(exc).__name__}: {exc}"
                ) from exc

    def _abandon(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._executor = self._new_executor()

    def close(self) -> None:
        """Let the hook thread go; a hook still running finishes in the background."""
        self._executor.shutdown(wait=False, cancel_futures=True)
