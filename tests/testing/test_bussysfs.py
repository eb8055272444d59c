"""The /sys/bus/<bus> model against the kernel's documented behaviour (``drivers/base/bus.c`` ``bind_store``,
``unbind_store``, ``drivers_probe_store``; ``drivers/base/dd.c``; ``Documentation/ABI/testing/sysfs-bus-pci`` and
``sysfs-bus-platform``, "driver_override"), each case as a driver sees it: through its SysfsAccess."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path

import pytest

from devplug.host.sysfs import HostSysfs, SysfsAccess
from devplug.testing.bussysfs import SysBusModel
from devplug.testing.devnodes import is_device_node
from devplug.testing.sysfsfiles import SysfsFiles

Bus = Callable[..., SysBusModel]


def _dsa(sysfs_bus: Bus) -> SysBusModel:
    model = sysfs_bus("dsa")
    model.add_device("wq0.0", {"mode": "dedicated"})
    model.add_device("wq0.1", {"mode": "shared"})
    model.load_driver("user", ["wq*"], node="dsa/{name}")
    return model


def _write(model: SysBusModel, rel: str, value: str) -> None:
    model.write_text(model.sysfs_root / rel, value)


def _errno(model: SysBusModel, rel: str, value: str) -> int | None:
    with pytest.raises(OSError, match="write") as caught:
        _write(model, rel, value)
    return caught.value.errno


def test_the_models_are_sysfs_accesses(tmp_path: Path, sysfs_bus: Bus) -> None:
    assert isinstance(sysfs_bus("dsa"), SysfsAccess)
    assert isinstance(SysfsFiles(tmp_path), SysfsAccess)


def test_the_tree_is_shaped_as_the_kernels(sysfs_bus: Bus) -> None:
    model = _dsa(sysfs_bus)
    host = HostSysfs(model.sysfs_root, model.dev_root)
    bus = model.sysfs_root / "bus" / "dsa"
    assert host.listdir(bus / "devices") == ["wq0.0", "wq0.1"]
    assert host.read_text(bus / "devices" / "wq0.1" / "mode") == "shared"
    assert host.link_name(bus / "devices" / "wq0.0" / "subsystem") == "dsa"
    assert host.link_name(bus / "devices" / "wq0.0" / "driver") == "user"  # autoprobe took it
    assert sorted(host.listdir(bus / "drivers" / "user")) == ["bind", "uevent", "unbind", "wq0.0", "wq0.1"]
    assert {"drivers_probe", "drivers_autoprobe", "uevent"} <= set(host.listdir(bus))
    assert not host.exists(bus / "devices" / "wq0.0" / "driver_override")  # a bus without overrides
    assert is_device_node(model.dev_root / "dsa" / "wq0.0")


def test_unbind_detaches_and_takes_the_node_away(sysfs_bus: Bus) -> None:
    model = _dsa(sysfs_bus)
    _write(model, "bus/dsa/drivers/user/unbind", "wq0.0\n")  # sysfs_streq: the trailing newline is ignored
    assert model.driver_of("wq0.0") is None
    assert not (model.sysfs_root / "bus/dsa/drivers/user/wq0.0").exists()
    assert not (model.dev_root / "dsa" / "wq0.0").exists()
    assert model.node("wq0.1") == model.dev_root / "dsa" / "wq0.1"


def test_unbind_of_a_device_not_bound_to_that_driver_is_enodev(sysfs_bus: Bus) -> None:
    # unbind_store: err = -ENODEV unless dev->driver == drv
    model = _dsa(sysfs_bus)
    model.load_driver("dmaengine", [])
    assert _errno(model, "bus/dsa/drivers/dmaengine/unbind", "wq0.0") == errno.ENODEV
    _write(model, "bus/dsa/drivers/user/unbind", "wq0.0")
    assert _errno(model, "bus/dsa/drivers/user/unbind", "wq0.0") == errno.ENODEV  # no driver at all
    assert _errno(model, "bus/dsa/drivers/user/unbind", "wq9.9") == errno.ENODEV  # no such device


def test_bind_of_a_bound_device_is_ebusy_and_of_a_stranger_enodev(sysfs_bus: Bus) -> None:
    model = _dsa(sysfs_bus)
    model.load_driver("dmaengine", ["wq*"])
    assert _errno(model, "bus/dsa/drivers/dmaengine/bind", "wq0.0") == errno.EBUSY
    model.load_driver("crypto", ["iax*"])
    _write(model, "bus/dsa/drivers/user/unbind", "wq0.0")
    assert _errno(model, "bus/dsa/drivers/crypto/bind", "wq0.0") == errno.ENODEV  # driver_match_device fails
    assert _errno(model, "bus/dsa/drivers/dmaengine/bind", "wq7.0") == errno.ENODEV
    _write(model, "bus/dsa/drivers/dmaengine/bind", "wq0.0")
    assert model.driver_of("wq0.0") == "dmaengine"
    assert model.node("wq0.0") is None  # dmaengine makes no node


def test_a_failing_probe_is_the_binds_error_and_silent_through_drivers_probe(sysfs_bus: Bus) -> None:
    model = _dsa(sysfs_bus)
    _write(model, "bus/dsa/drivers/user/unbind", "wq0.0")
    model.fail_probe("user", "wq0.0", "EINVAL")
    assert _errno(model, "bus/dsa/drivers/user/bind", "wq0.0") == errno.EINVAL
    _write(model, "bus/dsa/drivers_probe", "wq0.0")  # succeeds, binds nothing
    assert model.driver_of("wq0.0") is None
    model.fail_probe("user", "wq0.0", None)
    _write(model, "bus/dsa/drivers_probe", "wq0.0")
    assert model.driver_of("wq0.0") == "user"
    assert _errno(model, "bus/dsa/drivers_probe", "wq5.5") == errno.ENODEV


def test_a_busy_device_refuses_unbind(sysfs_bus: Bus) -> None:
    model = _dsa(sysfs_bus)
    model.set_busy("wq0.1")
    assert _errno(model, "bus/dsa/drivers/user/unbind", "wq0.1") == errno.EBUSY
    assert model.driver_of("wq0.1") == "user"


def test_driver_override_decides_alone_and_writing_it_moves_nothing(sysfs_bus: Bus) -> None:
    model = sysfs_bus("platform", overrides=True)
    model.add_device("serial8250", {})
    model.load_driver("serial8250", ["serial*"])
    model.load_driver("vfio-platform", [])
    dev = "bus/platform/devices/serial8250/driver_override"
    assert model.read_text(model.sysfs_root / dev) == "(null)"
    _write(model, dev, "vfio-platform")
    assert model.override_of("serial8250") == "vfio-platform"
    assert model.driver_of("serial8250") == "serial8250"  # neither unbinds nor probes
    _write(model, "bus/platform/drivers/serial8250/unbind", "serial8250")
    assert _errno(model, "bus/platform/drivers/serial8250/bind", "serial8250") == errno.ENODEV
    _write(model, "bus/platform/drivers_probe", "serial8250")
    assert model.driver_of("serial8250") == "vfio-platform"
    _write(model, "bus/platform/drivers/vfio-platform/unbind", "serial8250")
    _write(model, dev, "\n")  # a lone newline clears it
    assert model.read_text(model.sysfs_root / dev) == "(null)"
    _write(model, "bus/platform/drivers_probe", "serial8250")
    assert model.driver_of("serial8250") == "serial8250"
    assert _errno(model, dev, "x" * 4096) == errno.E2BIG


def test_autoprobe_off_leaves_new_devices_unbound(sysfs_bus: Bus) -> None:
    model = _dsa(sysfs_bus)
    model.set_autoprobe(False)
    model.add_device("wq1.0", {})
    assert model.driver_of("wq1.0") is None
    assert model.read_text(model.sysfs_root / "bus/dsa/drivers_autoprobe") == "0"


def test_hot_removal_and_unloading(sysfs_bus: Bus) -> None:
    model = _dsa(sysfs_bus)
    model.remove_device("wq0.0")
    assert model.devices() == ["wq0.1"]
    assert not (model.dev_root / "dsa" / "wq0.0").exists()
    assert not (model.sysfs_root / "bus/dsa/drivers/user/wq0.0").exists()
    model.unload_driver("user")
    assert model.driver_of("wq0.1") is None
    assert not (model.sysfs_root / "bus/dsa/drivers/user").exists()
    with pytest.raises(FileNotFoundError):
        _write(model, "bus/dsa/drivers/user/bind", "wq0.1")


def test_read_only_attributes_refuse_writes(sysfs_bus: Bus) -> None:
    model = _dsa(sysfs_bus)
    mode = model.sysfs_root / "bus/dsa/devices/wq0.0/mode"
    assert not model.writable(mode)
    assert model.writable(model.sysfs_root / "bus/dsa/drivers/user/bind")
    with pytest.raises(PermissionError):
        model.write_text(mode, "shared")


def test_two_models_on_one_root_are_one_machine(tmp_path: Path, sysfs_bus: Bus) -> None:
    model = _dsa(sysfs_bus)
    other = SysBusModel(tmp_path / "machine", "dsa")  # as a daemon under test opens it
    other.write_text(other.sysfs_root / "bus/dsa/drivers/user/unbind", "wq0.1")
    assert model.driver_of("wq0.1") is None
    assert model.writes() == [("bus/dsa/drivers/user/unbind", "wq0.1")]
