"""Issue 16's pieces on their own: the sharing keys of the config, replica IDs checked on the driver's lists,
the device table's replica map, the core's spread, and the Replicas value hooks get."""

from __future__ import annotations

from pathlib import Path

import pytest

from devplug import Device, Health, Replicas, Topology
from devplug.allocation import spread_replicas
from devplug.config import load_config
from devplug.drivers import check_device_list
from devplug.engine.devicetable import DeviceTable
from devplug.errors import ConfigError, DriverError
from devplug.types import replica_id

TABLE = """
[resources."example.com/gpu"]
driver = "mock"
options = { directory = "devs", count = 2 }
"""


def _load(tmp_path: Path, extra: str, more: str = "") -> tuple[Path, object]:
    path = tmp_path / "devplug.toml"
    path.write_text(TABLE + extra + more)
    return path, load_config(path)


def test_sharing_keys_are_typed(tmp_path: Path) -> None:
    _, config = _load(
        tmp_path, 'replicas = 4\nrename = "example.com/gpu.shared"\nfail_requests_greater_than_one = true\n'
    )
    (rc,) = config.resources  # type: ignore[attr-defined]
    assert (rc.name, rc.configured_name, rc.replicas, rc.fail_requests_greater_than_one) == (
        "example.com/gpu.shared",
        "example.com/gpu",
        4,
        True,
    )


def test_defaults_change_nothing(tmp_path: Path) -> None:
    _, config = _load(tmp_path, "")
    (rc,) = config.resources  # type: ignore[attr-defined]
    assert (rc.name, rc.configured_name, rc.replicas, rc.fail_requests_greater_than_one) == (
        "example.com/gpu",
        None,
        1,
        False,
    )


@pytest.mark.parametrize(
    ("extra", "key", "expected"),
    [
        ("replicas = 0\n", "replicas", "an integer from 1 to 1024"),
        ("replicas = 2000\n", "replicas", "an integer from 1 to 1024"),
        ("replicas = true\n", "replicas", "got True"),
        ('replicas = "4"\n', "replicas", "got '4'"),
        ('fail_requests_greater_than_one = "yes"\n', "fail_requests_greater_than_one", "expected true or false"),
        ('rename = "gpu.shared"\n', "rename", "the kubelet would refuse the resource name"),
        ("rename = 3\n", "rename", "expected a resource name"),
    ],
)
def test_bad_sharing_keys_name_file_resource_and_key(tmp_path: Path, extra: str, key: str, expected: str) -> None:
    path = tmp_path / "devplug.toml"
    path.write_text(TABLE + extra)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f'{path}: resources."example.com/gpu".{key}:'), message
    assert expected in message, message


def test_a_rename_onto_another_resource_is_refused(tmp_path: Path) -> None:
    other = '\n[resources."example.com/other"]\ndriver = "mock"\noptions = { directory = "o" }\n'
    path = tmp_path / "devplug.toml"
    path.write_text(TABLE + 'rename = "example.com/other"\n' + other)
    with pytest.raises(ConfigError, match=r'resources."example.com/gpu".rename: .* both be advertised'):
        load_config(path)


def test_replica_ids_are_checked_on_the_drivers_list() -> None:
    assert check_device_list("r", [Device("a"), Device("b", replicas=2)], replicas=1)
    with pytest.raises(DriverError, match="replica ID 'a::0' of device 'a' is also the ID of another device"):
        check_device_list("r", [Device("a"), Device("a::0")], replicas=2)
    with pytest.raises(DriverError, match=r"device 'x+' cannot be shared"):
        check_device_list("r", [Device("x" * 255)], replicas=2)
    with pytest.raises(ValueError, match="replicas must be an integer >= 1"):
        Device("a", replicas=0)


def test_the_table_advertises_replicas_and_maps_them_back() -> None:
    table = DeviceTable(replicas=2)
    table.replace([Device("a", topology=Topology((1,))), Device("b", replicas=1), Device("c", replicas=3)])
    assert sorted(d.id for d in table.reported_devices()) == ["a::0", "a::1", "b", "c::0", "c::1", "c::2"]
    assert [d.id for d in table.physical_devices()] == ["a", "b", "c"]
    assert table.physical_of("c::2") == "c" and table.physical_of("b") == "b"
    assert table.replica_ids("a") == ("a::0", "a::1") and table.replica_ids("b") == ("b",)
    assert table.advertised("a::1").topology == Topology((1,))  # type: ignore[union-attr]
    assert table.set_health({"a": Health.UNHEALTHY}) == ["a"]
    assert [table.advertised(i).health for i in ("a::0", "a::1")] == [Health.UNHEALTHY] * 2  # type: ignore[union-attr]
    table.update([Device("a", replicas=1)])  # the count changes: the old replica IDs go
    assert table.reported("a::0") is None and table.reported("a") is not None
    assert "a::1" in table.all_replica_ids("a"), "an allocation may still hold an old replica ID"
    table.update(removed=["c"])
    assert all(table.reported(replica_id("c", k)) is None for k in range(3))
    assert table.shared_devices() == {}


def test_an_unshared_table_is_the_drivers_list_itself() -> None:
    table = DeviceTable()
    devices = [Device("a"), Device("b")]
    table.replace(devices)
    assert table.reported("a") is devices[0] and not table.shared


def _spread(devices: list[Device], in_use: dict[str, int], size: int, must: list[str] | None = None) -> list[str]:
    replicas = Replicas(by_device={d.id: (f"{d.id}::0", f"{d.id}::1") for d in devices}, in_use=in_use)
    return spread_replicas(devices, must or [], size, replicas)


