"""The Allocate path's fast paths of issue 42 give what the slow ones gave.

- :func:`~devplug.engine.records.replaced` is ``dataclasses.replace`` for records;
- :func:`~devplug.engine.records.record_json` writes the text the thawed record's ``json.dumps`` gives;
- an Allocate's intent save does not look for a vanished ledger file (the look just before it did), every other
  save does;
- a change that keeps a record's set of devices (a confirm) leaves the index as a rebuilt one would be;
- the device locks taken without waiting do not look up the records' closure again; taken after a wait, they do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from devplug.engine.devicetable import DeviceTable
from devplug.engine.guard import DeviceGuard
from devplug.engine.ledger import Ledger
from devplug.engine.records import AllocationRecord, _thawed, prepared_summary, record_json, replaced
from devplug.types import ContainerAllocation, Device, DeviceSpec, Mount


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    """A JSON-like value as records hold them: tuples, read-only mappings, and scalars (strings most often)."""
    kind = rng.choice(["str", "str", "int", "float", "bool", "none", "tuple", "map"] if depth < 3 else ["str", "int"])
    if kind == "str":
        return rng.choice(["", "a", "d-1", 'q"uote', "back\\slash", "é", "\x01", "/dev/x"])
    if kind == "int":
        return rng.randint(-5, 5)
    if kind == "float":
        return rng.choice([0.5, 1e9, -2.25])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "none":
        return None
    if kind == "tuple":
        return tuple(_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4)))
    return MappingProxyType({f"k{i}": _random_value(rng, depth + 1) for i in range(rng.randint(0, 4))})


def _random_record(rng: random.Random) -> AllocationRecord:
    devices = tuple(f"d{i}" for i in rng.sample(range(20), rng.randint(0, 4)))
    return AllocationRecord(
        f"r{rng.randint(0, 999)}",
        devices=devices,
        pending=tuple(f"p{i}" for i in range(rng.randint(0, 2))),
        created=rng.choice([0.0, 1.5, 1796566578.25]),
        pod=rng.choice([None, "ns/p"]),
        allocated_at=rng.choice([None, 2.5]),
        releasing=rng.random() < 0.3,
        post_stopped=devices[: rng.randint(0, len(devices))],
        prepared=rng.choice([MappingProxyType({}), _random_value(rng)]),
        claim_uid=rng.choice([None, "uid-1"]),
        pod_uids=rng.choice([(), ("u1", "u2")]),
    )


def test_replaced_is_dataclasses_replace() -> None:
    rng = random.Random(42)
    names = [f.name for f in dataclasses.fields(AllocationRecord)]
    for _ in range(300):
        record, other = _random_record(rng), _random_record(rng)
        changes = {name: getattr(other, name) for name in rng.sample(names, rng.randint(0, len(names)))}
        copy = replaced(record, **changes)
        assert copy == dataclasses.replace(record, **changes)
        assert type(copy) is AllocationRecord and copy is not record
    with pytest.raises(TypeError, match="no field 'nope'"):
        replaced(_random_record(rng), nope=1)
    with pytest.raises(dataclasses.FrozenInstanceError):  # the copy is as frozen as the record
        replaced(_random_record(rng)).devices = ()  # type: ignore[misc]


def test_record_json_is_the_thawed_records_json_byte_for_byte() -> None:
    rng = random.Random(7)
    defaults = AllocationRecord("x")
    for _ in range(500):
        record = _random_record(rng)
        expected: dict[str, Any] = {"id": record.id}
        for field in dataclasses.fields(AllocationRecord)[1:]:
            value = getattr(record, field.name)
            if value != getattr(defaults, field.name):
                expected[field.name] = _thawed(value)
        assert record_json(record) == json.dumps(expected, separators=(",", ":"))
    allocation = ContainerAllocation(
        envs={"MOCK_DEVICES": "d-0001,d-0002"},
        mounts=(Mount(container_path="/m", host_path="/h", read_only=True),),
        devices=(DeviceSpec(container_path="/dev/a", host_path="/dev/a", permissions="rw"),),
        annotations={"a": "b"},
    )
    confirmed = replaced(defaults, devices=("d-0001", "d-0002"), prepared=prepared_summary(allocation))
    assert json.loads(record_json(confirmed))["prepared"] == {
        "envs": {"MOCK_DEVICES": "d-0001,d-0002"},
        "mounts": ["/m"],
        "devices": ["/dev/a"],
        "annotations": {"a": "b"},
        "cdi_devices": [],
    }


def test_the_index_after_any_changes_is_the_one_the_records_give(tmp_path: Path) -> None:
    rng = random.Random(3)
    ledger = Ledger("example.com/x", tmp_path / "ledger.json")
    ledger.load()
    for _ in range(400):
        live = list(ledger.records.values())
        step = rng.choice(["begin", "begin", "confirm", "remove", "drop"] if live else ["begin"])
        if step == "begin":  # new devices, or a later container reusing some (joined to their record)
            ledger.begin([f"d{rng.randint(0, 30)}" for _ in range(rng.randint(1, 4))], now=1.0)
        elif step == "confirm":
            ledger.confirm(rng.choice(live).id, ContainerAllocation(), now=2.0)
        elif step == "remove":
            ledger.remove(rng.choice(live).id)
        else:
            ledger.drop_devices([rng.choice(rng.choice(live).all_devices())])
        rebuilt: dict[str, set[str]] = {}
        for record in ledger.records.values():
            for device in record.all_devices():
                rebuilt.setdefault(device, set()).add(record.id)
        assert ledger._index == rebuilt, step


def _segment_unlinked(ledger: Ledger) -> Path:
    """Save one record (the segment opened), then unlink the segment under the ledger."""
    ledger.begin(["a"], now=1.0)
    asyncio.run(ledger.save())
    segment = ledger.file._segment.path
    segment.unlink()
    return segment


def test_a_save_told_not_to_look_leaves_a_vanished_segment_to_the_next_look(tmp_path: Path) -> None:
    ledger = Ledger("example.com/x", tmp_path / "ledger.json")
    ledger.load()
    segment = _segment_unlinked(ledger)
    ledger.begin(["b"], now=2.0)
    asyncio.run(ledger.save(look=False))  # an Allocate's intent: check_room() looked just before
    assert ledger.file.vanished is None
    ledger.confirm(ledger.holders("b")[0].id, ContainerAllocation(), now=3.0)

    async def confirm_saved() -> None:
        await ledger.save()  # the confirm's save looks, before the answer
        await asyncio.sleep(0.05)  # the write-back it starts

    asyncio.run(confirm_saved())
    assert ledger.file.vanished is not None and str(segment) in ledger.file.vanished


def _guard(ledger: Ledger) -> DeviceGuard:
    table = DeviceTable()
    table.replace(Device(id=f"d{i}") for i in range(4))
    return DeviceGuard("example.com/x", table, ledger, None, on_change=lambda: None, on_freed=lambda: None)  # type: ignore[arg-type]


def test_locks_taken_at_once_look_up_the_closure_once_and_after_a_wait_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger("example.com/x", tmp_path / "ledger.json")
    ledger.load()
    guard = _guard(ledger)
    looked: list[set[str]] = []
    closure = guard.closure

    def counted(ids: Any) -> set[str]:
        looked.append(set(ids))
        return closure(ids)

    monkeypatch.setattr(guard, "closure", counted)

    async def scenario() -> tuple[bool, list[set[str]], bool, list[set[str]]]:
        async with guard.hold(["d0"], "allocate") as waited_first:
            pass
        at_once = list(looked)
        looked.clear()
        first = guard.hold(["d1"], "allocate")
        await first.__aenter__()

        async def second() -> bool:
            async with guard.hold(["d2"], "allocate") as waited:
                return waited

        record = ledger.begin(["d1", "d2"], now=1.0)  # d2's record grows to d1, held by the first
        waiting = asyncio.ensure_future(second())
        await asyncio.sleep(0)
        await first.__aexit__(None, None, None)
        waited_second = await waiting
        assert record.id in ledger.records
        return waited_first, at_once, waited_second, list(looked)

    waited_first, at_once, waited_second, after = asyncio.run(scenario())
    assert not waited_first and at_once == [{"d0"}]  # one look: nothing ran while the locks were taken
    # the first hold (d1) looked once; the second (d2, whose record holds d1 too) waited for d1, then looked again
    assert waited_second and after == [{"d1"}, {"d2"}, {"d1", "d2"}]
