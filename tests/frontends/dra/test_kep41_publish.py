"""Issue 41's published forms, built without an API server (build_pool): a shared device as one device with
consumable capacity (KEP-5075) and parts with their parent's counter set (KEP-4815), their limits and refusals,
and the N-device form and plain parts left unchanged where the server keeps neither. Every slice built is checked
against the API-server stand-in's validation of a ResourceSlice (``validation.go``'s rules, as modelled)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from devplug.engine.devicetable import DeviceTable
from devplug.frontends.dra.capacity import SharedCapacity, shared_capacity
from devplug.frontends.dra.devicenames import device_name
from devplug.frontends.dra.slicecontent import DeviceDescription, Pool, SliceContentError, build_pool
from devplug.testing.apiserver import validation
from devplug.types import Device, Health, Partition, ShareCapacity

DRIVER = "fpga.example.com"


def table_of(*devs: Device, replicas: int = 1) -> DeviceTable:
    table = DeviceTable(replicas=replicas)
    table.replace(devs)
    return table


def build(table: DeviceTable, **kwargs: Any) -> Pool:
    pool = build_pool(table, driver=DRIVER, pool="node-a", node="node-a", **kwargs)
    for name, spec in pool.slices:  # each slice as the publisher writes it is one the API server takes
        obj = {
            "metadata": {"name": name},
            "spec": {**spec, "pool": {**spec["pool"], "generation": 1, "resourceSliceCount": len(pool.slices)}},
        }
        assert validation.resource_slice(obj, None) == [], (name, spec)
    return pool


def devices(pool: Pool) -> list[dict[str, Any]]:
    return [d for _, spec in pool.slices for d in spec.get("devices") or ()]


def by_name(pool: Pool) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in devices(pool)}


# --- consumable capacity


def test_a_shared_device_is_one_device_with_consumable_capacity_of_its_replicas() -> None:
    table = table_of(Device("fpga0", replicas=4, topology=_numa(1)), Device("fpga1"))
    pool = build(table, consumable=True)
    assert by_name(pool) == {
        "fpga0": {
            "name": "fpga0",
            "attributes": {"deviceID": {"string": "fpga0"}, "numaNode": {"int": 1}},
            "capacity": {
                "shares": {
                    "value": "4",
                    "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}},
                }
            },
            "allowMultipleAllocations": True,
        },
        "fpga1": {"name": "fpga1", "attributes": {"deviceID": {"string": "fpga1"}}},
    }
    assert pool.names.device_id("fpga0") == "fpga0", "the published name maps to the PHYSICAL device"
    assert pool.shared == {"fpga0": SharedCapacity("fpga0", "shares", 1, tuple(f"fpga0::{k}" for k in range(4)))}
    assert pool.shared_capacity("fpga0") is pool.shared["fpga0"] and pool.shared_capacity("fpga1") is None


def test_a_device_s_share_capacity_names_the_capacity_and_what_a_replica_is_worth() -> None:
    gib4 = 4 * 2**30
    table = table_of(Device("gpu0", replicas=3, share_capacity=ShareCapacity("memory", gib4)))
    [entry] = devices(build(table, consumable=True))
    step, total = str(gib4), str(3 * gib4)
    assert entry["capacity"] == {
        "memory": {
            "value": total,
            "requestPolicy": {"default": step, "validRange": {"min": step, "max": total, "step": step}},
        }
    }
    shared = shared_capacity(table, "gpu0")
    assert shared is not None and (shared.replicas, shared.total) == (3, 3 * gib4)
    assert [shared.replicas_for(n) for n in (1, gib4, gib4 + 1, 3 * gib4)] == [1, 1, 2, 3]
    with pytest.raises(ValueError, match=r"device 'gpu0': a share of 0 memory is outside 1\.\.12884901888"):
        shared.replicas_for(0)
    with pytest.raises(ValueError, match="outside"):
        shared.replicas_for(3 * gib4 + 1)


def test_quantities_are_written_in_the_canonical_form_the_server_gives_back() -> None:
    """quantity.go's CanonicalizeBytes of a DecimalSI quantity: what is read back compares equal to what was sent."""
    from devplug.frontends.dra.capacity import quantity_text

    cases = {0: "0", 4: "4", 1500: "1500", 2000: "2k", 20000: "20k", 4 * 2**30: "4294967296", 12 * 10**9: "12G"}
    assert {n: quantity_text(n) for n in cases} == cases
    assert quantity_text(9 * 10**18) == "9E"
    [entry] = devices(
        build(table_of(Device("gpu0", replicas=2, share_capacity=ShareCapacity("mem", 1000))), consumable=True)
    )
    policy = {"default": "1k", "validRange": {"min": "1k", "max": "2k", "step": "1k"}}
    assert entry["capacity"] == {"mem": {"value": "2k", "requestPolicy": policy}}


