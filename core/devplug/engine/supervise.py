"""Keeping the daemon's long-running tasks alive: an unexpected exception is logged, reported and retried."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from devplug.engine.asynctools import Backoff

__all__ = ["supervise"]

log = logging.getLogger("devplug.engine")


async def supervise(
    name: str,
    run: Callable[[], Awaitable[None]],
    *,
    report: Callable[[str | None], None],
    stopping: Callable[[], bool],
    backoff: Backoff | None = None,
) -> None:
    """Run ``run()`` until it returns, the daemon stops, or the task is cancelled.

    Whatever ``run`` raises other than cancellation is logged with its
    traceback, handed to ``report`` (as a one-line reason, for ``devplug
    status``), and ``run`` is started again after a capped backoff. A task
    that then runs for a while without failing is reported healthy again
    (``report(None)``) by its own code, not here.
    """
    delays = backoff or Backoff(initial=0.5, cap=30.0)
    while not stopping():
        try:
            await run()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            reason = f"{name} failed: {type(exc).__name__}: {exc}"
            report(reason)
            delay = delays.next()
            log.exception("%s; restarting it in %.1f s", reason, delay)
            await asyncio.sleep(delay)
