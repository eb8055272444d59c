"""devplug's pytest plugin (entry point ``pytest11``): a dev kubelet and a real daemon per test.

Fixtures:

* ``devplug_root`` -- a short temporary folder (unix socket paths must stay
  under 108 bytes, so not pytest's ``tmp_path``);
* ``dev_kubelet`` -- a started :class:`~devplug.devkubelet.DevKubeletThread`
  serving ``<root>/device-plugins/kubelet.sock`` and
  ``<root>/pod-resources/kubelet.sock`` (set ``dev_kubelet.kep_mode = True``
  before starting a daemon for a kubelet that calls the KEP's PostStopContainer
  and Deallocate). When it can (root, and a cgroup file system it may write),
  it runs every container as a real process in a real cgroup, under a
  ``--cgroup-root`` of the test's own that is removed afterwards: cgroup v1
  on a host whose ``/sys/fs/cgroup`` is v1 or hybrid, v2 on a v2 host (as a
  kubelet would pick), with the cgroupfs driver.
  ``@pytest.mark.devplug_cgroups("v2")`` asks for v2 (``"v1"`` for v1;
  ``driver="systemd"`` for the systemd driver's names; ``"off"`` for no
  processes); a test whose marker asks for cgroups the host cannot give is
  skipped. Without a marker, when cgroups cannot be used the fixture warns
  (``DevplugCgroupsWarning``) and falls back to containers without
  processes; ``DEVPLUG_REQUIRE_CGROUPS=1`` makes both a failure.
  ``dev_kubelet.liveness_config()`` is what a daemon needs to find the
  pods' cgroups;
  A container whose DeviceSpec host path is not a device node starts with a
  ``DeviceNodeDeprecationWarning`` (from devplug 1.0 it is refused, as
  containerd refuses it); a test asks for the refusal now with
  ``@pytest.mark.devplug_device_nodes``, a whole suite with
  ``devplug_check_device_nodes = true`` in its pytest config
  (``@pytest.mark.devplug_device_nodes(False)`` then takes one test out), or
  by setting ``dev_kubelet.dev_root`` to a node ``/dev`` of its own (see
  :mod:`devplug.devkubelet.devicespecs`);
* ``driver_harness`` -- a factory: ``driver_harness(driver, resource="example.com/test",
  state_dir=None, push_kinds=PUSH_KINDS, replicas=1)`` puts a driver instance
  behind the engine's facade with a context on a fresh state folder (under
  ``tmp_path`` unless given) and a :class:`~devplug.testing.sink.RecordingSink`
  (:class:`~devplug.testing.harness.DriverHarness`); every harness made is
  stopped at the end of the test;
* ``sysfs_class_tree`` -- a fresh :class:`~devplug.testing.classsysfs.SysfsClassModel` under ``tmp_path``
  (``/sys/class/<class>/`` device trees: add devices with ``add_device``; a driver reads ``model.sysfs_root``
  and ``model.dev_root``, or the model itself as its :class:`~devplug.host.sysfs.SysfsAccess`);
* ``sysfs_bus`` -- a factory of :class:`~devplug.testing.bussysfs.SysBusModel`: ``sysfs_bus("dsa")`` is a
  model of ``/sys/bus/dsa`` under ``tmp_path`` (devices, drivers, bind, unbind, ``driver_override``,
  ``drivers_probe``), the model a :class:`devplug.kit.sysbus.SysBus` is tested on;
* ``devplug_daemon`` -- a factory: ``devplug_daemon({"example.com/x": {"driver":
  "mine", "options": {...}}})`` writes a config under the root, starts
  ``devplug run`` as a child process, waits until every resource registered
  with ``dev_kubelet`` and sent its first device list, and returns the :class:`RunningDaemon`. Daemons still
  running at the end of the test get SIGTERM, and must exit 0. When the test fails, its
  report carries the last :data:`DAEMON_LOG_TAIL` lines of each daemon's log (a section
  of the failure's text, so a JUnit report, the VM's, has them too), and with
  ``DEVPLUG_DAEMON_LOGS=<folder>`` the whole logs are copied there (the VM runner sets
  it to its results share: the guest's files vanish with the guest).

The daemon finds drivers through their entry points, as in production, so the
driver must be installed (``pip install -e .``); the factory fails at once,
naming the installed drivers, when it is not. A driver's suite needs nothing else::

    def test_allocate(dev_kubelet, devplug_daemon):
        devplug_daemon({"example.com/x": {"driver": "mine"}})
        pod = dev_kubelet.admit_pod(PodSpec("p", [ContainerSpec("c", {"example.com/x": 1})]))

It also reports the guest's verdicts of real-kernel cases (:mod:`devplug.testing.vm`) and says in the terminal
summary whether each such suite ran.

Importing this module (which pytest does in every project where devplug-testing is
installed) imports neither gRPC nor the dev kubelet: the fixtures import them
when they are first used.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable, Collection, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from devplug.testing import loudlines
from devplug.testing.configs import dev_config, write_toml
from devplug.testing.declared import UndeclaredTestKitWarning, undeclared_test_kit, undeclared_test_kit_message
from devplug.testing.entrypoints import entry_point_env, installed_driver_names, missing_driver_message
from devplug.testing.process import DaemonProcess

if TYPE_CHECKING:
    from devplug.devkubelet import DevKubelet, DevKubeletThread
    from devplug.devkubelet.cgroups import CgroupLayout
    from devplug.testing.bussysfs import SysBusModel
    from devplug.testing.classsysfs import SysfsClassModel
    from devplug.testing.harness import DriverHarness

__all__ = [
    "DAEMON_LOGS_ENV",
    "DAEMON_LOG_TAIL",
    "REQUIRE_CGROUPS_ENV",
    "DevplugCgroupsWarning",
    "RunningDaemon",
    "cgroup_layout_for",
    "check_device_nodes_for",
    "require_cgroup_layout",
]

#: Set to 1 to make a dev kubelet without cgroups a test failure instead of a warning.
REQUIRE_CGROUPS_ENV = "DEVPLUG_REQUIRE_CGROUPS"
_MARKER = "devplug_cgroups"
_DEVICE_NODES_MARKER = "devplug_device_nodes"
_DEVICE_NODES_INI = "devplug_check_device_nodes"
#: Set to a folder: the whole log of every daemon a failing test started is copied there.
DAEMON_LOGS_ENV = "DEVPLUG_DAEMON_LOGS"
#: How many of the last lines of each daemon's log a failing test's report carries.
DAEMON_LOG_TAIL = 400
#: The daemons a test started through ``devplug_daemon`` (for its report, should it fail).
_DAEMONS = pytest.StashKey[list["RunningDaemon"]]()
#: Set once a test's report carries its daemons' logs (a failed call and a failed teardown show them once).
_LOGS_SHOWN = pytest.StashKey[bool]()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """A host-side ``[kernel]`` case of a :class:`devplug.testing.vm.VmSuite` reports its guest twin's verdict."""
    vm = sys.modules.get("devplug.testing.vm")  # no suite made, no placeholder: nothing to report
    return None if vm is None else vm.guest_verdict(pyfuncitem)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say loudly what the run's :func:`devplug.testing.loudlines.loud_source` sources say (whether each
    :class:`devplug.testing.vm.VmSuite`'s guest run happened, ...), this process's and pytest-xdist workers'."""
    loudlines.write(terminalreporter)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A pytest-xdist worker sends its loud lines to the controller."""
    loudlines.send_from_worker(session.config)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """pytest-xdist's controller, as a worker goes down: keep the loud lines it sent."""
    loudlines.receive_from_worker(node)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failing test that started daemons (``devplug_daemon``) shows what they did: their logs."""
    report: pytest.TestReport = yield
    daemons = item.stash.get(_DAEMONS, [])
    if report.failed and daemons and not item.stash.get(_LOGS_SHOWN, False):
        item.stash[_LOGS_SHOWN] = True
        for number, daemon in enumerate(daemons):
            _attach_daemon_log(item, report, daemon, number)
    return report


def _attach_daemon_log(item: pytest.Item, report: pytest.TestReport, daemon: RunningDaemon, number: int) -> None:
    """Add the tail of ``daemon``'s log to the failure ``report``, copying the whole log to
    ``$DEVPLUG_DAEMON_LOGS`` when that is set."""
    text = daemon.log_text()
    lines = text.splitlines()
    where = str(daemon.process.log_path)
    folder = os.environ.get(DAEMON_LOGS_ENV)
    if folder:
        copy = Path(folder) / (re.sub(r"[^A-Za-z0-9_.-]+", "_", item.nodeid)[-180:] + f"-daemon-{number}.log")
        try:
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text(text)
            where = str(copy)
        except OSError as exc:
            where += f" (could not copy it to {copy}: {exc})"
    shown = lines[-DAEMON_LOG_TAIL:]
    which = f"the last {len(shown)} of {len(lines)} lines" if len(shown) < len(lines) else f"all {len(lines)} lines"
    title = f"daemon {number}'s log ({which}; the whole log: {where})"
    content = "\n".join(shown)
    addsection = getattr(report.longrepr, "addsection", None)  # a traceback's (pytest's ExceptionRepr)
    if callable(addsection):
        addsection(title, content)  # in the failure's text, which a JUnit report (the VM's) keeps
    else:
        report.longrepr = f"{report.longrepr or ''}\n{'-' * 20} {title} {'-' * 20}\n{content}"


class DevplugCgroupsWarning(pytest.PytestWarning):
    """The ``dev_kubelet`` fixture could not run containers in cgroups and runs them without processes."""


def pytest_addoption(parser: pytest.Parser) -> None:
    """The ``devplug_check_device_nodes`` ini option (see the module docstring)."""
    parser.addini(
        _DEVICE_NODES_INI,
        "the dev_kubelet fixture refuses DeviceSpec host paths that are not device nodes, as containerd does "
        "(the default from devplug 1.0)",
        type="bool",
        default=False,
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``devplug_cgroups`` and ``devplug_device_nodes`` markers; warn a driver's run whose project
    does not declare the test kit's distribution (:mod:`devplug.testing.declared`: until devplug 1.0)."""
    undeclared = undeclared_test_kit(Path(config.rootpath))
    if undeclared is not None:
        config.issue_config_time_warning(UndeclaredTestKitWarning(undeclared_test_kit_message(undeclared)), 2)
    config.addinivalue_line(
        "markers",
        f'{_MARKER}(version="v1"|"v2"|"off", driver="cgroupfs"|"systemd"): how the dev_kubelet fixture runs '
        "containers (real processes in cgroups of that version and driver naming, or none)",
    )
    config.addinivalue_line(
        "markers",
        f"{_DEVICE_NODES_MARKER}(check=True): the dev_kubelet fixture refuses DeviceSpec host paths that are not "
        "device nodes, as containerd does (False: takes them with a DeprecationWarning until devplug 1.0)",
    )


