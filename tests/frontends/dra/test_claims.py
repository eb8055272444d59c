"""ClaimReader: a claim the kubelet names, read from the API server stand-in over real HTTP with lightkube, as
NodePrepareResources needs it (this driver's devices of this node's pool as device IDs, its opaque configs in order,
the pods it is reserved for), each claim that cannot be prepared a per-claim error, and presence for reconciling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from devplug.engine.devicetable import DeviceTable
from devplug.frontends.dra.claims import (
    AllocatedDevice,
    ClaimDeviceUnknownError,
    ClaimNotAllocatedError,
    ClaimNotFoundError,
    ClaimPoolMismatchError,
    ClaimPresence,
    ClaimReader,
    ClaimReadError,
    ClaimRef,
    ClaimReplacedError,
    NoDeviceOfOursError,
    OpaqueConfig,
)
from devplug.frontends.dra.devicenames import DeviceNameMap, device_name
from devplug.frontends.dra.slices import SlicePublisher
from devplug.kube.client import make_client
from devplug.testing.apiserver import ApiServer
from devplug.testing.scheduler import SchedulerStandIn
from devplug.types import Device

from .conftest import DRIVER, NODE, NS, eventually, node, run

OTHER = "gpu.example.com"
PCI = "0000:3b:00.1"
NAMES = DeviceNameMap(["fpga0", "fpga1", PCI])


def device_class(name: str, driver: str, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]}
    if parameters is not None:
        spec["config"] = [{"opaque": {"driver": driver, "parameters": parameters}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def claim_of(name: str, requests: dict[str, tuple[str, int]], config: list[Any] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {
        "requests": [{"name": r, "exactly": {"deviceClassName": c, "count": n}} for r, (c, n) in requests.items()]
    }
    if config:
        devices["config"] = list(config)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": devices},
    }


def slice_body(name: str, driver: str, devices: list[str], pool: str = NODE) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": NODE,
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": d} for d in devices],
        },
    }


def allocate(api: ApiServer, name: str, results: list[tuple[str, str, str, str]]) -> dict[str, Any]:
    """Write an allocation as the scheduler does (request, driver, pool, device per result)."""
    claim = api.get("resourceclaims", name, NS)
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [{"request": r, "driver": d, "pool": p, "device": x} for r, d, p, x in results],
            }
        }
    }
    return api.update("resourceclaims", claim, NS, manager="kube-scheduler", subresource="status")


def ref_of(stored: dict[str, Any]) -> ClaimRef:
    meta = stored["metadata"]
    return ClaimRef(meta["namespace"], meta["name"], meta["uid"])


def reading(api: ApiServer, kubeconfig: Path, body: Any, *, pool: str = NODE) -> Any:
    async def go() -> Any:
        client = make_client(kubeconfig, field_manager="devplug-test")
        try:
            return await body(ClaimReader(client, driver=DRIVER, pool=pool, device_id=NAMES.device_id))
        finally:
            await client.close()

    return run(go)


def test_a_claim_the_scheduler_allocated_from_the_published_slices_reads_as_device_ids_and_configs(
    api: ApiServer, kubeconfig: Path
) -> None:
    """The whole path: the publisher's slices, the scheduler's allocation, the reader's answer."""
    api.create("nodes", node())
    api.create("resourceslices", slice_body("node-a-gpu", OTHER, ["gpu0"]))
    api.create("deviceclasses", device_class("fpga", DRIVER, {"mode": "class"}))
    api.create("deviceclasses", device_class("gpu", OTHER, {"mode": "other driver's"}))
    claim_config = [
        {"opaque": {"driver": DRIVER, "parameters": {"bitstream": "all.gbs"}}},
        {"requests": ["b"], "opaque": {"driver": DRIVER, "parameters": {"bitstream": "b.gbs"}}},
        {"requests": ["g"], "opaque": {"driver": OTHER, "parameters": {"x": 1}}},
    ]
    api.create("resourceclaims", claim_of("c", {"a": ("fpga", 1), "b": ("fpga", 1), "g": ("gpu", 1)}, claim_config), NS)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "x"}], "resourceClaims": [{"name": "c", "resourceClaimName": "c"}]},
    }
    pod_uid = api.create("pods", pod, NS)["metadata"]["uid"]
    table = DeviceTable()
    table.replace([Device(PCI), Device("fpga1")])

    async def go() -> Any:
        client = make_client(kubeconfig, field_manager=f"devplug-{DRIVER}")
        publisher = SlicePublisher(driver=DRIVER, node=NODE, table=table, client=client, debounce=0.01)
        publisher.start()
        try:
            await eventually(lambda: publisher.state.in_sync, "the slices published")
            (claim,) = SchedulerStandIn(api.storage).schedule(NS, "p", NODE)
            reader = ClaimReader(client, driver=DRIVER, pool=NODE, device_id=publisher.device_id)
            return await reader.read(ref_of(claim))
        finally:
            await publisher.shutdown(last_instance=False)
            await client.close()

    allocation = run(go)
    assert allocation.devices == (
        AllocatedDevice("a", device_name(PCI), PCI),
        AllocatedDevice("b", "fpga1", "fpga1"),
    )
    assert allocation.device_ids == (PCI, "fpga1")
    assert allocation.configs == (
        OpaqueConfig("FromClass", ("a",), {"mode": "class"}),  # one per request: the scheduler stand-in's way
        OpaqueConfig("FromClass", ("b",), {"mode": "class"}),
        OpaqueConfig("FromClaim", (), {"bitstream": "all.gbs"}),
        OpaqueConfig("FromClaim", ("b",), {"bitstream": "b.gbs"}),
    )
    assert [c.parameters for c in allocation.configs_for("a")] == [{"mode": "class"}, {"bitstream": "all.gbs"}]
    assert [c.parameters for c in allocation.configs_for("b")] == [
        {"mode": "class"},
        {"bitstream": "all.gbs"},
        {"bitstream": "b.gbs"},
    ]
    assert allocation.reserved_for == (pod_uid,)