def test_without_consumable_capacity_a_shared_device_is_one_device_per_replica_as_before() -> None:
    table = table_of(Device("fpga0", replicas=2))
    plain = build(table)
    assert sorted(by_name(plain)) == sorted(device_name(f"fpga0::{k}") for k in range(2))
    assert all("allowMultipleAllocations" not in d and "capacity" not in d for d in devices(plain))
    assert sorted(d["attributes"]["replica"]["int"] for d in devices(plain)) == [0, 1]
    assert {d["attributes"]["physicalDevice"]["string"] for d in devices(plain)} == {"fpga0"}
    assert plain.shared == {}
    assert build(table, consumable=False).digest == plain.digest


def test_a_device_of_one_replica_stays_a_plain_device_in_the_consumable_form() -> None:
    """validateRequestPolicyRange refuses min + step above the capacity: one replica has no consumable form."""
    table = table_of(Device("fpga0"), Device("fpga1", replicas=1, share_capacity=ShareCapacity("memory", 4)))
    pool = build(table, consumable=True)
    assert by_name(pool) == by_name(build(table))
    assert all("capacity" not in d and "allowMultipleAllocations" not in d for d in devices(pool))
    assert pool.shared == {} and shared_capacity(table, "fpga1") is None


def test_the_shared_device_is_offered_while_a_replica_is_free_and_tainted_when_none_is_or_it_is_unhealthy() -> None:
    table = table_of(Device("fpga0", replicas=3))
    table.set_withheld({"fpga0::0", "fpga0::1"})  # two being released: the device stays offered, full capacity
    [entry] = devices(build(table, consumable=True))
    assert "taints" not in entry and entry["capacity"]["shares"]["value"] == "3"
    table.set_withheld({"fpga0::0", "fpga0::1", "fpga0::2"})
    [entry] = devices(build(table, consumable=True))
    assert entry["taints"] == [{"key": "devplug.io/unavailable", "value": "releasing", "effect": "NoSchedule"}]
    left_out = build(table, consumable=True, taints=False)
    assert devices(left_out) == [] and left_out.omitted == 1 and left_out.shared == {}
    table.set_withheld(())
    table.replace([Device("fpga0", replicas=3, health=Health.UNHEALTHY)])
    [entry] = devices(build(table, consumable=True))
    assert entry["taints"][0]["value"] == "unhealthy"


def test_a_description_may_not_take_the_share_capacity_s_name() -> None:
    table = table_of(Device("fpga0", replicas=2))
    describe = DeviceDescription(capacity={f"{DRIVER}/shares": 2})
    with pytest.raises(SliceContentError, match=r"device 'fpga0': capacity 'fpga\.example\.com/shares' is the shared"):
        build_pool(table, driver=DRIVER, pool="node-a", node="node-a", consumable=True, describe=lambda d: describe)
    described = build(table, consumable=True, describe=lambda d: DeviceDescription(capacity={"memory": "16Gi"}))
    # a share that asks for no memory takes none (without a policy the allocator would give it all 16Gi)
    assert devices(described)[0]["capacity"]["memory"] == {
        "value": "16Gi",
        "requestPolicy": {"default": "0", "validRange": {"min": "0"}},
    }
    plain = build(table, describe=lambda d: DeviceDescription(capacity={"memory": "16Gi"}))
    assert {d["capacity"]["memory"]["value"] for d in devices(plain)} == {"16Gi"}
    assert all("requestPolicy" not in d["capacity"]["memory"] for d in devices(plain)), "forbidden without sharing"


# --- counters


def _card(parent: str, size: int, take: int = 1) -> Partition:
    return Partition(parent, {"regions": size}, {"regions": take})


def test_parts_name_their_parent_s_counter_set_which_has_a_slice_of_its_own() -> None:
    table = table_of(
        Device("card0-whole", partition=_card("card0", 4, take=4)),
        Device("card0-part0", partition=_card("card0", 4)),
        Device("card0-part1", partition=_card("card0", 4)),
        Device("0000:3b:00.0", partition=Partition("PF/0", {"vfs": 2, "mbps": 1000}, {"vfs": 1, "mbps": 500})),
        Device("plain"),
    )
    pool = build(table, counters=True)
    assert [name for name, _ in pool.slices] == ["node-a-fpga.example.com-0", "node-a-fpga.example.com-1"]
    devs_spec, sets_spec = (spec for _, spec in pool.slices)
    assert "sharedCounters" not in devs_spec
    assert "devices" not in sets_spec, "a slice of counter sets has no devices at all (1.35+)"
    pf = device_name("PF/0")
    assert sets_spec["sharedCounters"] == [
        {"name": "card0", "counters": {"regions": {"value": "4"}}},
        {"name": pf, "counters": {"mbps": {"value": "1k"}, "vfs": {"value": "2"}}},  # canonical, as stored
    ]
    found = by_name(pool)
    assert found["card0-whole"]["consumesCounters"] == [
        {"counterSet": "card0", "counters": {"regions": {"value": "4"}}}
    ]
    assert found["card0-part1"]["consumesCounters"] == [
        {"counterSet": "card0", "counters": {"regions": {"value": "1"}}}
    ]
    assert found[device_name("0000:3b:00.0")]["consumesCounters"] == [
        {"counterSet": pf, "counters": {"mbps": {"value": "500"}, "vfs": {"value": "1"}}}
    ]
    assert "consumesCounters" not in found["plain"]
    assert pool.counter_sets == 2 and pool.device_count == 5