def check_device_nodes_for(node: pytest.Item | None, config: pytest.Config) -> bool:
    """Whether the ``dev_kubelet`` fixture checks device nodes for this test: its ``devplug_device_nodes``
    marker, else the ``devplug_check_device_nodes`` ini option."""
    marker = node.get_closest_marker(_DEVICE_NODES_MARKER) if node is not None else None
    if marker is None:
        return bool(config.getini(_DEVICE_NODES_INI))
    if len(marker.args) + len(marker.kwargs) > 1 or set(marker.kwargs) - {"check"}:
        raise pytest.UsageError(f"{_DEVICE_NODES_MARKER}: expected check=True or False, got {marker.args}")
    value = marker.args[0] if marker.args else marker.kwargs.get("check", True)
    if not isinstance(value, bool):
        raise pytest.UsageError(f"{_DEVICE_NODES_MARKER}: check must be True or False, got {value!r}")
    return value


def _marker_request(node: pytest.Item | None) -> tuple[bool, int | None, str]:
    """``(explicit, version, driver)`` from the test's marker; version 0 means no processes."""
    marker = node.get_closest_marker(_MARKER) if node is not None else None
    if marker is None:
        return False, None, "cgroupfs"
    if len(marker.args) > 1 or set(marker.kwargs) - {"version", "driver"}:
        raise pytest.UsageError(f"{_MARKER}: expected a version and driver=, got {marker.args} {marker.kwargs}")
    value = marker.args[0] if marker.args else marker.kwargs.get("version")
    versions: dict[object, int | None] = {"v1": 1, "v2": 2, 1: 1, 2: 2, None: None, "off": 0, False: 0}
    if value not in versions:
        raise pytest.UsageError(f'{_MARKER}: the version must be "v1", "v2" or "off", got {value!r}')
    driver = marker.kwargs.get("driver", "cgroupfs")
    if driver not in ("cgroupfs", "systemd"):
        raise pytest.UsageError(f'{_MARKER}: driver must be "cgroupfs" or "systemd", got {driver!r}')
    return True, versions[value], str(driver)


