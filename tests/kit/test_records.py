"""devplug.kit.records: a driver's records, typed, in one JSON file replaced atomically on every change."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from devplug import DriverError
from devplug.kit import RecordStore


@dataclass(frozen=True)
class Move:
    original_driver: str | None
    group: int
    phase: Literal["binding", "bound", "restoring"]
    allocated: bool = False


def _state(**devices: dict[str, object]) -> str:
    return json.dumps({"version": 1, "devices": devices})


def _store(tmp_path: Path) -> RecordStore:
    return RecordStore(tmp_path / "state.json", what="the test driver's state", recover="remove it by hand")


def test_a_change_is_on_disk_when_it_returns_and_read_back_typed(tmp_path: Path) -> None:
    moves = _store(tmp_path).table("devices", Move)
    assert dict(moves) == {}
    assert not (tmp_path / "state.json").exists()  # nothing written until something changes
    moves.put("0000:00:04.0", Move("e1000e", 4, "binding", allocated=True))
    on_disk = json.loads((tmp_path / "state.json").read_text())
    assert on_disk == {
        "version": 1,
        "devices": {"0000:00:04.0": {"original_driver": "e1000e", "group": 4, "phase": "binding", "allocated": True}},
    }
    assert moves.replace("0000:00:04.0", phase="bound") == Move("e1000e", 4, "bound", True)
    again = _store(tmp_path).table("devices", Move)
    assert dict(again) == {"0000:00:04.0": Move("e1000e", 4, "bound", True)}
    again.drop("0000:00:04.0", "not-there")
    assert dict(_store(tmp_path).table("devices", Move)) == {}
    assert oct(os.stat(tmp_path / "state.json").st_mode & 0o777) == "0o600"


def test_update_applies_several_changes_in_one_write(tmp_path: Path) -> None:
    moves = _store(tmp_path).table("devices", Move)
    moves.update({"a": Move(None, 1, "bound"), "b": Move(None, 1, "bound")})
    before = os.stat(tmp_path / "state.json").st_ino
    moves.update({"a": None, "b": Move(None, 1, "restoring"), "c": Move("x", 2, "binding")})
    assert os.stat(tmp_path / "state.json").st_ino != before  # replaced, not edited in place
    assert dict(_store(tmp_path).table("devices", Move)) == {
        "b": Move(None, 1, "restoring"),
        "c": Move("x", 2, "binding"),
    }


def test_a_snapshot_is_not_changed_by_later_changes(tmp_path: Path) -> None:
    moves = _store(tmp_path).table("devices", Move)
    moves.put("a", Move(None, 1, "bound"))
    seen = moves.snapshot()
    moves.drop("a")
    assert dict(seen) == {"a": Move(None, 1, "bound")}
    with pytest.raises(TypeError):
        seen["b"] = Move(None, 1, "bound")  # type: ignore[index]


def test_tables_of_plain_values_and_tables_not_read_are_kept(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text(
        json.dumps({"version": 1, "devices": {}, "power": {"card0": "127000000"}, "future": {"x": [1, 2]}})
    )
    store = _store(tmp_path)
    power = store.table("power", str)
    assert dict(power) == {"card0": "127000000"}
    store.table("devices", Move).put("d", Move(None, 0, "bound"))
    power.drop("card0")
    data = json.loads((tmp_path / "state.json").read_text())
    assert data == {"version": 1, "devices": {"d": {"original_driver": None, "group": 0, "phase": "bound",
                    "allocated": False}}, "power": {}, "future": {"x": [1, 2]}}  # fmt: skip


def test_a_field_with_a_default_may_be_missing_from_the_file(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text(json.dumps({"version": 1, "devices": {"a": {"original_driver": None,
                                         "group": 3, "phase": "bound"}}}))  # fmt: skip
    assert _store(tmp_path).table("devices", Move)["a"] == Move(None, 3, "bound", False)


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ("{not json", "not JSON"),
        ("[1]", "expected a JSON object"),
        (json.dumps({"version": 2, "devices": {}}), "unknown version 2, expected 1"),
        (json.dumps({"version": 1, "devices": []}), "table 'devices' is not a JSON object"),
        (_state(d0={"group": 1, "phase": "bound"}), "original_driver"),
        (
            json.dumps({"version": 1, "devices": {"d0": {"original_driver": None, "group": 1, "phase": "gone"}}}),
            "phase",
        ),
        (
            json.dumps(
                {"version": 1, "devices": {"d0": {"original_driver": None, "group": 1, "phase": "bound", "x": 1}}}
            ),
            "x: unknown key",
        ),
        (json.dumps({"version": 1, "devices": {"d0": "bound"}}), "expected a JSON object"),
    ],
)
def test_a_file_it_cannot_read_is_refused_naming_the_file_the_key_and_how_to_recover(
    tmp_path: Path, content: str, named: str
) -> None:
    (tmp_path / "state.json").write_text(content)
    with pytest.raises(DriverError) as caught:
        _store(tmp_path).table("devices", Move)
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'state.json'}: cannot read the test driver's state (")
    assert named in message
    assert message.endswith(": remove it by hand")
    if "d0" in content:
        assert "devices['d0']" in message


def test_a_plain_value_of_the_wrong_type_names_its_key(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text(json.dumps({"version": 1, "power": {"card0": 5}}))
    with pytest.raises(DriverError, match=r"power\['card0'\]: expected a string, got int 5"):
        _store(tmp_path).table("power", str)


def test_a_write_that_fails_changes_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "gone"
    folder.mkdir()
    moves = RecordStore(folder / "state.json", what="the test driver's state").table("devices", Move)
    moves.put("a", Move(None, 1, "bound"))
    (folder / "state.json").unlink()
    folder.rmdir()  # the state folder vanished under the driver
    with pytest.raises(DriverError, match=r"gone/state.json: cannot write the test driver's state"):
        moves.put("b", Move(None, 2, "bound"))
    assert dict(moves) == {"a": Move(None, 1, "bound")}


def test_records_of_another_type_are_refused(tmp_path: Path) -> None:
    moves = _store(tmp_path).table("devices", Move)
    with pytest.raises(TypeError, match="must be a Move"):
        moves.put("a", {"phase": "bound"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="holds Move records"):
        moves._store.table("devices", str)


def test_concurrent_changes_of_different_keys_all_land(tmp_path: Path) -> None:
    moves = _store(tmp_path).table("devices", Move)

    def work(i: int) -> None:
        for j in range(20):
            moves.put(f"d{i}-{j}", Move(None, i, "bound"))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(_store(tmp_path).table("devices", Move)) == 80
