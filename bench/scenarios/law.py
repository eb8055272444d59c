"""ListAndWatch push latency: one device file changes until the client holds the new list (median of N).

The change is an atomic rename of a rewritten device file (the mock ignores
the dotfile it is written to first); the clock starts just before the rename
and stops when the client's stream thread receives the list in which the
device has its new health. The floor is the bare grpcio server pushing its
precomputed list of the same size when sent SIGUSR1 (the clock starts just
before the kill). devplug and floor samples alternate.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from pathlib import Path

from bench.client import ListWatcher, device_health
from bench.floors import FloorProcess
from bench.stats import ms
from bench.workspace import stage_flip

__all__ = ["floor_push", "measure", "plugin_push"]

#: Pause between samples, so each push starts from a quiet daemon.
_GAP_S = 0.03


def plugin_push(watcher: ListWatcher, folder: Path, index: int, unhealthy: bool, numa_nodes: int = 0) -> int:
    """One device change until the new list arrived, in nanoseconds."""
    after = watcher.settle()
    want = "Unhealthy" if unhealthy else "Healthy"
    tmp, dest = stage_flip(folder, index, unhealthy, numa_nodes)
    start = time.perf_counter_ns()
    os.replace(tmp, dest)
    _, arrived = watcher.wait_until(lambda data: device_health(data, f"mock{index}") == want, after)
    return arrived - start


def floor_push(watcher: ListWatcher, floor: FloorProcess) -> int:
    """One SIGUSR1 until the floor's list arrived, in nanoseconds."""
    after = watcher.settle()
    start = time.perf_counter_ns()
    floor.signal(signal.SIGUSR1)
    _, arrived, _ = watcher.wait(after)
    return arrived - start


def measure(
    samples: int,
    watcher: ListWatcher,
    folder: Path,
    index: int,
    numa_nodes: int = 0,
    floor: tuple[ListWatcher, FloorProcess] | None = None,
) -> tuple[float, float | None]:
    """Median push latency in ms for devplug (and for the floor when given), alternating samples."""
    mine: list[int] = []
    theirs: list[int] = []
    for i in range(samples):
        mine.append(plugin_push(watcher, folder, index, unhealthy=i % 2 == 0, numa_nodes=numa_nodes))
        time.sleep(_GAP_S)
        if floor is not None:
            theirs.append(floor_push(*floor))
            time.sleep(_GAP_S)
    if samples % 2:  # leave the device healthy
        plugin_push(watcher, folder, index, unhealthy=False, numa_nodes=numa_nodes)
    return ms(statistics.median(mine)), (ms(statistics.median(theirs)) if theirs else None)
