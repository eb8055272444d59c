"""The PCI sysfs model of devplug.testing: each documented kernel effect, seen through SysfsAccess."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path

import pytest

from devplug.host.sysfs import HostSysfs, SysfsAccess
from devplug.testing.pcisysfs import PciSysfsModel

NIC = "0000:3b:00.0"
GPU = "0000:86:00.0"
AUDIO = "0000:86:00.1"


@pytest.fixture
def model(tmp_path: Path) -> Iterator[PciSysfsModel]:
    m = PciSysfsModel(tmp_path)
    m.add_device(NIC, 0x8086, 0x10D3, 0x020000, numa_node=0, iommu_group=12, driver="e1000e")
    m.add_device(GPU, 0x10DE, 0x2330, 0x030200, numa_node=1, iommu_group=40, driver="nvidia")
    m.add_device(AUDIO, 0x10DE, 0x22BB, 0x040300, numa_node=1, iommu_group=40)
    yield m
    m.close()


def dev(model: PciSysfsModel, address: str) -> Path:
    return model.sysfs_root / "bus/pci/devices" / address


def test_the_model_is_a_sysfs_access_with_the_kernel_layout(model: PciSysfsModel) -> None:
    assert isinstance(model, SysfsAccess)
    folder = dev(model, NIC)
    assert model.read_text(folder / "vendor") == "0x8086"
    assert model.read_text(folder / "class") == "0x020000"
    assert model.read_text(folder / "numa_node") == "0"
    assert model.read_text(folder / "driver_override") == "(null)"
    assert model.link_name(folder / "driver") == "e1000e"
    assert model.link_name(folder / "iommu_group") == "12"
    assert model.listdir(model.sysfs_root / "kernel/iommu_groups/40/devices") == [GPU, AUDIO]
    assert model.exists(model.sysfs_root / "bus/pci/drivers/e1000e" / NIC)
    assert model.listdir(model.dev_root / "vfio") == ["vfio"]


def test_override_unbind_probe_moves_a_device_and_back(model: PciSysfsModel) -> None:
    folder = dev(model, NIC)
    model.write_text(folder / "driver_override", "vfio-pci\n")
    assert model.driver_of(NIC) == "e1000e"  # the override alone unbinds nothing
    model.write_text(folder / "driver" / "unbind", NIC)
    assert model.link_name(folder / "driver") is None
    assert not model.exists(model.sysfs_root / "bus/pci/drivers/e1000e" / NIC)
    model.write_text(model.sysfs_root / "bus/pci/drivers_probe", NIC)
    assert model.link_name(folder / "driver") == "vfio-pci"
    assert model.listdir(model.dev_root / "vfio") == ["12", "vfio"]
    model.write_text(folder / "driver" / "unbind", NIC)
    model.write_text(folder / "driver_override", "\n")
    assert model.read_text(folder / "driver_override") == "(null)"
    model.write_text(model.sysfs_root / "bus/pci/drivers_probe", NIC)
    assert model.link_name(folder / "driver") == "e1000e"
    assert model.listdir(model.dev_root / "vfio") == ["vfio"]


def test_one_vfio_member_creates_the_group_node(model: PciSysfsModel) -> None:
    model.write_text(dev(model, AUDIO) / "driver_override", "vfio-pci")
    model.write_text(model.sysfs_root / "bus/pci/drivers_probe", AUDIO)
    assert model.driver_of(GPU) == "nvidia"
    assert "40" in model.listdir(model.dev_root / "vfio")


def test_without_an_iommu_the_probe_fails_silently_and_bind_says_why(model: PciSysfsModel) -> None:
    model.set_iommu(False)
    assert model.listdir(model.sysfs_root / "kernel/iommu_groups") == []
    assert model.link_name(dev(model, NIC) / "iommu_group") is None
    model.write_text(dev(model, AUDIO) / "driver_override", "vfio-pci")
    model.write_text(model.sysfs_root / "bus/pci/drivers_probe", AUDIO)  # no error
    assert model.driver_of(AUDIO) is None
    with pytest.raises(OSError, match="Invalid argument") as excinfo:
        model.write_text(model.sysfs_root / "bus/pci/drivers/vfio-pci/bind", AUDIO)
    assert excinfo.value.errno == errno.EINVAL


@pytest.mark.parametrize(
    ("path", "data", "code"),
    [
        ("bus/pci/drivers_probe", "0000:ff:00.0", errno.ENODEV),
        ("bus/pci/drivers/vfio-pci/unbind", NIC, errno.ENODEV),
        ("bus/pci/drivers/vfio-pci/bind", NIC, errno.ENODEV),
        ("bus/pci/drivers/e1000e/bind", NIC, errno.EBUSY),
        (f"bus/pci/devices/{NIC}/vendor", "0x1234", errno.EACCES),
        (f"bus/pci/devices/{NIC}/no_such_attribute", "1", errno.ENOENT),
    ],
)
def test_refused_writes_fail_as_the_kernel_does(model: PciSysfsModel, path: str, data: str, code: int) -> None:
    with pytest.raises(OSError, match=path.rsplit("/", 1)[-1]) as excinfo:
        model.write_text(model.sysfs_root / path, data)
    assert excinfo.value.errno == code


def test_new_id_binds_every_unbound_device_with_that_id(model: PciSysfsModel) -> None:
    model.write_text(model.sysfs_root / "bus/pci/drivers/vfio-pci/new_id", "10de 22bb")
    assert model.driver_of(AUDIO) == "vfio-pci"
    assert model.driver_of(GPU) == "nvidia"


def test_a_busy_device_refuses_unbind(model: PciSysfsModel) -> None:
    model.set_busy(NIC)
    with pytest.raises(OSError, match="busy") as excinfo:
        model.write_text(model.sysfs_root / "bus/pci/drivers/e1000e/unbind", NIC)
    assert excinfo.value.errno == errno.EBUSY
    assert model.driver_of(NIC) == "e1000e"


def test_hot_removal_and_rescan(model: PciSysfsModel) -> None:
    model.write_text(dev(model, NIC) / "driver_override", "vfio-pci")
    model.write_text(dev(model, NIC) / "remove", "1")
    assert not model.exists(model.sysfs_root / "bus/pci/devices" / NIC)
    assert model.listdir(model.sysfs_root / "kernel/iommu_groups") == ["40"]
    model.write_text(model.sysfs_root / "bus/pci/rescan", "1")
    assert model.driver_of(NIC) == "e1000e"  # back as a new device: no override, probed
    model.remove_device(GPU)
    assert model.listdir(model.sysfs_root / "bus/pci/devices") == [NIC, AUDIO]


def test_grab_and_unload(model: PciSysfsModel) -> None:
    model.grab(AUDIO, "snd_hda_intel")
    assert model.link_name(dev(model, AUDIO) / "driver") == "snd_hda_intel"
    model.unload_driver("snd_hda_intel")
    assert model.driver_of(AUDIO) is None
    assert not model.exists(model.sysfs_root / "bus/pci/drivers/snd_hda_intel")


def test_writes_are_recorded(model: PciSysfsModel) -> None:
    model.write_text(dev(model, NIC) / "driver_override", "vfio-pci")
    assert model.writes == [(f"devices/pci0000:00/{NIC}/driver_override", "vfio-pci")]


def test_host_sysfs_errors_name_the_path(tmp_path: Path) -> None:
    host = HostSysfs(tmp_path / "sys", tmp_path / "dev")
    with pytest.raises(FileNotFoundError, match="open to write 'x'") as excinfo:
        host.write_text(tmp_path / "sys" / "missing", "x")
    assert excinfo.value.filename == str(tmp_path / "sys" / "missing")
    (tmp_path / "attr").write_text("")
    host.write_text(tmp_path / "attr", "value\n")
    assert host.read_text(tmp_path / "attr") == "value"
    assert host.link_name(tmp_path / "attr") is None


def test_a_state_file_shares_the_machine_across_instances(tmp_path: Path) -> None:
    state = tmp_path / "model.json"
    first = PciSysfsModel(tmp_path / "m", state_file=state)
    first.add_device(NIC, 0x8086, 0x10D3, 0x020000, numa_node=0, iommu_group=12, driver="e1000e")
    nic = dev(first, NIC)
    first.write_text(nic / "driver_override", "vfio-pci")
    first.write_text(first.sysfs_root / "bus/pci/drivers/e1000e/unbind", NIC)
    first.set_busy(NIC)
    # Another process (here: another instance) opens the same machine, as a restarted daemon would.
    second = PciSysfsModel(tmp_path / "m", state_file=state)
    assert second.devices == first.devices
    assert second.drivers == first.drivers
    second.write_text(second.sysfs_root / "bus/pci/drivers_probe", NIC)
    assert second.driver_of(NIC) == "vfio-pci"
    assert PciSysfsModel(tmp_path / "m", state_file=state).driver_of(NIC) == "vfio-pci"


def test_the_state_file_keeps_sriov(tmp_path: Path) -> None:
    """A model shared through ``state_file`` keeps a PF's SR-IOV capability and its VFs across processes."""
    state = tmp_path / "model.json"
    model = PciSysfsModel(tmp_path / "one", state_file=state)
    pf = model.add_device("0000:01:00.0", 0x1B36, 0x0010, 0x010802, driver="nvme")
    model.enable_sriov(pf.address, total_vfs=4, vf_device=0x0010)
    model.write_text(model.sysfs_root / "bus/pci/devices" / pf.address / "sriov_numvfs", "2")
    again = PciSysfsModel(tmp_path / "two", state_file=state)
    kept = again.devices[pf.address]
    assert kept.sriov is not None and kept.sriov.total_vfs == 4 and len(kept.sriov.vfs) == 2
    assert all(again.devices[vf].physfn == pf.address for vf in kept.sriov.vfs)
