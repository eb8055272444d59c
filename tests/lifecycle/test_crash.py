"""Crash safety (issue 3): ``kill -9`` of the daemon at several points, a corrupt ledger, and two
daemons on one state dir. After every restart: each device is either used by a pod or released
through the driver, and no device is advertised free while the driver still holds it."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import pytest

from devplug.devkubelet import AdmittedPod, ContainerSpec, PodSpec
from devplug.errors import KubeletError

if TYPE_CHECKING:
    from tests.lifecycle.conftest import Lab

RESOURCE = "example.com/mock"
INTERVAL = 0.1
DEVICES = ("mock0", "mock1", "mock2", "mock3")


def _settled(lab: Lab) -> bool:
    """The daemon's ledger holds exactly the devices pods use, and the driver holds no other."""
    view = lab.view()
    held = {d for r in lab.ledger() for d in (*r["devices"], *r["pending"])}
    return held == set(view.in_use) and not any(lab.driver_holds(d) for d in DEVICES if d not in view.in_use)


def _assert_invariants(lab: Lab) -> None:
    """Every device is used by a pod (and the daemon knows it), or released and advertised healthy."""
    lab.wait(lambda: _settled(lab), what="the ledger and the driver to match the pods' devices")
    lab.wait(
        lambda: all(lab.health(d) == "Healthy" for d in DEVICES if d not in lab.view().in_use),
        what="every free device to be advertised healthy",
    )
    in_use = set(lab.view().in_use)
    lab.wait(
        lambda: {d["id"] for d in lab.resource_status()["devices"] if d["allocated"]} == in_use,
        what=f"the status to show exactly {sorted(in_use)} allocated",
    )


def _assert_withheld_until_released(lab: Lab, device: str, since: float) -> None:
    """Every device list the kubelet got after ``since`` and before the driver's deallocate of
    ``device`` returned shows it unhealthy: it was never offered while the driver still held it."""
    done = [c["time"] for c in lab.calls("deallocate", device) if c["time"] >= since]
    assert done, f"{device} was not deallocated after the restart"
    lists = [e for e in lab.events("list-and-watch", since=since) if e.time < done[0]]
    assert lists, "no device list reached the kubelet between the restart and the deallocate"
    for event in lists:
        assert device in event.device_ids, f"{device} advertised healthy before its deallocate returned: {event}"


def test_kill_mid_allocate_releases_the_unanswered_allocation(lab: Lab) -> None:
    lab.start()
    for dev in DEVICES:
        lab.write_device(dev, "delay=allocate:5")
    outcome: dict[str, AdmittedPod | Exception] = {}

    def admit() -> None:
        try:
            outcome["pod"] = lab.kubelet.admit_pod(PodSpec("p", [ContainerSpec("app", {RESOURCE: 1})]))
        except Exception as exc:
            outcome["error"] = exc

    admission = threading.Thread(target=admit)
    admission.start()
    record = lab.wait(
        lambda: next((r for r in lab.ledger() if r["pending"]), None), what="an Allocate in flight in the ledger"
    )
    (dev,) = record["pending"]
    lab.kill()
    admission.join(30)
    assert isinstance(outcome.get("error"), KubeletError), outcome
    assert lab.kubelet.pods() == []
    assert lab.calls("allocate", dev, ok=None) == [], "the allocate hook should have been killed mid-call"

    for d in DEVICES:
        lab.write_device(d)
    since = time.time()
    lab.restart_process()
    lab.wait_released(dev)
    assert lab.count("deallocate", dev) == 1
    assert any(c["time"] >= since for c in lab.calls("deallocate", dev))
    _assert_invariants(lab)
    assert "an Allocate that never completed" in lab.log()


