"""An orphan only the kubelet's housekeeping kills is never waited for inside Allocate (issue 35, case 2).

A static pod whose manifest was removed while the kubelet was down is in none of the restarted kubelet's pod lists:
its containers run on, its devices come back from the checkpoint and the first ``UpdateAllocatedDevices`` after the
sources are ready hands them to the next pod, and only housekeeping kills it (``HandlePodCleanups`` in
``pkg/kubelet/kubelet_pods.go``, a turn of ``syncLoopIteration`` every 2 s once the sources are ready). That turn
waits behind any Allocate the kubelet is in (``Allocate(context.Background())``,
``pkg/kubelet/cm/devicemanager/endpoint.go``), so an Allocate waiting for the orphan to exit would wait for
something that cannot happen until it answers: devplug refuses it at once, withholds the device, and releases it
once housekeeping has killed the orphan. Measured on a whole 1.32 kubelet before devplug withheld: the Allocate was
held the full ``[release] previous_tenant_wait`` (40 s), then refused, every time.

Orderings come from the dev kubelet's events and sync-loop turns, never from wall-clock bounds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from devplug.devkubelet import ContainerSpec, KubeletEvent, PodSpec, SyncLoopOp
from devplug.errors import KubeletError

if TYPE_CHECKING:
    from tests.lifecycle.conftest import Lab

RESOURCE = "example.com/mock"
#: What the issue measured the whole kubelet with.
PREVIOUS_TENANT_WAIT = 40.0
#: Seconds between devplug's release passes: one releases the device after the orphan's exit.
RELEASE_INTERVAL = 3.0
#: A turn's start and end are its wall-clock arrival plus monotonic durations; an event's time is read apart.
CLOCK_SLACK = 0.005


def _hooks(lab: Lab, device: str) -> list[str]:
    """The driver hooks that touched ``device``, in order (GetPreferredAllocation's aside)."""
    return [c["hook"] for c in lab.calls(device=device, resource=RESOURCE) if c["hook"] != "preferred_allocation"]


def _about(lab: Lab, kind: str, text: str) -> KubeletEvent:
    (found,) = [e for e in lab.kubelet.events_of(kind) if text in e.detail]
    return found


def _start(op: SyncLoopOp) -> float:
    return op.queued_at + op.waited - CLOCK_SLACK


def _end(op: SyncLoopOp) -> float:
    return op.queued_at + op.waited + op.held + CLOCK_SLACK


@pytest.mark.devplug_cgroups("v2")
def test_an_orphan_only_housekeeping_kills_is_refused_at_once_then_released(lab: Lab) -> None:
    lab.start(  # release passes are far apart: the Allocate meets the orphan before one withholds its device
        {RESOURCE: lab.resource_table(count=1)},
        release_interval=RELEASE_INTERVAL,
        release={"previous_tenant_wait": PREVIOUS_TENANT_WAIT},
    )
    spec = PodSpec(
        "orphan", [ContainerSpec("app", {RESOURCE: 1}, stop_delay=float("inf"))], termination_grace_period=30
    )
    (device,) = lab.kubelet.admit_pod(spec).container("app").devices[RESOURCE]
    uid = lab.kubelet.pod_uid("orphan")
    lab.wait(
        lambda: (r := lab.ledger_record(device)) is not None and r["pod_uid"] == uid,
        what="the ledger to learn pod orphan's UID",
    )
    at_kill: list[list[str]] = []  # the driver's hooks on the device when housekeeping began to kill the orphan
    lab.kubelet.add_listener(
        lambda e: at_kill.append(_hooks(lab, device)) if e.kind == "pod-terminating" and uid in e.detail else None
    )

    registrations = lab.kubelet.registrations(RESOURCE)
    lab.kubelet.restart(pod_list_delay=600, removed_static_pods=("orphan",))
    lab.kubelet.wait_registered(RESOURCE, timeout=15.0, after=registrations)
    lab.wait_advertised()
    assert lab.health(device) == "Healthy"
    assert lab.kubelet.containers_running("orphan")
    # right after a housekeeping tick (skipped: the sources are not ready), so the next one is a period away
    ticks = len(lab.kubelet.sync_loop_ops("HOUSEKEEPING"))
    lab.kubelet.wait_for(lambda k: len(k.sync_loop_ops("HOUSEKEEPING")) > ticks, what="a housekeeping tick")
    assert lab.kubelet.load_pods()

    with pytest.raises(KubeletError) as refused:
        lab.kubelet.admit_pod(PodSpec("new", [ContainerSpec("app", {RESOURCE: 1})]))

    message = str(refused.value)
    assert "UnexpectedAdmissionError" in message and device in message and "pod default/orphan" in message
    assert "not waiting" in message and "housekeeping" in message and "nothing was allocated" in message
    assert "waiting up to" not in lab.log()
    (add,) = lab.kubelet.sync_loop_ops("ADD", "default/new")
    assert _about(lab, "pods-loaded", "sources ready").time <= add.queued_at  # asked right after sources ready
    assert _about(lab, "pod-devices-dropped", uid).time <= _end(add)  # the kubelet gave the orphan's device on
    assert _about(lab, "pod-rejected", "default/new").time <= _end(add)

    # housekeeping, not held by that Allocate, kills the orphan
    lab.kubelet.wait_pod_cleaned_up("orphan", timeout=30)
    killed = _about(lab, "pod-terminating", uid)
    (killer,) = [op for op in lab.kubelet.sync_loop_ops("HOUSEKEEPING") if _start(op) <= killed.time <= _end(op)]
    assert add.queued_at + add.waited + add.held <= killer.queued_at + killer.waited
    assert killer.behind != "ADD default/new", "housekeeping waited behind the Allocate for the orphan"
    exited = _about(lab, "container-exited", "default/orphan/app ")
    assert killed.time <= exited.time

    # devplug releases the device once the orphan's processes are gone, and the next pod gets it
    lab.wait_released(device)
    assert at_kill == [["allocate", "pre_start"]], "released while nothing had killed the orphan yet"
    assert _hooks(lab, device) == ["allocate", "pre_start", "post_stop", "deallocate"]
    release = lab.wait(lambda: lab.resource_status()["recent_releases"], what="the release in the status")[-1]
    evidence = release["evidence"]  # the orphan's pod cgroup empty, or already removed
    assert uid in evidence and ("no process left" in evidence or "no cgroup of pod" in evidence), evidence
    lab.wait(lambda: lab.health(device) == "Healthy", what=f"{device} healthy again once released")
    assert lab.admit("later", 1) == (device,)
    assert _hooks(lab, device) == ["allocate", "pre_start", "post_stop", "deallocate", "allocate", "pre_start"]
