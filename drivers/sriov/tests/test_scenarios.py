"""Scenarios that run twice: against the kernel model and against the real kernel in a VM.

The machine: ``PF`` (``0000:02:00.0``), QEMU's NVMe controller on the nvme
driver, at most 4 VFs, each VF in an IOMMU group of its own. NVMe VFs have no
network interface, so these scenarios use ``vf_driver = "vfio-pci"``; the
kernel-mode netlink reset is covered by the network-namespace and model tests.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from devplug import DeviceSpec, DriverError, Health
from devplug.testing.configs import write_toml
from devplug_sriov import STATE_FILE

VFIO = {"vf_driver": "vfio-pci"}


def _state(harness: Any) -> dict[str, Any]:
    path = Path(harness.ctx.state_dir) / STATE_FILE
    return json.loads(path.read_text())["vfs"] if path.exists() else {}


# --- facts about the kernel the driver relies on (and the model must copy) -------------


def test_fact_numvfs_changes_only_through_zero(backend: Any, kit: ModuleType) -> None:
    sysfs = backend.sysfs
    assert kit.attr(sysfs, kit.PF, "sriov_totalvfs") == "4"
    assert kit.attr(sysfs, kit.PF, "sriov_numvfs") == "0"
    kit.write_attr(sysfs, kit.PF, "sriov_drivers_autoprobe", "0")
    kit.write_attr(sysfs, kit.PF, "sriov_numvfs", "2")
    assert [kit.present(sysfs, kit.vf(i)) for i in range(3)] == [True, True, False]
    assert sysfs.link_name(sysfs.sysfs_root / "bus/pci/devices" / kit.PF / "virtfn1") == kit.vf(1)
    assert sysfs.link_name(sysfs.sysfs_root / "bus/pci/devices" / kit.vf(1) / "physfn") == kit.PF
    assert kit.driver_of(sysfs, kit.vf(0)) is None  # autoprobe 0: no driver for new VFs
    assert kit.group_of(sysfs, kit.vf(0)) != kit.group_of(sysfs, kit.vf(1))

    with pytest.raises(OSError, match="busy") as busy:
        kit.write_attr(sysfs, kit.PF, "sriov_numvfs", "3")
    assert busy.value.errno == errno.EBUSY
    kit.write_attr(sysfs, kit.PF, "sriov_numvfs", "2")  # the same count: accepted, nothing changes
    with pytest.raises(OSError, match="out of range") as too_many:
        kit.write_attr(sysfs, kit.PF, "sriov_numvfs", "5")
    assert too_many.value.errno == errno.ERANGE
    assert kit.attr(sysfs, kit.PF, "sriov_numvfs") == "2"

    kit.write_attr(sysfs, kit.PF, "sriov_numvfs", "0")
    assert not kit.present(sysfs, kit.vf(0))
    assert not sysfs.exists(sysfs.sysfs_root / "bus/pci/devices" / kit.PF / "virtfn0")


# --- set-up -----------------------------------------------------------------------------


def test_setup_creates_the_vfs_once_and_pools_them(backend: Any, kit: ModuleType, make_harness: Any) -> None:
    counting = kit.CrashingSysfs(backend.sysfs)
    h = make_harness(counting, pfs=[kit.PF], num_vfs=2, **VFIO).start()
    assert counting.done == [
        (f"bus/pci/devices/{kit.PF}/sriov_drivers_autoprobe", "0"),
        (f"bus/pci/devices/{kit.PF}/sriov_numvfs", "2"),
    ]
    assert h.ids() == [kit.vf(0), kit.vf(1)]
    assert all(d.health is Health.HEALTHY for d in h.hooks.list_devices())
    assert kit.driver_of(backend.sysfs, kit.vf(0)) is None

    again = make_harness(counting, resource="example.com/again", pfs=[kit.PF], num_vfs=2, **VFIO).start()
    assert len(counting.done) == 2  # idempotent: nothing written when the count is already right
    assert again.ids() == [kit.vf(0), kit.vf(1)]


def test_a_new_count_goes_through_zero_unless_a_vf_is_allocated(
    backend: Any, kit: ModuleType, make_harness: Any
) -> None:
    sysfs = backend.sysfs
    first = make_harness(sysfs, pfs=[kit.PF], num_vfs=2, **VFIO).start()
    first.hooks.allocate([kit.vf(1)])
    first.hooks.stop()

    with pytest.raises(DriverError, match=rf"cannot change {kit.PF} from 2 to 3 VFs.*{kit.vf(1)}, allocated"):
        make_harness(sysfs, state_dir=first.ctx.state_dir, pfs=[kit.PF], num_vfs=3, **VFIO).start()
    assert kit.attr(sysfs, kit.PF, "sriov_numvfs") == "2"
    assert kit.driver_of(sysfs, kit.vf(1)) == "vfio-pci"  # the pod's VF is untouched

    first.release([kit.vf(1)])
    bigger = make_harness(sysfs, state_dir=first.ctx.state_dir, pfs=[kit.PF], num_vfs=3, **VFIO).start()
    assert kit.attr(sysfs, kit.PF, "sriov_numvfs") == "3"
    assert bigger.ids() == [kit.vf(0), kit.vf(1), kit.vf(2)]


def test_num_vfs_zero_removes_the_vfs(backend: Any, kit: ModuleType, make_harness: Any) -> None:
    sysfs = backend.sysfs
    make_harness(sysfs, pfs=[kit.PF], num_vfs=3, **VFIO).start()
    assert kit.present(sysfs, kit.vf(2))
    h = make_harness(sysfs, resource="example.com/none", pfs=[kit.PF], num_vfs=0, **VFIO).start()
    assert kit.attr(sysfs, kit.PF, "sriov_numvfs") == "0"
    assert not kit.present(sysfs, kit.vf(0))
    assert h.ids() == []


# --- allocation and release -----------------------------------------------------------


def test_vfio_mode_binds_on_allocate_and_restores_on_release(backend: Any, kit: ModuleType, make_harness: Any) -> None:
    sysfs = backend.sysfs
    h = make_harness(sysfs, pfs=[kit.PF], num_vfs=2, **VFIO).start()
    groups = [kit.group_of(sysfs, kit.vf(i)) for i in range(2)]

    allocation = h.hooks.allocate([kit.vf(0), kit.vf(1)])

    assert [kit.driver_of(sysfs, kit.vf(i)) for i in range(2)] == ["vfio-pci", "vfio-pci"]
    assert allocation.envs == {"PCIDEVICE_EXAMPLE_COM_VF": f"{kit.vf(0)},{kit.vf(1)}"}
    assert allocation.devices == (
        DeviceSpec("/dev/vfio/vfio", "/dev/vfio/vfio", "rw"),
        *(DeviceSpec(f"/dev/vfio/{g}", f"/dev/vfio/{g}", "rw") for g in sorted(groups)),
    )
    assert all(sysfs.exists(sysfs.dev_root / "vfio" / str(g)) for g in groups)
    assert {a: r["phase"] for a, r in _state(h).items()} == {kit.vf(0): "bound", kit.vf(1): "bound"}

    h.release([kit.vf(0), kit.vf(1)])

    assert [kit.driver_of(sysfs, kit.vf(i)) for i in range(2)] == [None, None]
    assert [kit.attr(sysfs, kit.vf(i), "driver_override") for i in range(2)] == ["(null)", "(null)"]
    assert _state(h) == {}
    h.release([kit.vf(0), kit.vf(1)], retry=True)  # at least once: the retry finds nothing to do
    assert h.hooks.check_health(h.hooks.list_devices()) == {}


def test_a_vf_count_changed_behind_devplugs_back_is_noticed(backend: Any, kit: ModuleType, make_harness: Any) -> None:
    sysfs = backend.sysfs
    h = make_harness(sysfs, pfs=[kit.PF], **VFIO)
    kit.write_attr(sysfs, kit.PF, "sriov_drivers_autoprobe", "0")
    kit.write_attr(sysfs, kit.PF, "sriov_numvfs", "3")
    h.start()
    assert h.ids() == [kit.vf(0), kit.vf(1), kit.vf(2)]

    kit.write_attr(sysfs, kit.PF, "sriov_numvfs", "0")  # someone else
    assert {d.id: d.health for d in h.driver.refresh()} == dict.fromkeys(
        [kit.vf(0), kit.vf(1), kit.vf(2)], Health.UNHEALTHY
    )
    kit.write_attr(sysfs, kit.PF, "sriov_numvfs", "2")
    assert {d.id: d.health for d in h.driver.refresh()} == {
        kit.vf(0): Health.HEALTHY,
        kit.vf(1): Health.HEALTHY,
        kit.vf(2): Health.UNHEALTHY,
    }
    assert h.sink.pushes[-1][2].health is Health.UNHEALTHY


# --- crashes ----------------------------------------------------------------------------


def test_a_crash_between_the_two_count_writes_is_finished_on_restart(
    backend: Any, kit: ModuleType, make_harness: Any
) -> None:
    sysfs = backend.sysfs
    make_harness(sysfs, pfs=[kit.PF], num_vfs=2, **VFIO).start()
    crashing = kit.CrashingSysfs(sysfs)
    crashing.arm(1)  # write 0, then die before writing 3
    with pytest.raises(kit.SimulatedCrash):
        make_harness(crashing, resource="example.com/b", pfs=[kit.PF], num_vfs=3, **VFIO).start()
    assert kit.attr(sysfs, kit.PF, "sriov_numvfs") == "0"

    h = make_harness(sysfs, resource="example.com/b", pfs=[kit.PF], num_vfs=3, **VFIO).start()
    assert kit.attr(sysfs, kit.PF, "sriov_numvfs") == "3"
    assert h.ids() == [kit.vf(0), kit.vf(1), kit.vf(2)]


@pytest.mark.parametrize("writes", [1, 2], ids=["after-override", "after-probe"])
def test_a_crash_while_binding_is_undone_by_deallocate(
    backend: Any, kit: ModuleType, make_harness: Any, writes: int
) -> None:
    sysfs = backend.sysfs
    crashing = kit.CrashingSysfs(sysfs)
    h = make_harness(crashing, pfs=[kit.PF], num_vfs=1, **VFIO).start()
    crashing.arm(writes)  # driver_override, drivers_probe
    with pytest.raises(kit.SimulatedCrash):
        h.hooks.allocate([kit.vf(0)])
    assert _state(h)[kit.vf(0)]["phase"] == "binding"

    restarted = make_harness(sysfs, state_dir=h.ctx.state_dir, pfs=[kit.PF], num_vfs=1, **VFIO).start()
    assert restarted.ids() == [kit.vf(0)]  # nothing allocated is ever re-created
    restarted.hooks.deallocate([kit.vf(0)], True)  # the engine undoes the allocation that never completed

    assert kit.driver_of(sysfs, kit.vf(0)) is None
    assert kit.attr(sysfs, kit.vf(0), "driver_override") == "(null)"
    assert _state(restarted) == {}


def test_a_crash_while_restoring_is_finished_on_restart(backend: Any, kit: ModuleType, make_harness: Any) -> None:
    sysfs = backend.sysfs
    crashing = kit.CrashingSysfs(sysfs)
    h = make_harness(crashing, pfs=[kit.PF], num_vfs=1, **VFIO).start()
    h.hooks.allocate([kit.vf(0)])
    crashing.arm(1)  # unbind vfio-pci, then die before clearing the override
    with pytest.raises(kit.SimulatedCrash):
        h.release([kit.vf(0)])
    assert kit.driver_of(sysfs, kit.vf(0)) is None

    restarted = make_harness(sysfs, state_dir=h.ctx.state_dir, pfs=[kit.PF], num_vfs=1, **VFIO).start()

    assert kit.attr(sysfs, kit.vf(0), "driver_override") == "(null)"
    assert _state(restarted) == {}
    restarted.release([kit.vf(0)], retry=True)
    assert kit.driver_of(sysfs, kit.vf(0)) is None


# --- the set-up command -----------------------------------------------------------------


def test_the_setup_command_dry_run_then_for_real(backend: Any, kit: ModuleType, tmp_path: Path) -> None:
    sysfs = backend.sysfs
    options: dict[str, Any] = {"pfs": [kit.PF], "num_vfs": 2, **VFIO}
    if backend.name == "model":
        options |= {"sysfs_root": str(sysfs.sysfs_root), "dev_root": str(sysfs.dev_root)}
    config = write_toml(
        tmp_path / "devplug.toml",
        {
            "state": {"dir": str(tmp_path / "state")},
            "resources": {"example.com/vf": {"driver": "sriov", "options": options}},
        },
    )
    folder = f"{sysfs.sysfs_root}/bus/pci/devices/{kit.PF}"

    dry = kit.run_setup("--config", str(config), "--dry-run")

    assert dry.returncode == 0, dry.stderr
    assert [line.split("  #")[0] for line in dry.stdout.splitlines()] == [
        f"would write 0 to {folder}/sriov_drivers_autoprobe",
        f"would write 2 to {folder}/sriov_numvfs",
    ]
    assert kit.attr(sysfs, kit.PF, "sriov_numvfs") == "0"
    assert kit.attr(sysfs, kit.PF, "sriov_drivers_autoprobe") == "1"
    if backend.name == "model":
        return  # the model's effects happen only through its own access layer, not in another process

    done = kit.run_setup("--config", str(config))
    assert done.returncode == 0, done.stderr
    assert kit.attr(sysfs, kit.PF, "sriov_numvfs") == "2"
    assert kit.attr(sysfs, kit.PF, "sriov_drivers_autoprobe") == "0"
    again = kit.run_setup("--config", str(config))
    assert again.stdout == "[example.com/vf] nothing to write: the PFs are set up\n"
