"""Measured call series, run in interleaved blocks so devplug and its floors see the same noisy moments."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

__all__ = ["CallSeries", "interleave"]


class CallSeries:
    """Calls ``call(i)`` for i = 0, 1, ... and times each; ``between(i)`` runs untimed before call ``i``."""

    def __init__(self, name: str, call: Callable[[int], object], between: Callable[[int], None] | None = None) -> None:
        self.name = name
        self._call = call
        self._between = between
        self._next = 0
        self.samples: list[int] = []

    def run(self, count: int) -> None:
        clock = time.perf_counter_ns
        for _ in range(count):
            i = self._next
            if self._between is not None:
                self._between(i)
            start = clock()
            self._call(i)
            self.samples.append(clock() - start)
            self._next += 1

    def warm_up(self, count: int) -> None:
        """Run ``count`` calls and forget their timings."""
        self.run(count)
        self.samples.clear()


def interleave(series: Sequence[CallSeries], total: int, block: int) -> None:
    """Run ``total`` measured calls of every series, ``block`` at a time, round robin."""
    done = 0
    while done < total:
        step = min(block, total - done)
        for one in series:
            one.run(step)
        done += step
