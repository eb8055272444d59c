"""The whole run: the speed nodes (benchmark kubelet), the lifecycle node and the release node (dev kubelet), and a
node serving through DRA (bench.dra)."""

from __future__ import annotations

import compileall
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import devplug
import devplug_mock
from bench.floors import FloorProcess, grpc_floor, unix_floor
from bench.kubelet import MiniKubelet
from bench.machine import machine_info
from bench.payloads import device_ids, mock_allocate_response
from bench.scenarios import allocate, exitrelease, handover, holds, law, lifecycle, metricsflood, preferred, release
from bench.settings import Settings
from bench.workspace import Node, Workspace
from devplug.devkubelet import CgroupLayout, CgroupsUnavailableError, DevKubeletThread
from devplug.devkubelet.cgroups import unique_cgroup_root

__all__ = ["SCENARIOS", "Scenario", "compile_bytecode", "run_all"]

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextmanager
def _phase(name: str, log: Log) -> Iterator[None]:
    log(f"bench: {name} ...")
    start = time.monotonic()
    yield
    log(f"bench: {name} done in {time.monotonic() - start:.1f} s")


@contextmanager
def _running(node: Node, allow_failure: bool = False) -> Iterator[Node]:
    try:
        yield node
    finally:
        try:
            node.stop()
        except RuntimeError as exc:  # a daemon stuck by a failed re-registration may not exit cleanly
            if not allow_failure:
                raise
            print(f"bench: {exc}", file=sys.stderr)


def _cgroups(version: int | None) -> CgroupLayout | None:
    """Cgroups of ``version`` (None: the host's kind) with a fresh root for a dev kubelet's containers, or None."""
    if os.geteuid() != 0:
        return None
    try:
        return CgroupLayout.detect(version, root=unique_cgroup_root("devplug-bench"))
    except CgroupsUnavailableError:
        return None


@contextmanager
def _dev_kubelet(node: Node, cgroups: CgroupLayout | None = None) -> Iterator[DevKubeletThread]:
    kubelet = DevKubeletThread(
        node.root / "device-plugins",
        pod_resources_socket=node.root / "pod-resources" / "kubelet.sock",
        cgroups=cgroups,
    )
    kubelet.start()
    try:
        yield kubelet
    finally:
        kubelet.close()