def _probe(version: int | None, driver: str) -> CgroupLayout:
    """A layout with a fresh root, after checking that the root can be made (and removing it again)."""
    from devplug.devkubelet.cgroups import CgroupFs, CgroupLayout, CgroupsUnavailableError

    if os.geteuid() != 0:
        raise CgroupsUnavailableError("not running as root")
    layout = CgroupLayout.detect(version, driver=driver)
    probe = CgroupFs(layout)
    try:
        probe.ensure(layout.root)
    except OSError as exc:
        raise CgroupsUnavailableError(f"cannot make {layout.root} in {layout.mount}: {exc}") from exc
    finally:
        probe.remove_created()
    return layout


def _describe(version: int | None, driver: str) -> str:
    return f"cgroup {'v' + str(version) + ' ' if version else ''}({driver} driver)"


def require_cgroup_layout(version: int | None = None, driver: str = "cgroupfs") -> CgroupLayout:
    """Cgroups of ``version`` (None: the host's kind) with a fresh root, for a test that needs them.

    Skips the test when the host cannot give them (fails it with ``DEVPLUG_REQUIRE_CGROUPS=1``).
    """
    try:
        return _probe(version, driver)
    except Exception as exc:
        message = f"the dev kubelet cannot run containers in {_describe(version, driver)}: {exc}"
        if os.environ.get(REQUIRE_CGROUPS_ENV) == "1":
            pytest.fail(f"{message} ({REQUIRE_CGROUPS_ENV}=1)", pytrace=False)
        pytest.skip(message)


