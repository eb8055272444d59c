"""Release correctness against a kubelet that behaves like the real one (issue 8).

Each test reproduces one failure seen with the kubelet's own code (Kubernetes
v1.32.10), now modelled by the dev kubelet: never a release under a running
container, always a release between two tenancies of a device, never a stuck
reconciler, and hooks called again after a crash flagged as retries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc
import pytest

from devplug.devkubelet import ContainerSpec, PodSpec
from devplug.errors import KubeletError

if TYPE_CHECKING:
    from tests.lifecycle.conftest import Lab

RESOURCE = "example.com/mock"
RESOURCE_B = "example.com/other"
RELEASE_HOOKS = ("post_stop", "deallocate")


def _hooks(lab: Lab, device: str, resource: str = RESOURCE) -> list[str]:
    """The device's successful allocate/post_stop/deallocate calls, in order."""
    return [
        c["hook"]
        for c in lab.calls(device=device, resource=resource)
        if c["hook"] in ("allocate", "post_stop", "deallocate")
    ]


def _released_nothing(lab: Lab, device: str) -> None:
    assert lab.count("post_stop", device) == 0, lab.calls(device=device)
    assert lab.count("deallocate", device) == 0, lab.calls(device=device)


# --- failure 1: a kubelet restart with an empty pod list


@pytest.mark.parametrize("checkpoint", [True, False], ids=["with-checkpoint", "podresources-only"])
def test_kubelet_restart_with_an_empty_pod_list_releases_nothing_under_running_pods(lab: Lab, checkpoint: bool) -> None:
    lab.kubelet.write_checkpoint = checkpoint
    grace = 3.0
    lab.start(grace_period=grace)
    (dev,) = lab.admit("p")
    lab.wait_seen(dev, "p")
    registrations = lab.kubelet.registrations(RESOURCE)
    writes = lab.kubelet.checkpoint_writes
    # With the checkpoint, the window lasts until the daemon has asked for the kubelet's view again and again
    # (however slow the machine), well past the grace period; without it, the window is shorter than the grace
    # period, as the grace period's documentation requires.
    lab.kubelet.restart(pod_list_delay=300.0 if checkpoint else grace - 1.0)
    lab.kubelet.wait_registered(RESOURCE, timeout=10, after=registrations)
    if checkpoint:
        lab.wait(lambda: lab.kubelet.checkpoint_writes > writes + 5, timeout=60, what="the daemon's checkpoint probes")
        assert not lab.kubelet.pod_list_loaded  # the probes fell in the window
        lab.quiet(grace + 0.5)  # past the grace period, the pod list still empty
        _released_nothing(lab, dev)
        assert lab.kubelet.load_pods()
    lab.wait(lambda: lab.kubelet.pod_list_loaded, what="the kubelet's pod list to be loaded again")
    lab.quiet(0.5)
    _released_nothing(lab, dev)
    assert lab.ledger_record(dev) is not None
    # The pod's real end is still noticed: polling went on, and the device is released once.
    lab.kubelet.remove_pod("p")
    lab.wait_released(dev)
    assert _hooks(lab, dev) == ["allocate", "post_stop", "deallocate"]


# --- failure 2: two tenants, no release between them


@pytest.mark.parametrize("observed", [True, False], ids=["seen-running", "never-seen"])
def test_a_finished_pods_device_handed_at_once_to_the_next_pod_is_released_in_between(lab: Lab, observed: bool) -> None:
    lab.kubelet.pod_resources_available = observed  # never-seen: no poll ever saw the first pod run
    # never-seen: no poll helps; seen-running: a poll may even release it before the next admission
    lab.start({RESOURCE: lab.resource_table(count=1)}, release_interval=0.2 if observed else 30.0)
    (dev,) = lab.admit("first")
    if observed:
        lab.wait_seen(dev, "first")
    lab.kubelet.finish_pod("first")
    (again,) = lab.admit("second")
    assert again == dev
    assert _hooks(lab, dev) == ["allocate", "post_stop", "deallocate", "allocate"]
    whys = ("ran with them", "no longer holds them") if observed else ("no longer attributes them to any pod",)
    lab.wait(
        lambda: any(w in r["reason"] for r in lab.resource_status()["recent_releases"] for w in whys),
        what=f"the status to say why the device was released before its second allocate ({whys})",
    )


