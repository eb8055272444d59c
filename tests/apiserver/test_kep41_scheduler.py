"""The scheduler stand-in allocating issue 41's devices as the structured allocator of 1.36 does: shares of devices
with consumable capacity, counters of partitionable devices, admin access over taken devices."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from devplug.testing.apiserver import ApiServer
from devplug.testing.scheduler import SchedulerStandIn, SchedulingError

from .conftest import DRIVER, NODE, driver_class, node

NS = "default"


def slice_with(
    name: str, devices: list[dict[str, Any]], *, counters: list[dict[str, Any]] | None = None, count: int = 1
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": DRIVER,
        "nodeName": NODE,
        "pool": {"name": NODE, "generation": 1, "resourceSliceCount": count},
    }
    if counters is not None:
        spec["sharedCounters"] = counters
    else:
        spec["devices"] = devices
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


def shared(name: str, capacity: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": name, "allowMultipleAllocations": True, "capacity": capacity, **extra}


def claim(name: str, *requests: dict[str, Any], namespace: str = NS) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": list(requests)}},
    }


def request(
    name: str = "r", capacity: dict[str, str] | None = None, count: int = 1, admin: bool = False
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "fpga", "count": count}
    if capacity is not None:
        exactly["capacity"] = {"requests": capacity}
    if admin:
        exactly["adminAccess"] = True
    return {"name": name, "exactly": exactly}


def pod(name: str, claims: list[str], namespace: str = NS) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [{"name": "app"}],
            "resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims],
        },
    }


@pytest.fixture
def cluster(api: ApiServer) -> ApiServer:
    api.create("nodes", node())
    api.create("deviceclasses", driver_class())
    return api


def schedule(api: ApiServer, name: str, *requests: dict[str, Any], namespace: str = NS) -> list[dict[str, Any]]:
    """A claim and a pod using it, scheduled; the claim's results."""
    api.create("resourceclaims", claim(name, *requests, namespace=namespace), namespace)
    api.create("pods", pod(f"pod-{name}", [name], namespace), namespace)
    (stored,) = SchedulerStandIn(api.storage).schedule(namespace, f"pod-{name}", NODE)
    results: list[dict[str, Any]] = stored["status"]["allocation"]["devices"]["results"]
    return results


def test_a_device_with_consumable_capacity_is_shared_until_its_capacity_is_used_up(cluster: ApiServer) -> None:
    """``allowMultipleAllocations``: every claim gets a share with a fresh UID, consuming the policy's default
    when it names no amount; the fifth share of four is refused, and nothing is written for it."""
    cluster.create(
        "resourceslices",
        slice_with("s", [shared("fpga-0", {"shares": {"value": "4", "requestPolicy": {"default": "1"}}})]),
    )
    share_ids = set()
    for i in range(4):
        (result,) = schedule(cluster, f"c{i}", request())
        assert (result["device"], result["consumedCapacity"]) == ("fpga-0", {"shares": "1"})
        assert str(uuid.UUID(result["shareID"])) == result["shareID"]
        share_ids.add(result["shareID"])
    assert len(share_ids) == 4
    with pytest.raises(SchedulingError, match=r"wants 1 device.* node node-a has 0 free"):
        schedule(cluster, "c4", request())
    assert "allocation" not in (cluster.get("resourceclaims", "c4", NS).get("status") or {})


def test_a_request_rounds_up_to_the_policy_step_and_is_refused_above_its_max(cluster: ApiServer) -> None:
    policy = {"default": "1Gi", "validRange": {"min": "1Gi", "max": "4Gi", "step": "1Gi"}}
    cluster.create(
        "resourceslices", slice_with("s", [shared("fpga-0", {"memory": {"value": "8Gi", "requestPolicy": policy}})])
    )
    (result,) = schedule(cluster, "a", request(capacity={"memory": "1500Mi"}))
    assert result["consumedCapacity"] == {"memory": "2Gi"}, "1.5Gi rounded up to the next 1Gi step"
    (result,) = schedule(cluster, "b", request(capacity={"memory": "100Mi"}))
    assert result["consumedCapacity"] == {"memory": "1Gi"}, "below min: min"
    with pytest.raises(SchedulingError):
        schedule(cluster, "c", request(capacity={"memory": "5Gi"}))  # above max: violates the policy
    (result,) = schedule(cluster, "d", request(capacity={"memory": "4Gi"}))
    assert result["consumedCapacity"] == {"memory": "4Gi"}
    with pytest.raises(SchedulingError):
        schedule(cluster, "e", request(capacity={"memory": "2Gi"}))  # 2 + 1 + 4 used of 8: 1 left


def test_valid_values_round_up_to_the_next_one(cluster: ApiServer) -> None:
    policy = {"default": "1", "validValues": ["1", "2", "4"]}
    cluster.create(
        "resourceslices", slice_with("s", [shared("fpga-0", {"lanes": {"value": "8", "requestPolicy": policy}})])
    )
    (result,) = schedule(cluster, "a", request(capacity={"lanes": "3"}))
    assert result["consumedCapacity"] == {"lanes": "4"}
    with pytest.raises(SchedulingError):
        schedule(cluster, "b", request(capacity={"lanes": "5"}))  # above every valid value


