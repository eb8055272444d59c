"""Fixtures for devplug-vfio's tests: two kernels behind one scenario, and the VM that runs the real one.

A scenario test takes the ``backend`` fixture, parametrized over:

* ``model`` -- :class:`devplug.testing.pcisysfs.PciSysfsModel`, laid out like the VM;
* ``kernel`` (marked ``vm``) -- the real kernel in QEMU (``tools/vm/run_guest.py``).

On the host, the ``kernel`` cases run all together in one guest boot (a
pytest session over ``-m vm`` inside the VM, with ``DEVPLUG_VM_GUEST=1``),
and each host-side ``[kernel]`` case reports its guest twin's verdict. In the
guest, the ``kernel`` backend is the real ``/sys`` and ``/dev``. When QEMU or
the kernel is missing the ``kernel`` cases are skipped, loudly; with
``DEVPLUG_REQUIRE_VM=1`` (CI) they fail instead.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import pytest

from devplug.host.sysfs import HostSysfs, SysfsAccess
from devplug.testing import vm
from devplug.testing.harness import DriverHarness
from devplug.testing.pcisysfs import PciSysfsModel, device_attribute, device_driver, device_iommu_group
from devplug.testing.sysfsfaults import CrashingSysfs, SimulatedCrash  # noqa: F401 (test modules use kit.*)
from devplug.testing.vm import VmRun, VmSuite
from devplug_vfio import VfioDriver, VfioOptions

REPO = Path(__file__).resolve().parents[3]
RESOURCE = "example.com/vfio"

#: The real-kernel half of the scenarios: every ``[kernel]`` case in one boot of tools/vm/run_guest.py's VM.
SUITE = VmSuite("vfio", runner=REPO / "tools" / "vm" / "run_guest.py", tests=Path(__file__).parent)

# The machine of tools/vm/run_guest.py; the model copies it.
LONE = "0000:00:03.0"  # edu: no driver, alone in its group
NIC = "0000:00:04.0"  # e1000e, alone in its group
PAIR = ("0000:00:05.0", "0000:00:05.1")  # two edu functions sharing a group
BRIDGE = "0000:00:06.0"  # an empty PCIe root port on pcieport
EDU = (0x1234, 0x11E8)
E1000E = (0x8086, 0x10D3)


# --- backends --------------------------------------------------------------------


class Backend(Protocol):
    """A kernel a scenario runs against."""

    name: str
    sysfs: SysfsAccess

    def unload_vfio_pci(self) -> None: ...

    def load_vfio_pci(self) -> None: ...


def build_model(root: Path) -> PciSysfsModel:
    """The VM's PCI devices, in the model."""
    model = PciSysfsModel(root)
    model.add_device("0000:00:00.0", 0x8086, 0x29C0, 0x060000, iommu_group=0)
    model.add_device("0000:00:01.0", 0x1AF4, 0x1009, 0x000200, iommu_group=1, driver="virtio-pci")
    model.add_device("0000:00:02.0", 0x1AF4, 0x1009, 0x000200, iommu_group=2, driver="virtio-pci")
    model.add_device(LONE, *EDU, 0x00FF00, iommu_group=3)
    model.add_device(NIC, *E1000E, 0x020000, iommu_group=4, driver="e1000e")
    model.add_device(PAIR[0], *EDU, 0x00FF00, iommu_group=5)
    model.add_device(PAIR[1], *EDU, 0x00FF00, iommu_group=5)
    model.add_device(BRIDGE, 0x1B36, 0x000C, 0x060400, iommu_group=7, driver="pcieport")
    model.add_device("0000:00:1f.0", 0x8086, 0x2918, 0x060100, iommu_group=6)
    model.add_device("0000:00:1f.2", 0x8086, 0x2922, 0x010601, iommu_group=6)
    model.add_device("0000:00:1f.3", 0x8086, 0x2930, 0x0C0500, iommu_group=6)
    return model


class ModelBackend(vm.ModelBackend):
    """The kernel model, whose vfio-pci driver a scenario may unload and load."""

    def unload_vfio_pci(self) -> None:
        self.model.unload_driver("vfio-pci")

    def load_vfio_pci(self) -> None:
        self.model.load_driver("vfio-pci")