def test_share_id_consumed_capacity_and_admin_access_are_kept(api: ApiServer, kubeconfig: Path) -> None:
    # the API server takes an admin-access allocation only in a namespace labelled for it (KEP-5018), and a shareID
    # only as a UUID (validation.go); the reader's part is to keep both
    labels = {"resource.kubernetes.io/admin-access": "true"}
    api.create("namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "labels": labels}})
    share = "1b4e28ba-2fa1-41d2-883f-0016d3cca427"
    stored = api.create("resourceclaims", claim_of("c", {"a": ("fpga", 2)}), NS)
    claim = api.get("resourceclaims", "c", NS)
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "a", "driver": DRIVER, "pool": NODE, "device": "fpga0", "adminAccess": True},
                    {
                        "request": "a",
                        "driver": DRIVER,
                        "pool": NODE,
                        "device": "fpga1",
                        "shareID": share,
                        "consumedCapacity": {"shares": "2"},
                    },
                ]
            }
        }
    }
    api.update("resourceclaims", claim, NS, manager="kube-scheduler", subresource="status")
    allocation = reading(api, kubeconfig, lambda reader: reader.read(ref_of(stored)))
    assert allocation.devices == (
        AllocatedDevice("a", "fpga0", "fpga0", None, True),
        AllocatedDevice("a", "fpga1", "fpga1", share, False, (("shares", "2"),)),
    )
    assert allocation.configs == () and allocation.reserved_for == ()


def failure(api: ApiServer, kubeconfig: Path, ref: ClaimRef, pool: str = NODE) -> Exception:
    async def body(reader: ClaimReader) -> Exception:
        try:
            await reader.read(ref)
        except Exception as exc:
            return exc
        raise AssertionError(f"{ref} was read")

    error: Exception = reading(api, kubeconfig, body, pool=pool)
    return error


