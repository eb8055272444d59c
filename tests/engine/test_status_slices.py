"""A status build over many held allocations lets other work run on the event loop between slices."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from devplug.devkubelet import DevKubeletThread
from devplug.engine.resourcereport import ITEMS_PER_SLICE

from .conftest import MOCK_RESOURCE, daemon_holding, ticks_during

HELD = 3 * ITEMS_PER_SLICE + 10


def test_a_status_build_over_held_allocations_yields_between_slices(
    dev_kubelet: DevKubeletThread, devplug_root: Path, mock_dir: Path
) -> None:
    """With 310 allocations held, other coroutines (an Allocate) run at least six times during one build (records,
    then device entries): in one go, a build with 1,000 held kept the loop for 3-4 ms every second."""
    with daemon_holding(dev_kubelet, devplug_root, mock_dir, HELD) as (daemon, _):

        async def build() -> dict[str, Any]:
            daemon.daemon._status.forget(MOCK_RESOURCE)  # from scratch, whatever the debounced writes built
            return await daemon.daemon._status.build(daemon.daemon.resources)

        loop = daemon.daemon._loop
        assert loop is not None
        ticks, status = asyncio.run_coroutine_threadsafe(ticks_during(build), loop).result(30)
    assert ticks >= 2 * (HELD // ITEMS_PER_SLICE), ticks
    resources = status["resources"]
    assert isinstance(resources, list) and len(resources) == 1
    entry: dict[str, Any] = resources[0]
    assert entry["counts"]["allocated"] == HELD
    assert sorted(d["id"] for d in entry["devices"]) == sorted(f"mock{i}" for i in range(HELD))
    assert all(d["allocated"] and not d["releasing"] for d in entry["devices"])
