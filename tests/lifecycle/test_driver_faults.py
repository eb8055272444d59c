"""Failing drivers (issue 3): a hook that raises fails only its request, all or nothing; a hook that
hangs times out (``hook_timeout``) and its devices stay out of service (advertised unhealthy, no new hook
on them, an Allocate of them refused naming them) until the call really returns, while the resource's other
devices and the daemon's other resources keep working (issue 23: "driver failing" is for the driver as a
whole, not for one device's hook)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import grpc
import pytest

from devplug.errors import KubeletError
from devplug_mock import read_calls

if TYPE_CHECKING:
    from tests.lifecycle.conftest import Lab

RESOURCE = "example.com/mock"
RESOURCE_B = "example.com/other"
DEVICES = ("mock0", "mock1", "mock2", "mock3")
HANG = 3.0  # how long a hung allocate sleeps; the hook timeout is 0.5 s


def test_raising_allocate_rejects_the_pod_and_leaves_nothing_allocated(lab: Lab) -> None:
    lab.start()
    lab.write_device("mock0", "fail=allocate")

    with pytest.raises(KubeletError) as rejected:
        lab.admit("p", 4)  # every device: the failing one is among them
    message = str(rejected.value)
    assert "mock: allocate failed for device mock0" in message
    assert "rolled back" in message

    assert lab.kubelet.pods() == []
    assert lab.ledger() == []
    assert not any(lab.driver_holds(d) for d in DEVICES)
    assert lab.calls("allocate", "mock0", ok=False)
    lab.wait(lambda: lab.resource_status()["counts"]["allocated"] == 0, what="status: nothing allocated")
    assert lab.view().allocatable == 4  # a plain failure does not degrade the resource
    assert "allocation was rolled back" in lab.log()

    response = lab.allocate("mock1", "mock2", "mock3")  # the other devices are still allocatable
    assert response.container_responses[0].envs["MOCK_DEVICES"] == "mock1,mock2,mock3"
    assert lab.driver_holds("mock1")


def _hanging(lab: Lab) -> float:
    """Start a daemon whose first resource's allocate hangs; admit a pod; return when it was rejected."""
    lab.start(
        {RESOURCE: lab.resource_table(hook_timeout=0.5), RESOURCE_B: lab.resource_table(RESOURCE_B)},
    )
    for dev in DEVICES:
        lab.write_device(dev, f"delay=allocate:{HANG}")
    started = time.time()
    with pytest.raises(KubeletError, match=r"did not return within 0\.5 s \(hook_timeout\)") as failed:
        lab.admit("p", 1)
    assert "code = DeadlineExceeded" in str(failed.value)  # the kubelet words the gRPC status the Go way
    assert lab.kubelet.pods() == []
    return started


def test_a_hanging_allocate_keeps_only_its_device_out_of_service_until_it_returns(lab: Lab) -> None:
    started = _hanging(lab)
    (attempt,) = lab.events("allocate", since=started)
    (hung,) = attempt.device_ids
    others = [d for d in DEVICES if d != hung]
    lab.wait(lambda: lab.health(hung) == "Unhealthy", what=f"the kubelet to get {hung} (hook still running) unhealthy")
    assert lab.view().allocatable == 3
    assert all(lab.health(d) == "Healthy" for d in others)
    assert "driver failing" not in lab.log()
    assert lab.resource_status()["degraded"] is None
    busy = lab.wait(lambda: lab.resource_status()["busy_devices"], what="the status to show the busy device")
    assert list(busy) == [hung] and "allocate running past hook_timeout" in busy[hung]

    with pytest.raises(grpc.RpcError) as refused:
        lab.allocate(hung)  # a kubelet offering it anyway gets a clear no, and no second hook runs on it
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert hung in str(refused.value.details()) and "past hook_timeout" in str(refused.value.details())
    started_on_it = [
        c["hook"]
        for c in read_calls(lab.mock_dir(), started=True)
        if hung in c["device_ids"] and c["hook"] != "preferred_allocation"  # that one lists every device offered
    ]
    assert started_on_it == ["allocate"]

    lab.write_device(others[0])  # the others keep serving (without the slow directive)
    response = lab.allocate(others[0])
    assert response.container_responses[0].envs["MOCK_DEVICES"] == others[0]

    lab.wait(lambda: lab.health(hung) == "Healthy", timeout=HANG + 10, what=f"{hung} back once its call returned")
    assert lab.calls("deallocate", hung), "the late allocate is undone before the device is offered again"
    lab.wait(lambda: lab.resource_status()["busy_devices"] == {}, what="the status to show no busy device")


def test_other_resource_keeps_working_while_a_hook_hangs(lab: Lab) -> None:
    _hanging(lab)
    (dev,) = lab.admit("q", 1, RESOURCE_B)
    assert lab.calls("allocate", resource=RESOURCE, ok=None) == [], "the hung hook should still be sleeping"
    assert lab.driver_holds(dev, RESOURCE_B)
    assert lab.view(RESOURCE_B).allocatable == 4


def test_hung_allocate_returning_late_is_undone_before_its_device_is_offered_again(lab: Lab) -> None:
    """The abandoned allocate finishes after the kubelet was told it failed: the driver then holds
    the device, so the engine must deallocate it afterwards, and advertise it free only then."""
    started = _hanging(lab)
    late = lab.wait(
        lambda: lab.calls("allocate", resource=RESOURCE), timeout=HANG + 10, what="the hung allocate to return"
    )
    (dev,) = late[0]["device_ids"]
    lab.wait(
        lambda: not lab.driver_holds(dev),
        timeout=10,
        what=f"a deallocate of {dev} after the late allocate returned (the driver still holds it)",
    )
    undone = next(c["time"] for c in lab.calls("deallocate", dev) if c["time"] >= late[0]["time"])
    offered = [e for e in lab.events("list-and-watch", since=started) if e.time < undone and dev not in e.device_ids]
    assert offered == [], f"{dev} advertised healthy while the driver held it"


def test_an_allocate_whose_undo_fails_keeps_the_devices_out_of_service_until_a_deallocate_succeeds(lab: Lab) -> None:
    """Issue 27: "a failed clean keeping the device out of service". The allocate fails and so does the undo's
    deallocate: the driver may still hold the devices, so they are never offered until a deallocate (a retry,
    flagged so) succeeds."""
    lab.start(release_interval=0.1)
    lab.write_device("mock0", "fail=allocate,deallocate")
    with pytest.raises(KubeletError, match="rolled back"):
        lab.admit("p", 4)  # every device: the failing one is among them
    lab.wait(lambda: lab.health("mock0") == "Unhealthy", what="mock0, not taken back, advertised unhealthy")
    (record,) = lab.ledger()
    assert set(record["pending"]) == set(DEVICES) and record["releasing"] and record["deallocate_begun"]
    lab.wait(lambda: len(lab.calls("deallocate", "mock0", ok=False)) >= 3, what="the deallocate retried")
    assert all(call.get("retry") for call in lab.calls("deallocate", "mock0", ok=False)[1:])
    assert lab.view().allocatable == 0, "no device of the failed undo offered while the driver may hold it"
    assert "stay out of service until a deallocate succeeds" in lab.log()

    lab.write_device("mock0")  # the device recovers: the next retry succeeds
    lab.wait(lambda: lab.ledger() == [], what="the release to succeed and the record to go")
    assert lab.calls("deallocate", "mock0")[-1].get("retry") is True
    lab.wait(lambda: lab.view().allocatable == 4, what="the devices offered again")
    assert lab.allocate("mock0").container_responses[0].envs["MOCK_DEVICES"] == "mock0"
