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

import importlib.util
import os
import subprocess
import time
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
from devplug_vfio import VfioDriver, VfioOptions

IN_GUEST = os.environ.get("DEVPLUG_VM_GUEST") == "1"
REQUIRE_VM = os.environ.get("DEVPLUG_REQUIRE_VM") == "1"
REPO = Path(__file__).resolve().parents[3]
RESOURCE = "example.com/vfio"

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


@dataclass
class ModelBackend:
    """The kernel model."""

    model: PciSysfsModel
    name: str = "model"

    @property
    def sysfs(self) -> SysfsAccess:
        return self.model

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


@dataclass(frozen=True)
class Verdict:
    """One guest test's outcome."""

    outcome: str  # passed, failed, skipped
    message: str = ""


@dataclass
class VmRun:
    """The verdicts of the one guest session, by test name."""

    verdicts: dict[str, Verdict]
    results_dir: Path
    seconds: float


_vm_status: dict[str, Any] = {}


def _load_run_guest() -> ModuleType:
    path = REPO / "tools" / "vm" / "run_guest.py"
    spec = importlib.util.spec_from_file_location("devplug_run_guest", path)
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


def _verdict_key(item: pytest.Item) -> str:
    return f"{Path(str(item.path)).stem}::{item.name}"


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
    results = tmp_path_factory.mktemp("vm-results")
    started = time.monotonic()
    code = run_guest.run(results, ["-m", "vm", "-p", "no:cacheprovider", str(Path(__file__).parent)], timeout=900)
    seconds = time.monotonic() - started
    junit = results / "junit.xml"
    if not junit.is_file():
        console = (results / "console.log").read_text(errors="replace")[-4000:]
        pytest.fail(f"the VM run reported nothing (exit {code}); console tail:\n{console}", pytrace=False)
    run = VmRun(_parse_junit(junit), results, seconds)
    _vm_status["ran"] = run
    return run


@dataclass(frozen=True)
class HostPlaceholder:
    """What a ``[kernel]`` case gets on the host: its verdict comes from the guest."""

    run: VmRun
    name: str = "kernel"


@pytest.fixture(params=[pytest.param("model", id="model"), pytest.param("kernel", id="kernel", marks=pytest.mark.vm)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """The kernel a scenario runs against (see the module docstring)."""
    if request.param == "model":
        model = build_model(tmp_path / "machine")
        yield ModelBackend(model)
        return
    if not IN_GUEST:
        yield HostPlaceholder(request.getfixturevalue("vm_run"))
        return
    kernel = KernelBackend()
    kernel.reset()
    kernel.check_baseline()
    try:
        yield kernel
    finally:
        kernel.reset()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """On the host, a ``[kernel]`` case reports what its twin did in the guest."""
    placeholder = pyfuncitem.funcargs.get("backend")
    if not isinstance(placeholder, HostPlaceholder):
        return None
    verdict = placeholder.run.verdicts.get(_verdict_key(pyfuncitem))
    if verdict is None:
        pytest.fail(
            f"the guest did not run {_verdict_key(pyfuncitem)}; see {placeholder.run.results_dir}/console.log",
            pytrace=False,
        )
    if verdict.outcome == "skipped":
        pytest.skip(f"skipped in the guest: {verdict.message}")
    if verdict.outcome == "failed":
        pytest.fail(f"failed against the real kernel (in the VM):\n{verdict.message}", pytrace=False)
    return True


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say loudly whether the real-kernel suite ran."""
    if "skipped" in _vm_status:
        terminalreporter.write_line(f"WARNING: {_vm_status['skipped']}", red=True, bold=True)
    elif "ran" in _vm_status:
        run: VmRun = _vm_status["ran"]
        terminalreporter.write_line(
            f"real-kernel suite: {len(run.verdicts)} cases ran in one VM boot, {run.seconds:.1f} s", green=True
        )


# --- driving the driver as the engine does ------------------------------------------


@dataclass
class Harness:
    """One driver instance behind the core's facade, with its context and sink."""

    driver: VfioDriver
    hooks: DriverHooks
    ctx: DriverContext
    sink: RecordingSink

    def start(self) -> Harness:
        self.hooks.start(self.ctx)
        return self

    def release(self, ids: list[str]) -> None:
        """What the engine does when the pod is gone: post_stop, then deallocate."""
        self.hooks.post_stop(ids)
        self.hooks.deallocate(ids)


HarnessFactory = Callable[..., Harness]


@pytest.fixture
def make_harness(tmp_path: Path) -> Iterator[HarnessFactory]:
    """``make_harness(sysfs, resource=..., state_dir=..., **options)``; stops every driver afterwards."""
    made: list[Harness] = []

    def make(sysfs: SysfsAccess, resource: str = RESOURCE, state_dir: Path | None = None, **options: Any) -> Harness:
        options.setdefault("rescan_interval", 0)
        opts = VfioOptions(**options)
        state = state_dir if state_dir is not None else tmp_path / "state" / resource.replace("/", "_")
        state.mkdir(parents=True, exist_ok=True)
        driver = VfioDriver(opts, access=sysfs)
        sink = RecordingSink(kinds=("replace",))  # the vfio driver pushes whole lists
        harness = Harness(driver, DriverHooks(resource, driver), DriverContext(resource, state, sink), sink)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.hooks.stop()


# --- crashes -------------------------------------------------------------------------


class SimulatedCrash(BaseException):
    """The process dying: not an Exception, so no ``except Exception`` cleans up after it."""


class CrashingSysfs:
    """A SysfsAccess that lets ``writes`` writes through, then dies at the next operation of any kind."""

    def __init__(self, inner: SysfsAccess, writes: int) -> None:
        self.inner = inner
        self.allowed = writes
        self.done = 0

    @property
    def sysfs_root(self) -> Path:
        return self.inner.sysfs_root

    @property
    def dev_root(self) -> Path:
        return self.inner.dev_root

    def _check(self) -> None:
        if self.done >= self.allowed:
            raise SimulatedCrash(f"crash after {self.done} sysfs writes")

    def read_text(self, path: Path) -> str:
        self._check()
        return self.inner.read_text(path)

    def write_text(self, path: Path, data: str) -> None:
        self._check()
        self.inner.write_text(path, data)
        self.done += 1

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

    def arm(self, writes: int) -> None:
        """Die after ``writes`` more writes."""
        self.allowed = self.done + writes


# --- reading the machine ---------------------------------------------------------------


def driver_of(sysfs: SysfsAccess, address: str) -> str | None:
    """The device's driver, from its ``driver`` link."""
    return sysfs.link_name(sysfs.sysfs_root / "bus/pci/devices" / address / "driver")


def override_of(sysfs: SysfsAccess, address: str) -> str:
    """The device's ``driver_override`` as read (``(null)`` when unset)."""
    return sysfs.read_text(sysfs.sysfs_root / "bus/pci/devices" / address / "driver_override")


def group_of(sysfs: SysfsAccess, address: str) -> int:
    """The device's IOMMU group number."""
    name = sysfs.link_name(sysfs.sysfs_root / "bus/pci/devices" / address / "iommu_group")
    assert name is not None, f"{address} has no IOMMU group"
    return int(name)


def vfio_nodes(sysfs: SysfsAccess) -> list[str]:
    """The entries of /dev/vfio."""
    return sysfs.listdir(sysfs.dev_root / "vfio")


@pytest.fixture
def kit() -> ModuleType:
    """This module, for its helpers and constants (test modules cannot import a conftest by name)."""
    import sys

    return sys.modules[__name__]