def test_spread_takes_distinct_least_loaded_devices_on_one_numa_node() -> None:
    devices = [
        Device("a", topology=Topology((0,))),
        Device("b", topology=Topology((1,))),
        Device("c", topology=Topology((0,))),
        Device("d", topology=Topology((1,))),
    ]
    assert _spread(devices, {"a": 1}, 1) == ["b"]  # least loaded, in the kubelet's order
    assert _spread(devices, {"a": 1}, 2) == ["b", "d"]  # distinct, and b's NUMA node first
    assert _spread(devices, {}, 2, must=["c"]) == ["c", "a"]
    assert _spread(devices[:1], {}, 2) == ["a", "a"]  # one device left: both its replicas
    assert _spread(devices[:1], {}, 3) == ["a", "a"]  # no more replicas offered


def test_replicas_value() -> None:
    shared = Replicas(by_device={"gpu0": ("gpu0::0", "gpu0::3")}, tenants={"gpu0": 1})
    assert shared.shared and shared.replica_ids("gpu0") == ("gpu0::0", "gpu0::3")
    assert shared.device_of("gpu0::3") == "gpu0" and shared.device_of("x") is None
    assert not Replicas.unshared(["a", "b"]).shared
    with pytest.raises(TypeError):
        shared.by_device["x"] = ()  # type: ignore[index]


@pytest.mark.parametrize("made", ["from IDs", "from devices"])
def test_unshared_replicas_are_the_same_value_as_built_by_hand(made: str) -> None:
    if made == "from IDs":
        lazy = Replicas.unshared(["a", "b", "a"])
    else:  # the devices' IDs gathered only when the mapping is looked at
        lazy = Replicas.unshared_devices([Device("a"), Device("b"), Device("a")])
        assert not lazy.shared
    assert lazy == Replicas(by_device={"a": ("a",), "b": ("b",)}) == lazy
    assert list(lazy.by_device.items()) == [("a", ("a",)), ("b", ("b",))] and len(lazy.by_device) == 2
    assert lazy.replica_ids("b") == ("b",) and lazy.replica_ids("z") == () and "z" not in lazy.by_device
    assert lazy.device_of("a") == "a" and lazy.device_of("z") is None
    assert (dict(lazy.in_use), dict(lazy.tenants)) == ({}, {})
    with pytest.raises(KeyError):
        lazy.by_device["z"]
    with pytest.raises(TypeError):
        lazy.by_device["z"] = ()  # type: ignore[index]


def test_held_replicas_of_a_lowered_count_still_map_to_their_device() -> None:
    table = DeviceTable(replicas=2)
    table.replace([Device("a"), Device("b", replicas=1)])
    assert table.learn_replica_ids(["a::0", "a::3", "b::1", "b", "zz::0", "a::x"]) == ["a::3", "b::1"]
    assert table.physical_of("a::3") == "a" and "a::3" in table.all_replica_ids("a")
    assert table.physical_of("b::1") == "b", "b shared before, one replica now: its old replica is still b's"
    assert table.physical_of("zz::0") == "zz::0", "not a device the driver lists"


def test_a_lowered_count_withholds_free_replicas_beyond_the_count_while_the_excess_holds() -> None:
    table = DeviceTable()
    table.replace([Device("a", replicas=4), Device("b", replicas=2)])
    assert not table.shrunk and table.excess_replicas(lambda i: True) == set()
    held = {"a::0", "a::2", "a::3"}
    table.update([Device("a", replicas=2)])  # the driver lowers a's count while three tenants hold it
    assert table.shrunk and sorted(table.ids) == ["a::0", "a::1", "b::0", "b::1"]
    assert table.excess_replicas(held.__contains__) == {"a::1"}, "3 tenants on 2 replicas: a::1 not offered"
    held.discard("a::3")
    assert table.excess_replicas(held.__contains__) == {"a::1"}, "2 tenants: still full"
    held.discard("a::2")
    assert table.excess_replicas(held.__contains__) == set(), "1 tenant: a::1 offered again"
    held = {"a::3", "a::2"}  # both tenants on replicas no longer advertised: neither free replica is offered
    assert table.excess_replicas(held.__contains__) == {"a::0", "a::1"}
    held = {"a::3"}
    assert table.excess_replicas(held.__contains__) == {"a::1"}, "the lowest free replica is the one offered"


def test_devplug_status_shows_each_shared_devices_tenants() -> None:
    from devplug.cli.statusview import format_status
    from devplug.daemon.statusschema import check_status

    share = {"device": "gpu0", "replicas": 4, "in_use": 2, "tenants": 2, "releasing": 0, "pods": ["default/a"]}
    sharing = {"replicas": 4, "configured_as": "example.com/gpu", "fail_requests_greater_than_one": False}
    resource = {"name": "example.com/gpu.shared", "driver": "mock", "state": "registered"}
    data = check_status({"pid": 1, "resources": [{**resource, "sharing": {**sharing, "devices": [share]}}]})
    text = format_status(data)
    assert "sharing: 4 replicas per device, configured as example.com/gpu" in text
    assert "gpu0                     2/4 replicas in use, 2 tenants, pods default/a" in text
    with pytest.raises(ValueError, match="in_use"):
        check_status({"pid": 1, "resources": [{**resource, "sharing": {"devices": [{**share, "in_use": "2"}]}}]})
