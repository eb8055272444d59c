"""One daemon thread running blocking calls in order, for the event loop to await.

Unlike a ``ThreadPoolExecutor``'s workers, which the interpreter joins at
exit, its thread is a daemon thread: a call stuck for good (a driver hook
reading ``/proc/kmsg``, a write to a hung disk) cannot keep the process from
exiting once the daemon is done.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["SerialThread"]

T = TypeVar("T")

_Job = tuple[Callable[[], Any], "Future[Any]"]


class SerialThread:
    """Runs submitted calls one after another in one daemon thread (started on the first call)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Queue ``fn``; the future gets its result or exception (or is cancelled if never started)."""
        future: Future[T] = Future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
            self._thread.start()
        self._jobs.put((fn, future))
        return future

    def close(self) -> None:
        """Cancel the calls not started; the thread ends once the running one (if any) returns."""
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[1].cancel()
        self._jobs.put(None)

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn()
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)
