"""Allocate on several trees' daemons in one interleaved series: ``bench.compare``'s finest comparison.

Each tree's daemon serves the 1k resource of ``make bench`` on a node of its
own; the calls of ``make bench``'s 1k Allocate series (4 distinct devices per
call from a 1,000-device pool, the pool freed untimed when used up) go to each
daemon in turn, ``block`` calls at a time, with the bare grpcio floors (aio
and sync) between them, as :mod:`bench.decompose` does for its variants: every
daemon sees the same moments of the machine. Each tree's figures are those of
``make bench`` (``allocate_p50_ms``, ``allocate_p99_ms`` and their ratios to
the floor of the same run).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack

from bench.kubelet import MiniKubelet, Registration
from bench.scenarios.allocate import chosen_floor, devplug_series, floor_clients, floor_series, free_pool, settler
from bench.scenarios.series import CallSeries, interleave
from bench.settings import Settings
from bench.stats import summary_ms
from bench.workspace import Node, Workspace

__all__ = ["FIGURES", "RESOURCE", "allocate_side_by_side"]

RESOURCE = "bench.dev/a1k"

#: The results.json keys :func:`allocate_side_by_side` gives for each tree.
FIGURES = (
    "allocate_p50_ms",
    "allocate_p99_ms",
    "allocate_ratio_p50",
    "allocate_ratio_p99",
    "allocate_floor_p50_ms",
    "allocate_floor_p99_ms",
)


def _registered(kubelet: MiniKubelet, node: Node, name: str, timeout: float = 60.0) -> Registration:
    """The registration of ``node``'s daemon (tree ``name``); its log's end in the error when it exits first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return kubelet.wait_registered(RESOURCE, timeout=0.2)
        except TimeoutError:
            if not node.process.running():
                raise RuntimeError(
                    f"bench.compare: {name}'s daemon exited before registering:\n{node.process.log_text()[-3000:]}"
                ) from None
            if time.monotonic() > deadline:
                raise


def allocate_side_by_side(
    ws: Workspace, settings: Settings, daemon_envs: Mapping[str, Mapping[str, str]], order: Sequence[str]
) -> dict[str, dict[str, float]]:
    """The figures of each tree (``daemon_envs``: its name -> its daemon's environment), their series run in
    ``order`` (the names) within each block; the floors' series after them."""
    n, block, warm = settings.allocate_calls, settings.block, settings.warmup
    with ExitStack() as stack:
        clients = {}
        for name in order:
            node = ws.node(
                f"a-{name}",
                {RESOURCE: (settings.devices_1k, settings.numa_nodes)},
                grace_period=3600,
                daemon_env=daemon_envs[name],
            )
            kubelet = stack.enter_context(MiniKubelet(node.root))
            stack.callback(node.stop)
            node.start()
            registration = _registered(kubelet, node, name)
            registration.watcher.wait(0, timeout=60)
            clients[name] = (registration.client, registration.watcher, node)
        folder = ws.path("af")
        host_dir = str(clients[order[0]][2].mock_folder(RESOURCE))
        aio, sync = floor_clients(stack, folder, host_dir)
        series = {
            name: devplug_series(name, client, settings, settler(watcher))
            for name, (client, watcher, _) in clients.items()
        }
        extra = [floor_series("floor-aio", aio, settings), floor_series("floor-sync", sync, settings)]
        every: list[CallSeries] = [*(series[name] for name in order), *extra]
        for one in every:
            one.warm_up(warm)
        interleave(every, n, block)
        for client, watcher, _ in clients.values():
            free_pool(client, settings, watcher)
        fa, fs = (summary_ms(s.samples) for s in extra)
        _, floor = chosen_floor(fa, fs)
        out: dict[str, dict[str, float]] = {}
        for name in order:
            figures = summary_ms(series[name].samples)
            out[name] = {
                "allocate_p50_ms": figures["p50"],
                "allocate_p99_ms": figures["p99"],
                "allocate_ratio_p50": figures["p50"] / floor["p50"],
                "allocate_ratio_p99": figures["p99"] / floor["p99"],
                "allocate_floor_p50_ms": floor["p50"],
                "allocate_floor_p99_ms": floor["p99"],
            }
    return out