def _speed(ws: Workspace, s: Settings, out: dict[str, Any], log: Log) -> None:
    a1k, a10, b10k, r1k = "bench.dev/a1k", "bench.dev/a10", "bench.dev/b10k", "bench.dev/r1k"
    e10k = "bench.dev/e10k"  # node b's resource again, in a daemon that holds 1,000 allocations
    t1k = "bench.dev/t1k"  # the same 1k devices, the mock's hooks in the resource's hook thread
    floors = ws.path("f")
    with ExitStack() as stack:
        mocks_a = {a1k: (s.devices_1k, s.numa_nodes), a10: (s.devices_small, 0), t1k: (s.devices_1k, s.numa_nodes)}
        node_a = ws.node("a", mocks_a, grace_period=3600, threaded_hooks={t1k})
        node_b = ws.node("b", {b10k: (s.devices_10k, 0)}, grace_period=3600)
        node_e = ws.node("e", {e10k: (s.devices_10k, 0)}, grace_period=3600)
        shared = s.devices_1k // allocate.REPLICAS
        node_c = ws.node("c", {r1k: (shared, s.numa_nodes)}, grace_period=3600, replicas={r1k: allocate.REPLICAS})
        kube_a = stack.enter_context(MiniKubelet(node_a.root))
        kube_b = stack.enter_context(MiniKubelet(node_b.root))
        kube_c = stack.enter_context(MiniKubelet(node_c.root))
        kube_e = stack.enter_context(MiniKubelet(node_e.root))
        for node in (node_a, node_b, node_c, node_e):
            stack.enter_context(_running(node))
            node.start()
        host_dir = str(node_a.mock_folder(a1k))
        reply = len(mock_allocate_response(device_ids(s.per_call), host_dir).SerializeToString())
        aio = stack.enter_context(
            grpc_floor(floors / "aio.sock", floors / "aio.log", mode="aio", devices=s.devices_10k, host_dir=host_dir)
        )
        sync = stack.enter_context(
            grpc_floor(floors / "sync.sock", floors / "sync.log", mode="sync", devices=10, host_dir=host_dir)
        )
        unix = stack.enter_context(unix_floor(floors / "unix.sock", floors / "unix.log", reply_size=reply))
        reg_1k, reg_10, reg_10k, reg_r1k, reg_t1k, reg_e10k = (
            kube_a.wait_registered(a1k),
            kube_a.wait_registered(a10),
            kube_b.wait_registered(b10k),
            kube_c.wait_registered(r1k),
            kube_a.wait_registered(t1k),
            kube_e.wait_registered(e10k),
        )
        for reg in (reg_1k, reg_10, reg_10k, reg_r1k, reg_t1k, reg_e10k):
            reg.watcher.wait(0, timeout=60)
        floor_aio, floor_sync = (stack.enter_context(_closing_client(f)) for f in (aio, sync))
        floor_aio.options()
        floor_sync.options()

        with _phase("Allocate (1k, floors, empty ledger, replicas = 8, 10k, churn)", log):
            out.update(
                allocate.measure(
                    s,
                    plugin_1k=(reg_1k.client, reg_1k.watcher),
                    plugin_10k=(reg_10k.client, reg_10k.watcher, node_b.mock_folder(b10k)),
                    plugin_10k_held=(reg_e10k.client, reg_e10k.watcher),
                    plugin_replicas=(reg_r1k.client, reg_r1k.watcher),
                    plugin_threaded=(reg_t1k.client, reg_t1k.watcher),
                    floor_aio=floor_aio,
                    floor_sync=floor_sync,
                    unix_socket=unix.socket,
                    host_dir=host_dir,
                )
            )
        with _phase("GetPreferredAllocation", log):
            out.update(preferred.measure(s, client=reg_1k.client, floor=floor_aio))
        with _phase("ListAndWatch push", log):
            last = s.devices_small - 1
            out["law_push_ms_10"], _ = law.measure(s.law_samples, reg_10.watcher, node_a.mock_folder(a10), last)
            last = s.devices_1k - 1
            out["law_push_ms_1k"], _ = law.measure(
                s.law_samples, reg_1k.watcher, node_a.mock_folder(a1k), last, s.numa_nodes
            )
            floor_watcher = floor_aio.watch()
            try:
                floor_watcher.wait(0, timeout=30)
                last = s.devices_10k - 1
                mine, floor = law.measure(
                    s.law_samples, reg_10k.watcher, node_b.mock_folder(b10k), last, floor=(floor_watcher, aio)
                )
            finally:
                floor_watcher.close()
            assert floor is not None
            out.update(law_push_ms_10k=mine, law_push_floor_ms_10k=floor, law_push_ratio_10k=mine / floor)


@contextmanager
def _closing_client(floor: FloorProcess) -> Iterator[Any]:
    from bench.client import PluginClient

    client = PluginClient(floor.socket)
    try:
        yield client
    finally:
        client.close()


def _lifecycle(ws: Workspace, s: Settings, out: dict[str, Any], log: Log) -> None:
    floors = ws.path("g")
    resources = {f"bench.dev/c{i}": (s.idle_devices, 0) for i in range(s.idle_resources)}
    node = ws.node("c", resources)
    with _dev_kubelet(node) as kubelet, _running(node, allow_failure=True):
        with _phase("start-up", log):
            starts = [
                grpc_floor(floors / f"s{i}.sock", floors / f"s{i}.log", mode="aio", devices=10, host_dir="/tmp")
                for i in range(s.startup_runs)
            ]
            out["startup_floor_ms"] = lifecycle.measure_startup_floor(s, starts)
            out.update(lifecycle.measure_startup(s, node, kubelet))
        with _phase(f"idle ({s.idle_s:g} s)", log):
            idle_floor = grpc_floor(
                floors / "idle.sock", floors / "idle.log", mode="aio", devices=s.idle_devices, host_dir="/tmp"
            )
            with idle_floor:
                out.update(lifecycle.measure_idle(s, node, idle_floor))
        with _phase("kubelet restarts", log):
            out.update(lifecycle.measure_reregister(s, node, kubelet))


