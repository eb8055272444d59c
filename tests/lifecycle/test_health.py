"""Health (issue 3): health changes reach the kubelet (the resource's ``health_interval`` polling and
the driver's pushes), an unhealthy device is never offered by preferred allocation nor allocatable,
and a device can become healthy again."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc
import pytest

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp

if TYPE_CHECKING:
    from tests.lifecycle.conftest import Lab

RESOURCE = "example.com/mock"


def _start(lab: Lab) -> None:
    lab.start({RESOURCE: lab.resource_table(health_interval=0.2)})


def test_health_interval_polling_reaches_the_kubelet(lab: Lab) -> None:
    """The device file is edited through a hard link outside the mock's folder, which the mock's
    folder watch does not see: only the engine's ``check_health`` polling can notice the change."""
    shadow = lab.root / "shadow-mock1"
    shadow.write_text("")
    lab.mock_dir().mkdir()
    (lab.mock_dir() / "mock1").hardlink_to(shadow)
    _start(lab)
    assert lab.health("mock1") == "Healthy"

    shadow.write_text("unhealthy\n")
    lab.wait(lambda: lab.health("mock1") == "Unhealthy", what="mock1 reported unhealthy by polling")
    assert "[example.com/mock mock1] health is now Unhealthy" in lab.log()
    assert lab.view().allocatable == 3

    shadow.write_text("")
    lab.wait(lambda: lab.health("mock1") == "Healthy", what="mock1 healthy again by polling")
    assert "[example.com/mock mock1] health is now Healthy" in lab.log()


def test_pushed_health_changes_reach_the_kubelet(lab: Lab) -> None:
    lab.start()  # no health_interval: only the driver's pushes
    lab.write_device("mock1", "unhealthy")
    lab.wait(lambda: lab.health("mock1") == "Unhealthy", what="mock1 reported unhealthy")
    assert lab.view().allocatable == 3
    assert lab.health("mock0") == "Healthy"

    lab.write_device("mock1")
    lab.wait(lambda: lab.health("mock1") == "Healthy", what="mock1 healthy again")
    assert lab.view().allocatable == 4


def test_unhealthy_device_is_never_offered_by_preferred_allocation(lab: Lab) -> None:
    _start(lab)
    lab.write_device("mock1", "unhealthy")
    lab.wait(lambda: lab.health("mock1") == "Unhealthy", what="mock1 reported unhealthy")

    devices = lab.admit("p", 3)
    assert sorted(devices) == ["mock0", "mock2", "mock3"]
    for call in lab.calls("preferred_allocation"):
        assert "mock1" not in call["device_ids"]

    # a kubelet with a stale view offers it anyway: the engine filters it out before the driver
    request = dp.PreferredAllocationRequest(
        container_requests=[
            dp.ContainerPreferredAllocationRequest(available_deviceIDs=["mock1", "mock0"], allocation_size=1)
        ]
    )
    before = len(lab.calls("preferred_allocation"))
    response = lab.grpc_call("GetPreferredAllocation", request, dp.PreferredAllocationResponse)
    assert list(response.container_responses[0].deviceIDs) == ["mock0"]
    latest = lab.calls("preferred_allocation")[before:]
    assert latest, "the driver's preferred_allocation was not called"
    assert all("mock1" not in call["device_ids"] for call in latest)


def test_allocate_of_an_unhealthy_device_is_invalid_until_it_is_healthy_again(lab: Lab) -> None:
    _start(lab)
    lab.write_device("mock2", "unhealthy")
    lab.wait(lambda: lab.health("mock2") == "Unhealthy", what="mock2 reported unhealthy")

    with pytest.raises(grpc.RpcError) as refused:
        lab.allocate("mock2")
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unhealthy device IDs: mock2" in (refused.value.details() or "")
    assert lab.calls("allocate", "mock2", ok=None) == []
    assert lab.ledger_record("mock2") is None

    lab.write_device("mock2")
    lab.wait(lambda: lab.health("mock2") == "Healthy", what="mock2 healthy again")
    response = lab.allocate("mock2")
    assert response.container_responses[0].envs["MOCK_DEVICES"] == "mock2"
    assert lab.ledger_record("mock2") is not None
