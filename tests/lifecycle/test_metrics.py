"""Metrics and probes (issue 15): a real daemon with ``[metrics] enabled``, scraped over HTTP on loopback while
the dev kubelet admits and removes pods, restarts, and the driver fails or hangs. The exposition is parsed with
prometheus_client's own parser, and every counter is checked to move by exactly what happened."""

from __future__ import annotations

import functools
import http.client
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devplug.devkubelet import ContainerSpec, DevKubeletThread, KubeletError, PodSpec
from devplug.testing.configs import dev_config, write_toml
from devplug.testing.conformance import poll_until
from devplug.testing.recorder import read_hook_calls

RESOURCE = "example.com/mock"
#: The hooks the mock driver records in its call log.
HOOKS = ("preferred_allocation", "allocate", "pre_start", "post_stop", "deallocate")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str) -> tuple[int, str, str]:
    """GET over a plain connection (no proxy from the environment): status, body, content type."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode(), response.getheader("Content-Type") or ""
    finally:
        conn.close()


def _scrape(port: int) -> Samples:
    status, body, ctype = _get(port, "/metrics")
    assert status == 200, body
    assert ctype.startswith("text/plain; version=")  # the Prometheus text format
    samples: Samples = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _v(samples: Samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"no sample {name}{labels}; have {sorted(k for k in samples if k[0] == name)}"
    return samples[key]


def _hook(samples: Samples, kind: str, hook: str) -> float:
    return _v(samples, f"devplug_hook_{kind}_total", resource=RESOURCE, driver="mock", hook=hook)


#: The kit's poll_until, bounded at 20 s.
_poll = functools.partial(poll_until, timeout=20.0)


def _start(devplug_daemon: Any, folder: Path, count: int, replicas: int = 1, **knobs: Any) -> int:
    port = _free_port()
    table: dict[str, Any] = {"driver": "mock", "options": {"directory": str(folder), "count": count}}
    if replicas != 1:
        table["replicas"] = replicas
    devplug_daemon(
        {RESOURCE: table},
        metrics={"enabled": True, "port": port},
        **knobs,
    )
    _poll(lambda: _get(port, "/readyz")[0] == 200, "/readyz to answer 200")
    return port


@pytest.mark.parametrize("kep_mode", [False, True], ids=["stock-kubelet", "kep-kubelet"])
def test_counters_follow_a_pod_lifecycle(
    dev_kubelet: DevKubeletThread, devplug_daemon: Any, devplug_root: Path, kep_mode: bool
) -> None:
    dev_kubelet.kep_mode = kep_mode  # the KEP kubelet calls PostStopContainer and Deallocate itself
    folder = devplug_root / "mock"
    port = _start(devplug_daemon, folder, 2)
    assert _get(port, "/healthz")[:2] == (200, "ok\n")
    assert _get(port, "/readyz")[:2] == (200, "ready\n")
    assert _get(port, "/nothing")[0] == 404
    calls_before = {h: len(read_hook_calls(folder, hook=h)) for h in HOOKS}
    before = _scrape(port)
    assert _v(before, "devplug_devices", resource=RESOURCE, health="healthy") == 2
    assert _v(before, "devplug_devices", resource=RESOURCE, health="unhealthy") == 0
    assert _v(before, "devplug_resource_registered", resource=RESOURCE) == 1
    assert _v(before, "devplug_registrations_total", resource=RESOURCE) == 1
    assert _v(before, "devplug_kubelet_restarts_total", resource=RESOURCE) == 0
    assert _v(before, "devplug_allocations_total", resource=RESOURCE) == 0
    assert _v(before, "devplug_releases_total", resource=RESOURCE) == 0
    assert _v(before, "devplug_release_duration_seconds_count", resource=RESOURCE) == 0
    assert _hook(before, "calls", "start") == 1
    assert _hook(before, "calls", "list_devices") == 1

    pod = dev_kubelet.admit_pod(PodSpec("p", [ContainerSpec("c", {RESOURCE: 1})]))
    (dev,) = pod.container("c").devices[RESOURCE]
    admitted = _scrape(port)
    assert _v(admitted, "devplug_allocations_total", resource=RESOURCE) == 1
    assert _hook(admitted, "calls", "allocate") - _hook(before, "calls", "allocate") == 1
    assert _hook(admitted, "calls", "pre_start") - _hook(before, "calls", "pre_start") == 1
    assert _hook(admitted, "calls", "post_stop") == _hook(before, "calls", "post_stop") == 0
    assert _v(admitted, "devplug_releases_total", resource=RESOURCE) == 0
    journal = "devplug_ledger_write_duration_seconds_count"
    assert _v(admitted, journal, resource=RESOURCE, kind="journal") > _v(
        before, journal, resource=RESOURCE, kind="journal"
    )

    dev_kubelet.finish_pod("p")
    dev_kubelet.remove_pod("p")
    _poll(lambda: _v(_scrape(port), "devplug_releases_total", resource=RESOURCE) == 1, "the release to be counted")
    after = _scrape(port)
    assert [c.hook for c in read_hook_calls(folder, device=dev) if c.hook in ("post_stop", "deallocate")] == [
        "post_stop",
        "deallocate",
    ]
    # Each hook counter moved by exactly the calls the driver recorded, and allocation/release by one.
    for hook in HOOKS:
        recorded = len(read_hook_calls(folder, hook=hook)) - calls_before[hook]
        assert _hook(after, "calls", hook) - _hook(before, "calls", hook) == recorded, hook
    assert _hook(after, "calls", "post_stop") - _hook(before, "calls", "post_stop") == 1
    assert _hook(after, "calls", "deallocate") - _hook(before, "calls", "deallocate") == 1
    assert _v(after, "devplug_allocations_total", resource=RESOURCE) == 1
    assert _v(after, "devplug_release_duration_seconds_count", resource=RESOURCE) == 1
    assert _v(after, "devplug_release_duration_seconds_bucket", resource=RESOURCE, le="+Inf") == 1
    assert _v(after, "devplug_release_duration_seconds_sum", resource=RESOURCE) > 0
    for hook in HOOKS:
        assert _hook(after, "errors", hook) == 0, hook
        assert _hook(after, "timeouts", hook) == 0, hook
    assert _v(after, "devplug_devices", resource=RESOURCE, health="healthy") == 2
    assert _v(after, "devplug_registrations_total", resource=RESOURCE) == 1
    assert _v(after, "devplug_kubelet_restarts_total", resource=RESOURCE) == 0


def test_readiness_and_kubelet_restarts(dev_kubelet: DevKubeletThread, devplug_daemon: Any, devplug_root: Path) -> None:
    port = _start(devplug_daemon, devplug_root / "mock", 1)
    dev_kubelet.stop()
    _, body, _ = _poll(lambda: (r := _get(port, "/readyz")) and r[0] == 503 and r, "/readyz to answer 503")
    assert body == f"not ready: not registered with the kubelet: {RESOURCE}\n"
    assert _v(_scrape(port), "devplug_resource_registered", resource=RESOURCE) == 0
    assert _get(port, "/healthz")[0] == 200  # the loop still runs: alive, just not ready
    dev_kubelet.start()
    _poll(lambda: _get(port, "/readyz")[0] == 200, "/readyz to answer 200 again")
    samples = _scrape(port)
    # one kubelet restart ended the registration (its later signs count no more), one registration followed
    assert _v(samples, "devplug_kubelet_restarts_total", resource=RESOURCE) == 1
    assert _v(samples, "devplug_registrations_total", resource=RESOURCE) == 2
    assert _v(_scrape(port), "devplug_resource_registered", resource=RESOURCE) == 1


def test_hook_errors_and_timeouts(dev_kubelet: DevKubeletThread, devplug_daemon: Any, devplug_root: Path) -> None:
    folder = devplug_root / "mock"
    port = _start(devplug_daemon, folder, 1, hook_timeout=0.5)
    (folder / "mock0").write_text("fail=allocate\n")
    before = _scrape(port)
    with pytest.raises(KubeletError):
        dev_kubelet.admit_pod(PodSpec("p", [ContainerSpec("c", {RESOURCE: 1})]))
    failed = _scrape(port)
    assert _hook(failed, "calls", "allocate") - _hook(before, "calls", "allocate") == 1
    assert _hook(failed, "errors", "allocate") - _hook(before, "errors", "allocate") == 1
    assert _hook(failed, "timeouts", "allocate") == 0
    assert _v(failed, "devplug_allocations_total", resource=RESOURCE) == 0

    (folder / "mock0").write_text("delay=allocate:3\n")
    dev_kubelet.remove_pod("p")
    with pytest.raises(KubeletError, match="hook_timeout"):
        dev_kubelet.admit_pod(PodSpec("q", [ContainerSpec("c", {RESOURCE: 1})]))
    hung = _scrape(port)
    assert _hook(hung, "timeouts", "allocate") == 1
    assert _hook(hung, "errors", "allocate") == _hook(failed, "errors", "allocate")
    assert _v(hung, "devplug_allocations_total", resource=RESOURCE) == 0


def _run_once(root: Path, **tables: Any) -> subprocess.CompletedProcess[str]:
    config = dev_config(root, {RESOURCE: {"driver": "mock", "options": {"directory": str(root / "mock")}}}, **tables)
    path = write_toml(root / "devplug.toml", config)
    return subprocess.run(
        [sys.executable, "-m", "devplug", "run", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_taken_port_stops_the_daemon_naming_it(devplug_root: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _run_once(devplug_root, metrics={"enabled": True, "port": port})
    assert result.returncode == 2, result.stderr
    assert f"metrics: cannot serve on 127.0.0.1 port {port}: Address already in use" in result.stderr


def test_shared_devices_are_measured_by_physical_device(
    dev_kubelet: DevKubeletThread, devplug_daemon: Any, devplug_root: Path
) -> None:
    folder = devplug_root / "mock"
    port = _start(devplug_daemon, folder, 2, replicas=3)
    idle = _scrape(port)
    for device in ("mock0", "mock1"):
        assert _v(idle, "devplug_shared_device_replicas", resource=RESOURCE, device=device) == 3
        assert _v(idle, "devplug_shared_device_replicas_in_use", resource=RESOURCE, device=device) == 0
        assert _v(idle, "devplug_shared_device_tenants", resource=RESOURCE, device=device) == 0
    assert _v(idle, "devplug_devices", resource=RESOURCE, health="healthy") == 6  # replicas, as the kubelet sees them

    a = dev_kubelet.admit_pod(PodSpec("a", [ContainerSpec("c", {RESOURCE: 1})]))
    b = dev_kubelet.admit_pod(PodSpec("b", [ContainerSpec("c", {RESOURCE: 1})]))
    (ra,) = a.container("c").devices[RESOURCE]
    (rb,) = b.container("c").devices[RESOURCE]
    used = _scrape(port)
    per_device: dict[str, int] = {}
    for replica in (ra, rb):
        device = replica.split("::", 1)[0]
        per_device[device] = per_device.get(device, 0) + 1
    for device, n in per_device.items():
        assert _v(used, "devplug_shared_device_replicas_in_use", resource=RESOURCE, device=device) == n
        assert _v(used, "devplug_shared_device_tenants", resource=RESOURCE, device=device) == n
    total = sum(_v(used, "devplug_shared_device_tenants", resource=RESOURCE, device=d) for d in ("mock0", "mock1"))
    assert total == 2


def test_what_an_operator_alerts_on_allocated_devices_build_process_podresources_and_readiness(
    dev_kubelet: DevKubeletThread, devplug_daemon: Any, devplug_root: Path
) -> None:
    """Issue 25: allocated devices, build info, process metrics, PodResources reads; /readyz fails, saying why,
    while PodResources is unreadable past [release] grace_period (no release can be decided then)."""
    folder = devplug_root / "mock"
    port = _start(devplug_daemon, folder, 3, release_interval=0.1, grace_period=1.0)
    pod = dev_kubelet.admit_pod(PodSpec("p", [ContainerSpec("c", {RESOURCE: 2})]))
    assert len(pod.container("c").devices[RESOURCE]) == 2

    def read_twice() -> Samples | None:
        samples = _scrape(port)
        return samples if _v(samples, "devplug_podresources_reads_total") >= 2 else None

    samples = _poll(read_twice, "the reconciler to read PodResources")
    assert _v(samples, "devplug_devices_allocated", resource=RESOURCE) == 2
    assert _v(samples, "devplug_devices_busy", resource=RESOURCE) == 0
    assert _v(samples, "devplug_releases_failing", resource=RESOURCE) == 0
    assert _v(samples, "devplug_podresources_read_failures_total") == 0
    assert _v(samples, "devplug_podresources_last_success_timestamp_seconds") > 0
    assert _v(samples, "devplug_tenancies_awaiting_exit") == 0
    assert ("devplug_container_liveness_known", ()) in samples
    (build,) = [labels for name, labels in samples if name == "devplug_build_info"]
    assert dict(build)["version"] and dict(build)["hook_contract"] and dict(build)["python"]
    assert _v(samples, "process_resident_memory_bytes") > 0
    assert _v(samples, "process_cpu_seconds_total") > 0

    dev_kubelet.pod_resources_available = False  # an outage: no release can be decided
    _, body, _ = _poll(
        lambda: (r := _get(port, "/readyz"))[0] == 503 and r, "/readyz to fail while PodResources is unreadable"
    )
    assert "PodResources unreadable for" in body and "no release can be decided" in body
    assert _v(_scrape(port), "devplug_podresources_read_failures_total") > 0
    dev_kubelet.pod_resources_available = True
    _poll(lambda: _get(port, "/readyz")[:2] == (200, "ready\n"), "/readyz ready again once PodResources answers")
