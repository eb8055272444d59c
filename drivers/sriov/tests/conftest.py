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

import importlib.util
import os
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import pytest

from devplug import DriverContext
from devplug.drivers import DriverHooks
from devplug.sysfs import HostSysfs, SysfsAccess
from devplug.testing.pcisysfs import PciSysfsModel
from devplug.testing.sink import RecordingSink
from devplug_sriov import SriovDriver, SriovOptions
from devplug_sriov.netlink import LINK_STATE_AUTO, ZERO_MAC, NetlinkVfLinks, VfLinks, VfState
from devplug_sriov.vfmodel import IGB_VF_OPS, VfLinkModel

IN_GUEST = os.environ.get("DEVPLUG_VM_GUEST") == "1"
REQUIRE_VM = os.environ.get("DEVPLUG_REQUIRE_VM") == "1"
REPO = Path(__file__).resolve().parents[3]
RESOURCE = "example.com/vf"
WAIT = 20.0  # seconds: a bound on "eventually", never a timing assertion

# The VM's SR-IOV PF (tools/vm/run_guest.py): an NVMe controller behind the root port 00:07.0.
PF = "0000:02:00.0"
NVME = (0x1B36, 0x0010)
TOTAL_VFS = 4


#: The two parametrizations of a scenario. On the host, the first ``kernel`` case waits for the whole VM run (its
#: boot and every guest case, a few minutes under TCG), which pytest-timeout's 120 s per test would cut short.
BACKENDS = [
    pytest.param("model", id="model"),
    pytest.param("kernel", id="kernel", marks=[pytest.mark.vm, *([] if IN_GUEST else [pytest.mark.timeout(900)])]),
]


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
    """Poll until ``predicate()`` is true; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened within {timeout:g} s: {what}")
        time.sleep(0.05)


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
class ModelBackend:
    """The kernel model."""

    model: PciSysfsModel
    name: str = "model"

    @property
    def sysfs(self) -> SysfsAccess:
        return self.model


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
    if request.param == "model":
        yield NicModel(*build_nic_model(tmp_path / "machine"))
        return
    if not IN_GUEST:
        run: VmRun = request.getfixturevalue("vm_run")
        if not run.igb:
            reason = _vm_status["igb_skipped"]
            if REQUIRE_VM:
                pytest.fail(reason + " [DEVPLUG_REQUIRE_VM=1]", pytrace=False)
            pytest.skip(reason)
        yield HostPlaceholder(run)
        return
    if not Path("/sys/bus/pci/devices", NIC_PORT).exists():
        pytest.skip("this VM was booted without the igb NIC (tools/vm/run_guest.py --igb)")
    kernel = NicKernel()
    kernel.reset()
    try:
        yield kernel
    finally:
        kernel.reset()


# --- the VM, seen from the host ----------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """One guest test's outcome."""

    outcome: str
    message: str = ""


@dataclass
class VmRun:
    """The verdicts of the one guest session, by test name."""

    verdicts: dict[str, Verdict]
    results_dir: Path
    seconds: float
    #: Whether the VM had the igb NIC (QEMU >= 8.0).
    igb: bool


_vm_status: dict[str, Any] = {}