def cgroup_layout_for(node: pytest.Item | None) -> CgroupLayout | None:
    """The cgroups the ``dev_kubelet`` fixture gives this test (see the module docstring), or None.

    A test whose ``devplug_cgroups`` marker asks for cgroups the host cannot
    give is skipped (failed with ``DEVPLUG_REQUIRE_CGROUPS=1``); without a
    marker, when the default ones cannot be had, it warns and returns None
    (``DEVPLUG_REQUIRE_CGROUPS=1``: fails).
    """
    explicit, version, driver = _marker_request(node)
    if version == 0:
        return None
    if explicit:
        return require_cgroup_layout(version, driver)
    try:
        return _probe(version, driver)
    except Exception as exc:
        message = f"the dev kubelet cannot run containers in {_describe(version, driver)}: {exc}"
        if os.environ.get(REQUIRE_CGROUPS_ENV) == "1":
            pytest.fail(f"{message} ({REQUIRE_CGROUPS_ENV}=1)", pytrace=False)
        warnings.warn(
            DevplugCgroupsWarning(
                f"{message}; its containers run WITHOUT processes (set {REQUIRE_CGROUPS_ENV}=1 to fail instead)"
            ),
            stacklevel=2,
        )
        return None


@dataclass
class RunningDaemon:
    """A daemon started by the ``devplug_daemon`` fixture: its process, config and the kubelet it serves."""

    process: DaemonProcess
    config_path: Path
    config: dict[str, Any]
    root: Path
    kubelet: DevKubeletThread | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def state_dir(self) -> Path:
        """The daemon's ``[state] dir`` (lock, ledgers, ``status.json``, and per resource
        ``resources/<domain>/<name>/driver/``: the folder a driver gets as ``ctx.state_dir``)."""
        return Path(self.config["state"]["dir"])

    @property
    def resources(self) -> list[str]:
        """The resource names the kubelet sees: the config's, or the ``rename`` a table sets."""
        return [table.get("rename") or name for name, table in self.config["resources"].items()]

    def kill(self) -> None:
        """SIGKILL the daemon (the crash it must survive); :meth:`restart` starts it again."""
        self.process.kill()

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait; returns the exit code (0 for a clean shutdown)."""
        return self.process.stop(timeout)

    def restart(self, kubelet: DevKubeletThread | None = None, timeout: float = 15.0) -> None:
        """Stop it (SIGTERM; nothing when it is already dead, killed say) and start it again on the same config;
        wait until every resource registered again and sent its first device list."""
        kubelet = kubelet or self.kubelet
        assert kubelet is not None, "restart needs the dev kubelet"
        self.process.stop()
        counts = {name: kubelet.registrations(name) for name in self.resources}
        self.process.start()
        _wait_served(kubelet, self, counts, timeout)

    def log_text(self) -> str:
        """Everything the daemon logged so far (all its runs)."""
        return self.process.log_text()


def _listed_since_registration(resource: str, registrations: int) -> Callable[[DevKubelet], bool]:
    """True once the resource's registration number ``registrations + 1`` (or later) sent its device list."""

    def arrived(kubelet: DevKubelet) -> bool:
        events = [e for e in kubelet.events if e.resource == resource and e.kind in ("register", "list-and-watch")]
        registers = [i for i, e in enumerate(events) if e.kind == "register"]
        if len(registers) <= registrations:
            return False
        return any(e.kind == "list-and-watch" for e in events[registers[registrations] :])

    return arrived