def test_two_requests_of_one_claim_share_one_device_and_a_key_must_be_written_as_the_device_does(
    cluster: ApiServer,
) -> None:
    cluster.create(
        "resourceslices",
        slice_with("s", [shared("fpga-0", {"shares": {"value": "4", "requestPolicy": {"default": "1"}}})]),
    )
    first, second = schedule(cluster, "a", request("x", {"shares": "1"}), request("y", {"shares": "2"}))
    assert (first["device"], second["device"]) == ("fpga-0", "fpga-0") and first["shareID"] != second["shareID"]
    assert (first["consumedCapacity"], second["consumedCapacity"]) == ({"shares": "1"}, {"shares": "2"})
    with pytest.raises(SchedulingError):  # requestsContainNonExistCapacity: compared as written in 1.36
        schedule(cluster, "b", request(capacity={f"{DRIVER}/shares": "1"}))
    with pytest.raises(SchedulingError):  # one request takes a device once
        schedule(cluster, "c", request(count=2))


def test_a_device_without_multiple_allocations_stays_exclusive(cluster: ApiServer) -> None:
    cluster.create("resourceslices", slice_with("s", [{"name": "fpga-0", "capacity": {"shares": {"value": "4"}}}]))
    (result,) = schedule(cluster, "a", request(capacity={"shares": "1"}))
    assert "shareID" not in result and "consumedCapacity" not in result
    with pytest.raises(SchedulingError):
        schedule(cluster, "b", request(capacity={"shares": "1"}))


def partitioned(cluster: ApiServer, parts: dict[str, int], slots: int = 2, counter_set: str = "card") -> None:
    """A pool of two slices: the counter set (``slots`` slots) and parts consuming some each."""
    cluster.create(
        "resourceslices",
        slice_with(
            "a-counters", [], counters=[{"name": "card", "counters": {"slots": {"value": str(slots)}}}], count=2
        ),
    )
    devices = [
        {"name": name, "consumesCounters": [{"counterSet": counter_set, "counters": {"slots": {"value": str(n)}}}]}
        for name, n in parts.items()
    ]
    cluster.create("resourceslices", slice_with("b-parts", devices, count=2))


def test_counters_forbid_two_parts_the_card_cannot_hold(cluster: ApiServer) -> None:
    partitioned(cluster, {"whole": 2, "half-0": 1, "half-1": 1})
    (result,) = schedule(cluster, "a", request())
    assert result["device"] == "whole"
    with pytest.raises(SchedulingError):  # both halves would need slots the whole card took
        schedule(cluster, "b", request())
    cluster.storage.update(
        cluster.resource("resourceclaims"),
        NS,
        "a",
        {**cluster.get("resourceclaims", "a", NS), "status": {}},
        subresource="status",
    )
    assert [r["device"] for r in schedule(cluster, "c", request(count=2))] == ["half-0", "half-1"]
    with pytest.raises(SchedulingError):
        schedule(cluster, "d", request())


def test_a_pool_whose_device_names_an_unknown_counter_set_is_not_allocated_from(cluster: ApiServer) -> None:
    partitioned(cluster, {"whole": 2}, counter_set="nope")
    with pytest.raises(SchedulingError, match="counter set nope not found"):
        schedule(cluster, "a", request())


def test_a_shared_device_consumes_its_counters_once(cluster: ApiServer) -> None:
    cluster.create(
        "resourceslices",
        slice_with("a-counters", [], counters=[{"name": "card", "counters": {"slots": {"value": "1"}}}], count=2),
    )
    device = shared(
        "fpga-0",
        {"shares": {"value": "2", "requestPolicy": {"default": "1"}}},
        consumesCounters=[{"counterSet": "card", "counters": {"slots": {"value": "1"}}}],
    )
    cluster.create("resourceslices", slice_with("b-parts", [device], count=2))
    assert schedule(cluster, "a", request())[0]["device"] == "fpga-0"
    assert schedule(cluster, "b", request())[0]["device"] == "fpga-0", "a second share: no second slot"


def test_a_request_for_more_devices_than_there_are_fails_at_once_naming_how_many_are_free(cluster: ApiServer) -> None:
    """The search does not try every combination of 30 devices before saying 31 do not fit; a claim may not have
    more than 32 results (``AllocationResultsMaxSize``)."""
    cluster.create("resourceslices", slice_with("s", [{"name": f"fpga-{i}"} for i in range(40)]))
    schedule(cluster, "first", request(count=10))
    with pytest.raises(SchedulingError, match=r"wants 31 device\(s\) .* has 30 free"):
        schedule(cluster, "a", request(count=31))
    with pytest.raises(SchedulingError, match="number of requested devices 33 exceeds the claim limit of 32"):
        schedule(cluster, "b", request(count=33))
    assert len(schedule(cluster, "c", request(count=30))) == 30
