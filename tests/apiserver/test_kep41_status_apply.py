"""``status.devices`` written by drivers with server-side apply, as devplug does (PATCH application/apply-patch+yaml
on ``resourceclaims/status``, fieldManager = the driver, force): a list map keyed by driver, device, pool and
shareID (``+listType=map``, ``+listMapKey`` in ``k8s.io/api/resource/v1/types.go``), each entry owned by the
manager that applied it; and the scheduler stand-in's admin access over a taken device."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from devplug.testing.apiserver import ApiServer
from devplug.testing.apiserver.admin import LABEL
from devplug.testing.scheduler import SchedulerStandIn, SchedulingError

from .conftest import DRIVER, NODE, driver_class, node

NS = "default"
OTHER = "nic.example.com"
APPLY = "application/apply-patch+yaml"
S1 = "0b0f3c0e-8e8a-4c59-9d69-6a1f4c7e0a11"
S2 = "1c1f3c0e-8e8a-4c59-9d69-6a1f4c7e0a22"


@pytest.fixture
def http(api: ApiServer) -> Any:
    with httpx2.Client(base_url=api.url, timeout=10.0, trust_env=False) as client:
        yield client


def allocated(api: ApiServer) -> None:
    """Claim ``c`` with four results: two shares of one FPGA, an exclusive FPGA, and a NIC of another driver."""
    api.create(
        "resourceclaims",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "fpga"}}]}},
        },
        NS,
    )
    stored = api.get("resourceclaims", "c", NS)
    results = [
        {"request": "r", "driver": DRIVER, "pool": NODE, "device": "fpga-0", "shareID": S1},
        {"request": "r", "driver": DRIVER, "pool": NODE, "device": "fpga-0", "shareID": S2},
        {"request": "r", "driver": DRIVER, "pool": NODE, "device": "fpga-1"},
        {"request": "r", "driver": OTHER, "pool": NODE, "device": "nic-0"},
    ]
    stored["status"] = {"allocation": {"devices": {"results": results}}}
    api.update("resourceclaims", stored, NS, "kube-scheduler", "status")


def apply_status(http: Any, manager: str, devices: list[dict[str, Any]]) -> Any:
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c", "namespace": NS}}
    body["status"] = {"devices": devices}
    return http.patch(
        f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/c/status",
        params={"fieldManager": manager, "force": "true"},
        content=json.dumps(body),
        headers={"Content-Type": APPLY},
    )


def entry(device: str, driver: str = DRIVER, share: str | None = None, **data: Any) -> dict[str, Any]:
    found: dict[str, Any] = {"driver": driver, "pool": NODE, "device": device}
    if share is not None:
        found["shareID"] = share
    if data:
        found["data"] = data
    return found


def statuses(api: ApiServer) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = api.get("resourceclaims", "c", NS)["status"].get("devices") or []
    return found


def test_each_driver_owns_its_entries_and_an_apply_without_one_removes_it(api: ApiServer, http: Any) -> None:
    allocated(api)
    answer = apply_status(
        http, DRIVER, [entry("fpga-0", share=S1, image="a"), entry("fpga-0", share=S2, image="b"), entry("fpga-1")]
    )
    assert answer.status_code == 200, answer.text
    assert apply_status(http, OTHER, [entry("nic-0", OTHER, image="n")]).status_code == 200
    assert [(d["device"], d.get("shareID")) for d in statuses(api)] == [
        ("fpga-0", S1),
        ("fpga-0", S2),
        ("fpga-1", None),
        ("nic-0", None),
    ], "two shares of one device are two entries (shareID is a key)"
    # the FPGA driver unprepares the second share: its apply leaves that entry out
    assert apply_status(http, DRIVER, [entry("fpga-0", share=S1, image="a"), entry("fpga-1")]).status_code == 200
    assert [(d["device"], d.get("shareID")) for d in statuses(api)] == [
        ("fpga-0", S1),
        ("fpga-1", None),
        ("nic-0", None),
    ]
    # a changed entry replaces the driver's fields of it
    assert apply_status(http, DRIVER, [entry("fpga-0", share=S1, image="c"), entry("fpga-1")]).status_code == 200
    assert statuses(api)[0]["data"] == {"image": "c"}
    # everything unprepared: an empty list as the same manager removes its entries, the NIC's stay
    assert apply_status(http, DRIVER, []).status_code == 200
    assert statuses(api) == [entry("nic-0", OTHER, image="n")]
    managers = {m["manager"] for m in api.get("resourceclaims", "c", NS)["metadata"]["managedFields"]}
    assert {DRIVER, OTHER, "kube-scheduler"} <= managers


def test_an_apply_naming_an_unallocated_device_is_refused_and_changes_nothing(api: ApiServer, http: Any) -> None:
    allocated(api)
    assert apply_status(http, DRIVER, [entry("fpga-1")]).status_code == 200
    answer = apply_status(http, DRIVER, [entry("fpga-1"), entry("fpga-9")])
    assert answer.status_code == 422
    assert answer.json()["details"]["causes"][0]["field"] == "status.devices[1]"
    assert statuses(api) == [entry("fpga-1")]


def test_admin_access_gets_a_taken_device_and_does_not_take_it(api: ApiServer) -> None:
    """``foreachAllocatedDevice`` skips admin results; ``allocateDevice`` lets an admin request use a taken
    device. Without the label the admin claim is not even created."""
    api.create("nodes", node())
    api.create("deviceclasses", driver_class())
    one = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s"},
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "fpga-0"}],
        },
    }
    api.create("resourceslices", one)
    api.create(
        "namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "monitoring", "labels": {LABEL: "true"}}},
    )
    scheduler = SchedulerStandIn(api.storage)

    def run(name: str, namespace: str, admin: bool) -> dict[str, Any]:
        exactly: dict[str, Any] = {"deviceClassName": "fpga", **({"adminAccess": True} if admin else {})}
        api.create(
            "resourceclaims",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name},
                "spec": {"devices": {"requests": [{"name": "r", "exactly": exactly}]}},
            },
            namespace,
        )
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "c"}], "resourceClaims": [{"name": name, "resourceClaimName": name}]},
        }
        api.create("pods", pod, namespace)
        (stored,) = scheduler.schedule(namespace, name, NODE)
        result: dict[str, Any] = stored["status"]["allocation"]["devices"]["results"][0]
        return result

    assert run("watch-first", "monitoring", admin=True) == {
        "request": "r",
        "driver": DRIVER,
        "pool": NODE,
        "device": "fpga-0",
        "adminAccess": True,
    }
    assert run("user", NS, admin=False)["device"] == "fpga-0", "an admin result does not take the device"
    assert run("watch-again", "monitoring", admin=True)["device"] == "fpga-0", "admin access over a taken device"
    with pytest.raises(SchedulingError):
        run("second-user", NS, admin=False)
    api.create("namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "plain"}})
    with pytest.raises(Exception, match="admin access to devices requires"):
        run("sneaky", "plain", admin=True)
