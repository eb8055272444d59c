"""Fixtures for devplug-sriov's tests: the models and the real kernel behind one scenario, the VM, netns.

A scenario test takes ``backend`` (the VM's SR-IOV NVMe controller) or ``nic``
(the VM's SR-IOV NIC, QEMU's Intel 82576 on the kernel's igb and igbvf), each
parametrized over:

* ``model`` -- :class:`devplug.testing.pcisysfs.PciSysfsModel` laid out like the
  VM, with (for ``nic``) :class:`devplug_sriov.vfmodel.VfLinkModel` holding igb's rules;
* ``kernel`` (marked ``vm``) -- the real kernel in QEMU (``tools/vm/run_guest.py``).

On the host the ``kernel`` cases run together in one guest boot (pytest over
``-m vm`` inside the VM, with ``DEVPLUG_VM_GUEST=1``), and each host-side
``[kernel]`` case reports its guest twin's verdict. Missing QEMU or kernel
skips them loudly, and so does a QEMU without the ``igb`` device (before 8.0,
as Debian bookworm's own 7.2) for the ``nic`` cases; ``DEVPLUG_REQUIRE_VM=1``
(CI) fails them instead.

``netns`` gives a fresh network namespace with a veth pair (``pf0``/``pf0peer``),
removed afterwards, for the real netlink tests.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import pytest

from devplug.host.sysfs import HostSysfs, SysfsAccess
from devplug.kit.retries import DEVICE_RETRY_MAX
from devplug.testing.clock import ManualClock
from devplug.testing.harness import DriverHarness
from devplug.testing.pcisysfs import (
    PciSysfsModel,
    device_attribute,
    device_driver,
    device_iommu_group,
    device_present,
    write_device_attribute,
)
from devplug.testing.sysfsfaults import CrashingSysfs, SimulatedCrash  # noqa: F401 (test modules use kit.*)
from devplug.testing.vm import ModelBackend, VmRun, VmSuite
from devplug.testing.waiting import poll_until
from devplug_sriov import SriovDriver, SriovOptions
from devplug_sriov.netlink import LINK_STATE_AUTO, ZERO_MAC, NetlinkVfLinks, VfLinks, VfState
from devplug_sriov.vfmodel import IGB_VF_OPS, VfLinkModel

REPO = Path(__file__).resolve().parents[3]
RESOURCE = "example.com/vf"
WAIT = 20.0  # seconds: a bound on "eventually", never a timing assertion
#: The same bound in the VM on the emulated 82576 (TCG): VF creation and each VF setting are mailbox round trips
#: to igbvf, read back, and took 15-30 s for a daemon's set-up or a two-VF release beside a failing reset (seen in
#: CI-like runs); a bound, never a timing assertion.
VM_WAIT = 90.0

# The VM's SR-IOV PF (tools/vm/run_guest.py): an NVMe controller behind the root port 00:07.0.
PF = "0000:02:00.0"
NVME = (0x1B36, 0x0010)
TOTAL_VFS = 4


#: The real-kernel half of the scenarios: every ``[kernel]`` case in one boot of tools/vm/run_guest.py's VM.
SUITE = VmSuite("sriov", runner=REPO / "tools" / "vm" / "run_guest.py", tests=Path(__file__).parent)
#: The two parametrizations of a scenario (the ``kernel`` one waits for the whole VM run on the host).
BACKENDS = SUITE.params()


def vf(index: int) -> str:
    """The address of VF ``index`` (offset 1, stride 1, as QEMU's NVMe has them)."""
    return f"0000:02:00.{index + 1}"


# The VM's SR-IOV NIC (tools/vm/run_guest.py --igb): QEMU's 82576 on igb, behind the root port 00:08.0.
NIC_PF = "0000:03:00.0"
NIC_PORT = "0000:00:08.0"
IGB = (0x8086, 0x10C9)
IGBVF_DEVICE = 0x10CA
NIC_TOTAL_VFS = 7
#: What igb reports for a VF it has just created (igb_vf_configure), as the model and the kernel both show.
NEW_VF = VfState(mac=ZERO_MAC, vlan=0, qos=0, spoofchk=True, trust=False, link_state=LINK_STATE_AUTO)


def nic_vf(index: int) -> str:
    """The address of the NIC's VF ``index``: the 82576's first VF offset is 128, its stride 2 (``sriov_offset``,
    ``sriov_stride``), so VF 0 is ``03:10.0`` and VF 1 ``03:10.2``."""
    routing = 0x80 + 2 * index
    return f"0000:03:{routing >> 3:02x}.{routing & 7}"


def eventually(predicate: Callable[[], object], what: str, timeout: float = WAIT) -> None:
    """The kit's :func:`~devplug.testing.waiting.poll_until`, by this suite's name for it."""
    poll_until(predicate, what, timeout)


# --- backends --------------------------------------------------------------------


class Backend(Protocol):
    """A kernel a scenario runs against."""

    name: str
    sysfs: SysfsAccess


def build_model(root: Path) -> PciSysfsModel:
    """The VM's SR-IOV part, in the model: a root port, and the NVMe PF on nvme with 4 VFs at most."""
    model = PciSysfsModel(root)
    model.add_device("0000:00:07.0", 0x1B36, 0x000C, 0x060400, iommu_group=8, driver="pcieport")
    model.add_device(PF, *NVME, 0x010802, iommu_group=9, driver="nvme")
    model.enable_sriov(PF, TOTAL_VFS, NVME[1], vf_driver="nvme")
    return model


@dataclass
class KernelBackend:
    """The guest's real kernel; :meth:`reset` puts the PF back as at boot (no VFs, autoprobe 1)."""

    sysfs: SysfsAccess = field(default_factory=lambda: HostSysfs(Path("/sys"), Path("/dev")))
    name: str = "kernel"

    def reset(self) -> None:
        folder = self.sysfs.sysfs_root / "bus/pci/devices" / PF
        for index in range(TOTAL_VFS):
            vf_dir = self.sysfs.sysfs_root / "bus/pci/devices" / vf(index)
            if self.sysfs.exists(vf_dir) and self.sysfs.link_name(vf_dir / "driver") == "vfio-pci":
                self.sysfs.write_text(self.sysfs.sysfs_root / "bus/pci/drivers/vfio-pci/unbind", vf(index))
        self.sysfs.write_text(folder / "sriov_numvfs", "0")
        self.sysfs.write_text(folder / "sriov_drivers_autoprobe", "1")


def build_nic_model(root: Path) -> tuple[PciSysfsModel, VfLinkModel]:
    """The VM's NIC in the models: the root port, the 82576 PF on igb (interface ``eth1``, at most 7 VFs on igbvf,
    SR-IOV disabled by igb when the PF is removed), and the VF settings with igb's handlers."""
    model = PciSysfsModel(root)
    model.add_device(NIC_PORT, 0x1B36, 0x000C, 0x060400, iommu_group=10, driver="pcieport")
    model.add_device(NIC_PF, *IGB, 0x020000, iommu_group=11, driver="igb")
    model.enable_sriov(
        NIC_PF, NIC_TOTAL_VFS, IGBVF_DEVICE, offset=0x80, stride=2, vf_driver="igbvf", netdev="eth1",
        disabled_on_remove=True,
    )  # fmt: skip
    links = VfLinkModel()
    links.add_pf("eth1", ops=IGB_VF_OPS, pci=model, address=NIC_PF)
    return model, links


class Nic(Protocol):
    """The SR-IOV NIC a scenario runs against."""

    name: str
    sysfs: SysfsAccess
    links: VfLinks

    @property
    def pf_netdev(self) -> str: ...


@dataclass
class NicModel:
    """The NIC in the models."""

    model: PciSysfsModel
    links: VfLinkModel
    name: str = "model"

    @property
    def sysfs(self) -> SysfsAccess:
        return self.model

    @property
    def pf_netdev(self) -> str:
        return _netdev(self.model, NIC_PF)


def _netdev(sysfs: SysfsAccess, address: str) -> str:
    names = sysfs.listdir(sysfs.sysfs_root / "bus/pci/devices" / address / "net")
    assert len(names) == 1, f"{address} has network interfaces {names}"
    return names[0]


@dataclass
class NicKernel:
    """The guest's igb PF; :meth:`reset` puts it back as at boot (present, no VFs, autoprobe 1), its link up."""

    sysfs: SysfsAccess = field(default_factory=lambda: HostSysfs(Path("/sys"), Path("/dev")))
    links: NetlinkVfLinks = field(default_factory=NetlinkVfLinks)
    name: str = "kernel"

    @property
    def pf_netdev(self) -> str:
        return _netdev(self.sysfs, NIC_PF)

    def reset(self) -> None:
        from pyroute2 import IPRoute

        devices = self.sysfs.sysfs_root / "bus/pci/devices"
        if not self.sysfs.exists(devices / NIC_PF):
            self.sysfs.write_text(self.sysfs.sysfs_root / "bus/pci/rescan", "1")  # a PF removal test stopped early
        for index in range(NIC_TOTAL_VFS):
            if self.sysfs.exists(devices / nic_vf(index)) and driver_of(self.sysfs, nic_vf(index)) == "vfio-pci":
                self.sysfs.write_text(self.sysfs.sysfs_root / "bus/pci/drivers/vfio-pci/unbind", nic_vf(index))
        self.sysfs.write_text(devices / NIC_PF / "sriov_numvfs", "0")  # VFs made again start from igb's defaults
        self.sysfs.write_text(devices / NIC_PF / "sriov_drivers_autoprobe", "1")
        with IPRoute() as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname=self.pf_netdev)[0], state="up")


