"""The allocation ledger's bookkeeping: reuse merges, rollback, KEP drops, and its file."""

from __future__ import annotations

import json
from pathlib import Path

from devplug.engine.ledger import FORMAT_VERSION, Ledger
from devplug.types import ContainerAllocation


def _ledger(tmp_path: Path) -> Ledger:
    return Ledger("example.com/x", tmp_path / "ledger.json")


def test_reuse_by_a_later_container_joins_the_allocation(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    init = ledger.begin(["a"], now=1.0)
    ledger.confirm(init, ContainerAllocation())
    app = ledger.begin(["a", "b"], now=2.0)
    assert app is init
    assert (app.devices, app.pending) == (["a"], ["b"])
    ledger.confirm(app, ContainerAllocation(envs={"X": "1"}))
    assert [r.devices for r in ledger] == [["a", "b"]]
    assert app.prepared["envs"] == {"X": "1"}


def test_rollback_restores_what_begin_changed_and_leaves_other_allocations(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    held = ledger.begin(["a"], now=1.0)
    ledger.confirm(held, ContainerAllocation())
    snapshot = ledger.snapshot(["a", "c", "d"])
    joined = ledger.begin(["a", "c"], now=2.0)
    fresh = ledger.begin(["d"], now=2.0)
    other = ledger.begin(["z"], now=2.0)  # another Allocate in flight meanwhile
    ledger.restore(snapshot, {joined.id, fresh.id})
    assert {r.id: (r.devices, r.pending) for r in ledger} == {held.id: (["a"], []), other.id: ([], ["z"])}


def test_kep_deallocate_drops_devices_and_empties_records(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    record = ledger.begin(["a", "b"], now=1.0)
    ledger.confirm(record, ContainerAllocation())
    assert ledger.drop_devices(["a"]) == []
    assert ledger.drop_devices(["b"]) == [record]
    assert list(ledger) == []


def test_post_stop_is_tracked_per_device(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    record = ledger.begin(["a", "b"], now=1.0)
    ledger.confirm(record, ContainerAllocation())
    record.mark_post_stopped(["a"])
    assert not record.post_stop_done
    record.mark_post_stopped(["b", "a"])
    assert record.post_stop_done
    assert record.post_stopped == ["a", "b"]


def test_file_round_trip_and_format(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    record = ledger.begin(["a"], now=1.0)
    ledger.confirm(record, ContainerAllocation())
    ledger.path.write_bytes(ledger.serialize())
    data = json.loads(ledger.path.read_bytes())
    assert data["format"] == FORMAT_VERSION
    assert data["resource"] == "example.com/x"
    again = _ledger(tmp_path)
    again.load()
    assert [(r.id, r.devices) for r in again] == [(record.id, ["a"])]
    assert again.recovered_from_corruption is None


def test_a_ledger_of_another_resource_is_set_aside(tmp_path: Path) -> None:
    other = Ledger("example.com/other", tmp_path / "ledger.json")
    other.begin(["a"], now=1.0)
    other.path.write_bytes(other.serialize())
    ledger = _ledger(tmp_path)
    ledger.load()
    assert list(ledger) == []
    assert ledger.recovered_from_corruption is not None
    assert ledger.recovered_from_corruption.name.startswith("ledger.json.corrupt-")
    assert not ledger.path.exists()
