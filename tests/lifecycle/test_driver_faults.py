"""Failing drivers (issue 3): a hook that raises fails only its request, all or nothing; a hook that
hangs times out (``hook_timeout``), its resource reports every device unhealthy until the driver
answers again, and the daemon's other resources keep working meanwhile."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from devplug.errors import KubeletError

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


def test_hanging_allocate_times_out_and_degrades_the_resource_until_the_driver_answers(lab: Lab) -> None:
    started = _hanging(lab)
    lab.wait(
        lambda: any(set(e.device_ids) == set(DEVICES) for e in lab.events("list-and-watch", since=started)),
        what="the kubelet to get every device of the resource as unhealthy",
    )
    assert lab.calls("allocate", resource=RESOURCE, ok=None) == [], "reported while the hook was still hung"
    assert "driver failing, all devices reported unhealthy" in lab.log()
    assert "did not return within 0.5 s" in lab.log()
    lab.wait(lambda: lab.view().allocatable > 0, timeout=HANG + 10, what="the resource to recover")
    assert "driver recovered" in lab.log()


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
