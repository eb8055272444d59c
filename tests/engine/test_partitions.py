"""Partitions (contract 1.1, KEP-4815): the pure module's sums, and the device table and guard that act on them.

A card of 4 regions offered whole (``card0`` consumes 4) and by region (4 parts consuming 1 each), as the brief of
issue 41 and :class:`~devplug.types.Partition`'s docstring describe it (the whole card is a device of its own ID,
``card0``, whose parent is named ``fpga0``: a device cannot be a part of itself).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from devplug.engine.devicetable import DeviceTable
from devplug.engine.guard import DeviceGuard
from devplug.engine.ledger import Ledger
from devplug.engine.partitions import (
    PartitionBusy,
    PartitionConflictError,
    PartitionMap,
    PartitionOverflow,
    partitions_of,
)
from devplug.errors import DeviceBusyError, RequestError
from devplug.types import Device, Partition

CARD = {"regions": 4}
PARENT = "fpga0"


def _card(parent: str = PARENT, counters: dict[str, int] | None = None, replicas: int | None = None) -> list[Device]:
    have = counters or CARD
    return [
        Device("card0", partition=Partition(parent, have, {"regions": 4})),
        *(
            Device(f"card0-r{i}", partition=Partition(parent, have, {"regions": 1}), replicas=replicas)
            for i in range(4)
        ),
    ]


def _map(devices: list[Device]) -> PartitionMap:
    return PartitionMap(partitions_of(devices))


# --- the pure module


def test_nothing_held_nothing_blocked_and_use_is_empty() -> None:
    parts = _map(_card())
    assert parts.blocked(set()) == set()
    assert parts.in_use(set()) == {}
    parts.check(["card0"], set())  # the whole card alone fits
    parts.check(["card0-r0", "card0-r1", "card0-r2", "card0-r3"], set())  # so do the four regions


def test_a_held_region_blocks_the_whole_card_only() -> None:
    parts = _map(_card())
    assert parts.in_use({"card0-r1"}) == {PARENT: {"regions": 1}}
    assert parts.blocked({"card0-r1"}) == {"card0"}


def test_the_whole_card_held_blocks_every_region() -> None:
    assert _map(_card()).blocked({"card0"}) == {f"card0-r{i}" for i in range(4)}


def test_the_card_and_a_region_together_are_refused_naming_parent_counter_and_amounts() -> None:
    with pytest.raises(PartitionOverflow) as caught:
        _map(_card()).check(["card0", "card0-r2"], set(), "example.com/fpga")
    message = str(caught.value)
    assert isinstance(caught.value, RequestError)
    for word in ("example.com/fpga", "card0", "card0-r2", "'regions'", "'fpga0'", "5", "has 4", "nothing was"):
        assert word in message, message


def test_a_part_refused_for_what_is_held_names_the_holders() -> None:
    with pytest.raises(PartitionBusy) as caught:
        _map(_card()).check(["card0"], {"card0-r3"})
    message = str(caught.value)
    assert isinstance(caught.value, DeviceBusyError)
    assert "card0-r3" in message and "1 of it is in use" in message and "5 > 4" in message, message


def test_a_part_held_and_requested_again_counts_once() -> None:
    parts = _map(_card())
    parts.check(["card0"], {"card0"})  # the same tenancy's next container: one card, consumed once
    parts.check(["card0-r0", "card0-r1"], {"card0-r0", "card0-r2", "card0-r3"})  # 4 regions in all


def test_other_parents_and_plain_devices_do_not_count() -> None:
    other = [Device(f"card1-r{i}", partition=Partition("fpga1", CARD, {"regions": 1})) for i in range(4)]
    parts = PartitionMap(partitions_of([*_card(), *other, Device("plain")]))
    assert parts.blocked({f"card1-r{i}" for i in range(4)} | {"plain"}) == set()
    parts.check(["card0", "plain"], {f"card1-r{i}" for i in range(4)})


def test_several_counters_each_checked() -> None:
    have = {"regions": 4, "memory": 8}
    devices = [
        Device("big", partition=Partition("c", have, {"regions": 1, "memory": 6})),
        Device("small", partition=Partition("c", have, {"regions": 1, "memory": 2})),
        Device("mid", partition=Partition("c", have, {"regions": 1, "memory": 4})),
    ]
    parts = _map(devices)
    assert parts.blocked({"big"}) == {"mid"}  # 6 + 4 > 8 memory; 6 + 2 fits
    with pytest.raises(PartitionOverflow, match="'memory'"):
        parts.check(["big", "mid"], set())


def test_disagreeing_counters_name_both_devices_and_withhold_the_parent() -> None:
    devices = [
        Device("a", partition=Partition("p", {"regions": 4}, {"regions": 1})),
        Device("b", partition=Partition("p", {"regions": 2}, {"regions": 1})),
        Device("c", partition=Partition("q", {"regions": 2}, {"regions": 1})),
    ]
    parts = _map(devices)
    assert set(parts.conflicts) == {"p"}
    why = parts.conflicts["p"]
    assert "'a'" in why and "'b'" in why and "{regions: 4}" in why and "{regions: 2}" in why, why
    assert parts.blocked(set()) == {"a", "b"}  # neither picked; q's part is fine
    with pytest.raises(PartitionConflictError, match="'a' says"):
        parts.raise_conflicts()
    with pytest.raises(PartitionBusy, match="declare different counters"):
        parts.check(["a"], set())
    parts.check(["c"], set())


def test_a_held_part_no_longer_listed_still_consumes() -> None:
    card = _card()
    parts = PartitionMap(partitions_of(card[1:]), gone=partitions_of(card[:1]))  # the whole card gone from the list
    assert parts.blocked({"card0"}) == {f"card0-r{i}" for i in range(4)}
    assert parts.blocked(set()) == set()


def test_usage_for_the_status() -> None:
    (usage,) = _map(_card()).usage({"card0-r0", "card0-r1"})
    assert usage.parent == PARENT
    assert dict(usage.counters) == CARD and dict(usage.in_use) == {"regions": 2}
    assert usage.held == ("card0-r0", "card0-r1") and usage.blocked == ("card0",) and usage.conflict is None


# --- the table and the guard


class _Runner:
    timeout = 10.0


def _guard(tmp_path: Path, table: DeviceTable) -> tuple[DeviceGuard, Ledger, list[str]]:
    ledger = Ledger("example.com/fpga", tmp_path / "ledger.json")
    ledger.load()
    changes: list[str] = []
    guard = DeviceGuard(
        "example.com/fpga",
        table,
        ledger,
        _Runner(),  # type: ignore[arg-type]
        on_change=lambda: changes.append("change"),
        on_freed=lambda: None,
    )
    return guard, ledger, changes


def test_a_table_without_partitions_has_no_map(tmp_path: Path) -> None:
    table = DeviceTable()
    table.replace([Device("a"), Device("b")])
    table.update([Device("c")], ["a"])
    assert table.partitions is None


def test_the_guard_withholds_what_cannot_fit_and_gives_it_back(tmp_path: Path) -> None:
    table = DeviceTable()
    table.replace(_card())
    guard, ledger, _ = _guard(tmp_path, table)
    guard.sync_withheld()
    assert table.withheld == frozenset()
    record = ledger.begin(["card0-r2"], 1.0)
    guard.sync_withheld()
    assert table.withheld == {"card0"}
    assert table.partition_blocked == {"card0"}  # withheld for the counters alone (DRA lets the scheduler count)
    assert table.advertised("card0").healthy is False  # type: ignore[union-attr]
    ledger.begin_release(record.id)  # being cleaned: still occupies the card
    guard.sync_withheld()
    assert table.withheld == {"card0", "card0-r2"} and table.partition_blocked == {"card0"}
    ledger.remove(record.id)
    guard.sync_withheld()
    assert table.withheld == frozenset() and table.partition_blocked == frozenset()


def test_quarantined_and_shared_parts_count_once_per_physical_device(tmp_path: Path) -> None:
    table = DeviceTable()
    table.replace(_card(replicas=2))  # each region shared by two containers
    guard, ledger, _ = _guard(tmp_path, table)
    ledger.begin(["card0-r0::0"], 1.0)
    ledger.begin(["card0-r0::1"], 1.0)
    guard.sync_withheld()
    assert table.withheld == {"card0"}  # region 0 is held twice, consumes 1: the other regions' replicas are free
    assert guard.parts.held() == {"card0-r0"}
    guard.parts.check(["card0-r1::0", "card0-r2::1", "card0-r3::0"])
    with pytest.raises(PartitionBusy, match="card0-r0"):
        guard.parts.check(["card0"])


def test_a_table_change_resyncs_and_disagreement_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    guards: list[DeviceGuard] = []

    def resync() -> None:  # as the resource has the lifecycle do, once there is one
        for guard in guards:
            guard.sync_withheld()

    table = DeviceTable(on_partitions=resync)
    table.replace(_card())
    guard, ledger, _ = _guard(tmp_path, table)
    guards.append(guard)
    ledger.begin(["card0"], 1.0)
    guard.sync_withheld()
    assert table.withheld == {f"card0-r{i}" for i in range(4)}
    table.update([Device("card0-r4", partition=Partition(PARENT, CARD, {"regions": 1}))])  # a hot-plugged part
    assert "card0-r4" in table.withheld  # resynced by the table's change, not by the test
    caplog.set_level(logging.ERROR, "devplug.engine")
    wrong = Device("card0-r5", partition=Partition(PARENT, {"regions": 8}, {"regions": 1}))
    table.update([wrong])
    table.update([Device("unrelated")])
    errors = [r.getMessage() for r in caplog.records if "declare different counters" in r.getMessage()]
    assert len(errors) == 1 and "'card0'" in errors[0] and "'card0-r5'" in errors[0], errors
    assert "example.com/fpga" in errors[0]
    assert {"card0-r4", "card0-r5"} <= table.withheld
    table.update(removed=["card0-r5"])  # the driver agrees with itself again
    assert table.partitions is not None and not table.partitions.conflicts
    assert "card0-r5" not in table.withheld


def test_the_settling_check_ignores_the_records_an_admission_may_release(tmp_path: Path) -> None:
    three = Device("card0-3", partition=Partition(PARENT, CARD, {"regions": 3}))
    table = DeviceTable()
    table.replace([*_card(), three])
    guard, ledger, _ = _guard(tmp_path, table)
    ledger.begin(["card0-r0", "card0-r1"], 1.0)  # an earlier tenancy the kubelet hands on
    guard.parts.check(["card0-r0", "card0-3"], settling=True)  # its card0-r1 may be released first: 1 + 3
    with pytest.raises(PartitionBusy, match="card0-r1"):
        guard.parts.check(["card0-r0", "card0-3"])  # exact (reused, or settled later): card0-r1 still held
    with pytest.raises(PartitionOverflow):
        guard.parts.check(["card0-r0", "card0"], settling=True)  # a region and the card alone: never


def test_an_over_consumed_counter_leaves_no_part_of_its_parent_allocatable() -> None:
    """The driver lowered what the parent has while parts were held: as ``checkAvailableCounters`` compares every
    counter of the set, a part consuming nothing of the over-consumed counter does not fit either."""
    have = {"regions": 4, "memory": 8}
    devices = [
        Device("big", partition=Partition("c", have, {"memory": 6})),
        Device("mid", partition=Partition("c", have, {"memory": 4})),
        Device("port", partition=Partition("c", have, {"regions": 1})),
    ]
    parts = _map(devices)
    assert parts.blocked({"big", "mid"}) == {"port"}
    with pytest.raises(PartitionBusy, match="'memory'"):
        parts.check(["port"], {"big", "mid"})


def test_fits_counts_chosen_and_held_parts_once() -> None:
    parts = _map(_card())
    assert parts.fits("card0", set(), set())
    assert not parts.fits("card0", {"card0-r0"}, set())
    assert not parts.fits("card0", set(), {"card0-r3"})
    assert parts.fits("card0-r0", {"card0-r0"}, set())  # chosen already: consumes once
    assert parts.fits("plain", {"card0"}, set())  # no part


def test_a_preferred_allocation_keeps_parts_that_fit_together(tmp_path: Path) -> None:
    table = DeviceTable()
    table.replace([*_card(), Device("plain")])
    guard, ledger, _ = _guard(tmp_path, table)
    card = ["card0", "card0-r0", "card0-r1", "card0-r2", "card0-r3"]
    available = [*card, "plain"]
    # The driver's (or the core's) first two: the card and a region, which never fit together.
    assert guard.parts.fitting(["card0", "card0-r0"], card, [], 2) == ["card0-r0", "card0-r1"]
    assert guard.parts.fitting(["card0", "card0-r0"], available, [], 2) == [
        "card0",
        "plain",
    ]  # the choice's first, kept
    assert guard.parts.fitting(["card0"], available, [], 1) == ["card0"]
    ledger.begin(["card0-r3"], 1.0)
    assert guard.parts.fitting(["card0"], ["card0", "card0-r0"], [], 1) == ["card0-r0"]
    assert guard.parts.fitting(["card0-r0"], available, ["card0-r1"], 2) == ["card0-r1", "card0-r0"]
