"""Small asyncio helpers the engine shares: waiting on several events, walking long lists in slices, capped
backoff, background tasks, blocking calls in threads that never hold up the exit.

:class:`Backoff` is devplug's one backoff (:mod:`devplug.backoff`, the driver kit's
:class:`~devplug.kit.retries.CappedBackoff` counted over a run of failures), named here for the engine and the
front ends that import it from here."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from typing import Any, TypeVar

from devplug.backoff import Backoff

__all__ = ["Backoff", "BackgroundTasks", "in_daemon_thread", "sliced", "wait_any"]

T = TypeVar("T")


async def wait_any(*events: asyncio.Event, timeout: float | None = None) -> None:
    """Return when any of ``events`` is set, or after ``timeout`` seconds."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def sliced(items: Iterable[T], every: int) -> AsyncIterator[T]:
    """``items``, letting the event loop run other work (an Allocate) after every ``every`` of them: a walk over
    1,000 held allocations in one go keeps the loop for milliseconds. ``items`` must not change meanwhile (pass a
    copy)."""
    for number, item in enumerate(items, 1):
        yield item
        if number % every == 0:
            await asyncio.sleep(0)


class BackgroundTasks:
    """Tasks started and forgotten by their starter, kept referenced until done (asyncio keeps only weak ones)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` in a task of its own; returns the task."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def cancel_all(self) -> None:
        """Cancel every task still running."""
        for task in list(self._tasks):
            task.cancel()

    def __len__(self) -> int:
        return len(self._tasks)


async def in_daemon_thread(name: str, call: Callable[[], T], timeout: float) -> T:
    """``call()`` in a daemon thread of its own; its result, or :class:`TimeoutError` after ``timeout`` seconds.

    Unlike ``run_in_executor``, a call that never returns (a read stuck on a hung file system) holds up neither
    the caller beyond ``timeout`` nor the process's exit: ``asyncio.run`` waits for the default executor's
    threads when it ends, never for daemon threads. Such a call is abandoned; its result, if it ever comes, is
    dropped.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not done.done():
            outcome()

    def main() -> None:
        try:
            result = call()
        except BaseException as exc:  # handed to the awaiting coroutine
            error = exc
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(settle, lambda: done.set_exception(error))
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, lambda: done.set_result(result))

    threading.Thread(target=main, name=name, daemon=True).start()
    return await asyncio.wait_for(done, timeout)
