"""``devplug demo``: the whole device lifecycle on ``config.example.toml``, on a machine without a kubelet.

A dev kubelet and the real daemon (a child process) run in a temporary
folder; the example config is moved there. The demo admits pods (preferred
allocation, allocate, pre-start, init-container device reuse), restarts a
container, hot-plugs a device and flips another's health, removes the pods
(post-stop and deallocate: found through PodResources on a stock kubelet, or
called directly in KEP mode), simulates a kubelet restart, and shuts the
daemon down. It prints what happened as a table, then the checks it made.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from devplug.config.tomlwrite import write_toml
from devplug.daemon.status import read_status
from devplug.devkubelet import CgroupLayout, ContainerSpec, DevKubeletThread, PodSpec
from devplug.devkubelet.cgroups import unique_cgroup_root
from devplug.devkubelet.daemonconfig import no_containers_liveness
from devplug.engine import read_ledger_records
from devplug.errors import ConfigError, StateError
from devplug.kit.hookrecord import read_hook_calls
from devplug.kube.names import resource_state_dir
from devplug.testing.process import DaemonProcess
from devplug.types import ContainerAllocation

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["run_demo"]

Echo = Callable[[str], None]


def example_config_text() -> str:
    """The text of ``config.example.toml`` as shipped with devplug."""
    return (resources.files("devplug") / "config.example.toml").read_text()


def relocate(
    config: dict[str, Any], root: Path, liveness: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, Path]]:
    """The example config with every path moved under ``root``; also each mock resource's folder.

    ``liveness`` is the ``[liveness]`` table for the dev kubelet's containers; by default the dev kubelet runs none,
    and a pod that vanished is released after :data:`~devplug.devkubelet.daemonconfig.NO_CONTAINERS_GRACE`
    seconds.
    """
    config = json.loads(json.dumps(config))
    config["liveness"] = liveness if liveness is not None else no_containers_liveness(root)
    config.setdefault("kubelet", {})
    config["kubelet"]["device_plugin_dir"] = str(root / "device-plugins")
    config["kubelet"]["pod_resources_socket"] = str(root / "pod-resources" / "kubelet.sock")
    config.setdefault("state", {})["dir"] = str(root / "state")
    config.setdefault("cdi", {}).update(enabled=True, spec_dir=str(root / "cdi"))  # CDI specs, in the folder too
    mock_dirs: dict[str, Path] = {}
    for i, (name, table) in enumerate(config.get("resources", {}).items()):
        if table.get("driver") == "mock":
            directory = root / f"mock-{i}"
            table.setdefault("options", {})["directory"] = str(directory)
            mock_dirs[name] = directory
    if not mock_dirs:
        raise ConfigError("config.example.toml has no resource with driver = 'mock'; the demo needs one")
    return config, mock_dirs


@dataclass
class _Report:
    echo: Echo
    start: float = field(default_factory=time.time)
    rows: list[tuple[float, str, str, str, str]] = field(default_factory=list)
    checks: list[tuple[str, bool]] = field(default_factory=list)

    def check(self, what: str, ok: bool) -> bool:
        self.checks.append((what, ok))
        return ok


def _wait(what: str, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def run_demo(*, kep_mode: bool = False, keep: bool = False, echo: Echo = print) -> bool:
    """Run the demo; return True when every lifecycle check passed."""
    raw = tomllib.loads(example_config_text())
    root = Path(tempfile.mkdtemp(prefix="devplug-demo-", dir="/tmp"))
    report = _Report(echo)
    cgroups = _cgroups(echo)
    try:
        config, mock_dirs = relocate(raw, root, cgroups.liveness_config() if cgroups is not None else None)
        config_path = write_toml(root / "config.toml", config)
        resource, mock_dir = next(iter(mock_dirs.items()))
        count = int(config["resources"][resource]["options"].get("count", 0))
        echo(f"devplug demo ({'KEP' if kep_mode else 'stock'} kubelet mode) in {root}")
        echo(f"config: config.example.toml with its paths moved there and CDI on; resource {resource} (mock driver)\n")
        with DevKubeletThread(
            root / "device-plugins",
            pod_resources_socket=root / "pod-resources" / "kubelet.sock",
            kep_mode=kep_mode,
            cgroups=cgroups,
        ) as kubelet:
            daemon = DaemonProcess(config_path, root / "daemon.log", log_level="info")
            daemon.start()
            try:
                _lifecycle(
                    report, kubelet, daemon, resource, mock_dir, count, kep_mode, config["state"]["dir"], root / "cdi"
                )
            finally:
                if daemon.running():
                    code = daemon.stop()
                    report.check("daemon exits 0 on SIGTERM", code == 0)
                    socket = root / "device-plugins" / f"devplug-{resource.replace('/', '_')}.sock"
                    report.check("daemon removed its socket", not socket.exists())
            _table(report, kubelet, mock_dir)
        _summary(report)
        if not all(ok for _, ok in report.checks):
            echo(f"\ndaemon log: {root / 'daemon.log'}")
            keep = True
        return all(ok for _, ok in report.checks)
    finally:
        if keep:
            echo(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def _cdi_check(
    report: _Report, ids: tuple[str, ...], answer: ContainerAllocation, resource: str, spec_dir: Path
) -> None:
    """Allocate named the devices' CDI devices, kept the device nodes as fallback, and the spec file lists them."""
    names = [c.name for c in answer.cdi_devices]
    nodes = sorted(d.container_path for d in answer.devices)
    report.check(
        "Allocate answered CDI device names, and the device nodes as fallback",
        names == [f"{resource}={i}" for i in ids] and nodes == sorted(f"/dev/mock/{i}" for i in ids),
    )
    spec_file = spec_dir / f"devplug-{resource.replace('/', '_')}.json"
    try:
        listed = {d["name"] for d in json.loads(spec_file.read_text())["devices"]}
    except (OSError, ValueError, KeyError, TypeError):
        listed = set()
    report.check(f"the CDI spec {spec_file.name} describes them", bool(ids) and set(ids) <= listed)


