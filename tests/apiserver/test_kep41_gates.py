"""Issue 41's feature gates in the API server stand-in: which are off in each release, and what a write loses when
one is off (the strategies' ``dropDisabled...Fields``, pkg/registry/resource/*/strategy.go), written over HTTP."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from devplug.testing.apiserver import ApiServer
from devplug.testing.apiserver.versions import RELEASES

from .conftest import DRIVER, NODE

NS = "default"
UID = "0b0f3c0e-8e8a-4c59-9d69-6a1f4c7e0a11"


def _raw(api: ApiServer) -> httpx2.Client:
    return httpx2.Client(base_url=api.url, timeout=10.0, trust_env=False)


def shared_slice(name: str = "a-fpga") -> dict[str, Any]:
    """A slice using consumable capacity and counters (written without the counter set: only the gates matter)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "fpga-0",
                    "allowMultipleAllocations": True,
                    "capacity": {"shares": {"value": "4", "requestPolicy": {"default": "1"}}},
                    "consumesCounters": [{"counterSet": "card", "counters": {"slots": {"value": "1"}}}],
                }
            ],
        },
    }


def claim(name: str = "c", *, admin: bool = False, capacity: bool = False) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "fpga"}
    if admin:
        exactly["adminAccess"] = True
    if capacity:
        exactly["capacity"] = {"requests": {"shares": "2"}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": exactly}]}},
    }


def test_each_release_has_the_gates_kube_features_go_gives_it_off() -> None:
    assert RELEASES["1.32"].off_by_default == {"DRAAdminAccess", "DRAResourceClaimDeviceStatus"}
    assert RELEASES["1.33"].off_by_default == {"DRAAdminAccess", "DRADeviceTaints", "DRAPartitionableDevices"}
    for minor in ("1.34", "1.35"):
        assert RELEASES[minor].off_by_default == {
            "DRADeviceTaints",
            "DRAPartitionableDevices",
            "DRAConsumableCapacity",
        }
    assert RELEASES["1.36"].off_by_default == frozenset()


def test_a_slice_written_with_the_gates_off_loses_counters_and_shares_and_keeps_them_with_the_gates_on() -> None:
    with ApiServer(release="1.34") as api, _raw(api) as http:
        answer = http.post("/apis/resource.k8s.io/v1/resourceslices", json=shared_slice())
        assert answer.status_code == 201, answer.text
        device = answer.json()["spec"]["devices"][0]
        assert device == {"name": "fpga-0", "capacity": {"shares": {"value": "4"}}}
    with ApiServer(release="1.34", enabled_features={"DRAConsumableCapacity"}) as api, _raw(api) as http:
        device = http.post("/apis/resource.k8s.io/v1/resourceslices", json=shared_slice()).json()["spec"]["devices"][0]
        assert device["allowMultipleAllocations"] is True and "consumesCounters" not in device
        assert device["capacity"]["shares"]["requestPolicy"] == {"default": "1"}
    with ApiServer() as api, _raw(api) as http:  # 1.36: both on
        device = http.post("/apis/resource.k8s.io/v1/resourceslices", json=shared_slice()).json()["spec"]["devices"][0]
        assert device["consumesCounters"][0]["counterSet"] == "card" and device["allowMultipleAllocations"] is True


def test_a_field_in_use_is_kept_when_the_gate_is_turned_off_later() -> None:
    """``draConsumableCapacityFeatureInUse``: an update of a slice already using the fields keeps them."""
    with ApiServer() as api:
        api.create("resourceslices", shared_slice())
        api.restart(disabled_features={"DRAConsumableCapacity", "DRAPartitionableDevices"})
        stored = api.get("resourceslices", "a-fpga")
        stored["spec"]["devices"][0]["attributes"] = {"model": {"string": "agilex"}}
        kept = api.update("resourceslices", stored)["spec"]["devices"][0]
        assert kept["allowMultipleAllocations"] is True and kept["consumesCounters"]
        fresh = api.create("resourceslices", shared_slice("b-fpga"))["spec"]["devices"][0]
        assert "allowMultipleAllocations" not in fresh and "consumesCounters" not in fresh


