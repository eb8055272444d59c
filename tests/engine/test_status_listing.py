"""The status file of a resource with more than LIST_ALL_DEVICES_UP_TO devices lists only the interesting ones."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from devplug import Device, Health, hookimpl
from devplug.daemon.status import read_status
from devplug.devkubelet import ContainerSpec, DevKubeletThread, PodSpec
from devplug.engine.resourcereport import LIST_ALL_DEVICES_UP_TO
from devplug.testing.daemon import DaemonThread

from .conftest import Wait, in_process_config, view_of

BIG = "example.com/big"
COUNT = LIST_ALL_DEVICES_UP_TO + 44


class Big:
    """Many devices, two of them unhealthy."""

    @hookimpl
    def list_devices(self) -> Sequence[Device]:
        return [Device(f"b{i}", Health.UNHEALTHY if i in (7, 250) else Health.HEALTHY) for i in range(COUNT)]


def _entry(state_dir: Path) -> dict[str, Any]:
    (entry,) = [r for r in read_status(state_dir)["resources"] if r["name"] == BIG]
    assert isinstance(entry, dict)
    return entry


def test_a_big_resource_lists_allocated_and_unhealthy_devices_only(
    dev_kubelet: DevKubeletThread, devplug_root: Path, wait_until: Wait
) -> None:
    config = in_process_config(devplug_root, {BIG: Big})
    with DaemonThread(config):
        dev_kubelet.wait_registered(BIG, timeout=10)
        dev_kubelet.wait_for(lambda k: len(view_of(k, BIG).devices) == COUNT, 10)
        pod = dev_kubelet.admit_pod(PodSpec("p", [ContainerSpec("c", {BIG: 2})]))
        held = set(pod.container("c").devices[BIG])

        def listed() -> set[str]:
            return {d["id"] for d in _entry(config.state.dir)["devices"]}

        wait_until(lambda: listed() == held | {"b7", "b250"}, "the status to list the held and unhealthy devices")
        entry = _entry(config.state.dir)
        dev_kubelet.remove_pod("p")  # released: the entries built for the held devices must not linger
        wait_until(lambda: listed() == {"b7", "b250"}, "the released devices to leave the status", timeout=20)
        after = _entry(config.state.dir)
    assert entry["devices_listed"] == "allocated, releasing or unhealthy"
    assert entry["counts"] == {"devices": COUNT, "healthy": COUNT - 2, "unhealthy": 2, "allocated": 2, "releasing": 0}
    by_id = {d["id"]: d for d in entry["devices"]}
    assert all(by_id[i]["allocated"] and by_id[i]["pod"] for i in held)
    assert by_id["b7"]["health"] == "Unhealthy" and not by_id["b7"]["allocated"]
    assert after["counts"]["allocated"] == 0
    assert [d["allocated"] for d in after["devices"]] == [False, False]
