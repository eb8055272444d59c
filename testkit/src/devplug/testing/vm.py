"""One scenario, two kernels: a kernel model on the host and the real kernel in a VM, for drivers' suites.

A scenario test takes a ``backend`` fixture parametrized over ``model`` (a
kernel model, here) and ``kernel`` (marked ``vm``: the real kernel in QEMU).
The ``kernel`` cases of a test folder run all together in one guest boot: on
the host, the first ``kernel`` case boots the VM (a session fixture), which
runs pytest over ``-m vm`` on the same folder inside the guest (where
:data:`IN_GUEST` is true and the ``kernel`` backend is the real ``/sys`` and
``/dev``), and each host-side ``[kernel]`` case reports its guest twin's
verdict; under pytest-xdist the workers of a run share that one boot. When
QEMU or the kernel is missing the ``kernel`` cases are skipped, loudly; with
``DEVPLUG_REQUIRE_VM=1`` (CI) they fail instead.

The VM itself is a *runner* module: a Python file with ``missing_assets() ->
list[str]`` (what is missing to boot, empty when nothing) and ``run(results:
Path, pytest_args: list[str], timeout: float, **options) -> int``, which boots
the guest, runs pytest there with ``DEVPLUG_VM_GUEST=1`` and
``--junitxml=<results>/junit.xml``, and returns its exit status (devplug's own
is ``tools/vm/run_guest.py``). A driver's ``conftest.py``::

    SUITE = VmSuite("vfio", runner=REPO / "tools/vm/run_guest.py", tests=Path(__file__).parent)

    @pytest.fixture(scope="session")
    def vm_run(tmp_path_factory):
        return SUITE.run(tmp_path_factory)

    @pytest.fixture(params=SUITE.params())
    def backend(request, tmp_path):
        yield from SUITE.backend(request, model=lambda: build_model(tmp_path), kernel=KernelBackend)

devplug's pytest plugin does the rest: a host-side ``[kernel]`` case reports its
guest twin's verdict (:func:`guest_verdict`, its ``pytest_pyfunc_call``), and
the terminal summary says whether each suite's guest run happened.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from devplug.testing.loudlines import LoudLine, loud_source, write_lines

__all__ = [
    "IN_GUEST",
    "REQUIRE_VM",
    "SUITES",
    "HostPlaceholder",
    "ModelBackend",
    "Verdict",
    "VmRun",
    "VmSuite",
    "guest_verdict",
    "parse_junit",
    "verdict_key",
]

#: True inside the guest (the runner sets ``DEVPLUG_VM_GUEST=1``).
IN_GUEST = os.environ.get("DEVPLUG_VM_GUEST") == "1"
#: With ``DEVPLUG_REQUIRE_VM=1`` (CI), a VM that cannot run fails the ``kernel`` cases instead of skipping them.
REQUIRE_VM = os.environ.get("DEVPLUG_REQUIRE_VM") == "1"
#: Seconds the one guest run (boot and every ``kernel`` case) may take.
GUEST_TIMEOUT = 900.0


@dataclass(frozen=True)
class Verdict:
    """One guest test's outcome: ``passed``, ``failed`` or ``skipped``, and what pytest said."""

    outcome: str
    message: str = ""


@dataclass
class VmRun:
    """The verdicts of one guest session, by :func:`verdict_key`; ``options`` are what the runner was given."""

    verdicts: dict[str, Verdict]
    results_dir: Path
    seconds: float
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HostPlaceholder:
    """What a ``[kernel]`` case gets on the host: its verdict comes from the guest (:func:`guest_verdict`)."""

    run: VmRun
    name: str = "kernel"


@dataclass
class ModelBackend:
    """The ``model`` backend of a scenario: a kernel model (a :class:`~devplug.testing.pcisysfs.PciSysfsModel`, ...)
    as the scenario's ``sysfs``."""

    model: Any
    name: str = "model"

    @property
    def sysfs(self) -> Any:
        """The model, which is a :class:`devplug.host.sysfs.SysfsAccess`."""
        return self.model