def test_a_claim_loses_admin_access_and_capacity_requests_with_their_gates_off() -> None:
    with ApiServer(release="1.33") as api, _raw(api) as http:  # DRAAdminAccess alpha: off
        body = {**claim(admin=True), "apiVersion": "resource.k8s.io/v1beta2"}
        answer = http.post(f"/apis/resource.k8s.io/v1beta2/namespaces/{NS}/resourceclaims", json=body)
        assert answer.status_code == 201, answer.text
        assert answer.json()["spec"]["devices"]["requests"][0]["exactly"] == {"deviceClassName": "fpga"}
    with ApiServer(release="1.35") as api:  # DRAConsumableCapacity alpha: off
        stored = api.create("resourceclaims", claim(capacity=True), NS)
        assert "capacity" not in stored["spec"]["devices"]["requests"][0]["exactly"]
    with ApiServer() as api:
        stored = api.create("resourceclaims", claim(capacity=True), NS)
        assert stored["spec"]["devices"]["requests"][0]["exactly"]["capacity"] == {"requests": {"shares": "2"}}


def _allocate(api: ApiServer, name: str = "c", **result: Any) -> dict[str, Any]:
    stored = api.get("resourceclaims", name, NS)
    entry = {"request": "r", "driver": DRIVER, "pool": NODE, "device": "fpga-0", **result}
    stored["status"] = {"allocation": {"devices": {"results": [entry]}}}
    return api.update("resourceclaims", stored, NS, "kube-scheduler", "status")


@pytest.mark.parametrize(
    ("release", "gate", "result", "status_entry", "dropped"),
    [
        (
            "1.34",
            "DRAConsumableCapacity",
            {"shareID": UID, "consumedCapacity": {"shares": "1"}},
            {"shareID": UID},
            True,
        ),
        (
            "1.36",
            "DRAConsumableCapacity",
            {"shareID": UID, "consumedCapacity": {"shares": "1"}},
            {"shareID": UID},
            False,
        ),
    ],
)
def test_the_share_id_of_results_and_device_statuses_is_dropped_with_consumable_capacity_off(
    release: str, gate: str, result: dict[str, Any], status_entry: dict[str, Any], dropped: bool
) -> None:
    with ApiServer(release=release) as api:
        api.create("resourceclaims", claim(), NS)
        allocated = _allocate(api, **result)
        stored = allocated["status"]["allocation"]["devices"]["results"][0]
        assert ("shareID" not in stored and "consumedCapacity" not in stored) is dropped
        if dropped:
            assert gate in api.storage.disabled_features


def test_status_devices_are_dropped_on_a_1_32_server_and_kept_with_the_gate_on() -> None:
    entry = {"driver": DRIVER, "pool": NODE, "device": "fpga-0", "data": {"image": "blue"}}
    for features, kept in ((None, False), ((), True)):
        with ApiServer(release="1.32", disabled_features=features) as api:
            api.create("resourceclaims", claim(), NS)
            allocated = _allocate(api)
            allocated["status"]["devices"] = [entry]
            written = api.update("resourceclaims", allocated, NS, DRIVER, "status")
            assert ("devices" in written["status"]) is kept, json.dumps(written["status"])


def test_a_status_update_that_deallocates_a_device_drops_its_status_entry() -> None:
    """``dropDeallocatedStatusDevices``: the resourceclaim controller clearing the allocation need not know about
    ``status.devices``; the entries of the devices it took away go."""
    with ApiServer() as api:
        api.create("resourceclaims", claim(), NS)
        allocated = _allocate(api)
        allocated["status"]["devices"] = [{"driver": DRIVER, "pool": NODE, "device": "fpga-0"}]
        written = api.update("resourceclaims", allocated, NS, DRIVER, "status")
        assert written["status"]["devices"] == [{"driver": DRIVER, "pool": NODE, "device": "fpga-0"}]
        cleared = api.update(
            "resourceclaims",
            {**written, "status": {"devices": written["status"]["devices"]}},
            NS,
            "kube-controller-manager",
            "status",
        )
        assert "devices" not in cleared["status"]