def _lifecycle(
    report: _Report,
    kubelet: DevKubeletThread,
    daemon: DaemonProcess,
    resource: str,
    mock_dir: Path,
    count: int,
    kep_mode: bool,
    daemon_state_dir: str,
    cdi_dir: Path,
) -> None:
    check = report.check
    kubelet.wait_registered(resource, timeout=15)
    check(f"{resource} registered", True)

    def view_ok(capacity: int, allocatable: int) -> Callable[[], bool]:
        def ok() -> bool:
            view = kubelet.resource(resource)
            return view is not None and view.capacity == capacity and view.allocatable == allocatable

        return ok

    check(f"{count} healthy devices advertised", _wait("devices", view_ok(count, count)))

    train = PodSpec(
        "train-0",
        [
            ContainerSpec("prepare", {resource: 1}, init=True),
            ContainerSpec("trainer", {resource: 2}),
        ],
    )
    pod = kubelet.admit_pod(train)
    init_ids = pod.containers[0].devices[resource]
    app_ids = pod.containers[1].devices[resource]
    check("init container's device reused by the app container", set(init_ids) <= set(app_ids))
    env = pod.containers[1].allocations[resource].envs.get("MOCK_DEVICES", "")
    check("Allocate answered MOCK_DEVICES for the app container", env == ",".join(app_ids))
    _cdi_check(report, app_ids, pod.containers[1].allocations[resource], resource, cdi_dir)
    serve = kubelet.admit_pod(PodSpec("serve-0", [ContainerSpec("server", {resource: 1})]))
    serve_ids = serve.containers[0].devices[resource]
    check("pods got distinct devices", not set(serve_ids) & set(app_ids))
    kubelet.start_container("serve-0", "server")
    pre_starts = read_hook_calls(mock_dir, hook="pre_start")
    check("pre-start called at each container start (restart included)", len(pre_starts) >= 3)

    state_dir = Path(daemon_state_dir)

    def pods_seen() -> bool:
        try:
            status = read_status(state_dir)
        except StateError:
            return False
        seen = {d["id"]: d.get("pod") for r in status["resources"] for d in r["devices"]}
        return all(seen.get(i) for i in (*app_ids, *serve_ids))

    check("daemon saw the pods in PodResources", _wait("pods seen", pods_seen, 15))

    hot = f"mock{count}"
    (mock_dir / hot).write_text("numa=0\n")
    # The kubelet's allocatable counts healthy devices, allocated or not.
    check(f"hot-plugged {hot} reached the kubelet", _wait("hot-plug", view_ok(count + 1, count + 1)))
    free = sorted({f"mock{i}" for i in range(count)} - set(app_ids) - set(serve_ids))
    sick = free[0] if free else hot
    (mock_dir / sick).write_text("unhealthy\n")
    check(f"{sick} turning unhealthy reached the kubelet", _wait("unhealthy", view_ok(count + 1, count)))
    (mock_dir / sick).write_text("")
    check(f"{sick} healthy again", _wait("healthy", view_ok(count + 1, count + 1)))

    kubelet.remove_pod("train-0")
    kubelet.remove_pod("serve-0")

    def released() -> bool:
        done = read_hook_calls(mock_dir, hook="deallocate", ok=True)
        return {d for c in done for d in c.device_ids} >= set(app_ids) | set(serve_ids)

    how = "the KEP's Deallocate" if kep_mode else "PodResources (stock kubelet)"
    check(f"removed pods' devices post-stopped and deallocated via {how}", _wait("release", released, 15))
    deallocs = read_hook_calls(mock_dir, hook="deallocate")
    per_device = [d for c in deallocs for d in c.device_ids]
    check("each device deallocated exactly once", len(per_device) == len(set(per_device)))
    check(
        "every device healthy and free again",
        _wait("free", lambda: view_ok(count + 1, count + 1)() and not kubelet.pods()),
    )

    before = kubelet.registrations(resource)
    start = time.monotonic()
    kubelet.restart()
    kubelet.wait_registered(resource, timeout=10, after=before)
    took = (time.monotonic() - start) * 1000
    check(
        f"re-registered after a kubelet restart ({took:.0f} ms)", _wait("after restart", view_ok(count + 1, count + 1))
    )
    if kubelet.cgroup_layout is not None and not kep_mode:
        _removal_window(report, kubelet, resource, mock_dir, state_dir)
    check("daemon still running", daemon.running())