def parse_junit(path: Path) -> dict[str, Verdict]:
    """The verdicts of a JUnit XML report, by ``<module stem>::<test name>``."""
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


def verdict_key(item: pytest.Item) -> str:
    """The key of ``item``'s verdict: ``<module stem>::<test name>`` (a class-less test, as the guest reports it)."""
    return f"{Path(str(item.path)).stem}::{item.name}"


def guest_verdict(pyfuncitem: pytest.Function) -> bool | None:
    """For ``pytest_pyfunc_call``: a test given a :class:`HostPlaceholder` reports its guest twin's verdict (passes,
    fails or skips with its message; fails when the guest did not run it); ``None`` for every other test."""
    placeholder = next((v for v in pyfuncitem.funcargs.values() if isinstance(v, HostPlaceholder)), None)
    if placeholder is None:
        return None
    key = verdict_key(pyfuncitem)
    verdict = placeholder.run.verdicts.get(key)
    if verdict is None:
        pytest.fail(f"the guest did not run {key}; see {placeholder.run.results_dir}/console.log", pytrace=False)
    if verdict.outcome == "skipped":
        pytest.skip(f"skipped in the guest: {verdict.message}")
    if verdict.outcome == "failed":
        pytest.fail(
            f"failed against the real kernel (in the VM; its results, daemon logs included, are in "
            f"{placeholder.run.results_dir}):\n{verdict.message}",
            pytrace=False,
        )
    return True