def test_a_rejected_pods_device_is_released_before_the_next_pod_gets_it(lab: Lab) -> None:
    lab.start(
        {RESOURCE: lab.resource_table(count=1), RESOURCE_B: lab.resource_table(RESOURCE_B, count=1)},
        release_interval=30.0,
    )
    lab.write_device("mock0", "fail=allocate", resource=RESOURCE_B)
    with pytest.raises(KubeletError):
        lab.kubelet.admit_pod(PodSpec("rejected", [ContainerSpec("app", {RESOURCE: 1, RESOURCE_B: 1})]))
    assert _hooks(lab, "mock0") == ["allocate"]
    (again,) = lab.admit("next")
    assert again == "mock0"
    assert _hooks(lab, "mock0") == ["allocate", "post_stop", "deallocate", "allocate"]


def test_init_container_reuse_stays_one_allocation_with_the_kubelets_evidence(lab: Lab) -> None:
    lab.start({RESOURCE: lab.resource_table(count=1)}, release_interval=30.0)
    pod = lab.kubelet.admit_pod(
        PodSpec("p", [ContainerSpec("init", {RESOURCE: 1}, init=True), ContainerSpec("app", {RESOURCE: 1})])
    )
    assert pod.container("init").devices[RESOURCE] == pod.container("app").devices[RESOURCE] == ("mock0",)
    assert _hooks(lab, "mock0") == ["allocate", "allocate"]  # reuse: nothing released in between
    assert len(lab.ledger()) == 1


def test_without_evidence_a_reuse_is_cleaned_as_a_new_tenancy_never_dirty(lab: Lab) -> None:
    lab.kubelet.write_checkpoint = False
    lab.start({RESOURCE: lab.resource_table(count=1)}, release_interval=30.0)
    lab.kubelet.admit_pod(
        PodSpec("p", [ContainerSpec("init", {RESOURCE: 1}, init=True), ContainerSpec("app", {RESOURCE: 1})])
    )
    assert _hooks(lab, "mock0") == ["allocate", "post_stop", "deallocate", "allocate"]


def test_an_init_containers_device_is_not_released_while_its_pod_runs(lab: Lab) -> None:
    """PodResources never lists init containers; the kubelet's checkpoint still attributes their devices."""
    lab.start(grace_period=0.3)
    pod = lab.kubelet.admit_pod(PodSpec("p", [ContainerSpec("init", {RESOURCE: 1}, init=True), ContainerSpec("app")]))
    (dev,) = pod.container("init").devices[RESOURCE]
    writes = lab.kubelet.checkpoint_writes
    # A count of probes, not a time: on a loaded machine each probe (a pass, a ListAndWatch message, the kubelet's
    # rewrite) takes longer, so the wait is bounded generously.
    lab.wait(
        lambda: lab.kubelet.checkpoint_writes > writes + 10, timeout=60, what="ten probes of the kubelet past the grace"
    )
    _released_nothing(lab, dev)
    lab.kubelet.remove_pod("p")
    lab.wait_released(dev)


# --- the release still running when the kubelet allocates the device again


def test_an_allocate_waits_for_a_release_of_its_device_still_running(lab: Lab) -> None:
    lab.start({RESOURCE: lab.resource_table(count=1)})
    (dev,) = lab.admit("p")
    lab.wait_seen(dev, "p")
    lab.write_device(dev, "delay=post_stop:1.0")
    lab.kubelet.remove_pod("p")
    lab.wait(lambda: (lab.ledger_record(dev) or {}).get("releasing"), what="the release to be under way")
    answer = lab.allocate(dev)  # as a kubelet that picked the device before it was withheld
    assert dict(answer.container_responses[0].envs) == {"MOCK_DEVICES": dev}
    assert _hooks(lab, dev) == ["allocate", "post_stop", "deallocate", "allocate"]


def test_an_allocate_is_refused_naming_the_device_and_hook_when_the_release_fails(lab: Lab) -> None:
    lab.start({RESOURCE: lab.resource_table(count=1)})
    (dev,) = lab.admit("p")
    lab.wait_seen(dev, "p")
    lab.write_device(dev, "fail=post_stop")
    lab.kubelet.remove_pod("p")
    lab.wait(lambda: lab.calls("post_stop", dev, ok=False), what="the release to fail")
    with pytest.raises(grpc.RpcError) as info:
        lab.allocate(dev)
    details = info.value.details() or ""
    assert dev in details and "post_stop" in details and "nothing was allocated" in details
    assert lab.count("allocate", dev) == 1


# --- failure 3: a malformed ledger record stops nothing


