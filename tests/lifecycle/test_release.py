"""Release detection (issue 3): post-stop then deallocate, exactly once per allocation, on stock
kubelets (PodResources polling) and KEP kubelets (PostStopContainer/Deallocate), with init-container
reuse, the grace period for fresh allocations, and PodResources outages releasing nothing."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from devplug.devkubelet import ContainerSpec, PodSpec

if TYPE_CHECKING:
    from tests.lifecycle.conftest import Lab

RESOURCE = "example.com/mock"
RESOURCE_B = "example.com/other"
INTERVAL = 0.1


def _hooks_in_order(lab: Lab, device: str) -> list[str]:
    return [c["hook"] for c in lab.calls(device=device) if c["hook"] in ("allocate", "post_stop", "deallocate")]


def _canary_release(lab: Lab, resource: str = RESOURCE_B) -> None:
    """Admit and remove a pod on ``resource`` (stock mode) and wait for its release.

    Proves the reconciler made passes after this point: a negative assertion
    checked afterwards ("X was not released") had the reconciler's chance to fail.
    """
    kep = lab.kubelet.kep_mode
    lab.kubelet.kep_mode = False
    (device,) = lab.admit("canary", 1, resource)
    lab.wait_seen(device, "canary", resource)
    lab.kubelet.remove_pod("canary")
    lab.wait_released(device, resource=resource)
    lab.kubelet.kep_mode = kep


def test_stock_mode_pod_removal_runs_post_stop_then_deallocate_once(lab: Lab) -> None:
    lab.start()
    devices = lab.admit("p", 2)
    for dev in devices:
        lab.wait_seen(dev, "p")

    lab.kubelet.remove_pod("p")
    for dev in devices:
        lab.wait_released(dev)
    lab.quiet(5 * INTERVAL)

    for dev in devices:
        assert _hooks_in_order(lab, dev) == ["allocate", "post_stop", "deallocate"]
        assert lab.count("post_stop", dev) == 1
        assert lab.count("deallocate", dev) == 1
    # a stock kubelet: the engine found the release itself
    assert lab.events("post-stop") == []
    assert lab.events("deallocate") == []
    assert lab.ledger() == []
    lab.wait(lambda: lab.view().free == 4, what="every device free and healthy again")


def test_kep_mode_pod_removal_releases_once_and_reconciler_does_not_release_again(lab: Lab) -> None:
    lab.start({RESOURCE: lab.resource_table(), RESOURCE_B: lab.resource_table(RESOURCE_B)})
    lab.kubelet.kep_mode = True
    devices = lab.admit("p", 2)
    for dev in devices:
        lab.wait_seen(dev, "p")

    lab.kubelet.remove_pod("p")  # returns after the kubelet's PostStopContainer and Deallocate
    assert [e.kind for e in lab.events("post-stop")] == ["post-stop"]
    assert [e.kind for e in lab.events("deallocate")] == ["deallocate"]
    for dev in devices:
        assert lab.count("post_stop", dev) == 1
        assert lab.count("deallocate", dev) == 1

    _canary_release(lab)  # the reconciler ran after the KEP release
    lab.quiet(5 * INTERVAL)
    for dev in devices:
        assert _hooks_in_order(lab, dev) == ["allocate", "post_stop", "deallocate"]
    assert lab.ledger() == []


def test_kep_mode_slow_post_stop_is_not_released_twice_by_the_reconciler(lab: Lab) -> None:
    """The kubelet drops the pod from PodResources before its KEP calls finish: the reconciler,
    polling every 0.1 s, sees the pod gone while PostStopContainer is still running."""
    lab.start()
    lab.kubelet.kep_mode = True
    devices = lab.admit("p", 1)
    (dev,) = devices
    lab.wait_seen(dev, "p")
    lab.write_device(dev, "delay=post_stop:0.6")

    lab.kubelet.remove_pod("p")
    lab.wait(lambda: lab.ledger() == [], what="the ledger to be empty")
    lab.quiet(5 * INTERVAL)

    assert _hooks_in_order(lab, dev) == ["allocate", "post_stop", "deallocate"], lab.log()


def test_init_container_device_reuse_is_one_allocation_released_once(lab: Lab) -> None:
    lab.start()
    pod = PodSpec(
        "p",
        [ContainerSpec("init", {RESOURCE: 1}, init=True), ContainerSpec("app", {RESOURCE: 2})],
    )
    admitted = lab.kubelet.admit_pod(pod)
    (init_dev,) = admitted.container("init").devices[RESOURCE]
    app_devs = admitted.container("app").devices[RESOURCE]
    assert init_dev in app_devs, "the dev kubelet should hand the init container's device to the app"
    assert lab.count("allocate", init_dev) == 2  # allocated twice, no release in between

    records = lab.ledger()
    assert len(records) == 1, f"one pod's reuse must be one allocation: {records}"
    assert sorted(records[0]["devices"]) == sorted(app_devs)
    for dev in app_devs:
        lab.wait_seen(dev, "p")

    lab.kubelet.remove_pod("p")
    for dev in app_devs:
        lab.wait_released(dev)
    lab.quiet(5 * INTERVAL)
    for dev in app_devs:
        assert lab.count("post_stop", dev) == 1
        assert lab.count("deallocate", dev) == 1
    # The status is written at most once a second: wait for it to show the release, then check there is one.
    lab.wait(lambda: lab.resource_status()["recent_releases"], what="the release in the status")
    releases = lab.resource_status()["recent_releases"]
    assert len(releases) == 1
    assert sorted(releases[0]["devices"]) == sorted(app_devs)


def test_grace_period_keeps_an_unlisted_fresh_allocation_then_releases_it(lab: Lab) -> None:
    grace = 8.0  # long enough for the canary release to finish inside it on a loaded machine (3 s was not, in CI)
    lab.start({RESOURCE: lab.resource_table(), RESOURCE_B: lab.resource_table(RESOURCE_B)}, grace_period=grace)
    lab.allocate("mock2")  # like an admission in progress: no pod lists it
    record = lab.ledger_record("mock2")
    assert record is not None
    assert record["devices"] == ["mock2"]
    assert record["pod"] is None

    _canary_release(lab)  # reconciler passes happened since the allocation
    assert time.time() < record["created"] + grace, "too slow to check the state within the grace period"
    assert lab.count("post_stop", "mock2") == 0
    assert lab.count("deallocate", "mock2") == 0
    assert lab.ledger_record("mock2") is not None

    lab.wait_released("mock2", timeout=grace + 10)
    assert _hooks_in_order(lab, "mock2") == ["allocate", "post_stop", "deallocate"]
    # The ledger is written right after the driver's deallocate returned (the call log is written first).
    lab.wait(lambda: lab.ledger_record("mock2") is None, what="the ledger to drop mock2 after its deallocate")
    lab.wait(
        lambda: any("grace period" in r["reason"] for r in lab.resource_status()["recent_releases"]),
        what="the status to give the grace period as the release's reason",
    )


def test_pod_resources_outage_releases_nothing_until_it_answers(lab: Lab) -> None:
    lab.start()
    devices = lab.admit("p", 2)
    for dev in devices:
        lab.wait_seen(dev, "p")

    lab.kubelet.pod_resources_available = False
    lab.wait(lambda: "cannot read PodResources" in lab.log(), what="the daemon to notice the outage")
    lab.kubelet.remove_pod("p")
    lab.quiet(10 * INTERVAL)
    for dev in devices:
        assert lab.count("post_stop", dev) == 0
        assert lab.count("deallocate", dev) == 0
        assert lab.ledger_record(dev) is not None

    lab.kubelet.pod_resources_available = True
    for dev in devices:
        lab.wait_released(dev)
        assert _hooks_in_order(lab, dev) == ["allocate", "post_stop", "deallocate"]
    assert "PodResources readable again" in lab.log()
