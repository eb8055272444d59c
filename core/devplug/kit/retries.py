"""Retrying failed work with capped backoff: the delays of the rescan loop, and a schedule per device.

A driver's rescan loop (:class:`~devplug.kit.rescan.RescanLoop`) backs off a
failing scan; a driver that also retries failed work on one device from that
loop (a reset the kernel refused, an erase that failed) backs off each device
the same way, so that a device that keeps failing is tried again less and less
often instead of on every scan, and costs the other devices nothing between
its attempts::

    retries = DeviceRetries(retry_min=RESCAN_RETRY_MIN, retry_max=DEVICE_RETRY_MAX)

    def scan(self):                                 # the rescan loop
        with self.locks.hold_free(retries.due(self.failed())) as due:
            for device in due:
                try:
                    self.erase(device)
                except DriverError:
                    retries.failed(device)          # tried again after 0.5, 1, 2, 4 ... 60 s
                else:
                    retries.succeeded(device)

Every failed attempt counts, whoever made it (a hook the engine called or the
loop's retry), so the loop does not add its own attempts to the engine's
between two of them. Both use :class:`CappedBackoff`: ``retry_min`` seconds
after the first failure, doubling after each further one, at most
``retry_max``.

:class:`CappedBackoff` is devplug's one backoff (defined in
:mod:`devplug.backoff`, so that the engine, which does not import the kit,
waits by it too); besides ``retry_min`` and ``retry_max`` it takes a
``factor``, ``jitter`` and a server's ``Retry-After``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from devplug.backoff import CappedBackoff

__all__ = ["DEVICE_RETRY_MAX", "CappedBackoff", "DeviceRetries"]

#: The longest wait :class:`DeviceRetries` puts between two attempts on one device by default (a minute, as the
#: engine's ``[release] max_retry_interval``).
DEVICE_RETRY_MAX = 60.0


@dataclass
class _Failing:
    failures: int
    due: float


class DeviceRetries:
    """When each device's failed work may be tried again (thread-safe); see the module docstring.

    ``clock`` is ``time.monotonic`` unless a test gives its own.
    """

    def __init__(
        self,
        *,
        retry_min: float,
        retry_max: float = DEVICE_RETRY_MAX,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backoff = CappedBackoff(retry_min, max(retry_min, retry_max))
        self._clock = clock
        self._lock = threading.Lock()
        self._failing: dict[str, _Failing] = {}

    def __repr__(self) -> str:
        return f"<DeviceRetries {len(self._failing)} device(s) backing off>"

    def failed(self, device_id: str) -> float:
        """One more failure in a row of work on ``device_id``: returns the seconds until it is due again."""
        with self._lock:
            failing = self._failing.get(device_id)
            failures = failing.failures + 1 if failing is not None else 1
            delay = self.backoff.delay(failures)
            self._failing[device_id] = _Failing(failures, self._clock() + delay)
            return delay

    def succeeded(self, device_id: str) -> None:
        """The work on ``device_id`` is done (or no longer owed): it is due at once next time it fails."""
        with self._lock:
            self._failing.pop(device_id, None)

    def due(self, device_ids: Iterable[str]) -> list[str]:
        """Those of ``device_ids`` (in order) that may be tried now: never failed, or their wait is over."""
        with self._lock:
            now = self._clock()
            return [d for d in dict.fromkeys(device_ids) if (f := self._failing.get(d)) is None or f.due <= now]

    def failures(self, device_id: str) -> int:
        """Failures in a row of the work on ``device_id`` (0 when none)."""
        with self._lock:
            failing = self._failing.get(device_id)
            return failing.failures if failing is not None else 0

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the schedule of every device not in ``keep`` (devices whose work is no longer owed)."""
        kept = set(keep)
        with self._lock:
            for device_id in [d for d in self._failing if d not in kept]:
                del self._failing[device_id]