@pytest.fixture(params=BACKENDS)
def nic(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """The SR-IOV NIC a scenario runs against (see the module docstring)."""
    placeholder = SUITE.placeholder(request) if request.param == "kernel" else None
    if placeholder is not None and not placeholder.run.options["igb"]:
        SUITE.fail_or_skip(SUITE.warnings[0] if SUITE.warnings else "igb scenarios not run: no igb NIC")

    def real_nic() -> NicKernel:
        if not Path("/sys/bus/pci/devices", NIC_PORT).exists():
            pytest.skip("this VM was booted without the igb NIC (tools/vm/run_guest.py --igb)")
        return NicKernel()

    yield from SUITE.backend(request, model=lambda: NicModel(*build_nic_model(tmp_path / "machine")), kernel=real_nic)


# --- the VM, seen from the host ----------------------------------------------------


@pytest.fixture(scope="session")
def vm_run(tmp_path_factory: pytest.TempPathFactory) -> VmRun:
    """Boot the VM once (with the igb NIC when this QEMU has it) and run every ``vm`` test of this folder inside."""
    runner = SUITE.runner()
    igb = not runner.missing_assets() and runner.has_igb()
    if not igb and not SUITE.warnings and not runner.missing_assets():
        version = subprocess.run([runner.QEMU, "--version"], capture_output=True, text=True, check=False)
        SUITE.warnings.append(
            f"igb scenarios not run: {version.stdout.splitlines()[0] if version.stdout else runner.QEMU} has no "
            "'igb' device (QEMU >= 8.0 emulates the 82576; tools/vm/fetch-assets.sh installs it from "
            "bookworm-backports)"
        )
    return SUITE.run(tmp_path_factory, igb=igb)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """The kernel a scenario runs against (see the module docstring)."""
    yield from SUITE.backend(
        request, model=lambda: ModelBackend(build_model(tmp_path / "machine")), kernel=KernelBackend
    )


# --- driving the driver as the engine does ------------------------------------------


@pytest.fixture
def clock() -> ManualClock:
    """The clock of the drivers ``make_harness`` makes (their retries' backoff): it moves only when a test moves
    it, so a test says when a failed reset is due again (:data:`RETRY_DUE`) instead of sleeping."""
    return ManualClock()


#: Seconds after which any failed reset is due again: the longest wait of the driver's backoff.
RETRY_DUE = DEVICE_RETRY_MAX


@pytest.fixture
def make_harness(driver_harness: Callable[..., DriverHarness], clock: ManualClock) -> Callable[..., DriverHarness]:
    """``make_harness(sysfs, links=..., resource=..., state_dir=..., **options)``: the kit's ``driver_harness``
    on an sriov driver (on a netlink model unless ``links`` is given) whose whole lists are pushed, its retries
    on the test's ``clock``."""

    def make(
        sysfs: SysfsAccess,
        links: VfLinks | None = None,
        resource: str = RESOURCE,
        state_dir: Path | None = None,
        **options: Any,
    ) -> DriverHarness:
        options.setdefault("rescan_interval", 0)
        driver = SriovDriver(
            SriovOptions(**options), access=sysfs, links=links if links is not None else VfLinkModel(), clock=clock
        )
        return driver_harness(driver, resource, state_dir, push_kinds=("replace",))

    return make


# --- reading the machine ---------------------------------------------------------------

attr = device_attribute
write_attr = write_device_attribute
driver_of = device_driver
present = device_present
group_of = device_iommu_group


@pytest.fixture
def kit() -> ModuleType:
    """This module, for its helpers and constants (test modules cannot import a conftest by name)."""
    return sys.modules[__name__]


# --- network namespaces ------------------------------------------------------------------


@dataclass(frozen=True)
class NetNs:
    """A network namespace of the test's own with a veth pair ``pf0`` / ``pf0peer`` (both down)."""

    name: str


@pytest.fixture
def netns() -> Iterator[NetNs]:
    """A fresh named network namespace, removed afterwards (skipped where namespaces cannot be made)."""
    from pyroute2 import IPRoute
    from pyroute2 import netns as pyroute2_netns

    name = f"devplug-sriov-{uuid.uuid4().hex[:8]}"
    try:
        pyroute2_netns.create(name)
    except OSError as exc:
        pytest.skip(f"cannot create a network namespace here ({exc}); run as root")
    try:
        with IPRoute(netns=name) as ipr:
            ipr.link("add", ifname="pf0", kind="veth", peer="pf0peer")
        yield NetNs(name)
    finally:
        pyroute2_netns.remove(name)


def set_link(ns: NetNs, ifname: str, up: bool) -> None:
    """``ip link set dev IFNAME up|down`` in the namespace, through pyroute2."""
    from pyroute2 import IPRoute

    with IPRoute(netns=ns.name) as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname=ifname)[0], state="up" if up else "down")


def run_setup(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m devplug_sriov.setup ARGS``."""
    return subprocess.run(
        [sys.executable, "-m", "devplug_sriov.setup", *args], capture_output=True, text=True, timeout=60, check=False
    )
