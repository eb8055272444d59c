"""The core's default preferred allocation: as few NUMA nodes as possible."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from devplug.types import Device

__all__ = ["pack_numa"]


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
    by_id = {d.id: d for d in available}
    taken = set(chosen)
    groups: dict[int | None, list[str]] = defaultdict(list)
    for dev in available:
        if dev.id not in taken:
            node = dev.topology.numa_nodes[0] if dev.topology.numa_nodes else None
            groups[node].append(dev.id)
    used_nodes = {n for i in chosen if i in by_id for n in by_id[i].topology.numa_nodes}
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