def test_without_counters_parts_are_plain_devices_and_the_pool_is_as_before() -> None:
    table = table_of(
        Device("card0-part0", partition=_card("card0", 4)), Device("card0-part1", partition=_card("card0", 4))
    )
    pool = build(table)
    assert len(pool.slices) == 1 and all("consumesCounters" not in d for d in devices(pool))
    assert pool.counter_sets == 0
    # a table without parts gives the same pool (and digest) whether or not counters are used
    plain = table_of(Device("fpga0"), Device("fpga1", replicas=2))
    assert build(plain, counters=True) == build(plain)


def test_parts_of_one_parent_that_disagree_on_its_counters_are_refused_naming_both() -> None:
    table = table_of(
        Device("card0-part0", partition=_card("card0", 4)), Device("card0-part1", partition=_card("card0", 8))
    )
    with pytest.raises(
        SliceContentError, match="devices 'card0-part0' and 'card0-part1' are parts of 'card0' but give"
    ):
        build_pool(table, driver=DRIVER, pool="node-a", node="node-a", counters=True)
    build(table)  # without counters the engine alone keeps the parts apart: nothing to refuse here


def test_two_parents_whose_counter_sets_would_share_a_name_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """No two real IDs are known to collide (65 bits of SHA-256): the name map is made to see a collision."""
    from devplug.frontends.dra import counters, devicenames

    class Colliding(devicenames.DeviceNameMap):
        def __init__(self, ids: Iterable[str] = ()) -> None:
            listed = list(ids)
            if len(listed) == 2:
                raise devicenames.DeviceNameCollisionError(
                    f"device IDs {listed[0]!r} and {listed[1]!r} both map to 'x'"
                )
            super().__init__(listed)

    table = table_of(Device("a-part", partition=_card("A", 1)), Device("b-part", partition=_card("B", 1)))
    monkeypatch.setattr(counters, "DeviceNameMap", Colliding)
    with pytest.raises(SliceContentError, match="counter sets: parent IDs 'A' and 'B' both map to"):
        build_pool(table, driver=DRIVER, pool="node-a", node="node-a", counters=True)


def test_slices_with_parts_hold_64_devices_and_counter_sets_8_a_slice() -> None:
    parts = [Device(f"card{c}-part{p}", partition=_card(f"card{c}", 7)) for c in range(10) for p in range(7)]
    pool = build(table_of(*parts), counters=True)
    sizes = [(len(spec.get("devices") or ()), len(spec.get("sharedCounters") or ())) for _, spec in pool.slices]
    assert sizes == [(64, 0), (6, 0), (0, 8), (0, 2)]
    assert pool.counter_sets == 10
    assert [len(spec.get("devices") or ()) for _, spec in build(table_of(*parts)).slices] == [70], "128 without"


def test_a_changed_counter_set_is_a_new_pool_and_a_retired_resource_has_no_counter_slices() -> None:
    table = table_of(Device("card0-part0", partition=_card("card0", 4)))
    before = build(table, counters=True)
    table.replace([Device("card0-part0", partition=_card("card0", 2))])
    after = build(table, counters=True)
    assert before.digest != after.digest
    assert after.slices[1][1]["sharedCounters"] == [{"name": "card0", "counters": {"regions": {"value": "2"}}}]
    table.retire("removed from the config")
    retired = build(table, counters=True)
    assert [spec.get("sharedCounters") for _, spec in retired.slices] == [None] and retired.device_count == 0


def test_a_part_blocked_by_its_parent_s_counters_is_left_to_the_scheduler_where_they_are_published() -> None:
    """table.partition_blocked: the engine withholds parts that do not fit now; with counter sets published the
    scheduler does that sum itself (no taint), without them the part is tainted ``blocked``."""
    table = table_of(
        Device("card0-whole", partition=_card("card0", 4, take=4)), Device("card0-part0", partition=_card("card0", 4))
    )
    table.set_withheld({"card0-whole", "card0-part0"}, partition_blocked={"card0-whole"})
    with_counters = by_name(build(table, counters=True))
    assert "taints" not in with_counters["card0-whole"]
    assert with_counters["card0-part0"]["taints"][0]["value"] == "releasing", "released, not blocked: still tainted"
    without = by_name(build(table))
    assert without["card0-whole"]["taints"][0]["value"] == "blocked"
    assert without["card0-part0"]["taints"][0]["value"] == "releasing"


def test_a_shared_part_is_one_consumable_device_consuming_its_parent_s_counters_once() -> None:
    table = table_of(Device("card0-part0", replicas=2, partition=_card("card0", 4)))
    [entry] = devices(build(table, consumable=True, counters=True))
    assert entry["allowMultipleAllocations"] is True
    assert entry["consumesCounters"] == [{"counterSet": "card0", "counters": {"regions": {"value": "1"}}}]


def _numa(node: int) -> Any:
    from devplug.types import Topology

    return Topology(numa_nodes=(node,))
