"""Waiting for a condition in a test: the one poll helper of the kit.

Tests wait on conditions, never on fixed sleeps: ``poll_until`` calls a
predicate until it returns something truthy and returns that value, or fails
after ``timeout`` seconds naming what it waited for::

    from devplug.testing.waiting import poll_until

    device = poll_until(lambda: sink.table.get("dev0"), "dev0 in the device table")
    poll_until(lambda: healthy(kubelet, ids), f"{ids} advertised healthy", details=daemon.log_text)

The timeout is a generous bound on "soon" (:data:`WAIT`, 30 s), never a timing
assertion: a condition that holds returns at once. ``details`` is called only
on a timeout, and its text (a log tail, the state seen) is added to the
failure. The failure is :class:`WaitTimeout`, a :class:`TimeoutError`, so the
helper also serves demos and scripts that run without pytest.

Importing this module imports nothing beyond the standard library.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["INTERVAL", "WAIT", "WaitTimeout", "poll_until"]

#: Seconds any awaited condition may take by default: a generous bound on "soon", never a timing assertion.
WAIT = 30.0
#: Seconds between two calls of the predicate.
INTERVAL = 0.02


class WaitTimeout(TimeoutError):
    """A condition did not hold within its timeout; the message names it (and its ``details``)."""


def poll_until(
    predicate: Callable[[], Any],
    what: str,
    timeout: float = WAIT,
    details: Callable[[], str] | None = None,
    *,
    interval: float = INTERVAL,
) -> Any:
    """Call ``predicate`` until it returns something truthy, and return that; :class:`WaitTimeout` naming
    ``what`` (with ``details()`` when given) once ``timeout`` seconds passed.

    The predicate is always called at least once, and once more at the deadline.
    An exception it raises propagates at once.
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not this loop
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        now = time.monotonic()
        if now >= deadline:
            extra = f"\n{details()}" if details is not None else ""
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what}{extra}")
        time.sleep(min(interval, deadline - now))
