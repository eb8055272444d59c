"""Scenarios that run twice: against the kernel model and against the real kernel in a VM.

Each test takes ``backend`` (``[model]`` or ``[kernel]``, see conftest.py), so a
difference between the model and the kernel shows up as one of the two failing.
The machine: ``LONE`` (edu, no driver), ``NIC`` (e1000e), ``PAIR`` (two edu
functions in one IOMMU group), ``BRIDGE`` (a root port on pcieport).
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from devplug import DeviceSpec, DriverError, Health
from devplug_vfio import STATE_FILE


def _state(harness: Any) -> dict[str, Any]:
    path = Path(harness.ctx.state_dir) / STATE_FILE
    return json.loads(path.read_text())["devices"] if path.exists() else {}


# --- facts about the kernel the driver relies on (and the model must copy) -------------


def test_fact_one_bound_member_creates_the_group_node(backend: Any, kit: ModuleType) -> None:
    sysfs = backend.sysfs
    first = kit.PAIR[0]
    group = kit.group_of(sysfs, first)
    assert str(group) not in kit.vfio_nodes(sysfs)
    sysfs.write_text(sysfs.sysfs_root / "bus/pci/devices" / first / "driver_override", "vfio-pci")
    sysfs.write_text(sysfs.sysfs_root / "bus/pci/drivers_probe", first)
    assert kit.driver_of(sysfs, first) == "vfio-pci"
    assert kit.driver_of(sysfs, kit.PAIR[1]) is None
    assert str(group) in kit.vfio_nodes(sysfs)
    sysfs.write_text(sysfs.sysfs_root / "bus/pci/drivers/vfio-pci/unbind", first)
    assert str(group) not in kit.vfio_nodes(sysfs)
    assert kit.override_of(sysfs, first) == "vfio-pci"
    sysfs.write_text(sysfs.sysfs_root / "bus/pci/devices" / first / "driver_override", "\n")
    assert kit.override_of(sysfs, first) == "(null)"


def test_fact_a_failed_probe_looks_successful_through_drivers_probe(backend: Any, kit: ModuleType) -> None:
    sysfs = backend.sysfs
    folder = sysfs.sysfs_root / "bus/pci/devices" / kit.BRIDGE
    sysfs.write_text(folder / "driver_override", "vfio-pci")
    sysfs.write_text(sysfs.sysfs_root / "bus/pci/drivers/pcieport/unbind", kit.BRIDGE)
    sysfs.write_text(sysfs.sysfs_root / "bus/pci/drivers_probe", kit.BRIDGE)  # vfio-pci refuses bridges: no error
    assert kit.driver_of(sysfs, kit.BRIDGE) is None
    with pytest.raises(OSError, match="Invalid argument") as excinfo:  # through bind, the probe's error shows
        sysfs.write_text(sysfs.sysfs_root / "bus/pci/drivers/vfio-pci/bind", kit.BRIDGE)
    assert excinfo.value.errno == errno.EINVAL
    sysfs.write_text(folder / "driver_override", "\n")
    sysfs.write_text(sysfs.sysfs_root / "bus/pci/drivers_probe", kit.BRIDGE)
    assert kit.driver_of(sysfs, kit.BRIDGE) == "pcieport"


def test_fact_bind_needs_a_matching_override_or_id(backend: Any, kit: ModuleType) -> None:
    sysfs = backend.sysfs
    with pytest.raises(OSError, match="No such device") as excinfo:  # vfio-pci has no ID table: no match
        sysfs.write_text(sysfs.sysfs_root / "bus/pci/drivers/vfio-pci/bind", kit.LONE)
    assert excinfo.value.errno == errno.ENODEV
    with pytest.raises(OSError, match="No such device") as excinfo:  # unbind from a driver it is not bound to
        sysfs.write_text(sysfs.sysfs_root / "bus/pci/drivers/vfio-pci/unbind", kit.NIC)
    assert excinfo.value.errno == errno.ENODEV


def test_fact_bind_of_a_bound_device_is_ebusy(backend: Any, kit: ModuleType) -> None:
    # drivers/base/dd.c, __driver_probe_device: a device that has a driver is EBUSY to bind_store, even for the
    # driver that holds it (devplug.testing.bussysfs models the same for any bus)
    sysfs = backend.sysfs
    with pytest.raises(OSError, match="busy") as excinfo:
        sysfs.write_text(sysfs.sysfs_root / "bus/pci/drivers/e1000e/bind", kit.NIC)
    assert excinfo.value.errno == errno.EBUSY
    assert kit.driver_of(sysfs, kit.NIC) == "e1000e"


def test_fact_the_kits_sysbus_moves_a_device_and_back(backend: Any, kit: ModuleType) -> None:
    # devplug.kit.SysBus, the generic bus helper PciBus is the pci case of, on the real pci bus
    from devplug.kit import SysBus

    bus = SysBus(backend.sysfs, "pci")
    assert kit.NIC in bus.devices() and "e1000e" in bus.drivers()
    with pytest.raises(DriverError, match="e1000e holds it, not vfio-pci"):
        bus.bind(kit.NIC, "vfio-pci")
    assert bus.unbind(kit.NIC) == "e1000e"
    assert bus.driver(kit.NIC) is None
    with pytest.raises(DriverError, match=r"cannot bind it to vfio-pci: .*No such device"):  # no ID of vfio-pci's
        bus.bind(kit.NIC, "vfio-pci")
    bus.bind(kit.NIC, "e1000e")
    assert bus.rebind(kit.NIC, "e1000e") == "e1000e"
    assert bus.driver(kit.NIC) == "e1000e"


# --- the driver -----------------------------------------------------------------------


def test_selection_reads_ids_classes_and_topology(backend: Any, kit: ModuleType, make_harness: Any) -> None:
    edu = make_harness(backend.sysfs, resource="example.com/edu", vendors=["1234"]).start()
    assert [d.id for d in edu.hooks.list_devices()] == [kit.LONE, *kit.PAIR]
    assert all(d.topology.numa_nodes == () and d.health is Health.HEALTHY for d in edu.hooks.list_devices())
    nic = make_harness(backend.sysfs, resource="example.com/nic", classes=["0200"]).start()
    assert [d.id for d in nic.hooks.list_devices()] == [kit.NIC]
    assert kit.driver_of(backend.sysfs, kit.NIC) == "e1000e"  # selecting touches nothing


def test_allocate_binds_and_release_restores_the_real_driver(backend: Any, kit: ModuleType, make_harness: Any) -> None:
    sysfs = backend.sysfs
    h = make_harness(sysfs, resource="example.com/nic-e1000e", devices=["8086:10d3"]).start()
    assert kit.driver_of(sysfs, kit.NIC) == "e1000e"
    group = kit.group_of(sysfs, kit.NIC)

    allocation = h.hooks.allocate([kit.NIC])

    assert kit.driver_of(sysfs, kit.NIC) == "vfio-pci"
    assert str(group) in kit.vfio_nodes(sysfs)
    assert allocation.envs == {"PCI_RESOURCE_EXAMPLE_COM_NIC_E1000E": kit.NIC}
    assert allocation.devices == (
        # host paths as the runtime resolves them, whatever dev_root this daemon sees /dev at
        DeviceSpec("/dev/vfio/vfio", "/dev/vfio/vfio", "rw"),
        DeviceSpec(f"/dev/vfio/{group}", f"/dev/vfio/{group}", "rw"),
    )
    assert _state(h)[kit.NIC]["original_driver"] == "e1000e"
    listed = h.hooks.list_devices()
    assert h.hooks.check_health(listed) == {d.id: Health.HEALTHY for d in listed}  # every device, all healthy

    h.release([kit.NIC])

    assert kit.driver_of(sysfs, kit.NIC) == "e1000e"
    assert kit.override_of(sysfs, kit.NIC) == "(null)"
    assert str(group) not in kit.vfio_nodes(sysfs)
    assert _state(h) == {}
    h.release([kit.NIC])  # a second call (the engine retrying) changes nothing
    assert kit.driver_of(sysfs, kit.NIC) == "e1000e"


def test_a_device_without_driver_is_left_without_one(backend: Any, kit: ModuleType, make_harness: Any) -> None:
    sysfs = backend.sysfs
    h = make_harness(sysfs, addresses=[kit.LONE]).start()
    h.hooks.allocate([kit.LONE])
    assert kit.driver_of(sysfs, kit.LONE) == "vfio-pci"
    h.release([kit.LONE])
    assert kit.driver_of(sysfs, kit.LONE) is None
    assert kit.override_of(sysfs, kit.LONE) == "(null)"


def test_an_iommu_group_moves_as_a_whole(backend: Any, kit: ModuleType, make_harness: Any) -> None:
    sysfs = backend.sysfs
    h = make_harness(sysfs, addresses=["00:05.*"]).start()
    with pytest.raises(DriverError, match=r"0000:00:05\.1 share IOMMU group \d+"):
        h.hooks.allocate([kit.PAIR[0]])
    assert kit.driver_of(sysfs, kit.PAIR[0]) is None
    assert h.hooks.preferred_allocation(h.hooks.list_devices(), [], 2) == list(kit.PAIR)

    allocation = h.hooks.allocate(list(kit.PAIR))

    assert [kit.driver_of(sysfs, a) for a in kit.PAIR] == ["vfio-pci", "vfio-pci"]
    assert allocation.envs["PCI_RESOURCE_EXAMPLE_COM_VFIO"] == ",".join(kit.PAIR)
    h.release([kit.PAIR[0]])  # one ID of the allocation releases its whole group
    assert [kit.driver_of(sysfs, a) for a in kit.PAIR] == [None, None]


def test_a_group_with_an_unselected_device_is_refused(backend: Any, kit: ModuleType, make_harness: Any) -> None:
    h = make_harness(backend.sysfs, addresses=[kit.PAIR[0]])
    group = kit.group_of(backend.sysfs, kit.PAIR[0])
    with pytest.raises(DriverError, match=rf"IOMMU group {group} holds 0000:00:05\.1 .*does not select"):
        h.start()
    assert kit.driver_of(backend.sysfs, kit.PAIR[0]) is None


def test_a_failed_bind_is_reported_and_rolled_back(backend: Any, kit: ModuleType, make_harness: Any) -> None:
    sysfs = backend.sysfs
    h = make_harness(sysfs, devices=["8086:10d3"]).start()
    backend.unload_vfio_pci()
    try:
        with pytest.raises(DriverError, match=r"0000:00:04\.0: the kernel did not bind it to vfio-pci"):
            h.hooks.allocate([kit.NIC])
        assert kit.driver_of(sysfs, kit.NIC) == "e1000e"
        assert kit.override_of(sysfs, kit.NIC) == "(null)"
        assert _state(h) == {}
    finally:
        backend.load_vfio_pci()


def test_start_fails_clearly_without_vfio_pci(backend: Any, kit: ModuleType, make_harness: Any) -> None:
    backend.unload_vfio_pci()
    try:
        with pytest.raises(DriverError, match=r"vfio-pci is not available.*modprobe vfio-pci"):
            make_harness(backend.sysfs, devices=["8086:10d3"]).start()
    finally:
        backend.load_vfio_pci()


def test_at_start_binds_at_start_and_keeps_devices_bound(backend: Any, kit: ModuleType, make_harness: Any) -> None:
    sysfs = backend.sysfs
    h = make_harness(sysfs, devices=["8086:10d3"], bind="at-start").start()
    assert kit.driver_of(sysfs, kit.NIC) == "vfio-pci"
    allocation = h.hooks.allocate([kit.NIC])
    assert allocation.envs["PCI_RESOURCE_EXAMPLE_COM_VFIO"] == kit.NIC
    h.release([kit.NIC])
    assert kit.driver_of(sysfs, kit.NIC) == "vfio-pci"
    again = make_harness(sysfs, state_dir=h.ctx.state_dir, drivers=["e1000e"], bind="at-start").start()
    assert [d.id for d in again.hooks.list_devices()] == [kit.NIC]  # still selected by its own driver
    assert _state(again)[kit.NIC]["original_driver"] == "e1000e"


@pytest.mark.parametrize("writes", [2, 3], ids=["before-probe", "after-probe"])
def test_a_crash_while_binding_is_undone_by_deallocate(
    backend: Any, kit: ModuleType, make_harness: Any, writes: int
) -> None:
    sysfs = backend.sysfs
    crashing = kit.CrashingSysfs(sysfs, writes=10**6)
    h = make_harness(crashing, devices=["8086:10d3"]).start()
    crashing.arm(writes)  # override, unbind e1000e, probe
    with pytest.raises(kit.SimulatedCrash):
        h.hooks.allocate([kit.NIC])
    assert _state(h)[kit.NIC]["phase"] == "binding"

    restarted = make_harness(sysfs, state_dir=h.ctx.state_dir, devices=["8086:10d3"]).start()
    assert [d.id for d in restarted.hooks.list_devices()] == [kit.NIC]
    restarted.hooks.deallocate([kit.NIC])  # the engine undoes the allocation that never completed

    assert kit.driver_of(sysfs, kit.NIC) == "e1000e"
    assert kit.override_of(sysfs, kit.NIC) == "(null)"
    assert _state(restarted) == {}


def test_a_crash_while_releasing_is_finished_on_restart(backend: Any, kit: ModuleType, make_harness: Any) -> None:
    sysfs = backend.sysfs
    crashing = kit.CrashingSysfs(sysfs, writes=10**6)
    h = make_harness(crashing, devices=["8086:10d3"]).start()
    h.hooks.allocate([kit.NIC])
    crashing.arm(1)  # unbind vfio-pci, then die before clearing the override and probing
    with pytest.raises(kit.SimulatedCrash):
        h.release([kit.NIC])
    assert kit.driver_of(sysfs, kit.NIC) is None

    restarted = make_harness(sysfs, state_dir=h.ctx.state_dir, devices=["8086:10d3"]).start()

    assert kit.driver_of(sysfs, kit.NIC) == "e1000e"
    assert kit.override_of(sysfs, kit.NIC) == "(null)"
    assert _state(restarted) == {}
    restarted.release([kit.NIC])  # the engine's retry after the restart finds nothing to do
    assert kit.driver_of(sysfs, kit.NIC) == "e1000e"


def test_hot_unplug_while_allocated_makes_the_device_unhealthy(
    backend: Any, kit: ModuleType, make_harness: Any
) -> None:
    sysfs = backend.sysfs
    h = make_harness(sysfs, addresses=[kit.LONE]).start()
    h.hooks.allocate([kit.LONE])
    devices = h.hooks.list_devices()
    sysfs.write_text(sysfs.sysfs_root / "bus/pci/devices" / kit.LONE / "remove", "1")

    assert h.hooks.check_health(devices) == {kit.LONE: Health.UNHEALTHY}
    assert [(d.id, d.health) for d in h.driver.refresh()] == [(kit.LONE, Health.UNHEALTHY)]
    assert h.sink.pushes[-1][0].health is Health.UNHEALTHY
    h.release([kit.LONE])  # the device is gone: nothing to give back, no error
    assert _state(h) == {}

    sysfs.write_text(sysfs.sysfs_root / "bus/pci/rescan", "1")  # it comes back: hot-plug
    assert [(d.id, d.health) for d in h.driver.refresh()] == [(kit.LONE, Health.HEALTHY)]


def test_another_driver_taking_an_allocated_device_makes_it_unhealthy(
    backend: Any, kit: ModuleType, make_harness: Any
) -> None:
    sysfs = backend.sysfs
    h = make_harness(sysfs, devices=["8086:10d3"]).start()
    h.hooks.allocate([kit.NIC])
    devices = h.hooks.list_devices()
    # Someone gives the NIC back to e1000e by hand while the pod holds it.
    sysfs.write_text(sysfs.sysfs_root / "bus/pci/drivers/vfio-pci/unbind", kit.NIC)
    sysfs.write_text(sysfs.sysfs_root / "bus/pci/devices" / kit.NIC / "driver_override", "\n")
    sysfs.write_text(sysfs.sysfs_root / "bus/pci/drivers/e1000e/bind", kit.NIC)

    assert h.hooks.check_health(devices) == {kit.NIC: Health.UNHEALTHY}
    h.release([kit.NIC])
    assert kit.driver_of(sysfs, kit.NIC) == "e1000e"
    listed = h.hooks.list_devices()
    assert h.hooks.check_health(listed) == {d.id: Health.HEALTHY for d in listed}
