"""Container liveness as release evidence (issue 23), on the dev kubelet's real containers in real cgroups.

Removing a static pod's manifest, or deleting a pod with ``--grace-period=0 --force``, makes the kubelet forget the
pod at once while its container runs out its grace period: PodResources and the checkpoint drop it, and the kubelet
hands its device to the next pod. devplug must not clean the device until the container is gone, and must never let
two live tenants share it. Each case runs on cgroup v1 (polled) and v2 (inotify on cgroup.events).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pytest

from devplug.devkubelet import ContainerSpec, PodSpec
from devplug.errors import KubeletError
from devplug_mock import read_calls

if TYPE_CHECKING:
    from tests.lifecycle.conftest import Lab

RESOURCE = "example.com/mock"
CGROUPS = [
    pytest.param("v1", marks=pytest.mark.devplug_cgroups("v1"), id="cgroup-v1"),
    pytest.param("v2", marks=pytest.mark.devplug_cgroups("v2"), id="cgroup-v2"),
]
REMOVALS = ["static", "force"]


def _admit(lab: Lab, name: str, *, stop_delay: float, grace: int = 10, count: int = 1) -> str:
    """A pod whose one container takes ``stop_delay`` seconds to exit after SIGTERM; its device."""
    spec = PodSpec(
        name, [ContainerSpec("app", {RESOURCE: count}, stop_delay=stop_delay)], termination_grace_period=grace
    )
    (device,) = lab.kubelet.admit_pod(spec).container("app").devices[RESOURCE]
    uid = lab.kubelet.pod_uid(name)
    lab.wait(
        lambda: (r := lab.ledger_record(device)) is not None and r["pod_uid"] == uid,
        what=f"the ledger to learn pod {name}'s UID for {device} (from the kubelet's checkpoint)",
    )
    return device


def _remove(lab: Lab, how: str, name: str) -> None:
    if how == "static":
        lab.kubelet.remove_static_pod(name)
    else:
        lab.kubelet.force_delete_pod(name)


def _release_calls(lab: Lab, device: str) -> list[dict[str, Any]]:
    return [
        c for c in read_calls(lab.mock_dir()) if c["hook"] in ("post_stop", "deallocate") and device in c["device_ids"]
    ]


def _exit_time(lab: Lab, name: str) -> float:
    """When the pod's last container exited (the dev kubelet's event)."""
    exits = [e.time for e in lab.kubelet.events if e.kind == "container-exited" and f"/{name}/" in f"{e.detail}/"]
    assert exits, f"no container-exited event for {name}"
    return max(exits)


@pytest.mark.parametrize("cgroups", CGROUPS)
@pytest.mark.parametrize("how", REMOVALS)
def test_a_forgotten_pods_device_is_cleaned_only_once_its_container_is_gone(lab: Lab, how: str, cgroups: str) -> None:
    lab.start()
    device = _admit(lab, "old", stop_delay=2.5)
    _remove(lab, how, "old")
    assert lab.kubelet.containers_running("old"), "the container runs out its grace period"
    assert device not in lab.kubelet.attributed(RESOURCE), "the kubelet forgot the pod at once"
    waiting = lab.wait(
        lambda: [w for w in lab.status()["release"]["awaiting_exit"] if device in w["devices"]],
        what=f"the status to show {device} waiting for pod old to exit",
    )
    assert waiting[0]["pod"] == "default/old"
    lab.quiet(0.5)
    assert lab.kubelet.containers_running("old")
    assert _release_calls(lab, device) == [], "cleaned under a running container"

    lab.kubelet.wait_containers_exited("old", timeout=30)
    exited = _exit_time(lab, "old")
    lab.wait_released(device)
    calls = _release_calls(lab, device)
    assert [c["hook"] for c in calls] == ["post_stop", "deallocate"]
    assert min(c["time"] for c in calls) >= exited, "a release hook ran before the container exited"
    releases = lab.wait(lambda: lab.resource_status()["recent_releases"], what="the release in the status")
    evidence = releases[-1]["evidence"]
    assert "no process left" in evidence or "no cgroup of pod" in evidence


@pytest.mark.parametrize("cgroups", CGROUPS)
def test_the_next_tenant_waits_for_the_previous_ones_container_and_gets_a_clean_device(lab: Lab, cgroups: str) -> None:
    """The kubelet reassigns the device during the window: the new pod's Allocate waits for the old container to exit
    and the release to finish; never two live tenants."""
    lab.start({RESOURCE: lab.resource_table(count=1)})
    device = _admit(lab, "old", stop_delay=2.0)
    lab.kubelet.force_delete_pod("old")
    admitted: dict[str, Any] = {}

    def admit_next() -> None:
        try:
            admitted["pod"] = lab.kubelet.admit_pod(PodSpec("new", [ContainerSpec("app", {RESOURCE: 1})]))
        except Exception as exc:  # reported by the main thread
            admitted["error"] = exc

    thread = threading.Thread(target=admit_next)
    thread.start()
    thread.join(60)
    assert "error" not in admitted, admitted.get("error")
    assert admitted["pod"].container("app").devices[RESOURCE] == (device,)
    exited = _exit_time(lab, "old")
    calls = [c for c in read_calls(lab.mock_dir()) if device in c["device_ids"] and c["hook"] != "preferred_allocation"]
    hooks = [c["hook"] for c in calls]
    assert hooks == ["allocate", "pre_start", "post_stop", "deallocate", "allocate", "pre_start"], hooks
    assert calls[2]["time"] >= exited, "the old tenancy was cleaned while its container ran"
    started = [e.time for e in lab.kubelet.events if e.kind == "container-started" and "new" in e.detail]
    assert started and min(started) >= exited, "two live tenants on one device"
    assert "waiting up to" in lab.log() and "pod default/old" in lab.log()


@pytest.mark.devplug_cgroups("v2")
def test_the_next_tenant_is_refused_naming_the_device_and_the_pod_when_the_old_container_outlasts_the_wait(
    lab: Lab,
) -> None:
    lab.start({RESOURCE: lab.resource_table(count=1)}, release={"previous_tenant_wait": 1.0})
    device = _admit(lab, "old", stop_delay=float("inf"), grace=6)
    lab.kubelet.remove_static_pod("old")
    with pytest.raises(KubeletError) as refused:
        lab.kubelet.admit_pod(PodSpec("new", [ContainerSpec("app", {RESOURCE: 1})]))
    message = str(refused.value)
    assert "FailedPrecondition" in message and device in message and "pod default/old" in message
    assert "previous_tenant_wait" in message and "nothing was allocated" in message
    assert [c["hook"] for c in _release_calls(lab, device)] == [], "nothing is done"
    assert len(lab.calls("allocate", device)) == 1, "the refused Allocate called the driver"

    lab.kubelet.wait_containers_exited("old", timeout=30)  # killed at the end of its 6 s grace
    lab.wait_released(device)
    assert lab.kubelet.admit_pod(PodSpec("later", [ContainerSpec("app", {RESOURCE: 1})]))


@pytest.mark.devplug_cgroups("v1")
@pytest.mark.parametrize("step", ["waiting", "post_stop", "deallocate"])
def test_kill_9_at_each_step_of_a_release_waiting_on_liveness(lab: Lab, step: str) -> None:
    """The daemon dies while it waits for the container to exit, or inside the release that follows: the restarted
    daemon still waits for the container, then runs each release hook to completion once (retry=True for the one
    cut short)."""
    lab.start()
    device = _admit(lab, "old", stop_delay=float("inf"), grace=4)
    if step != "waiting":
        lab.write_device(device, f"delay={step}:30")
    lab.kubelet.remove_static_pod("old")
    if step == "waiting":
        lab.wait(
            lambda: [w for w in lab.status()["release"]["awaiting_exit"] if device in w["devices"]],
            what="the daemon to wait for the container",
        )
    else:
        lab.kubelet.wait_containers_exited("old", timeout=30)
        lab.wait(
            lambda: [
                c for c in read_calls(lab.mock_dir(), started=True) if c["hook"] == step and device in c["device_ids"]
            ],
            what=f"{step} to start",
        )
    lab.kill()
    if step != "waiting":
        lab.write_device(device)  # fast again
    lab.restart_process()
    if step == "waiting":
        assert lab.kubelet.containers_running("old")
        lab.quiet(0.5)
        assert _release_calls(lab, device) == [], "released after the restart while the container ran"
        lab.kubelet.wait_containers_exited("old", timeout=30)
    lab.wait_released(device)
    exited = _exit_time(lab, "old")
    calls = _release_calls(lab, device)
    assert [c["hook"] for c in calls] == ["post_stop", "deallocate"], calls
    assert all(c["time"] >= exited for c in calls)
    retried = {c["hook"]: bool(c.get("retry")) for c in calls}
    if step == "waiting":
        assert retried == {"post_stop": False, "deallocate": False}
    elif step == "post_stop":
        assert retried == {"post_stop": True, "deallocate": False}
    else:
        assert retried == {"post_stop": False, "deallocate": True}