def _release(ws: Workspace, s: Settings, out: dict[str, Any], log: Log) -> None:
    cgroups = _cgroups(2) or _cgroups(None)  # the pods' containers are real processes, so releases wait on them
    liveness = cgroups.liveness_config() if cgroups is not None else None
    node = ws.node("d", {"bench.dev/rel": (max(40, 2 * s.release_pods), 0)}, liveness=liveness)  # default interval
    with _dev_kubelet(node, cgroups) as kubelet, _running(node):
        node.start()
        kubelet.wait_registered("bench.dev/rel", timeout=60)
        lifecycle.wait_streams(kubelet, ["bench.dev/rel"])
        with _phase("release (stock kubelet, 1 s interval)", log):
            out.update(release.measure(s, node, kubelet))


def _exit(ws: Workspace, s: Settings, out: dict[str, Any], log: Log) -> None:
    for version, label in ((2, "v2"), (1, "v1")):
        cgroups = _cgroups(version)
        if cgroups is None:
            log(f"bench: no cgroup {label} for the dev kubelet's containers: exit-to-release not measured there")
            continue
        node = ws.node(
            f"x{version}", {"bench.dev/exit": (max(40, 2 * s.release_pods), 0)}, liveness=cgroups.liveness_config()
        )
        with _dev_kubelet(node, cgroups) as kubelet, _running(node):
            node.start()
            kubelet.wait_registered("bench.dev/exit", timeout=60)
            lifecycle.wait_streams(kubelet, ["bench.dev/exit"])
            with _phase(f"container exit to release (cgroup {label}, kubelet already forgot the pod)", log):
                out.update(exitrelease.measure(s, node, kubelet, label))


def _holds(ws: Workspace, s: Settings, out: dict[str, Any], log: Log) -> None:
    cgroups = _cgroups(2)
    if cgroups is None:
        log("bench: no cgroup v2 for the dev kubelet's containers: the kubelet call holds are not measured")
        return
    port = metricsflood.free_port()
    metrics = {"enabled": True, "address": "127.0.0.1", "port": port}
    node = ws.node(
        "k", {holds.HOLDING: (4, 0), holds.FAILING: (1, 0)}, liveness=cgroups.liveness_config(), metrics=metrics
    )
    (node.mock_folder(holds.FAILING) / "mock0").write_text("fail=allocate\n")
    with _dev_kubelet(node, cgroups) as kubelet, _running(node):
        node.start()
        for resource in (holds.HOLDING, holds.FAILING):
            kubelet.wait_registered(resource, timeout=60)
        lifecycle.wait_streams(kubelet, [holds.HOLDING, holds.FAILING])
        with _phase("kubelet call holds (rejected pod, short pod, free beside busy, forced removal's window)", log):
            out.update(holds.measure(s, node, kubelet, port))


def _metrics_flood(ws: Workspace, s: Settings, out: dict[str, Any], log: Log) -> None:
    port = metricsflood.free_port()
    metrics = {"enabled": True, "address": "127.0.0.1", "port": port}
    node = ws.node("m", {"bench.dev/flood": (s.flood_devices, 0)}, grace_period=3600, metrics=metrics)
    with MiniKubelet(node.root) as kubelet, _running(node):
        node.start()
        reg = kubelet.wait_registered("bench.dev/flood")
        reg.watcher.wait(0, timeout=60)
        pid = node.process.pid
        with _phase(f"Allocate beside {s.flood_connections} slow clients of the metrics port", log):
            out.update(metricsflood.measure(s, reg.client, pid, port, node.process.log_path))


