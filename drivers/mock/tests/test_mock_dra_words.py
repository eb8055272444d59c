"""The mock's options for contract 1.1 (issue 41): ``partitions``, ``share_capacity``, ``device_status``.

Through the config as the daemon reads it (bad input named by key) and the started driver behind the core's
facade (the devices listed with their partition and share capacity; allocate's statuses and their record).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devplug import Claim, ConfigError, ContainerAllocation
from devplug.config import parse_config
from devplug.drivers import DriverHooks
from devplug.testing.harness import make_harness
from devplug.types import DeviceCondition, DeviceStatus, NetworkData, Partition, ShareCapacity
from devplug_mock import MockDriver, MockOptions, read_calls
from devplug_mock.features import invalid_status, mock_network_data

CARD = {"parent": "card0", "counters": {"regions": 4}, "whole": "card0-whole", "parts": 4}


def config(options: dict[str, Any]) -> dict[str, Any]:
    return {"resources": {"example.com/mock": {"driver": "mock", "options": {"directory": "/d", **options}}}}


def started(tmp_path: Path, **options: Any) -> tuple[Path, DriverHooks]:
    directory = tmp_path / "devices"
    [resource] = parse_config(config({**options, "directory": str(directory)})).resources
    harness = make_harness(MockDriver(resource.options), "example.com/mock", tmp_path / "state").start()
    return directory, harness.hooks


@pytest.fixture
def card(tmp_path: Path) -> Iterator[tuple[Path, DriverHooks]]:
    directory, hooks = started(tmp_path, count=1, partitions=[CARD])
    yield directory, hooks
    hooks.stop()


# --- the options, as the config gives them


def test_without_the_new_options_nothing_changes(tmp_path: Path) -> None:
    directory, hooks = started(tmp_path, count=2)
    try:
        assert all(d.partition is None and d.share_capacity is None for d in hooks.list_devices())
        answer = hooks.allocate(["mock0"])
        assert answer == ContainerAllocation(envs={"MOCK_DEVICES": "mock0"})
        assert not answer.device_status
        assert "device_status" not in read_calls(directory)[-1]
    finally:
        hooks.stop()


def test_the_options_from_the_config() -> None:
    [resource] = parse_config(
        config(
            {
                "partitions": [
                    CARD,
                    {"parent": "nic0", "counters": {"bandwidth": 100}, "devices": {"vf0": {"bandwidth": 25}}},
                ],
                "share_capacity": {"name": "memory", "per_replica": 4294967296},
                "device_status": "network",
            }
        )
    ).resources
    options = resource.options
    card = {"regions": 4}
    assert dict(options.parts) == {
        "card0-whole": Partition("card0", card, {"regions": 4}),
        **{f"card0-part{i}": Partition("card0", card, {"regions": 1}) for i in range(4)},
        "vf0": Partition("nic0", {"bandwidth": 100}, {"bandwidth": 25}),
    }
    assert options.capacity == ShareCapacity("memory", 4294967296)
    assert options.device_status == "network"
    assert MockOptions(directory=Path("/d")).parts == {}


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"partitions": [{"counters": {"regions": 4}, "parts": 4}]}, "partitions[0].parent: missing required key"),
        ({"partitions": [{"parent": "card0", "parts": 4}]}, "partitions[0].counters: missing required key"),
        ({"partitions": [{**CARD, "prats": 2}]}, "partitions[0].prats: unknown key; did you mean 'parts'"),
        ({"partitions": [{**CARD, "parts": 3}]}, "partitions[0].parts: 3 parts cannot share counter 'regions'"),
        ({"partitions": [{**CARD, "parts": 0}]}, "partitions[0].parts: expected an integer from 1 to 1024"),
        ({"partitions": [{**CARD, "whole": "card0"}]}, "partitions[0].whole: 'card0' is the parent itself"),
        (
            {"partitions": [{**CARD, "counters": {"regions": 0}}]},
            "partitions[0].counters.regions: expected an integer >= 1",
        ),
        ({"partitions": [{**CARD, "counters": {"Regions": 4}, "parts": 1}]}, "must be a DNS label"),
        ({"partitions": [{"parent": "card0", "counters": {"regions": 4}}]}, "partitions[0]: names no device"),
        (
            {"partitions": [{"parent": "card0", "counters": {"regions": 4}, "devices": {"r0": {"slots": 1}}}]},
            "partitions[0] (device 'r0')",
        ),
        (
            {"partitions": [{"parent": "card0", "counters": {"regions": 4}, "devices": {"r0": {"regions": 5}}}]},
            "more than the parent has",
        ),
        (
            {"partitions": [CARD, {**CARD, "parent": "card1"}]},
            "partitions[1]: device 'card0-whole' is named by an earlier",
        ),
        ({"partitions": [CARD, {**CARD, "whole": "x"}]}, "partitions[1].parent: 'card0' is named by an earlier entry"),
        ({"partitions": ["card0"]}, "partitions[0]: expected a table"),
        ({"share_capacity": {"name": "memory", "per_replica": 0}}, "share_capacity: ShareCapacity.per_replica"),
        ({"share_capacity": {"name": "mem ory"}}, "share_capacity: ShareCapacity.name must be a C identifier"),
        ({"share_capacity": {"nmae": "memory"}}, "share_capacity.nmae: unknown key; did you mean 'name'"),
        ({"device_status": "yes"}, "device_status: expected one of 'ready', 'network', 'invalid'"),
    ],
)
def test_bad_options_are_named(options: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(config(options), source="devplug.toml")
    message = str(info.value)
    assert message.startswith('devplug.toml: resources."example.com/mock".options')
    assert fragment in message


# --- partitions and share capacity on the listed devices


def test_partition_files_are_made_and_the_devices_carry_their_partition(card: tuple[Path, DriverHooks]) -> None:
    directory, hooks = card
    devices = {d.id: d for d in hooks.list_devices()}
    assert sorted(devices) == sorted(["mock0", "card0-whole", *(f"card0-part{i}" for i in range(4))])
    assert all((directory / i).is_file() for i in devices)
    assert devices["mock0"].partition is None
    assert devices["card0-whole"].partition == Partition("card0", {"regions": 4}, {"regions": 4})
    assert devices["card0-part2"].partition == Partition("card0", {"regions": 4}, {"regions": 1})
    assert devices["card0-part2"].allocation is not None  # still described as every mock device is


def test_a_removed_part_is_not_listed(card: tuple[Path, DriverHooks]) -> None:
    directory, hooks = card
    (directory / "card0-part3").unlink()
    assert "card0-part3" not in {d.id for d in hooks.list_devices()}


def test_share_capacity_on_every_device(tmp_path: Path) -> None:
    directory, hooks = started(tmp_path, count=2, share_capacity={"name": "memory", "per_replica": 1024})
    try:
        (directory / "mock1").write_text("replicas=4\n")
        devices = {d.id: d for d in hooks.list_devices()}
        assert devices["mock1"].replicas == 4
        assert all(d.share_capacity == ShareCapacity("memory", 1024) for d in devices.values())
    finally:
        hooks.stop()


# --- device status


def test_ready_statuses_through_the_device_plugin_api(tmp_path: Path) -> None:
    directory, hooks = started(tmp_path, count=2, device_status="ready")
    try:
        answer = hooks.allocate(["mock0", "mock1"])
    finally:
        hooks.stop()
    assert dict(answer.device_status) == {
        i: DeviceStatus(
            conditions=(DeviceCondition("Ready", "True", "Prepared", f"mock device {i} prepared"),),
            data={"mockDevice": i, "tenant": "device-plugin"},
        )
        for i in ("mock0", "mock1")
    }
    [record] = [c for c in read_calls(directory) if c["hook"] == "allocate"]
    assert record["device_status"]["mock1"] == {
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "Prepared", "message": "mock device mock1 prepared"}
        ],
        "data": {"mockDevice": "mock1", "tenant": "device-plugin"},
    }


def test_network_statuses_for_a_claim(tmp_path: Path) -> None:
    directory, hooks = started(tmp_path, count=2, device_status="network")
    claim = Claim("team-a", "gpu-claim", "0b7c2a4e-3f9d-4c8e-9a51-6d2f0e8b1c3a", {"req": ("mock1",)})
    try:
        answer = hooks.allocate(["mock1"], claim=claim)
    finally:
        hooks.stop()
    status = answer.device_status["mock1"]
    assert status.data == {"mockDevice": "mock1", "tenant": "team-a/gpu-claim"}
    net = status.network_data
    assert net == mock_network_data("mock1") != mock_network_data("mock0")
    assert net is not None and net.interface_name.startswith("mock-") and len(net.interface_name) <= 15
    (ip,) = net.ips
    assert str(ipaddress.ip_interface(ip)) == ip and ip.startswith("10.")
    assert net.hardware_address.startswith("02:") and len(net.hardware_address) == 17
    [record] = [c for c in read_calls(directory) if c["hook"] == "allocate"]
    assert record["device_status"]["mock1"]["networkData"] == {
        "interfaceName": net.interface_name,
        "ips": [ip],
        "hardwareAddress": net.hardware_address,
    }
    assert record["claim"]["name"] == "team-a/gpu-claim"


def test_invalid_statuses_are_built_but_break_the_api_rules(tmp_path: Path) -> None:
    _, hooks = started(tmp_path, count=1, device_status="invalid")
    try:
        answer = hooks.allocate(["mock0"])
    finally:
        hooks.stop()
    status = answer.device_status["mock0"]
    assert status == invalid_status("mock0", None)
    # IsQualifiedName: at most 63 characters of name (k8s.io/apimachinery/pkg/util/validation/validation.go)
    assert len(status.conditions[0].type.rpartition("/")[2]) > 63
    # IsValidInterfaceAddress: an IPv4-mapped address is canonical only in its IPv4 form
    assert status.network_data == NetworkData(interface_name="mock-invalid", ips=("::ffff:a00:1/120",))
    assert ipaddress.IPv6Interface("::ffff:a00:1/120").ip.ipv4_mapped == ipaddress.IPv4Address("10.0.0.1")