def _load_run_guest() -> ModuleType:
    spec = importlib.util.spec_from_file_location("devplug_run_guest_sriov", REPO / "tools" / "vm" / "run_guest.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parse_junit(path: Path) -> dict[str, Verdict]:
    verdicts = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        key = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = "failed", f"{child.get('message', '')}\n{child.text or ''}"
                break
            if child.tag == "skipped":
                outcome, message = "skipped", child.get("message", "")
        verdicts[key] = Verdict(outcome, message)
    return verdicts


@pytest.fixture(scope="session")
def vm_run(tmp_path_factory: pytest.TempPathFactory) -> VmRun:
    """Boot the VM once and run every ``vm`` test of this folder inside it."""
    run_guest = _load_run_guest()
    missing = run_guest.missing_assets()
    if missing:
        reason = "real-kernel (VM) suite not run: missing " + "; ".join(missing) + " (run tools/vm/fetch-assets.sh)"
        _vm_status["skipped"] = reason
        if REQUIRE_VM:
            pytest.fail(reason + " [DEVPLUG_REQUIRE_VM=1]", pytrace=False)
        pytest.skip(reason)
    igb = run_guest.has_igb()
    if not igb:
        version = subprocess.run([run_guest.QEMU, "--version"], capture_output=True, text=True, check=False)
        _vm_status["igb_skipped"] = (
            f"igb scenarios not run: {version.stdout.splitlines()[0] if version.stdout else run_guest.QEMU} has no "
            "'igb' device (QEMU >= 8.0 emulates the 82576; tools/vm/fetch-assets.sh installs it from "
            "bookworm-backports)"
        )
    results = tmp_path_factory.mktemp("vm-results-sriov")
    started = time.monotonic()
    code = run_guest.run(
        results, ["-m", "vm", "-p", "no:cacheprovider", str(Path(__file__).parent)], timeout=900, igb=igb
    )
    seconds = time.monotonic() - started
    junit = results / "junit.xml"
    if not junit.is_file():
        console = (results / "console.log").read_text(errors="replace")[-4000:]
        pytest.fail(f"the VM run reported nothing (exit {code}); console tail:\n{console}", pytrace=False)
    run = VmRun(_parse_junit(junit), results, seconds, igb)
    _vm_status["ran"] = run
    return run


@dataclass(frozen=True)
class HostPlaceholder:
    """What a ``[kernel]`` case gets on the host: its verdict comes from the guest."""

    run: VmRun
    name: str = "kernel"


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """The kernel a scenario runs against (see the module docstring)."""
    if request.param == "model":
        yield ModelBackend(build_model(tmp_path / "machine"))
        return
    if not IN_GUEST:
        yield HostPlaceholder(request.getfixturevalue("vm_run"))
        return
    kernel = KernelBackend()
    kernel.reset()
    try:
        yield kernel
    finally:
        kernel.reset()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """On the host, a ``[kernel]`` case reports what its twin did in the guest."""
    placeholder = next((v for v in pyfuncitem.funcargs.values() if isinstance(v, HostPlaceholder)), None)
    if placeholder is None:
        return None
    key = f"{Path(str(pyfuncitem.path)).stem}::{pyfuncitem.name}"
    verdict = placeholder.run.verdicts.get(key)
    if verdict is None:
        pytest.fail(f"the guest did not run {key}; see {placeholder.run.results_dir}/console.log", pytrace=False)
    if verdict.outcome == "skipped":
        pytest.skip(f"skipped in the guest: {verdict.message}")
    if verdict.outcome == "failed":
        pytest.fail(f"failed against the real kernel (in the VM):\n{verdict.message}", pytrace=False)
    return True


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say loudly whether the real-kernel suite ran."""
    if "skipped" in _vm_status:
        terminalreporter.write_line(f"WARNING (sriov): {_vm_status['skipped']}", red=True, bold=True)
    elif "ran" in _vm_status:
        run: VmRun = _vm_status["ran"]
        nic = "with the igb NIC" if run.igb else "WITHOUT the igb NIC"
        terminalreporter.write_line(
            f"sriov real-kernel suite: {len(run.verdicts)} cases ran in one VM boot {nic}, {run.seconds:.1f} s",
            green=run.igb,
            red=not run.igb,
        )
    if "igb_skipped" in _vm_status:
        terminalreporter.write_line(f"WARNING (sriov): {_vm_status['igb_skipped']}", red=True, bold=True)


# --- driving the driver as the engine does ------------------------------------------


@dataclass
class Harness:
    """One driver instance behind the core's facade, with its context and sink."""

    driver: SriovDriver
    hooks: DriverHooks
    ctx: DriverContext
    sink: RecordingSink

    def start(self) -> Harness:
        self.hooks.start(self.ctx)
        return self

    def ids(self) -> list[str]:
        return [d.id for d in self.hooks.list_devices()]

    def release(self, ids: list[str], retry: bool = False) -> None:
        """What the engine does when the pod is gone: post_stop, then deallocate."""
        self.hooks.post_stop(ids, retry)
        self.hooks.deallocate(ids, retry)


HarnessFactory = Callable[..., Harness]


@pytest.fixture
def make_harness(tmp_path: Path) -> Iterator[HarnessFactory]:
    """``make_harness(sysfs, links=..., resource=..., state_dir=..., **options)``; stops every driver afterwards."""
    made: list[Harness] = []

    def make(
        sysfs: SysfsAccess,
        links: VfLinks | None = None,
        resource: str = RESOURCE,
        state_dir: Path | None = None,
        **options: Any,
    ) -> Harness:
        options.setdefault("rescan_interval", 0)
        opts = SriovOptions(**options)
        state = state_dir if state_dir is not None else tmp_path / "state" / resource.replace("/", "_")
        state.mkdir(parents=True, exist_ok=True)
        driver = SriovDriver(opts, access=sysfs, links=links if links is not None else VfLinkModel())
        sink = RecordingSink(kinds=("replace",))  # the sriov driver pushes whole lists
        harness = Harness(driver, DriverHooks(resource, driver), DriverContext(resource, state, sink), sink)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.hooks.stop()


# --- crashes and counting writes --------------------------------------------------------


class SimulatedCrash(BaseException):
    """The process dying: not an Exception, so no ``except Exception`` cleans up after it."""


class CrashingSysfs:
    """A SysfsAccess that counts writes, and dies at the first operation after ``arm(n)`` more writes."""

    def __init__(self, inner: SysfsAccess) -> None:
        self.inner = inner
        self.allowed = 10**9
        self.done: list[tuple[str, str]] = []

    @property
    def sysfs_root(self) -> Path:
        return self.inner.sysfs_root

    @property
    def dev_root(self) -> Path:
        return self.inner.dev_root

    def arm(self, writes: int) -> None:
        """Die after ``writes`` more writes."""
        self.allowed = len(self.done) + writes

    def _check(self) -> None:
        if len(self.done) >= self.allowed:
            raise SimulatedCrash(f"crash after {len(self.done)} sysfs writes")

    def read_text(self, path: Path) -> str:
        self._check()
        return self.inner.read_text(path)

    def write_text(self, path: Path, data: str) -> None:
        self._check()
        self.inner.write_text(path, data)
        self.done.append((str(path.relative_to(self.sysfs_root)), data))

    def exists(self, path: Path) -> bool:
        self._check()
        return self.inner.exists(path)

    def is_dir(self, path: Path) -> bool:
        self._check()
        return self.inner.is_dir(path)

    def listdir(self, path: Path) -> list[str]:
        self._check()
        return self.inner.listdir(path)

    def link_name(self, path: Path) -> str | None:
        self._check()
        return self.inner.link_name(path)

    def writable(self, path: Path) -> bool:
        self._check()
        return self.inner.writable(path)


# --- reading the machine ---------------------------------------------------------------


def attr(sysfs: SysfsAccess, address: str, name: str) -> str:
    """A device attribute, as read."""
    return sysfs.read_text(sysfs.sysfs_root / "bus/pci/devices" / address / name)


def write_attr(sysfs: SysfsAccess, address: str, name: str, value: str) -> None:
    """Write a device attribute (as an admin would by hand)."""
    sysfs.write_text(sysfs.sysfs_root / "bus/pci/devices" / address / name, value)


def driver_of(sysfs: SysfsAccess, address: str) -> str | None:
    """The device's driver, from its ``driver`` link."""
    return sysfs.link_name(sysfs.sysfs_root / "bus/pci/devices" / address / "driver")


def present(sysfs: SysfsAccess, address: str) -> bool:
    return sysfs.exists(sysfs.sysfs_root / "bus/pci/devices" / address)


def group_of(sysfs: SysfsAccess, address: str) -> int:
    name = sysfs.link_name(sysfs.sysfs_root / "bus/pci/devices" / address / "iommu_group")
    assert name is not None, f"{address} has no IOMMU group"
    return int(name)


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
