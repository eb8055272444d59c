"""The reconciler stays under the kubelet's PodResources rate limit and backs off when told to."""

from __future__ import annotations

from pathlib import Path

from devplug.daemon.status import read_status
from devplug.devkubelet import ContainerSpec, DevKubeletThread, PodSpec
from devplug.engine.ledger import read_ledger_records
from devplug.errors import StateError
from devplug.kube.names import resource_state_dir
from devplug.testing.configs import dev_config, write_toml
from devplug.testing.daemon import DaemonProcess
from devplug_mock import read_calls

from .conftest import Wait

MOCK = "example.com/mock"


def _release_error(state: Path) -> str:
    try:
        return str(read_status(state)["release"]["last_error"] or "")
    except StateError:
        return ""


def _pod_in_ledger(state: Path) -> str | None:
    records = read_ledger_records(resource_state_dir(state, MOCK) / "ledger.json", MOCK)
    return next((r["pod"] for r in records if r["pod"]), None)


def test_resource_exhausted_backs_off_and_releases_nothing_by_mistake(devplug_root: Path, wait_until: Wait) -> None:
    # A kubelet allowing one PodResources call every 2 s, against a daemon polling every 50 ms.
    with DevKubeletThread(
        devplug_root / "device-plugins",
        pod_resources_socket=devplug_root / "pod-resources" / "kubelet.sock",
        pod_resources_rate=(0.5, 1),
    ) as kubelet:
        mock_dir = devplug_root / "mock"
        config = dev_config(
            devplug_root,
            {MOCK: {"driver": "mock", "options": {"directory": str(mock_dir), "count": 2}}},
            release_interval=0.05,
            grace_period=30.0,
        )
        daemon = DaemonProcess(write_toml(devplug_root / "c.toml", config), devplug_root / "d.log").start()
        try:
            kubelet.wait_registered(MOCK, timeout=15)
            kubelet.wait_for(lambda k: bool(k.events_of("list-and-watch", MOCK)), timeout=15)
            pod = kubelet.admit_pod(PodSpec("p", [ContainerSpec("c", {MOCK: 1})]))
            (device,) = pod.containers[0].devices[MOCK]
            state = devplug_root / "state"
            wait_until(lambda: "RESOURCE_EXHAUSTED" in _release_error(state), "the daemon to be rate-limited")
            assert "releasing nothing until it answers" in daemon.log_text()
            # Refused reads release nothing: the pod still holds its device.
            assert [c for c in read_calls(mock_dir) if c["hook"] in ("post_stop", "deallocate")] == []
            # A read got through while the pod ran (so its end, not the fresh-allocation grace, releases it).
            wait_until(lambda: _pod_in_ledger(state) == "default/p", "a read to see the pod", timeout=15)
            kubelet.remove_pod("p")
            wait_until(
                lambda: [c["device_ids"] for c in read_calls(mock_dir) if c["hook"] == "deallocate"] == [[device]],
                "the release once a read gets through",
                timeout=30,
            )
        finally:
            assert daemon.stop() == 0, daemon.log_text()