@pytest.mark.parametrize("hook", ["post_stop", "deallocate"])
def test_kill_mid_release_finishes_the_release_after_restart(lab: Lab, hook: str) -> None:
    lab.start()
    (dev,) = lab.admit("p", 1)
    lab.wait_seen(dev, "p")
    lab.write_device(dev, f"delay={hook}:5")
    lab.kubelet.remove_pod("p")
    if hook == "post_stop":
        lab.wait(lambda: (r := lab.ledger_record(dev)) is not None and r["releasing"], what="the release to start")
    else:  # post-stop is done (and saved): the deallocate hook is running
        lab.wait(lambda: (r := lab.ledger_record(dev)) is not None and r["post_stop_done"], what="post-stop done")
    lab.kill()
    assert lab.calls(hook, dev, ok=None) == [], f"the {hook} hook should have been killed mid-call"

    lab.write_device(dev, f"delay={hook}:1")  # the resumed release takes a while: it must stay withheld
    since = time.time()
    lab.restart_process()
    lab.wait_released(dev)
    _assert_withheld_until_released(lab, dev, since)
    assert lab.count("post_stop", dev) == 1
    assert lab.count("deallocate", dev) == 1
    lab.write_device(dev)
    _assert_invariants(lab)
    assert lab.view().free == len(DEVICES)


def test_kill_right_after_allocation_keeps_the_device_allocated(lab: Lab) -> None:
    lab.start()
    devices = lab.admit("p", 2)
    lab.kill()  # at once: the reconciler may not even have seen the pod yet

    lab.restart_process()
    for dev in devices:
        lab.wait_seen(dev, "p")  # the restarted daemon compared its ledger with PodResources
    lab.quiet(5 * INTERVAL)
    for dev in devices:
        assert lab.count("post_stop", dev) == 0
        assert lab.count("deallocate", dev) == 0
        assert lab.driver_holds(dev)
    _assert_invariants(lab)
    assert lab.resource_status()["counts"]["allocated"] == 2

    lab.kubelet.remove_pod("p")
    for dev in devices:
        lab.wait_released(dev)
        assert lab.count("post_stop", dev) == 1


def test_pod_removed_while_daemon_is_dead_is_released_after_restart(lab: Lab) -> None:
    lab.start()
    devices = lab.admit("p", 2)
    for dev in devices:
        lab.wait_seen(dev, "p")
    lab.kill()
    lab.kubelet.remove_pod("p")

    lab.restart_process()
    for dev in devices:
        lab.wait_released(dev)
    for dev in devices:
        assert lab.count("post_stop", dev) == 1
        assert lab.count("deallocate", dev) == 1
    _assert_invariants(lab)
    assert "pod default/p no longer holds them" in lab.log()


def test_corrupt_ledger_is_moved_aside_and_rebuilt_from_pod_resources(lab: Lab) -> None:
    lab.start()
    devices = lab.admit("p", 2)
    for dev in devices:
        lab.wait_seen(dev, "p")
    daemon = lab.daemon
    assert daemon is not None
    assert daemon.process.stop() == 0
    ledger = lab.ledger_path()
    ledger.write_bytes(b'{"format": 1, "allocations": [{"id": ')  # a torn, garbled file

    lab.restart_process()
    aside = list(ledger.parent.glob("ledger.json.corrupt-*"))
    assert len(aside) == 1, list(ledger.parent.iterdir())
    assert aside[0].read_bytes().startswith(b'{"format": 1, "allocations"')
    log = lab.log()
    assert "is corrupt" in log
    assert str(aside[0]) in log
    for dev in devices:
        lab.wait_seen(dev, "p")  # adopted: back in the ledger, held by the pod
    assert "adopted" in lab.log()
    for dev in devices:
        assert lab.count("deallocate", dev) == 0

    lab.kubelet.remove_pod("p")
    for dev in devices:
        lab.wait_released(dev)
        assert lab.count("post_stop", dev) == 1
        assert lab.count("deallocate", dev) == 1


def test_second_daemon_on_the_same_state_dir_refuses_naming_the_first(lab: Lab) -> None:
    first = lab.start()
    registrations = lab.kubelet.registrations(RESOURCE)
    second = lab.factory({RESOURCE: lab.resource_table()}, wait=False)
    code = second.process.wait(20)
    assert code != 0
    assert second.state_dir == first.state_dir
    log = second.process.log_text()
    assert f"pid {first.process.pid}" in log, log
    assert first.process.running()
    assert lab.kubelet.registrations(RESOURCE) == registrations
    assert lab.admit("p", 1)