@pytest.mark.parametrize(("field", "value"), [("created", "yesterday"), ("kep_at", "soon"), ("post_stopped", "mock0")])
def test_a_malformed_ledger_record_is_quarantined_and_other_releases_go_on(lab: Lab, field: str, value: object) -> None:
    lab.start({RESOURCE: lab.resource_table(), RESOURCE_B: lab.resource_table(RESOURCE_B)})
    (bad,) = lab.admit("bad")
    (good,) = lab.admit("good")
    (other,) = lab.admit("other", resource=RESOURCE_B)
    lab.wait_seen(good, "good")
    lab.kill()
    records = lab.ledger()
    for record in records:
        if bad in record["devices"]:
            record[field] = value
    lab.rewrite_ledger(records)
    lab.restart_process()
    lab.kubelet.remove_pod("good")
    lab.kubelet.remove_pod("other")
    lab.wait_released(good)
    lab.wait_released(other, resource=RESOURCE_B)
    lab.wait(lambda: lab.resource_status()["quarantined_records"], what="the status to show the quarantined record")
    (quarantined,) = lab.resource_status()["quarantined_records"]
    assert quarantined["devices"] == [bad] and field in quarantined["reason"]
    assert "quarantined" in lab.log()
    assert lab.status()["release"]["last_error"] is None


# --- failure 4: a start that fails unexpectedly is retried, and says why


def test_a_resource_whose_start_fails_unexpectedly_reports_it_and_retries(lab: Lab) -> None:
    lab.start()
    lab.kill()
    state = lab.ledger_path().parent
    for child in sorted(state.rglob("*"), reverse=True):
        child.rmdir() if child.is_dir() else child.unlink()
    state.rmdir()
    state.write_text("not a folder")  # the resource's state folder cannot be made
    registrations = lab.kubelet.registrations(RESOURCE)
    lab.daemon.process.start()  # type: ignore[union-attr]
    lab.wait(
        lambda: any(
            r["name"] == RESOURCE and r["state"] == "failed" and r["last_error"] for r in lab.status()["resources"]
        ),
        what="the status to show the failed start and why",
    )
    state.unlink()
    lab.kubelet.wait_registered(RESOURCE, timeout=15, after=registrations)


# --- failure 5: hooks called again after kill -9 are flagged as retries


@pytest.mark.parametrize("hook", ["post_stop", "deallocate"])
def test_a_hook_killed_after_it_returned_is_called_again_flagged_as_a_retry(lab: Lab, hook: str) -> None:
    lab.start()
    (dev,) = lab.admit("p")
    lab.wait_seen(dev, "p")
    lab.write_device(dev, f"crash={hook}")
    lab.kubelet.remove_pod("p")
    lab.wait(lambda: not lab.daemon.process.running(), what="the crash= directive to kill the daemon")  # type: ignore[union-attr]
    lab.write_device(dev)
    lab.restart_process()
    lab.wait(lambda: lab.ledger_record(dev) is None, what="the release to be finished after the restart")
    calls = [(c["hook"], c.get("retry", False)) for c in lab.calls(device=dev) if c["hook"] in RELEASE_HOOKS]
    if hook == "post_stop":
        assert calls == [("post_stop", False), ("post_stop", True), ("deallocate", False)]
    else:
        assert calls == [("post_stop", False), ("deallocate", False), ("deallocate", True)]
    lab.wait(lambda: lab.resource_status()["recent_releases"], what="the release in the status")
    (release,) = lab.resource_status()["recent_releases"]
    assert release["retry"] is True


# --- failure 6: a lost ledger, and pods that ended while the daemon was down


def test_a_lost_ledger_releases_pods_that_ended_while_the_daemon_was_down(lab: Lab) -> None:
    lab.start()
    (gone,) = lab.admit("gone")
    (kept,) = lab.admit("kept")
    lab.wait_seen(kept, "kept")
    lab.kill()
    lab.kubelet.remove_pod("gone")
    lab.delete_ledger()
    lab.restart_process()
    lab.wait_released(gone)
    calls = [(c["hook"], c.get("retry", False)) for c in lab.calls(device=gone) if c["hook"] in RELEASE_HOOKS]
    assert calls == [("post_stop", True), ("deallocate", True)]  # adopted: the driver is told it may be a repeat
    lab.quiet(0.5)
    _released_nothing(lab, kept)
    lab.kubelet.remove_pod("kept")
    lab.wait_released(kept)
