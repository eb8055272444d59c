"""A release pass over many held allocations lets other work run on the event loop between slices of records."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from devplug.config import parse_config
from devplug.devkubelet import DevKubeletThread
from devplug.engine.reconciler import RECORDS_PER_SLICE
from devplug.testing.configs import dev_config
from devplug.testing.daemon import DaemonThread

from .conftest import PluginClient

MOCK = "example.com/mock"
HELD = 3 * RECORDS_PER_SLICE + 10


def test_a_pass_over_held_allocations_yields_between_slices(
    dev_kubelet: DevKubeletThread, devplug_root: Path, mock_dir: Path
) -> None:
    """With 310 allocations held, other coroutines (an Allocate) run at least three times during one pass:
    in one go, a pass over 1,000 records kept the loop for 2-3 ms every second."""
    tables = {MOCK: {"driver": "mock", "options": {"directory": str(mock_dir), "count": HELD}}}
    config = parse_config(dev_config(devplug_root, tables, release_interval=3600.0, grace_period=3600.0))
    with DaemonThread(config) as daemon:
        dev_kubelet.wait_registered(MOCK, timeout=15)
        (resource,) = daemon.daemon.resources
        client = PluginClient(resource.socket_path)
        try:
            for i in range(HELD):
                client.allocate([f"mock{i}"])
        finally:
            client.channel.close()
        assert len(resource.ledger.records) == HELD

        async def pass_with_ticker() -> tuple[int, int]:
            ticks = 0
            done = False

            async def ticker() -> None:
                nonlocal ticks
                while not done:
                    ticks += 1
                    await asyncio.sleep(0)

            task = asyncio.ensure_future(ticker())
            await asyncio.sleep(0)  # the ticker's first tick, before the pass
            before = ticks
            await daemon.daemon.reconciler._reconcile_resource(resource, {}, time.time())
            done = True
            await task
            return before, ticks

        loop = daemon.daemon._loop
        assert loop is not None
        before, after = asyncio.run_coroutine_threadsafe(pass_with_ticker(), loop).result(30)
        assert after - before >= HELD // RECORDS_PER_SLICE, (before, after)
        assert len(resource.ledger.records) == HELD  # fresh allocations in their grace period: nothing released