def load_runner(path: Path) -> ModuleType:
    """The runner module at ``path`` (see the module docstring), imported under a name of its own."""
    spec = importlib.util.spec_from_file_location(f"devplug_vm_runner_{abs(hash(str(path)))}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the VM runner {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: Every suite made in this process, for the terminal summary.
SUITES: list[VmSuite] = []


@loud_source
def _suites_said() -> list[LoudLine]:
    return [line for suite in SUITES for line in suite.lines()]


class VmSuite:
    """The ``kernel`` half of one test folder's scenarios: one guest boot for all of them (see the module docstring).

    ``name`` labels its summary line; ``runner`` is the runner module's path; ``tests`` the folder whose ``vm``
    tests run in the guest.
    """

    def __init__(self, name: str, runner: Path, tests: Path, *, timeout: float = GUEST_TIMEOUT) -> None:
        self.name = name
        self.runner_path = Path(runner)
        self.tests = Path(tests)
        self.timeout = timeout
        #: Why the guest run was skipped, once it was.
        self.skipped: str | None = None
        #: The run, once it happened.
        self.ran: VmRun | None = None
        #: Warnings the summary repeats (what a run could not cover).
        self.warnings: list[str] = []
        #: Whether :attr:`ran` is another pytest-xdist worker's boot, read from its results.
        self.shared = False
        self._runner: ModuleType | None = None
        SUITES.append(self)

    def runner(self) -> ModuleType:
        """The runner module (imported once)."""
        if self._runner is None:
            self._runner = load_runner(self.runner_path)
        return self._runner

    def params(self) -> list[Any]:
        """``backend`` fixture parameters: ``model``, and ``kernel`` marked ``vm``; on the host ``kernel`` may take
        :attr:`timeout` (its first case waits for the whole guest run, beyond a per-test timeout)."""
        marks = [pytest.mark.vm, *([] if IN_GUEST else [pytest.mark.timeout(self.timeout)])]
        return [pytest.param("model", id="model"), pytest.param("kernel", id="kernel", marks=marks)]

    def fail_or_skip(self, reason: str) -> None:
        """Skip the test for ``reason``; fail it under ``DEVPLUG_REQUIRE_VM=1``."""
        if REQUIRE_VM:
            pytest.fail(reason + " [DEVPLUG_REQUIRE_VM=1]", pytrace=False)
        pytest.skip(reason)

    def run(self, tmp_path_factory: pytest.TempPathFactory, **options: Any) -> VmRun:
        """Boot the guest once and run every ``vm`` test of :attr:`tests` there (``options`` go to the runner);
        skips (or fails) when the runner says assets are missing, fails when the guest reports nothing.

        Under pytest-xdist the workers of one run share the boot: the first to ask boots the guest while holding a
        lock in the run's common temporary folder (the parent of each worker's own, as pytest-xdist lays them out),
        the others wait for it and read the same verdicts (a boot under TCG costs a core for minutes)."""
        if self.ran is not None:
            return self.ran
        missing = self.runner().missing_assets()
        if missing:
            self.skipped = "real-kernel (VM) suite not run: missing " + "; ".join(missing)
            self.fail_or_skip(self.skipped)
        if not os.environ.get("PYTEST_XDIST_TESTRUNUID"):
            self.ran = self._boot(tmp_path_factory.mktemp(f"vm-results-{self.name}"), options)
            return self.ran
        options_key = hashlib.sha256(repr(sorted(options.items())).encode()).hexdigest()[:12]
        results = tmp_path_factory.getbasetemp().parent / f"vm-results-{self.name}-{options_key}"
        results.mkdir(exist_ok=True)
        # fcntl.flock, not a lock library: one exclusive lock on Linux, released by the kernel if the worker dies.
        with open(results / "boot.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            booted = results / "booted.json"
            if booted.is_file():
                seconds = float(json.loads(booted.read_text())["seconds"])
                self.ran = VmRun(parse_junit(results / "junit.xml"), results, seconds, dict(options))
                self.shared = True
            else:
                self.ran = self._boot(results, options)
                booted.write_text(json.dumps({"seconds": self.ran.seconds}))
        return self.ran

    def _boot(self, results: Path, options: dict[str, Any]) -> VmRun:
        started = time.monotonic()
        args = ["-m", "vm", "-p", "no:cacheprovider", str(self.tests)]
        code = self.runner().run(results, args, timeout=self.timeout, **options)
        seconds = time.monotonic() - started
        junit = results / "junit.xml"
        if not junit.is_file():
            console = (results / "console.log").read_text(errors="replace")[-4000:]
            pytest.fail(f"the VM run reported nothing (exit {code}); console tail:\n{console}", pytrace=False)
        return VmRun(parse_junit(junit), results, seconds, dict(options))

    def placeholder(self, request: pytest.FixtureRequest) -> HostPlaceholder | None:
        """On the host, the placeholder of a ``kernel`` case (booting the guest first, through the ``vm_run``
        session fixture); ``None`` in the guest, where the case runs for real."""
        if IN_GUEST:
            return None
        run: VmRun = request.getfixturevalue("vm_run")
        return HostPlaceholder(run)

    def backend(
        self, request: pytest.FixtureRequest, *, model: Callable[[], Any], kernel: Callable[[], Any]
    ) -> Iterator[Any]:
        """The body of a ``backend`` fixture parametrized over :meth:`params` (``yield from`` it): ``model()``
        for ``model``; for ``kernel``, on the host the case's :class:`HostPlaceholder`, in the guest ``kernel()``
        (an object whose ``reset()`` puts the test devices back as at boot), reset before and after the test."""
        if request.param == "model":
            yield model()
            return
        placeholder = self.placeholder(request)
        if placeholder is not None:
            yield placeholder
            return
        real = kernel()
        real.reset()
        try:
            yield real
        finally:
            real.reset()

    def lines(self) -> list[LoudLine]:
        """What the run says loudly of this suite at its end: whether its guest run happened, and its warnings."""
        said: list[LoudLine] = []
        if self.skipped is not None:
            said.append((f"WARNING ({self.name}): {self.skipped}", "red"))
        elif self.ran is not None and not self.shared:  # a shared boot is said by the worker that booted it
            run = self.ran
            text = f"{self.name} real-kernel suite: {len(run.verdicts)} cases ran in one VM boot, {run.seconds:.1f} s"
            said.append((text, "red" if self.warnings else "green"))
        said.extend((f"WARNING ({self.name}): {warning}", "red") for warning in self.warnings)
        return said

    def summary(self, terminalreporter: Any) -> None:
        """Write :meth:`lines` (devplug's plugin says them itself, also from pytest-xdist's workers)."""
        write_lines(terminalreporter, self.lines())
