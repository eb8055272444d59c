"""A driver's rescan loop: look at the machine again every period, and soon after an event, in a thread of its own.

Drivers whose devices can change behind their back (hot-plug, another driver
taking a device, a cable pulled) look again now and then and push what
changed through their :class:`devplug.DriverContext`. :class:`RescanLoop` is
that loop, once for every driver::

    self.rescans = RescanLoop(self.refresh, interval=options.rescan_interval, name=f"nvme {ctx.resource_name}",
                              log=ctx.log)
    self.rescans.start()        # in the start hook, after the first scan
    ...
    self.rescans.trigger()      # an event: scan again soon (coalesced with any other pending one)
    ...
    self.rescans.stop()         # in the stop hook: waits for a scan in progress

What it guarantees:

* **one scan at a time**, in the loop's thread: ``scan`` is never called
  twice at once, so it needs no lock against itself (only against the hooks);
* **the period**: a scan every ``interval`` seconds after the last one ended
  (``interval = 0``: only after :meth:`RescanLoop.trigger`);
* **events**: :meth:`~RescanLoop.trigger` makes the next scan start at once
  (or when a backoff ends); triggers that arrive while a scan waits or runs
  are served by one more scan, not one each;
* **backoff**: a scan that raises is logged (its message; with the traceback
  the first time, unless it is a :class:`devplug.DriverError`, the expected
  kind) and tried again after ``retry_min`` seconds, doubling after every
  further failure up to ``retry_max`` (by default the period, so a failing
  scan is never retried later than a working one would run, nor in a hot
  loop; :class:`devplug.kit.retries.CappedBackoff`, which a driver's retries
  of failed work on one device use too). Repeats of the same failure are logged at debug level; the first
  scan that works again says so. Nothing a scan raises ends the loop;
* **stopping**: :meth:`~RescanLoop.stop` wakes the loop and waits for a scan
  in progress to end; no scan starts after it returns.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from devplug.errors import DriverError
from devplug.kit.retries import CappedBackoff

__all__ = ["MAX_RESCAN_INTERVAL", "RESCAN_RETRY_MIN", "RescanLoop", "check_rescan_interval"]

#: Seconds before a failed scan is first tried again.
RESCAN_RETRY_MIN = 0.5
#: The longest ``rescan_interval`` option :func:`check_rescan_interval` accepts (a day).
MAX_RESCAN_INTERVAL = 86400.0
#: The longest backoff when the loop has no period (``interval = 0``).
_RETRY_MAX_WITHOUT_PERIOD = 30.0

Logger = logging.Logger | logging.LoggerAdapter  # type: ignore[type-arg]


class RescanLoop:
    """Calls ``scan`` in a thread named ``name``, as the module docstring says; ``log`` gets its failures."""

    def __init__(
        self,
        scan: Callable[[], Any],
        *,
        interval: float,
        name: str,
        log: Logger,
        retry_min: float = RESCAN_RETRY_MIN,
        retry_max: float | None = None,
    ) -> None:
        if not interval >= 0:
            raise ValueError(f"RescanLoop {name!r}: interval must be a number of seconds >= 0, got {interval!r}")
        if not retry_min > 0:
            raise ValueError(f"RescanLoop {name!r}: retry_min must be a number of seconds > 0, got {retry_min!r}")
        self._scan = scan
        self.interval = float(interval)
        self.name = name
        self._log = log
        self.retry_min = float(retry_min)
        default_max = self.interval if self.interval > 0 else _RETRY_MAX_WITHOUT_PERIOD
        self.retry_max = max(self.retry_min, float(retry_max if retry_max is not None else default_max))
        self._delays = CappedBackoff(self.retry_min, self.retry_max)
        self._cond = threading.Condition()
        self._triggered = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        #: Failed scans in a row (0 after a scan that worked).
        self.failures = 0
        #: The message of the last failure of the current run of failures (``None`` after a scan that worked).
        self.last_error: str | None = None
        #: Scans done so far (those that raised included).
        self.scans = 0

    def __repr__(self) -> str:
        return f"<RescanLoop {self.name!r} every {self.interval:g} s, {self.failures} failure(s) in a row>"

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._thread is not None

    def start(self) -> None:
        """Start the thread; the first scan comes one period (or one trigger) from now."""
        with self._cond:
            if self._thread is not None:
                raise RuntimeError(f"RescanLoop {self.name!r} is already running")
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def trigger(self) -> None:
        """Ask for a scan soon (callable from any thread, a hook or a watcher's callback; never blocks)."""
        with self._cond:
            self._triggered = True
            self._cond.notify_all()

    def stop(self, timeout: float | None = None) -> None:
        """Stop the loop; wait (at most ``timeout`` seconds) for a scan in progress. A no-op when not running."""
        with self._cond:
            thread, self._thread = self._thread, None
            self._stopping = True
            self._cond.notify_all()
        if thread is None or thread is threading.current_thread():
            return
        thread.join(timeout)
        if thread.is_alive():
            self._log.warning("%s: a scan still runs after %g s; leaving it to finish", self.name, timeout or 0)

    def _backoff(self) -> float:
        return self._delays.delay(self.failures)

    def _run(self) -> None:
        due = time.monotonic() + self.interval if self.interval > 0 else float("inf")
        held_until = 0.0  # triggers wait for a backoff to end
        while True:
            with self._cond:
                while not self._stopping:
                    now = time.monotonic()
                    if now >= due or (self._triggered and now >= held_until):
                        break
                    wake = min(due, held_until) if self._triggered else due
                    self._cond.wait(None if wake == float("inf") else wake - now)
                if self._stopping:
                    return
                self._triggered = False
            ok = self._scan_once()
            now = time.monotonic()
            if ok:
                held_until = 0.0
                due = now + self.interval if self.interval > 0 else float("inf")
            else:
                held_until = due = now + self._backoff()

    def _scan_once(self) -> bool:
        """One scan; its failure logged. True when it worked."""
        self.scans += 1
        try:
            self._scan()
        except Exception as exc:
            self.failures += 1
            message = str(exc) or type(exc).__name__
            retry = self._backoff()
            if message != self.last_error:
                self._log.error(
                    "%s: rescan failed: %s (trying again in %g s)",
                    self.name,
                    message,
                    retry,
                    exc_info=None if isinstance(exc, DriverError) or self.last_error is not None else exc,
                )
            else:
                self._log.debug("%s: rescan failed again (%d in a row): %s", self.name, self.failures, message)
            self.last_error = message
            return False
        if self.failures:
            self._log.info("%s: rescan works again after %d failure(s)", self.name, self.failures)
        self.failures = 0
        self.last_error = None
        return True


def check_rescan_interval(value: float, key: str = "rescan_interval") -> None:
    """For a driver's ``Options``: ``ValueError`` naming ``key`` unless ``value`` is a finite number of seconds
    from 0 (no period) to :data:`MAX_RESCAN_INTERVAL`."""
    number = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if not number or not 0 <= value <= MAX_RESCAN_INTERVAL:
        raise ValueError(f"{key}: must be a finite number of seconds from 0 to {MAX_RESCAN_INTERVAL:g}, got {value!r}")
