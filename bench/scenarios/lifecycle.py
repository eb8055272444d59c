"""The daemon's life with the dev kubelet: start-up until registered, idle footprint, kubelet restarts.

One node, 3 resources x 100 devices. Start-up is timed from just before the
process is created until the dev kubelet recorded the last of the three
registrations (it records one once it dialed the plugin and got its options,
inside Register); the daemon is stopped and started again for each run, and
the last run stays up for the idle window and the restarts. The idle window
samples the daemon and, side by side, an idle bare grpcio server holding one
ListAndWatch stream of 100 devices.
"""

from __future__ import annotations

import statistics
import time

from bench.client import PluginClient
from bench.floors import FloorProcess
from bench.procstat import rss_parts_mb, sample
from bench.settings import Settings
from bench.stats import percentile
from bench.workspace import Node
from devplug.devkubelet import DevKubelet, DevKubeletThread

#: A resource not registered again this long after a kubelet restart counts as a failed re-registration.
REREGISTER_TIMEOUT_S = 10.0

__all__ = ["measure_idle", "measure_reregister", "measure_startup", "measure_startup_floor", "wait_streams"]


def _last_register_time(kubelet: DevKubeletThread, resources: list[str]) -> float:
    times = {}
    for event in kubelet.events:
        if event.kind == "register" and event.resource in resources:
            times[event.resource] = event.time
    return max(times[r] for r in resources)


def _wait_registered(kubelet: DevKubeletThread, before: dict[str, int], timeout: float = 60.0) -> None:
    kubelet.wait_for(
        lambda k: all(k.registrations(r) > n for r, n in before.items()),
        timeout,
        what="every resource to register again",
    )


def wait_streams(kubelet: DevKubeletThread, resources: list[str], timeout: float = 30.0) -> None:
    def streaming(k: DevKubelet) -> bool:
        views = [k.resource(r) for r in resources]
        return all(v is not None and v.stream_open and len(v.devices) > 0 for v in views)

    kubelet.wait_for(streaming, timeout, what="every ListAndWatch stream to be open")


def measure_startup(settings: Settings, node: Node, kubelet: DevKubeletThread) -> dict[str, float]:
    """Process start until every resource registered (median of the runs); leaves the daemon running."""
    resources = list(node.config["resources"])
    runs: list[float] = []
    for run in range(settings.startup_runs):
        before = {r: kubelet.registrations(r) for r in resources}
        started = node.start()
        _wait_registered(kubelet, before)
        runs.append(1000.0 * (_last_register_time(kubelet, resources) - started))
        wait_streams(kubelet, resources)
        if run < settings.startup_runs - 1:
            node.stop()
    return {"startup_to_registered_ms": statistics.median(runs), "startup_to_registered_min_ms": min(runs)}


def measure_startup_floor(settings: Settings, floors: list[FloorProcess]) -> float:
    """Process start until a bare grpcio server answered a call, in ms (median over ``floors``, each started here)."""
    runs = []
    for floor in floors:
        started = time.time()
        floor.start()
        client = PluginClient(floor.socket)
        try:
            client.options()
            runs.append(1000.0 * (time.time() - started))
        finally:
            client.close()
            floor.stop()
    return statistics.median(runs)


def measure_idle(settings: Settings, node: Node, floor: FloorProcess) -> dict[str, float]:
    """The registered daemon and an idle floor, sampled over the same ``idle_s`` window."""
    client = PluginClient(floor.socket)
    watcher = client.watch()
    try:
        watcher.wait(0)
        time.sleep(settings.idle_settle_s)
        pids = {"daemon": node.process.pid, "floor": floor.pid}
        first = {k: sample(p) for k, p in pids.items()}
        time.sleep(settings.idle_s)
        last = {k: sample(p) for k, p in pids.items()}
        rss = {k: rss_parts_mb(p) for k, p in pids.items()}
    finally:
        watcher.close()
        client.close()
    return {
        "idle_rss_mb": rss["daemon"]["VmRSS"],
        "idle_rss_anon_mb": rss["daemon"]["RssAnon"],
        "idle_rss_file_mb": rss["daemon"]["RssFile"],
        "idle_cpu_percent": first["daemon"].cpu_percent(last["daemon"]),
        "idle_cpu_percent_ticks": first["daemon"].cpu_percent_ticks(last["daemon"]),
        "idle_wakeups_per_s": first["daemon"].switches_per_s(last["daemon"]),
        "idle_floor_rss_mb": rss["floor"]["VmRSS"],
        "idle_floor_rss_anon_mb": rss["floor"]["RssAnon"],
        "idle_floor_rss_file_mb": rss["floor"]["RssFile"],
        "idle_floor_cpu_percent": first["floor"].cpu_percent(last["floor"]),
        "idle_floor_wakeups_per_s": first["floor"].switches_per_s(last["floor"]),
    }


def measure_reregister(settings: Settings, node: Node, kubelet: DevKubeletThread) -> dict[str, float]:
    """Dev kubelet restarts (sockets deleted, kubelet.sock served again) until every resource registered again.

    A restart after which some resource has not registered within ``REREGISTER_TIMEOUT_S`` counts as a
    failure: its sample is the timeout, and the series stops there (the daemon does not recover by itself).
    """
    resources = list(node.config["resources"])
    samples: list[float] = []
    failures = 0
    for _ in range(settings.reregister_restarts):
        wait_streams(kubelet, resources)
        time.sleep(0.1)
        before = {r: kubelet.registrations(r) for r in resources}
        started = time.time()
        kubelet.restart()
        try:
            _wait_registered(kubelet, before, timeout=REREGISTER_TIMEOUT_S)
        except TimeoutError:
            failures += 1
            samples.append(1000.0 * REREGISTER_TIMEOUT_S)
            break
        samples.append(1000.0 * (_last_register_time(kubelet, resources) - started))
    return {
        "reregister_p50_ms": percentile(samples, 50),
        "reregister_p99_ms": percentile(samples, 99),
        "reregister_restarts": float(len(samples)),
        "reregister_failures": float(failures),
    }
