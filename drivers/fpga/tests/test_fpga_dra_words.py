"""devplug-fpga's contract 1.1 options (issue 41), on the DFL model behind the core's facade: ``partitions`` (a
region is a part of its card, the whole card consumes every region) and ``device_status`` (the AFU IDs the
regions hold, and a ``Programmed`` condition), each off by default."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devplug import ConfigError
from devplug.config import parse_config
from devplug.drivers import DriverHooks
from devplug.testing.dflsysfs import DflModel, model_image
from devplug.testing.harness import make_harness
from devplug.types import DeviceCondition, DeviceStatus, Partition
from devplug_fpga import FpgaDriver
from devplug_fpga.devices import Card, Region, Target, partition

CARD = "0000:3b:00.0"
R0, R1, R2 = (f"{CARD}-region{i}" for i in range(3))
BLANK_AFU = "0b1a4c0000000000000000000000b1a4"
DEFAULT_AFU = "d5fa0100000000000000000000000d5f"


def config(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    machine = tmp_path / "machine"
    if not (machine / "sys").exists():
        DflModel(machine).add_card(CARD, ports=3, afu_id=BLANK_AFU)
    options = {
        "backend": "dfl",
        "model_root": str(machine),
        "blank_image": str(model_image(tmp_path / "blank.gbs", BLANK_AFU)),
        "blank_afu_id": BLANK_AFU,
        **extra,
    }
    return {"resources": {"example.com/fpga": {"driver": "fpga", "options": options}}}


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    running: list[DriverHooks] = []

    def started(**extra: Any) -> DriverHooks:
        [resource] = parse_config(config(tmp_path, **extra)).resources
        (tmp_path / "state").mkdir(exist_ok=True)
        hooks = make_harness(FpgaDriver(resource.options), "example.com/fpga", tmp_path / "state").start().hooks
        running.append(hooks)
        return hooks

    yield started
    for hooks in running:
        hooks.stop()


def test_by_default_no_partition_and_no_status(start: Any) -> None:
    hooks = start(mode="both")
    assert all(d.partition is None for d in hooks.list_devices())
    assert not hooks.allocate([R1]).device_status


def test_regions_are_parts_of_their_card(start: Any) -> None:
    hooks = start(partitions=True)
    card = {"regions": 3}
    assert {d.id: d.partition for d in hooks.list_devices()} == {
        r: Partition(f"{CARD}-card", card, {"regions": 1}) for r in (R0, R1, R2)
    }


def test_the_whole_card_consumes_every_region(start: Any) -> None:
    hooks = start(mode="both", partitions=True)
    parts = {d.id: d.partition for d in hooks.list_devices()}
    assert parts[CARD] == Partition(f"{CARD}-card", {"regions": 3}, {"regions": 3})
    assert parts[R2] == Partition(f"{CARD}-card", {"regions": 3}, {"regions": 1})


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"partitions": True, "mode": "whole"}, "partitions: mode = 'whole' offers each card as one device"),
        ({"partitions": "yes"}, "partitions: expected true or false"),
        ({"device_status": 1}, "device_status: expected true or false"),
    ],
)
def test_bad_options_are_named(tmp_path: Path, extra: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(config(tmp_path, **extra), source="devplug.toml")
    message = str(info.value)
    assert message.startswith('devplug.toml: resources."example.com/fpga".options')
    assert fragment in message


def port(tmp_path: Path, index: int) -> str:
    """The DFL port (``dfl-port.N``) of region ``index`` of the model's card."""
    return DflModel(tmp_path / "machine").card(CARD).ports[index]


def test_a_region_shows_the_blank_image_it_holds(tmp_path: Path, start: Any) -> None:
    hooks = start(device_status=True)
    assert dict(hooks.allocate([R1]).device_status) == {
        R1: DeviceStatus(
            conditions=(DeviceCondition("Programmed", "False", "Blank", "a region holds the blank image"),),
            data={"region": port(tmp_path, 1), "card": CARD, "afuId": BLANK_AFU},
        )
    }


def test_the_default_image_loaded_by_allocate_is_shown(tmp_path: Path, start: Any) -> None:
    default = model_image(tmp_path / "default.gbs", DEFAULT_AFU)
    hooks = start(mode="both", device_status=True, default_image=str(default), default_afu_id=DEFAULT_AFU)
    status = hooks.allocate([CARD]).device_status[CARD]
    assert status.conditions == (DeviceCondition("Programmed", "True", "DefaultImage", "the default image is loaded"),)
    assert status.data is not None
    assert status.data["card"] == CARD
    assert [r["afuId"] for r in status.data["regions"]] == [DEFAULT_AFU] * 3
    assert [r["region"] for r in status.data["regions"]] == [port(tmp_path, i) for i in range(3)]


def test_a_vanished_region_is_counted_against_the_card_as_found_now() -> None:
    old = Card(CARD, (Region(CARD, 0), Region(CARD, 1), Region(CARD, 2)))
    now = Card(CARD, (Region(CARD, 0), Region(CARD, 1)))  # port 2 went away; its device stays listed
    gone = Target(R2, old, (old.regions[2],), False)
    assert partition(gone, now) == Partition(f"{CARD}-card", {"regions": 2}, {"regions": 1})
    assert partition(Target(CARD, old, old.regions, True), now) is None  # more than the card has now
    assert partition(Target(CARD, Card(CARD, ()), (), True)) is None  # no regions: no counter
