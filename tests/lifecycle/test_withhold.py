"""Withhold, don't wait (issue 35): device safety that never holds the kubelet's Allocate without evidence.

The kubelet admits and removes every pod of the node in one loop and waits for Allocate with no deadline
(``syncLoopIteration`` in ``pkg/kubelet/kubelet.go``, ``Allocate(context.Background())`` in
``pkg/kubelet/cm/devicemanager/endpoint.go``). So devplug advertises a busy device unhealthy instead of making an
Allocate wait for it, proposes free devices before held ones, learns each tenancy's pod from every rewrite of the
kubelet's checkpoint, releases at once what a pod rejected at admission was allocated, and refuses at once an
Allocate whose previous tenant nothing says is ending. Each case runs on the dev kubelet's real containers in real
cgroups.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pytest

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.devkubelet import ContainerSpec, PodSpec
from devplug.errors import KubeletError
from devplug.testing.process import DaemonProcess
from tests.lifecycle.conftest import RESOURCE_B

if TYPE_CHECKING:
    from pathlib import Path

    from tests.lifecycle.conftest import Lab

RESOURCE = "example.com/mock"


def _hooks(lab: Lab, device: str, resource: str = RESOURCE) -> list[str]:
    """The driver hooks that touched ``device``, in order (GetPreferredAllocation's aside)."""
    return [c["hook"] for c in lab.calls(device=device, resource=resource) if c["hook"] != "preferred_allocation"]


def _running_pod(lab: Lab, name: str, count: int, *, grace: int = 30) -> tuple[str, ...]:
    """A pod whose container ignores SIGTERM (so it runs out its grace period); its devices, once the ledger knows
    its pod's UID."""
    spec = PodSpec(
        name, [ContainerSpec("app", {RESOURCE: count}, stop_delay=float("inf"))], termination_grace_period=grace
    )
    devices = lab.kubelet.admit_pod(spec).container("app").devices[RESOURCE]
    uid = lab.kubelet.pod_uid(name)
    lab.wait(
        lambda: all((r := lab.ledger_record(d)) is not None and r["pod_uid"] == uid for d in devices),
        what=f"the ledger to learn pod {name}'s UID",
    )
    return devices


def test_a_pod_rejected_at_admission_leaves_its_device_to_the_next_pod_at_once(lab: Lab) -> None:
    """Case 1: a pod asks for two resources, the second Allocate fails and the kubelet rejects it. No container of
    it ran, so the next pod gets the first resource's device cleaned, without waiting for anything."""
    lab.start({RESOURCE: lab.resource_table(count=1), RESOURCE_B: lab.resource_table(RESOURCE_B, count=1)})
    lab.write_device("mock0", "fail=allocate", resource=RESOURCE_B)
    both = PodSpec("rejected", [ContainerSpec("app", {RESOURCE: 1, RESOURCE_B: 1})])
    with pytest.raises(KubeletError, match="UnexpectedAdmissionError"):
        lab.kubelet.admit_pod(both)
    assert _hooks(lab, "mock0") == ["allocate"], "the first resource was allocated for the rejected pod"

    admitted = lab.kubelet.admit_pod(PodSpec("next", [ContainerSpec("app", {RESOURCE: 1})]))
    assert admitted.container("app").devices[RESOURCE] == ("mock0",)
    assert _hooks(lab, "mock0") == ["allocate", "post_stop", "deallocate", "allocate", "pre_start"]
    log = lab.log()
    assert "never had them" in log and "PreStartContainer" in log
    assert "waiting up to" not in log and "unknown_grace" not in log


@pytest.mark.devplug_cgroups("v2")
def test_a_forgotten_pods_running_devices_are_withheld_and_free_ones_given(lab: Lab) -> None:
    """Case 3: a force-deleted pod's devices, still used by its running container, are advertised unhealthy with
    the reason in the status and metrics; a pod asking for 2 of 4 gets the 2 free ones at once; the busy ones come
    back healthy, cleaned, once the container is gone."""
    lab.start()
    busy = _running_pod(lab, "old", 2, grace=8)
    lab.kubelet.force_delete_pod("old")
    lab.wait(lambda: all(lab.health(d) == "Unhealthy" for d in busy), what=f"{busy} advertised unhealthy")
    withheld = lab.wait(lambda: lab.resource_status()["withheld_busy"], what="the busy tenancy in the status")
    assert sorted(withheld[0]["devices"]) == sorted(busy) and withheld[0]["pod"] == "default/old"
    assert "may still run" in withheld[0]["why"]

    got = lab.admit("new", 2)
    assert set(got).isdisjoint(busy), f"the busy devices {busy} were given while free ones were not: {got}"
    assert lab.kubelet.containers_running("old")
    assert all(_hooks(lab, d) == ["allocate", "pre_start"] for d in busy), "cleaned under the running container"

    lab.kubelet.wait_containers_exited("old", timeout=30)
    for device in busy:
        lab.wait_released(device)
    lab.wait(lambda: all(lab.health(d) == "Healthy" for d in busy), what=f"{busy} healthy again once released")
    lab.wait(lambda: lab.resource_status()["withheld_busy"] == [], what="no busy tenancy left in the status")


def test_get_preferred_allocation_proposes_free_devices_before_held_ones(lab: Lab) -> None:
    """Case 3, the window before devplug knows a tenancy is over: the kubelet offers a device it forgot the pod of,
    and GetPreferredAllocation proposes the free ones first (held ones only to fill what free ones cannot)."""
    lab.start()
    held = lab.admit("holder", 2)
    free = sorted({"mock0", "mock1", "mock2", "mock3"} - set(held))

    def preferred(size: int) -> list[str]:
        request = dp.PreferredAllocationRequest(
            container_requests=[
                dp.ContainerPreferredAllocationRequest(
                    available_deviceIDs=["mock0", "mock1", "mock2", "mock3"], allocation_size=size
                )
            ]
        )
        answer = lab.grpc_call("GetPreferredAllocation", request, dp.PreferredAllocationResponse)
        return list(answer.container_responses[0].deviceIDs)

    assert sorted(preferred(2)) == free
    three = preferred(3)
    assert len(three) == 3 and set(free) <= set(three), three


def test_the_next_tenant_right_after_a_short_pod_finds_its_uid_learnt(lab: Lab) -> None:
    """Case 4: the pod's UID comes from the kubelet's checkpoint as it is written, not from a release pass (none
    runs here: the interval is long), so the next tenant's Allocate knows the pod's cgroup is gone and goes on."""
    lab.start({RESOURCE: lab.resource_table(count=1)}, release_interval=60.0)
    (device,) = lab.admit("short", 1)
    uid = lab.kubelet.pod_uid("short")
    lab.kubelet.finish_pod("short")
    lab.kubelet.wait_pod_cleaned_up("short", timeout=30)

    (again,) = lab.admit("next", 1)
    assert again == device
    assert _hooks(lab, device) == ["allocate", "pre_start", "post_stop", "deallocate", "allocate", "pre_start"]
    releases = lab.wait(lambda: lab.resource_status()["recent_releases"], what="the release in the status")
    evidence = releases[-1]["evidence"]
    assert uid in evidence and "unknown_grace" not in evidence, evidence
    assert "never learnt" not in lab.log()


@pytest.mark.devplug_cgroups("v2")
def test_an_allocate_is_refused_at_once_when_nothing_says_the_previous_tenant_ends(
    lab: Lab, devplug_root: Path
) -> None:
    """A previous tenant whose containers may still run while nothing says they stop without the kubelet's loop
    (here: its cgroup cannot be read) is not waited for inside Allocate: the Allocate is refused at once, naming the
    device and the pod, the device is withheld, and a pod needing no device, added while that Allocate was
    answered, is admitted long before the old container's grace ends."""
    unreadable = devplug_root / "no-cgroups-here"
    unreadable.mkdir()
    lab.start(  # no release pass runs (the interval is long): the Allocate comes before devplug withholds anything
        {RESOURCE: lab.resource_table(count=1)},
        release_interval=60.0,
        liveness={"cgroup_mount": str(unreadable), "unknown_grace": 30},
    )
    spec = PodSpec("old", [ContainerSpec("app", {RESOURCE: 1}, stop_delay=float("inf"))], termination_grace_period=20)
    (device,) = lab.kubelet.admit_pod(spec).container("app").devices[RESOURCE]
    lab.kubelet.force_delete_pod("old")

    outcome: dict[str, Any] = {}

    def admit_plain() -> None:
        outcome["plain"] = lab.kubelet.admit_pod(PodSpec("plain", [ContainerSpec("app", {})]))

    with pytest.raises(KubeletError) as refused:
        lab.kubelet.admit_pod(PodSpec("new", [ContainerSpec("app", {RESOURCE: 1})]))
    plain = threading.Thread(target=admit_plain)
    plain.start()
    plain.join(30)
    assert "plain" in outcome, "a pod needing no device was not admitted"
    assert lab.kubelet.containers_running("old"), "admitted only after the old container ended"
    message = str(refused.value)
    assert "FailedPrecondition" in message and device in message and "pod default/old" in message
    assert "not waiting" in message and "nothing was allocated" in message
    assert "waiting up to" not in lab.log()
    lab.wait(lambda: lab.health(device) == "Unhealthy", what=f"{device} withheld while pod old may still run")
    assert _hooks(lab, device) == ["allocate", "pre_start"], "nothing was cleaned under the running container"


@pytest.mark.devplug_cgroups("v2")
def test_an_allocate_waiting_for_a_killed_tenant_never_fails_a_handover(lab: Lab) -> None:
    """Case 5: an Allocate waits for a pod the kubelet is killing when a new instance asks for the node (the shipped
    [handover] timeout, 10 s, shorter than the wait allowed here): the wait is cut short and the Allocate refused,
    the devices stay withheld, and the handover completes; the old instance exits 0, the new one serves."""
    old = lab.start(  # no release pass runs: the Allocate meets the tenant before devplug withholds its device
        {RESOURCE: lab.resource_table(count=1)},
        handover={"enabled": True, "timeout": 10.0},
        release={"previous_tenant_wait": 20.0},
        release_interval=60.0,
    )
    (device,) = _running_pod(lab, "old", 1, grace=30)
    lab.kubelet.force_delete_pod("old")
    outcome: dict[str, Any] = {}

    def admit_next() -> None:
        try:
            outcome["pod"] = lab.kubelet.admit_pod(PodSpec("new", [ContainerSpec("app", {RESOURCE: 1})]))
        except KubeletError as exc:
            outcome["error"] = str(exc)

    waiting = threading.Thread(target=admit_next)
    waiting.start()
    lab.wait(lambda: "waiting up to 20 s" in lab.log(), what="the Allocate to wait for pod old")
    registrations = lab.kubelet.registrations(RESOURCE)
    new = DaemonProcess(old.config_path, old.root / "daemon-b.log", env={**old.env, "DEVPLUG_INSTANCE": "b"}).start()
    try:
        assert old.process.wait(20.0) == 0, old.log_text()
        waiting.join(20)
        assert "error" in outcome, f"the waiting Allocate was not refused: {outcome}"
        assert device in outcome["error"] and "handover" in outcome["error"], outcome["error"]
        assert "calls still ran" not in old.log_text()
        lab.wait(lambda: lab.kubelet.registrations(RESOURCE) > registrations, what="the new instance registered")
        assert "took the node over from" in new.log_text()
        assert lab.kubelet.containers_running("old")
        assert _hooks(lab, device) == ["allocate", "pre_start"], "cleaned under the running container"
    finally:
        assert new.stop() == 0, new.log_text()
