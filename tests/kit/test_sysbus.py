"""The kit's /sys/bus/<bus> helper on the bus model (devplug.testing.bussysfs), and PciBus as its pci case on the
PCI model: every move verified on the ``driver`` link, every refusal a DriverError naming the device."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from devplug import DriverError
from devplug.kit import SysBus
from devplug.kit.pci import VFIO_PCI, PciBus
from devplug.testing.bussysfs import SysBusModel
from devplug.testing.pcisysfs import PciSysfsModel

Bus = Callable[..., SysBusModel]


@pytest.fixture
def dsa(sysfs_bus: Bus) -> SysBusModel:
    model = sysfs_bus("dsa")
    model.add_device("wq0.0", {"mode": "dedicated"})
    model.add_device("wq0.1", {"mode": "shared"})
    model.load_driver("dmaengine", ["wq*"])
    model.load_driver("user", ["wq*"], node="dsa/{name}")
    return model


def test_reading_the_bus(dsa: SysBusModel) -> None:
    bus = SysBus(dsa, "dsa")
    assert bus.devices() == ["wq0.0", "wq0.1"]
    assert bus.drivers() == ["dmaengine", "user"]
    assert bus.driver("wq0.0") == "dmaengine"
    assert bus.attribute("wq0.1", "mode") == "shared"
    assert bus.override("wq0.0") is None  # no driver_override on this bus
    assert bus.exists("wq0.0") and not bus.exists("wq9.9")
    assert SysBus(dsa, "cxl").devices() == [] and SysBus(dsa, "cxl").drivers() == []


@pytest.mark.parametrize("name", ["", "a/b", "..", "."])
def test_a_bus_name_is_one_folder(dsa: SysBusModel, name: str) -> None:
    with pytest.raises(ValueError, match="bus name"):
        SysBus(dsa, name)


def test_rebind_moves_the_device_and_says_who_had_it(dsa: SysBusModel) -> None:
    bus = SysBus(dsa, "dsa")
    assert bus.rebind("wq0.0", "user") == "dmaengine"
    assert dsa.driver_of("wq0.0") == "user"
    assert (dsa.dev_root / "dsa" / "wq0.0").exists()
    writes = len(dsa.writes())
    assert bus.rebind("wq0.0", "user") == "user"  # already there: nothing written
    assert len(dsa.writes()) == writes
    assert bus.unbind("wq0.0") == "user"
    assert bus.unbind("wq0.0") is None
    bus.bind("wq0.0", "user")
    bus.bind("wq0.0", "user")  # idempotent
    assert dsa.writes()[-1] == ("bus/dsa/drivers/user/bind", "wq0.0")


def test_bind_refuses_a_device_another_driver_holds(dsa: SysBusModel) -> None:
    with pytest.raises(DriverError, match=r"wq0\.0: dmaengine holds it, not user"):
        SysBus(dsa, "dsa").bind("wq0.0", "user")


def test_a_refused_bind_names_the_device_the_file_and_the_errno(dsa: SysBusModel) -> None:
    bus = SysBus(dsa, "dsa")
    bus.unbind("wq0.0")
    dsa.load_driver("crypto", ["iax*"])
    with pytest.raises(DriverError, match=r"wq0\.0: cannot bind it to crypto: .*No such device.*crypto/bind"):
        bus.bind("wq0.0", "crypto")


def test_a_failed_rebind_gives_the_device_back(dsa: SysBusModel) -> None:
    dsa.fail_probe("user", "wq0.0", "EIO")
    with pytest.raises(DriverError, match="dmaengine holds it again"):
        SysBus(dsa, "dsa").rebind("wq0.0", "user")
    assert dsa.driver_of("wq0.0") == "dmaengine"
    dsa.fail_probe("dmaengine", "wq0.0", "EIO")
    with pytest.raises(DriverError, match=r"left without a driver \(dmaengine did not take it back\)"):
        SysBus(dsa, "dsa").rebind("wq0.0", "user")
    assert dsa.driver_of("wq0.0") is None


def test_a_busy_device_is_not_unbound(dsa: SysBusModel) -> None:
    dsa.set_busy("wq0.1")
    with pytest.raises(DriverError, match=r"wq0\.1: cannot unbind it from dmaengine: .*busy"):
        SysBus(dsa, "dsa").rebind("wq0.1", "user")
    assert dsa.driver_of("wq0.1") == "dmaengine"


def test_the_override_way_and_back_on_a_bus_with_overrides(sysfs_bus: Bus) -> None:
    model = sysfs_bus("platform", overrides=True)
    model.add_device("dev0", {})
    model.load_driver("native", ["dev*"])
    model.load_driver("vfio-platform", [])
    bus = SysBus(model, "platform")
    bus.bind_by_override("dev0", "vfio-platform")
    assert (model.driver_of("dev0"), model.override_of("dev0")) == ("vfio-platform", "vfio-platform")
    bus.give_back("dev0", "native", taken_by="vfio-platform")
    assert (model.driver_of("dev0"), model.override_of("dev0")) == ("native", None)
    bus.give_back("dev0", "native", taken_by="vfio-platform")  # idempotent
    model.fail_probe("vfio-platform", "dev0")
    with pytest.raises(DriverError, match=r"did not bind it to vfio-platform \(driver now: none\); no IOMMU\?"):
        bus.bind_by_override("dev0", "vfio-platform", hint="no IOMMU?")


def test_give_back_leaves_a_device_another_driver_took(sysfs_bus: Bus, caplog: pytest.LogCaptureFixture) -> None:
    model = sysfs_bus("platform", overrides=True)
    model.add_device("dev0", {})
    model.load_driver("native", ["dev*"])
    model.load_driver("other", ["dev*"])
    with caplog.at_level(logging.WARNING, logger="devplug.kit.sysbus"):
        SysBus(model, "platform").give_back("dev0", "other", taken_by="vfio-platform")
    assert "dev0: now held by native, not other; leaving it there" in caplog.text
    assert model.driver_of("dev0") == "native"


def test_pcibus_is_the_pci_case_and_keeps_its_messages(caplog: pytest.LogCaptureFixture) -> None:
    model = PciSysfsModel(iommu=False)
    try:
        model.add_device("0000:00:05.0", 0x8086, 0x1234, 0x020000, iommu_group=5, driver="e1000e")
        bus = PciBus(model)
        assert isinstance(bus, SysBus) and bus.bus == "pci"
        assert bus.drivers() == sorted([VFIO_PCI, "e1000e"])
        with pytest.raises(DriverError) as caught:
            bus.bind_vfio("0000:00:05.0")
        assert str(caught.value) == (
            "0000:00:05.0: the kernel did not bind it to vfio-pci (driver now: none); "
            "vfio-pci's probe fails without an IOMMU for the device, see the kernel log (dmesg)"
        )
        model.set_iommu(True)
        bus.bind_vfio("0000:00:05.0")
        assert bus.driver("0000:00:05.0") == VFIO_PCI
        bus.restore("0000:00:05.0", "e1000e")
        assert (bus.driver("0000:00:05.0"), bus.override("0000:00:05.0")) == ("e1000e", None)
        model.grab("0000:00:05.0", "igb")
        with caplog.at_level(logging.WARNING, logger="devplug.kit.pci"):
            bus.restore("0000:00:05.0", "e1000e")
        assert "0000:00:05.0: now held by igb, not e1000e; leaving it there" in caplog.text
        model.unload_driver("e1000e")
        model.unload_driver("igb")
        with pytest.raises(DriverError, match=r"e1000e did not take the device back .* is the e1000e module loaded"):
            bus.restore("0000:00:05.0", "e1000e")
    finally:
        model.close()
