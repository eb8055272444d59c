"""Issue 27: a driver's ``check_health`` gives a reason with each device's health (``HealthReport``); the kubelet
sees the device unhealthy, ``devplug status`` shows why, and a bare ``Health`` later keeps the reason."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from devplug import Device, Health, HealthReport, hookimpl
from devplug.daemon.status import read_status
from devplug.devkubelet import DevKubeletThread
from devplug.testing.daemon import DaemonThread

from .conftest import Wait, in_process_config, view_of

RESOURCE = "example.com/probed"


class Probed:
    """d1's link goes down; the driver says why."""

    down = False

    @hookimpl
    def list_devices(self) -> Sequence[Device]:
        return [Device("d0"), Device("d1")]

    @hookimpl
    def check_health(self, devices: Sequence[Device]) -> dict[str, Health | HealthReport]:
        if not type(self).down:
            return {d.id: Health.HEALTHY for d in devices}
        return {"d0": Health.HEALTHY, "d1": HealthReport(Health.UNHEALTHY, "link down on port 2")}


def _device(state_dir: Path, device: str) -> dict[str, object]:
    (entry,) = read_status(state_dir)["resources"]
    return next((d for d in entry["devices"] if d["id"] == device), {})


def test_a_reason_from_check_health_reaches_the_status(
    dev_kubelet: DevKubeletThread, devplug_root: Path, wait_until: Wait
) -> None:
    Probed.down = False
    config = in_process_config(devplug_root, {RESOURCE: Probed}, health_interval=0.05)
    with DaemonThread(config):
        dev_kubelet.wait_registered(RESOURCE, timeout=10)
        dev_kubelet.wait_for(lambda k: set(view_of(k, RESOURCE).healthy_ids) == {"d0", "d1"}, timeout=10)
        Probed.down = True
        dev_kubelet.wait_for(lambda k: set(view_of(k, RESOURCE).healthy_ids) == {"d0"}, timeout=10)
        wait_until(
            lambda: _device(config.state.dir, "d1").get("reason") == "link down on port 2",
            "the status to say why d1 is unhealthy",
        )
        assert _device(config.state.dir, "d1")["health"] == "Unhealthy"
        assert "reason" not in _device(config.state.dir, "d0")