def _wait_served(kubelet: DevKubeletThread, daemon: RunningDaemon, after: Mapping[str, int], timeout: float) -> None:
    """Wait until each resource registered more than ``after[name]`` times and then sent its device list."""
    for name in daemon.resources:
        try:
            kubelet.wait_registered(name, timeout=timeout, after=after.get(name, 0))
            # ...and the first device list arrived, so pods can be admitted at once.
            kubelet.wait_for(
                _listed_since_registration(name, after.get(name, 0)),
                timeout=timeout,
                what=f"the first device list of {name}",
            )
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n--- daemon log ---\n{daemon.log_text()}") from exc


@pytest.fixture
def devplug_root() -> Iterator[Path]:
    """A fresh short folder under /tmp, removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def dev_kubelet(devplug_root: Path, request: pytest.FixtureRequest) -> Iterator[DevKubeletThread]:
    """A started dev kubelet in ``devplug_root`` (a stock kubelet; set ``kep_mode`` for a KEP one).

    Its containers run in cgroups when they can, and it checks their device nodes where the test asks (see the
    module docstring);
    every process and cgroup is gone after the test, or the test errors.
    """
    from devplug.devkubelet import DevKubeletThread

    layout = cgroup_layout_for(request.node)
    kubelet = DevKubeletThread(
        devplug_root / "device-plugins",
        pod_resources_socket=devplug_root / "pod-resources" / "kubelet.sock",
        cgroups=layout,
        check_device_nodes=check_device_nodes_for(request.node, request.config),
    )
    try:
        kubelet.start()
        yield kubelet
    finally:
        kubelet.close()
        left = [str(p) for p in (layout.paths(layout.root) if layout is not None else ()) if p.exists()]
        if left:
            pytest.fail(f"dev_kubelet: cgroups left behind: {', '.join(left)}", pytrace=False)


DaemonFactory = Callable[..., RunningDaemon]


@pytest.fixture
def driver_harness(tmp_path: Path) -> Iterator[Callable[..., DriverHarness]]:
    """``driver_harness(driver, resource=..., state_dir=None, push_kinds=..., replicas=1)``: see the module
    docstring; each harness made is stopped (its ``stop`` hook) when the test ends."""
    from devplug.testing.harness import make_harness
    from devplug.testing.sink import PUSH_KINDS

    made: list[DriverHarness] = []

    def make(
        driver: Any,
        resource: str = "example.com/test",
        state_dir: Path | None = None,
        push_kinds: Collection[str] = PUSH_KINDS,
        replicas: int = 1,
    ) -> DriverHarness:
        folder = state_dir if state_dir is not None else tmp_path / "state" / resource.replace("/", "_")
        harness = make_harness(driver, resource, folder, push_kinds=push_kinds, replicas=replicas)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.stop()


@pytest.fixture
def sysfs_class_tree(tmp_path: Path) -> SysfsClassModel:
    """A fresh model of ``/sys/class/<class>/`` device trees in ``tmp_path / "machine"`` (see
    :mod:`devplug.testing.classsysfs`)."""
    from devplug.testing.classsysfs import SysfsClassModel

    return SysfsClassModel(tmp_path / "machine")


@pytest.fixture
def sysfs_bus(tmp_path: Path) -> Callable[..., SysBusModel]:
    """A factory of models of ``/sys/bus/<bus>`` in ``tmp_path / "machine"``: ``sysfs_bus("dsa")``, or
    ``sysfs_bus("platform", overrides=True)`` for a bus with ``driver_override`` (see
    :mod:`devplug.testing.bussysfs`). Buses made by one test share the machine."""
    from devplug.testing.bussysfs import SysBusModel

    def make(bus: str, *, overrides: bool = False) -> SysBusModel:
        return SysBusModel(tmp_path / "machine", bus, overrides=overrides)

    return make


def _liveness_table(kubelet: DevKubeletThread) -> dict[str, Any] | None:
    """The ``[liveness]`` table for a daemon serving ``kubelet``: where its containers' cgroups are (None: it runs
    no container processes, see :func:`~devplug.testing.configs.dev_config`).

    With a short ``unknown_grace``: an allocation no pod ever held (a test's own gRPC Allocate, which the kubelet
    never attributes) has no pod UID, hence no cgroup to read, and would otherwise wait the production 30 s.
    """
    from devplug.devkubelet.daemonconfig import NO_CONTAINERS_GRACE

    table = kubelet.liveness_config()
    return {**table, "unknown_grace": NO_CONTAINERS_GRACE} if table else None


def _check_drivers_installed(resources: Mapping[str, Mapping[str, Any]], extra_path: Sequence[Path]) -> None:
    """Fail the test at once (not after the registration timeout) when a resource names a driver
    the child process would not find."""
    installed = installed_driver_names(extra_path)
    for name, table in resources.items():
        driver = table.get("driver")
        if isinstance(driver, str) and driver not in installed:
            pytest.fail(f"devplug_daemon: {missing_driver_message(name, driver, installed)}", pytrace=False)


@pytest.fixture
def devplug_daemon(
    devplug_root: Path, dev_kubelet: DevKubeletThread, request: pytest.FixtureRequest
) -> Iterator[DaemonFactory]:
    """Start ``devplug run`` on a config of the given resources; wait for their registration.

    ``devplug_daemon(resources, *, wait=True, timeout=15.0, release_interval=0.2, grace_period=2.0,
    shutdown_timeout=None, health_interval=None, hook_timeout=None, test_drivers=None, python_path=())``:

    * ``resources`` -- ``{name: {"driver": ..., "options": {...}, ...}}``, the config's resource tables;
    * ``release_interval``, ``grace_period``, ``shutdown_timeout`` -- the config's ``[release] interval``,
      ``[release] grace_period`` and ``[shutdown] timeout`` (short defaults, so releases are quick);
      ``max_retry_interval`` caps a failing release's backoff (2 s), ``release`` adds other ``[release]`` keys;
    * ``liveness`` -- the ``[liveness]`` table (default: the dev kubelet's, where its containers' cgroups are);
    * ``metrics``, ``cdi``, ``handover`` -- the config's ``[metrics]``, ``[cdi]`` and ``[handover]`` tables (e.g.
      ``{"enabled": True, "port": p}``);
    * ``health_interval``, ``hook_timeout`` -- set on every resource table that does not set its own;
    * ``test_drivers`` -- ``{name: "module:Class"}``, drivers the daemon may use without being installed,
      their modules found in ``python_path`` (see :func:`devplug.testing.entrypoints.entry_point_env`);
    * ``wait`` -- wait until every resource registered and sent its device list (else return at once).

    A failing test's report shows the daemons' logs (see the module docstring).
    """
    started: list[RunningDaemon] = []
    request.node.stash[_DAEMONS] = started

    def start(
        resources: Mapping[str, Mapping[str, Any]],
        *,
        wait: bool = True,
        timeout: float = 15.0,
        health_interval: float | None = None,
        hook_timeout: float | None = None,
        test_drivers: Mapping[str, str] | None = None,
        python_path: Sequence[Path] = (),
        **config_options: Any,
    ) -> RunningDaemon:
        """Write the config and start the daemon; see the fixture's docstring for the knobs."""
        tables = {name: dict(table) for name, table in resources.items()}
        for table in tables.values():
            if health_interval is not None:
                table.setdefault("health_interval", health_interval)
            if hook_timeout is not None:
                table.setdefault("hook_timeout", hook_timeout)
        env = entry_point_env(devplug_root / "test-drivers", test_drivers or {}, python_path)
        _check_drivers_installed(tables, [devplug_root / "test-drivers"] if env else [])
        config_options.setdefault("liveness", _liveness_table(dev_kubelet))
        config = dev_config(devplug_root, tables, **config_options)
        path = write_toml(devplug_root / f"devplug-{len(started)}.toml", config)
        process = DaemonProcess(path, devplug_root / f"daemon-{len(started)}.log", env=env)
        daemon = RunningDaemon(process, path, config, devplug_root, dev_kubelet, env)
        started.append(daemon)
        process.start()
        if wait:
            _wait_served(dev_kubelet, daemon, {}, timeout)
        return daemon

    yield start
    failures = []
    for daemon in started:
        if daemon.process.running():
            code = daemon.process.stop()
            if code != 0:
                failures.append(f"daemon exited {code}:\n{daemon.process.log_text()}")
    if failures:
        pytest.fail("\n".join(failures))