def _busybox(*args: str) -> None:
    subprocess.run(["/bin/busybox", *args], check=True, capture_output=True, text=True)


@dataclass
class KernelBackend:
    """The real kernel of the guest; :meth:`reset` puts the test devices back as they were at boot."""

    sysfs: SysfsAccess = field(default_factory=lambda: HostSysfs(Path("/sys"), Path("/dev")))
    name: str = "kernel"
    baseline: dict[str, str | None] = field(
        default_factory=lambda: {LONE: None, NIC: "e1000e", PAIR[0]: None, PAIR[1]: None, BRIDGE: "pcieport"}
    )

    def unload_vfio_pci(self) -> None:
        _busybox("rmmod", "vfio_pci")

    def load_vfio_pci(self) -> None:
        _busybox("modprobe", "vfio-pci")

    def _driver(self, address: str) -> str | None:
        return self.sysfs.link_name(self.sysfs.sysfs_root / "bus/pci/devices" / address / "driver")

    def reset(self) -> None:
        """Put the test devices back as at boot, and check they are."""
        self._restore()
        self.check_baseline()

    def _restore(self) -> None:
        sys_root = self.sysfs.sysfs_root
        if not self.sysfs.exists(sys_root / "bus/pci/drivers/vfio-pci"):
            self.load_vfio_pci()
        if any(not self.sysfs.exists(sys_root / "bus/pci/devices" / a) for a in self.baseline):
            self.sysfs.write_text(sys_root / "bus/pci/rescan", "1")
        for address, want in self.baseline.items():
            folder = sys_root / "bus/pci/devices" / address
            current = self._driver(address)
            if current is not None and current != want:
                self.sysfs.write_text(sys_root / "bus/pci/drivers" / current / "unbind", address)
            if self.sysfs.read_text(folder / "driver_override") != "(null)":
                self.sysfs.write_text(folder / "driver_override", "\n")
            if want is not None and self._driver(address) is None:
                self.sysfs.write_text(sys_root / "bus/pci/drivers_probe", address)

    def check_baseline(self) -> None:
        found = {a: self._driver(a) for a in self.baseline}
        if found != self.baseline:
            raise AssertionError(f"the guest's devices are not as at boot: {found} (expected {self.baseline})")


# --- the VM, seen from the host ----------------------------------------------------


@pytest.fixture(scope="session")
def vm_run(tmp_path_factory: pytest.TempPathFactory) -> VmRun:
    """Boot the VM once and run every ``vm`` test of this folder inside it."""
    return SUITE.run(tmp_path_factory)


@pytest.fixture(params=SUITE.params())
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """The kernel a scenario runs against (see the module docstring)."""
    yield from SUITE.backend(
        request, model=lambda: ModelBackend(build_model(tmp_path / "machine")), kernel=KernelBackend
    )


# --- driving the driver as the engine does ------------------------------------------


@pytest.fixture
def make_harness(driver_harness: Callable[..., DriverHarness]) -> Callable[..., DriverHarness]:
    """``make_harness(sysfs, resource=..., state_dir=..., **options)``: the kit's ``driver_harness`` on a vfio
    driver whose whole lists are pushed (``replace``); stopped afterwards."""

    def make(
        sysfs: SysfsAccess, resource: str = RESOURCE, state_dir: Path | None = None, **options: Any
    ) -> DriverHarness:
        options.setdefault("rescan_interval", 0)
        driver = VfioDriver(VfioOptions(**options), access=sysfs)
        return driver_harness(driver, resource, state_dir, push_kinds=("replace",))

    return make


# --- reading the machine ---------------------------------------------------------------


driver_of = device_driver


def override_of(sysfs: SysfsAccess, address: str) -> str:
    """The device's ``driver_override`` as read (``(null)`` when unset)."""
    return device_attribute(sysfs, address, "driver_override")


group_of = device_iommu_group


def vfio_nodes(sysfs: SysfsAccess) -> list[str]:
    """The entries of /dev/vfio."""
    return sysfs.listdir(sysfs.dev_root / "vfio")


@pytest.fixture
def kit() -> ModuleType:
    """This module, for its helpers and constants (test modules cannot import a conftest by name)."""
    return sys.modules[__name__]
