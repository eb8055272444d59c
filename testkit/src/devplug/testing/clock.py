"""A clock a test moves by hand, for code that takes a ``clock`` (``time.monotonic`` in production).

::

    clock = ManualClock()
    retries = DeviceRetries(retry_min=0.5, clock=clock)
    retries.failed("vf0")
    clock.advance(0.5)              # the wait is over, without sleeping
    assert retries.due(["vf0"]) == ["vf0"]
"""

from __future__ import annotations

__all__ = ["ManualClock"]


class ManualClock:
    """A monotonic clock that stands still until :meth:`advance` moves it; call it for the time."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move the clock ``seconds`` (>= 0) forward; returns the new time."""
        if not seconds >= 0:
            raise ValueError(f"ManualClock: a monotonic clock moves forward only, got {seconds!r} seconds")
        self.now += seconds
        return self.now
