"""The sysfs class-tree model: the layout of sysfs-rules.rst, attribute semantics of sysfs.rst and kernfs, hot
removal and failing reads, seen through the model's door and through plain file reads (another process's view)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devplug.host.sysfs import HostSysfs, SysfsAccess
from devplug.testing.classsysfs import SysfsClassModel
from devplug.testing.devnodes import is_device_node

PARENT = "pci0000:00/0000:00:04.0"


def _nvme(model: SysfsClassModel, name: str = "nvme0", **extra: str) -> Path:
    return model.add_device(
        "nvme",
        name,
        {"model": "QEMU NVMe Ctrl", "serial": f"SN-{name}", **extra},
        writable={"reset_controller": None, "power_mode": ["on", "off"]},
        parent=PARENT,
        number=(240, int(name[-1])),
    )


def test_the_layout_is_the_kernels(sysfs_class_tree: SysfsClassModel) -> None:
    model = sysfs_class_tree
    folder = _nvme(model)
    sys_root = model.sysfs_root
    assert folder == sys_root / "devices" / PARENT / "nvme" / "nvme0"
    link = sys_root / "class/nvme/nvme0"
    assert link.is_symlink() and Path(os.path.realpath(link)) == folder
    assert Path(os.path.realpath(folder / "subsystem")) == sys_root / "class/nvme"
    assert Path(os.path.realpath(folder / "device")) == sys_root / "devices" / PARENT
    assert (folder / "dev").read_text() == "240:0\n"
    assert (folder / "uevent").read_text().split() == ["MAJOR=240", "MINOR=0", "DEVNAME=nvme0"]
    assert is_device_node(model.node("nvme0"))
    assert (folder / "model").read_text() == "QEMU NVMe Ctrl\n"  # one value, newline-terminated
    assert model.devices("nvme") == ["nvme0"]


def test_a_virtual_device_without_a_node(sysfs_class_tree: SysfsClassModel) -> None:
    folder = sysfs_class_tree.add_device("misc_acc", "acc0", {"state": "ready"}, number=None)
    assert folder == sysfs_class_tree.sysfs_root / "devices/virtual/misc_acc/acc0"
    assert not (folder / "device").exists() and not (folder / "dev").exists()
    assert (folder / "uevent").read_text() == "\n"
    assert not sysfs_class_tree.node("acc0").exists()


def test_another_process_reads_what_the_model_shows(sysfs_class_tree: SysfsClassModel) -> None:
    _nvme(sysfs_class_tree)
    sysfs_class_tree.set_attribute("nvme", "nvme0", "model", "Other Ctrl")
    code = (
        "import sys; from pathlib import Path; from devplug.host.sysfs import HostSysfs; "
        "print(HostSysfs(Path(sys.argv[1])).read_text(Path(sys.argv[1]) / 'class/nvme/nvme0/model'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(sysfs_class_tree.sysfs_root)], capture_output=True, text=True, check=True
    )
    assert out.stdout == "Other Ctrl\n"


def test_a_read_only_attribute_refuses_writes_with_eacces(sysfs_class_tree: SysfsClassModel) -> None:
    _nvme(sysfs_class_tree)
    path = sysfs_class_tree.sysfs_root / "class/nvme/nvme0/serial"
    assert not sysfs_class_tree.writable(path)
    with pytest.raises(PermissionError) as caught:
        sysfs_class_tree.write_text(path, "other")
    assert caught.value.errno == errno.EACCES and caught.value.filename == str(path)
    assert sysfs_class_tree.read_text(path) == "SN-nvme0"


def test_a_store_takes_what_it_accepts_and_refuses_the_rest_with_einval(sysfs_class_tree: SysfsClassModel) -> None:
    _nvme(sysfs_class_tree)
    path = sysfs_class_tree.sysfs_root / "class/nvme/nvme0/power_mode"
    assert sysfs_class_tree.read_text(path) == "on"  # the first accepted value
    assert sysfs_class_tree.writable(path)
    sysfs_class_tree.write_text(path, "off\n")
    assert path.read_text() == "off\n"
    with pytest.raises(OSError, match="Invalid argument") as caught:
        sysfs_class_tree.write_text(path, "sideways")
    assert caught.value.errno == errno.EINVAL
    assert sysfs_class_tree.read_text(path) == "off"  # nothing changed
    sysfs_class_tree.write_text(sysfs_class_tree.sysfs_root / "class/nvme/nvme0/reset_controller", "1")


def test_hot_removal_takes_link_folder_and_node(sysfs_class_tree: SysfsClassModel) -> None:
    model = sysfs_class_tree
    folder = _nvme(model)
    _nvme(model, "nvme1")
    model.fail_reads("nvme", "nvme1", "model")
    model.remove_device("nvme", "nvme0")
    assert model.devices("nvme") == ["nvme1"]
    assert not folder.exists() and not model.node("nvme0").exists()
    with pytest.raises(FileNotFoundError):
        model.read_text(model.sysfs_root / "class/nvme/nvme0/model")
    # another device's fault survives a removal
    with pytest.raises(OSError, match="Input/output error"):
        model.read_text(model.sysfs_root / "class/nvme/nvme1/model")
    _nvme(model)  # the same name again is a new device
    assert model.read_text(model.sysfs_root / "class/nvme/nvme0/serial") == "SN-nvme0"


def test_a_device_name_is_taken_once(sysfs_class_tree: SysfsClassModel) -> None:
    _nvme(sysfs_class_tree)
    with pytest.raises(FileExistsError, match="nvme already has a device nvme0"):
        _nvme(sysfs_class_tree)


def test_failing_reads_raise_the_errno_until_healed(sysfs_class_tree: SysfsClassModel) -> None:
    _nvme(sysfs_class_tree, state="live")
    path = sysfs_class_tree.sysfs_root / "class/nvme/nvme0/state"
    sysfs_class_tree.fail_reads("nvme", "nvme0", "state", "ENODEV")
    with pytest.raises(OSError, match="No such device") as caught:
        sysfs_class_tree.read_text(path)
    assert caught.value.errno == errno.ENODEV and caught.value.filename == str(path)
    assert sysfs_class_tree.read_text(path.with_name("model")) == "QEMU NVMe Ctrl"  # only that attribute
    sysfs_class_tree.heal_reads("nvme", "nvme0", "state")
    assert sysfs_class_tree.read_text(path) == "live"
    with pytest.raises(ValueError, match="unknown errno 'EWHATEVER'"):
        sysfs_class_tree.fail_reads("nvme", "nvme0", "state", "EWHATEVER")
    with pytest.raises(FileNotFoundError, match="nvme/nvme0 has no attribute nope"):
        sysfs_class_tree.fail_reads("nvme", "nvme0", "nope")


def test_it_is_a_sysfs_door_and_reads_as_the_host_does(sysfs_class_tree: SysfsClassModel) -> None:
    _nvme(sysfs_class_tree)
    assert isinstance(sysfs_class_tree, SysfsAccess)
    host = HostSysfs(sysfs_class_tree.sysfs_root, sysfs_class_tree.dev_root)
    folder = sysfs_class_tree.sysfs_root / "class/nvme/nvme0"
    for door in (sysfs_class_tree, host):
        assert door.listdir(sysfs_class_tree.sysfs_root / "class/nvme") == ["nvme0"]
        assert door.is_dir(folder) and door.exists(folder / "serial")
        assert door.link_name(folder / "subsystem") == "nvme"
        assert door.link_name(folder / "device") == "0000:00:04.0"
        assert door.read_text(folder / "dev") == "240:0"