def _removal_window(report: _Report, kubelet: DevKubeletThread, resource: str, mock_dir: Path, state_dir: Path) -> None:
    """A force-deleted pod whose container traps SIGTERM: the kubelet forgets it at once, devplug cleans its device
    only once the container is gone."""
    spec = PodSpec("slow-exit", [ContainerSpec("app", {resource: 1}, stop_delay=1.0)], termination_grace_period=5)
    (device,) = kubelet.admit_pod(spec).containers[0].devices[resource]
    kubelet.wait_for(lambda k: bool(k.container_pids("slow-exit", "app")), timeout=10)
    ledger = resource_state_dir(state_dir, resource) / "ledger.json"
    uid = kubelet.pod_uid("slow-exit")

    def uid_learnt() -> bool:  # the daemon reads the pod's UID from the kubelet's checkpoint at its next pass
        return any(r.get("pod_uid") == uid for r in read_ledger_records(ledger, resource))

    _wait("the pod's UID in the ledger", uid_learnt, 15)
    before = len(read_hook_calls(mock_dir, hook="deallocate"))
    kubelet.force_delete_pod("slow-exit")
    kubelet.wait_containers_exited("slow-exit", timeout=30)
    exited = _last_container_exit(kubelet, "slow-exit")

    def cleaned() -> bool:
        return any(device in c.device_ids for c in read_hook_calls(mock_dir, hook="deallocate")[before:])

    done = _wait("release after exit", cleaned, 15)
    when = [c.time for c in read_hook_calls(mock_dir, hook="deallocate")[before:] if device in c.device_ids]
    what = f"a force-deleted pod's {device} cleaned only after its last container exited"
    if exited is None:
        what += " (the dev kubelet recorded no container-exited event)"
    elif when:
        what += f" ({(when[0] - exited) * 1000:.0f} ms after)"
    report.check(what, done and bool(when) and exited is not None and when[0] >= exited)


def _last_container_exit(kubelet: DevKubeletThread, pod: str, namespace: str = "default") -> float | None:
    """When the last of the pod's containers exited: the time of the dev kubelet's ``container-exited`` event for it.

    Not when a poll noticed, which under load comes after the daemon's release and made a release that waited for
    the exit look like one that did not ("-0 ms after"). The event is recorded once the container's processes are
    gone and its cgroup removed, before the kubelet stops the pod's sandbox; the pod's cgroup, which the daemon
    waits for, empties only after that, so a release that waited is never earlier than this time. None: no event.
    """
    prefix = f"{namespace}/{pod}/"  # a container's label; the sandbox's is "namespace/pod (sandbox)"
    times = [e.time for e in kubelet.events_of("container-exited") if e.detail.startswith(prefix)]
    return max(times) if times else None


def _cgroups(echo: Echo) -> CgroupLayout | None:
    """Cgroups for the dev kubelet's containers (cgroup v2 when the host has it: its exits are events), or None
    when the demo cannot make them (not root): the containers are then not run, and the daemon is told so."""
    from devplug.devkubelet.cgroups import CgroupsUnavailableError

    if os.geteuid() != 0:
        echo("(not root: the dev kubelet runs no container processes, so releases wait a short grace instead)")
        return None
    for version in (2, None):
        try:
            return CgroupLayout.detect(version, root=unique_cgroup_root("devplug-demo"))
        except CgroupsUnavailableError:
            continue
    echo("(no usable cgroups: the dev kubelet runs no container processes)")
    return None


def _table(report: _Report, kubelet: DevKubeletThread, mock_dir: Path) -> None:
    rows: list[tuple[float, str, str, str, str]] = []
    for event in kubelet.events:
        if event.kind == "list-and-watch":
            continue
        rows.append((event.time, "kubelet", event.kind, ",".join(event.device_ids), event.detail))
    for call in read_hook_calls(mock_dir):
        detail = "" if call.ok else f"error: {call.error}"
        rows.append((call.time, "driver", call.hook, ",".join(call.device_ids), detail))
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0] if rows else time.time()
    echo = report.echo
    echo(f"{'time':>8}  {'who':<7}  {'event':<20}  {'devices':<22}  detail")
    echo(f"{'-' * 8}  {'-' * 7}  {'-' * 20}  {'-' * 22}  {'-' * 30}")
    for stamp, who, kind, devices, detail in rows:
        echo(f"{stamp - t0:8.3f}  {who:<7}  {kind:<20}  {devices:<22}  {detail[:70]}")


def _summary(report: _Report) -> None:
    report.echo("")
    for what, ok in report.checks:
        report.echo(f"  [{'ok' if ok else 'FAILED'}] {what}")
    passed = sum(ok for _, ok in report.checks)
    report.echo(f"\n{passed}/{len(report.checks)} lifecycle checks passed")