def _handover(ws: Workspace, s: Settings, out: dict[str, Any], log: Log) -> None:
    resource = "bench.dev/ho"
    node = ws.node("h", {resource: (s.handover_devices, 0)}, grace_period=3600, handover={"enabled": True})
    with _dev_kubelet(node) as kubelet, _running(node):
        node.start()
        kubelet.wait_registered(resource, timeout=60)
        lifecycle.wait_streams(kubelet, [resource])
        with _phase(f"rolling-update handover ({s.handovers}x, Allocates running)", log):
            out.update(handover.measure(s, node, kubelet))


def _dra(ws: Workspace, s: Settings, out: dict[str, Any], log: Log) -> None:
    from bench import dra  # its own API server stand-in, dev kubelet and folder under /tmp (short socket paths)

    with _phase(f"DRA prepare/unprepare ({s.dra_rounds} rounds) and health changes ({s.dra_health_rounds})", log):
        figures = dra.measure(s.dra_rounds, s.dra_warmup, s.dra_health_rounds, daemon_env=ws.daemon_env or None)
        out.update(dra.results_keys(figures))


def _dra_handover(ws: Workspace, s: Settings, out: dict[str, Any], log: Log) -> None:
    from bench import drahandover  # its own API server stand-in, dev kubelet and folder under /tmp

    with _phase(f"DRA rolling-update handover ({s.handovers}x, prepares running)", log):
        out.update(drahandover.measure(s.handovers, s.handover_steady_calls, daemon_env=ws.daemon_env))


@contextmanager
def _environment(added: Mapping[str, str]) -> Iterator[None]:
    """``added`` in this process's environment meanwhile (for children that take it whole), then as it was."""
    before = {name: os.environ.get(name) for name in added}
    os.environ.update(added)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _shared(ws: Workspace, s: Settings, out: dict[str, Any], log: Log) -> None:
    from bench.scenarios import shared  # devplug-shared is a driver of this checkout, installed by make

    # Its nodes (devplug.testing.nodes.LocalNode) start their daemons with this process's environment; the only
    # children it starts are those daemons (the dev kubelets are threads), so the workspace's daemon environment
    # goes there for the time of the scenario.
    with _phase("devplug-shared slot hand-over between two nodes", log), _environment(ws.daemon_env):
        out.update(shared.measure(handovers=2 if s.quick else 10))


#: A part of the run: it measures in the workspace (its daemons started with ``Workspace.daemon_env``) and adds its
#: figures (results.json keys) to the dict.
Scenario = Callable[[Workspace, Settings, dict[str, Any], Log], None]

#: Every part of ``make bench``, by name, in the order it runs them.
SCENARIOS: dict[str, Scenario] = {
    "speed": _speed,
    "lifecycle": _lifecycle,
    "release": _release,
    "exit": _exit,
    "holds": _holds,
    "flood": _metrics_flood,
    "handover": _handover,
    "dra": _dra,
    "dra-handover": _dra_handover,
    "shared": _shared,
}


def compile_bytecode(log: Log) -> None:
    """Compile devplug's and the mock's modules, as ``pip install`` does for a wheel.

    Daemons started from a source checkout under ``PYTHONDONTWRITEBYTECODE``
    (as CI and some shells set it) would otherwise compile every module at
    each start, which is not what a node running the installed wheels pays.
    """
    for package in (devplug, devplug_mock):
        if package.__file__ is None:  # a namespace package: nothing of ours to compile
            continue
        folder = Path(package.__file__).parent
        if not compileall.compile_dir(folder, quiet=1):
            log(f"bench: could not compile every module under {folder}")


def run_all(settings: Settings, *, keep: bool = False, log: Log = _stderr) -> dict[str, Any]:
    """Run every scenario; the results.json content (without goals)."""
    started = time.monotonic()
    compile_bytecode(log)
    out: dict[str, Any] = {"machine": machine_info(), "quick": settings.quick}
    with Workspace(keep=keep) as ws:
        log(f"bench: working in {ws.root}")
        for scenario in SCENARIOS.values():
            scenario(ws, settings, out, log)
    out["duration_s"] = round(time.monotonic() - started, 1)
    out["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return out
