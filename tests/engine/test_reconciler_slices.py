"""A release pass over many held allocations lets other work run on the event loop between slices of records."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from devplug.devkubelet import DevKubeletThread
from devplug.frontends.deviceplugin.reconciler import RECORDS_PER_SLICE

from .conftest import daemon_holding, ticks_during

HELD = 3 * RECORDS_PER_SLICE + 10


def test_a_pass_over_held_allocations_yields_between_slices(
    dev_kubelet: DevKubeletThread, devplug_root: Path, mock_dir: Path
) -> None:
    """With 310 allocations held, other coroutines (an Allocate) run at least three times during one pass:
    in one go, a pass over 1,000 records kept the loop for 2-3 ms every second."""
    with daemon_holding(dev_kubelet, devplug_root, mock_dir, HELD) as (daemon, resource):

        async def one_pass() -> None:
            await daemon.daemon.reconciler._reconcile_resource(resource, {}, time.time())

        loop = daemon.daemon._loop
        assert loop is not None
        ticks, _ = asyncio.run_coroutine_threadsafe(ticks_during(one_pass), loop).result(30)
        assert ticks >= HELD // RECORDS_PER_SLICE, ticks
        assert resource.held_count() == HELD  # fresh allocations in their grace period: nothing released
