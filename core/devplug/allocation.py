"""The core's default preferred allocations: as few NUMA nodes as possible, and replicas of shared devices
spread over as many devices as possible."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from devplug.types import Device, Replicas

__all__ = ["pack_numa", "spread_replicas"]


def pack_numa(available: Sequence[Device], must_include: Sequence[str], size: int) -> list[str]:
    """Choose ``size`` device IDs from ``available``, all of ``must_include`` first, spread over few NUMA nodes.

    The must-include devices are taken first. The rest are filled from the
    NUMA nodes already used by the must-include devices, then from the nodes
    with the most free devices (so a request that fits on one node lands on one
    node), devices without topology last; within a node, in the kubelet's
    order. Returns fewer than ``size`` IDs when not enough are available.
    """
    chosen: list[str] = list(dict.fromkeys(must_include))[: max(size, 0)]
    if len(chosen) >= size:
        return chosen
    taken = set(chosen)
    groups: dict[int | None, list[str]] = defaultdict(list)
    used_nodes: set[int] = set()
    for dev in available:  # one pass: group the free devices by node, note the nodes of the chosen ones
        nodes = dev.topology.numa_nodes
        if dev.id in taken:
            used_nodes.update(nodes)
        else:
            groups[nodes[0] if nodes else None].append(dev.id)
    need = size - len(chosen)

    def rank(node: int | None) -> tuple[int, int, int, int]:
        members = len(groups[node])
        # Prefer: nodes already in use, nodes that fit the whole rest, then the
        # tightest fit (fewest left over), then the lowest node number.
        fits = members >= need
        return (
            0 if node in used_nodes else 1,
            0 if node is not None else 1,
            0 if fits else 1,
            (members - need) if fits else -members,
        )

    for node in sorted(groups, key=lambda n: (rank(n), -1 if n is None else n)):
        for dev_id in groups[node]:
            if len(chosen) == size:
                return chosen
            chosen.append(dev_id)
            need -= 1
    return chosen


def spread_replicas(
    available: Sequence[Device], must_include: Sequence[str], size: int, replicas: Replicas
) -> list[str]:
    """Choose ``size`` replicas of shared devices: physical device IDs, one entry per replica.

    ``available`` are the physical devices with replicas offered
    (``replicas.by_device`` lists them, ``replicas.in_use`` counts the replicas
    other pods hold); ``must_include`` names physical devices, once per
    replica already chosen. Each further replica goes to the device that,
    in order: has the fewest replicas in this request (distinct devices
    first), sits on a NUMA node this request already uses, is least loaded
    (replicas in use, this request's included), and comes first in the
    kubelet's order. Returns fewer than ``size`` entries when not enough
    replicas are offered.
    """
    order = {d.id: n for n, d in enumerate(available)}
    nodes = {d.id: d.topology.numa_nodes for d in available}
    free = {d.id: len(replicas.replica_ids(d.id)) or 1 for d in available}
    mine: dict[str, int] = defaultdict(int)
    chosen: list[str] = []
    for dev_id in must_include[: max(size, 0)]:
        chosen.append(dev_id)
        mine[dev_id] += 1
        if dev_id in free:
            free[dev_id] -= 1
    used_nodes = {n for i in chosen for n in nodes.get(i, ())}
    while len(chosen) < size:
        candidates = [i for i, left in free.items() if left > 0]
        if not candidates:
            break

        def rank(dev_id: str) -> tuple[int, int, int, int]:
            near = 0 if not used_nodes or used_nodes & set(nodes[dev_id]) else 1
            return (mine[dev_id], near, replicas.in_use.get(dev_id, 0) + mine[dev_id], order[dev_id])

        best = min(candidates, key=rank)
        chosen.append(best)
        mine[best] += 1
        free[best] -= 1
        used_nodes.update(nodes[best])
    return chosen
