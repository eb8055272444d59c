"""The value types check themselves, and allocations merge or refuse to."""

from __future__ import annotations

import pytest

from devplug import CDIDevice, ContainerAllocation, Device, DeviceSpec, Health, Mount, Topology
from devplug.errors import AllocationConflictError
from devplug.types import merge_allocations


@pytest.mark.parametrize("bad", ["", "has space", "tab\there", "new\nline"])
def test_device_id_must_be_printable_without_whitespace(bad: str) -> None:
    with pytest.raises(ValueError, match="Device"):
        Device(bad)


def test_device_health_from_string_and_copy_with_health() -> None:
    dev = Device("gpu0", "Unhealthy", Topology((1,)))  # type: ignore[arg-type]
    assert dev.health is Health.UNHEALTHY and not dev.healthy
    assert dev.with_health(Health.HEALTHY) == Device("gpu0", Health.HEALTHY, Topology((1,)))
    with pytest.raises(ValueError, match="Sick"):
        Device("gpu0", "Sick")  # type: ignore[arg-type]


@pytest.mark.parametrize("node", [-1, True, "0"])
def test_topology_rejects_non_numa_numbers(node: object) -> None:
    with pytest.raises(ValueError, match="NUMA"):
        Topology((node,))  # type: ignore[arg-type]


def test_paths_must_be_absolute_and_permissions_rwm() -> None:
    with pytest.raises(ValueError, match="container_path"):
        Mount("relative", "/host")
    with pytest.raises(ValueError, match="host_path"):
        DeviceSpec("/dev/x", "host")
    for perms in ("", "rx", "rr"):
        with pytest.raises(ValueError, match="permissions"):
            DeviceSpec("/dev/x", "/dev/x", perms)
    assert DeviceSpec("/dev/x", "/dev/x", "rwm").permissions == "rwm"


@pytest.mark.parametrize("name", ["nvidia.com/gpu=0", "vendor.io/class=dev-1", "a.b.c/x_y=z:1"])
def test_cdi_names_fully_qualified(name: str) -> None:
    assert CDIDevice(name).name == name


@pytest.mark.parametrize("name", ["gpu0", "vendor/class=x", "Vendor.com/gpu=0", "vendor.com/gpu", "vendor.com/=x"])
def test_cdi_names_rejected(name: str) -> None:
    with pytest.raises(ValueError, match="CDI"):
        CDIDevice(name)


def test_allocation_is_immutable_and_checks_its_parts() -> None:
    envs = {"A": "1"}
    alloc = ContainerAllocation(envs=envs)
    envs["A"] = "changed"
    assert alloc.envs["A"] == "1"
    with pytest.raises(TypeError):
        alloc.envs["B"] = "2"  # type: ignore[index]
    with pytest.raises(ValueError, match="value must be a string"):
        ContainerAllocation(envs={"A": 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="not a Mount"):
        ContainerAllocation(mounts=("/x",))  # type: ignore[arg-type]
    with pytest.raises(AllocationConflictError, match="/dev/x"):
        ContainerAllocation(devices=(DeviceSpec("/dev/x", "/dev/a"), DeviceSpec("/dev/x", "/dev/b")))


def test_merge_unions_and_keeps_identical_entries_once() -> None:
    a = ContainerAllocation(
        envs={"A": "1"}, devices=(DeviceSpec("/dev/a", "/dev/a"),), cdi_devices=(CDIDevice("v.io/c=1"),)
    )
    b = ContainerAllocation(
        envs={"A": "1", "B": "2"},
        devices=(DeviceSpec("/dev/a", "/dev/a"), DeviceSpec("/dev/b", "/dev/b")),
        annotations={"k": "v"},
        cdi_devices=(CDIDevice("v.io/c=1"),),
    )
    merged = a.merge(b)
    assert dict(merged.envs) == {"A": "1", "B": "2"}
    assert [d.container_path for d in merged.devices] == ["/dev/a", "/dev/b"]
    assert dict(merged.annotations) == {"k": "v"}
    assert merged.cdi_devices == (CDIDevice("v.io/c=1"),)
    # built without the constructor's checks, the merge is the allocation the constructor makes
    built = ContainerAllocation(
        envs={"A": "1", "B": "2"},
        devices=(DeviceSpec("/dev/a", "/dev/a"), DeviceSpec("/dev/b", "/dev/b")),
        annotations={"k": "v"},
        cdi_devices=(CDIDevice("v.io/c=1"),),
    )
    assert merged == built and hash(merged) == hash(built)
    with pytest.raises(TypeError):
        merged.envs["C"] = "3"  # type: ignore[index]
    mixed = merge_allocations(
        [ContainerAllocation(mounts=(Mount("/m1", "/h"),)), a, ContainerAllocation(mounts=(Mount("/m2", "/h"),))]
    )
    assert [m.container_path for m in mixed.mounts] == ["/m1", "/m2"] and mixed.devices == a.devices


def test_merge_rejects_conflicts_naming_them() -> None:
    with pytest.raises(AllocationConflictError, match="env 'A'"):
        merge_allocations([ContainerAllocation(envs={"A": "1"}), ContainerAllocation(envs={"A": "2"})])
    with pytest.raises(AllocationConflictError, match="/data"):
        merge_allocations(
            [
                ContainerAllocation(mounts=(Mount("/data", "/srv/a"),)),
                ContainerAllocation(devices=(DeviceSpec("/data", "/dev/b"),)),
            ]
        )


def test_a_device_status_reads_back_what_it_wrote_and_refuses_anything_else() -> None:
    """Contract 1.1's DeviceStatus as the ledger keeps it (issue 41): the API's field names, read back equal."""
    from devplug.types import DeviceCondition, DeviceStatus, NetworkData

    status = DeviceStatus(
        (DeviceCondition("Ready", "True", "Prepared", "ok"),),
        {"image": "abc", "n": [1, 2]},
        NetworkData("net1", ("10.0.0.2/24",), "aa:bb:cc:dd:ee:ff"),
    )
    written = status.to_json()
    assert written["networkData"] == {
        "interfaceName": "net1",
        "ips": ["10.0.0.2/24"],
        "hardwareAddress": "aa:bb:cc:dd:ee:ff",
    }
    assert DeviceStatus.from_json(written) == status
    assert DeviceStatus.from_json({}) == DeviceStatus()
    with pytest.raises(ValueError, match="lacks or misspells 'reason'"):
        DeviceStatus.from_json({"conditions": [{"type": "Ready", "status": "True"}]})
    with pytest.raises(ValueError, match="must be a JSON object"):
        DeviceStatus.from_json(["Ready"])
