"""The default preferred allocation packs devices on as few NUMA nodes as possible."""

from __future__ import annotations

from devplug import Device, Topology
from devplug.allocation import pack_numa


def _devices(layout: dict[int | None, int]) -> list[Device]:
    out = []
    for node, count in layout.items():
        for i in range(count):
            topo = Topology(() if node is None else (node,))
            out.append(Device(f"n{node}-{i}", topology=topo))
    return out


def _nodes(chosen: list[str]) -> set[str]:
    return {c.split("-")[0] for c in chosen}


def test_fits_on_one_node_when_one_node_can_hold_it() -> None:
    chosen = pack_numa(_devices({0: 2, 1: 4, 2: 3}), [], 3)
    assert len(chosen) == 3 and _nodes(chosen) == {"n2"}  # the tightest node that fits


def test_spreads_over_fewest_nodes_when_none_fits() -> None:
    chosen = pack_numa(_devices({0: 2, 1: 4, 2: 3}), [], 6)
    assert len(chosen) == 6 and _nodes(chosen) == {"n1", "n2"}


def test_must_include_first_and_its_node_preferred() -> None:
    devices = _devices({0: 4, 1: 4})
    chosen = pack_numa(devices, ["n1-3"], 3)
    assert chosen[0] == "n1-3"
    assert _nodes(chosen) == {"n1"}


def test_devices_without_topology_come_last() -> None:
    chosen = pack_numa(_devices({None: 4, 0: 2}), [], 3)
    assert chosen[:2] == ["n0-0", "n0-1"] and chosen[2].startswith("nNone")


def test_short_when_not_enough_available() -> None:
    assert pack_numa(_devices({0: 2}), [], 5) == ["n0-0", "n0-1"]