def test_each_claim_that_cannot_be_prepared_is_a_per_claim_error_naming_it(api: ApiServer, kubeconfig: Path) -> None:
    missing = ClaimRef(NS, "nope", "0e4f0d7c-0000-4000-8000-000000000000")
    error = failure(api, kubeconfig, missing)
    assert isinstance(error, ClaimNotFoundError) and error.claim == missing
    assert str(error) == f"resource claim {NS}/nope (uid {missing.uid}): not found in the API server (deleted?)"

    stored = api.create("resourceclaims", claim_of("c", {"a": ("fpga", 1)}), NS)
    ref = ref_of(stored)
    replaced = ClaimRef(NS, "c", "0e4f0d7c-1111-4000-8000-000000000000")
    error = failure(api, kubeconfig, replaced)
    assert isinstance(error, ClaimReplacedError)
    assert f"the API server's claim of that name has uid {ref.uid}" in str(error)

    error = failure(api, kubeconfig, ref)
    assert isinstance(error, ClaimNotAllocatedError) and "not allocated" in str(error)

    allocate(api, "c", [("a", OTHER, NODE, "gpu0")])
    error = failure(api, kubeconfig, ref)
    assert isinstance(error, NoDeviceOfOursError)
    assert f"no device of driver {DRIVER} in pool {NODE}" in str(error) and f"{OTHER}/{NODE}" in str(error)

    other_pool = api.create("resourceclaims", claim_of("d", {"a": ("fpga", 1)}), NS)
    allocate(api, "d", [("a", DRIVER, "node-b", "fpga0")])
    error = failure(api, kubeconfig, ref_of(other_pool))
    assert isinstance(error, NoDeviceOfOursError) and f"{DRIVER}/node-b" in str(error)

    both = api.create("resourceclaims", claim_of("e", {"a": ("fpga", 2)}), NS)
    allocate(api, "e", [("a", DRIVER, NODE, "fpga0"), ("a", DRIVER, "node-b", "fpga1")])
    error = failure(api, kubeconfig, ref_of(both))
    assert isinstance(error, ClaimPoolMismatchError) and "fpga1 of pool node-b" in str(error)

    unknown = api.create("resourceclaims", claim_of("f", {"a": ("fpga", 1)}), NS)
    allocate(api, "f", [("a", DRIVER, NODE, "fpga9")])
    error = failure(api, kubeconfig, ref_of(unknown))
    assert isinstance(error, ClaimDeviceUnknownError)
    assert f"request 'a' was given device 'fpga9' of pool {NODE}, which this node does not publish" in str(error)


def test_an_api_server_failure_is_a_read_error_not_a_claim_error(api: ApiServer, kubeconfig: Path) -> None:
    stored = api.create("resourceclaims", claim_of("c", {"a": ("fpga", 1)}), NS)
    api.faults.fail(503, verb="get", resource="resourceclaims")
    error = failure(api, kubeconfig, ref_of(stored))
    assert isinstance(error, ClaimReadError) and "the API server failed to give it: 503 ServiceUnavailable" in str(
        error
    )
    api.close()  # nothing listens any more
    error = failure(api, kubeconfig, ref_of(stored))
    assert isinstance(error, ClaimReadError) and "the API server did not answer" in str(error)


def test_presence_tells_present_deleted_replaced_and_deallocated_claims_apart(api: ApiServer, kubeconfig: Path) -> None:
    present = ref_of(api.create("resourceclaims", claim_of("present", {"a": ("fpga", 1)}), NS))
    allocate(api, "present", [("a", DRIVER, NODE, "fpga0")])
    deallocated = ref_of(api.create("resourceclaims", claim_of("deallocated", {"a": ("fpga", 1)}), NS))
    replaced = ClaimRef(NS, "present", "0e4f0d7c-2222-4000-8000-000000000000")
    deleted = ClaimRef("other", "gone", "0e4f0d7c-3333-4000-8000-000000000000")
    answer = reading(api, kubeconfig, lambda reader: reader.presence([present, deallocated, replaced, deleted]))
    assert answer == {
        present: ClaimPresence.PRESENT,
        deallocated: ClaimPresence.DEALLOCATED,
        replaced: ClaimPresence.REPLACED,
        deleted: ClaimPresence.DELETED,
    }
    assert [p for p in ClaimPresence if p.gone] == [
        ClaimPresence.DELETED,
        ClaimPresence.REPLACED,
        ClaimPresence.DEALLOCATED,
    ]
    assert api.count(verb="list", resource="resourceclaims") == 0  # a get per claim, never a list of the cluster's

    api.faults.fail(500, verb="get", resource="resourceclaims")

    async def failed(reader: ClaimReader) -> Exception:
        try:
            await reader.presence([present, deleted])
        except ClaimReadError as exc:
            return exc
        raise AssertionError("presence concluded without the API server")

    assert "500 InternalError" in str(reading(api, kubeconfig, failed))
