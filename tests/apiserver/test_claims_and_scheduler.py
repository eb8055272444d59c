"""ResourceClaims (the status subresource, immutability) and the scheduler stand-in's allocations, read back
through lightkube as a DRA driver reads them; KEP-5004's claim made for an extended resource."""

from __future__ import annotations

from typing import Any

import pytest
from lightkube import ApiError
from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimStatus

from devplug.testing.apiserver import ApiServer
from devplug.testing.conformance import poll_until
from devplug.testing.scheduler import EXTENDED_CLAIM_ANNOTATION, FINALIZER, SchedulerStandIn, SchedulingError

from .conftest import DRIVER, NODE, node, slice_of, status_of

NS = "default"


def _claim(name: str, count: int = 1, cls: str = "fpga", config: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "devices": {"requests": [{"name": "fpga", "exactly": {"deviceClassName": cls, "count": count}}]}
    }
    if config:
        spec["devices"]["config"] = [
            {"requests": ["fpga"], "opaque": {"driver": DRIVER, "parameters": {"bitstream": "claim.gbs"}}}
        ]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name}, "spec": spec}


def _class(name: str = "fpga", selector: str = f'device.driver == "{DRIVER}"', **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": selector}}], **spec},
    }


def _pod(name: str, claims: list[str] = (), resources: dict[str, str] | None = None) -> dict[str, Any]:  # type: ignore[assignment]
    container: dict[str, Any] = {"name": "app"}
    if resources:
        container["resources"] = {"requests": resources, "limits": resources}
    spec: dict[str, Any] = {"containers": [container]}
    if claims:
        spec["resourceClaims"] = [{"name": c, "resourceClaimName": c} for c in claims]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


@pytest.fixture
def cluster(api: ApiServer) -> ApiServer:
    """A node publishing three FPGAs, a class selecting its driver with an opaque config."""
    owner = api.create("nodes", node())
    api.apply("resourceslices", slice_of("node-a-fpga", owner, ["fpga-0", "fpga-1", "fpga-2"]), DRIVER)
    config = [{"opaque": {"driver": DRIVER, "parameters": {"mode": "exclusive"}}}]
    api.create("deviceclasses", _class(config=config))
    return api


def test_the_claim_status_is_its_own_subresource(api: ApiServer, client: Any) -> None:
    sent = _claim("c")
    sent["status"] = {"reservedFor": [{"resource": "pods", "name": "p", "uid": "1"}]}
    created = client.create(ResourceClaim.from_dict(sent))
    assert created.status is None or not created.status.reservedFor, "a create clears the status"
    allocation = {"devices": {"results": [{"request": "fpga", "driver": DRIVER, "pool": NODE, "device": "fpga-0"}]}}
    updated = client.replace(ResourceClaimStatus.from_dict({**created.to_dict(), "status": {"allocation": allocation}}))
    assert updated.status.allocation.devices.results[0].device == "fpga-0"
    main = client.get(ResourceClaim, "c")
    main.status.allocation = None
    main.metadata.labels = {"seen": "yes"}
    kept = client.replace(main)
    assert kept.status.allocation is not None and kept.metadata.labels == {"seen": "yes"}, (
        "the main resource keeps the status"
    )
    changed = client.get(ResourceClaim, "c")
    changed.spec.devices.requests[0].exactly.count = 2
    with pytest.raises(ApiError) as immutable:
        client.replace(changed)
    assert (immutable.value.status.code, status_of(immutable)["details"]["causes"][0]["field"]) == (422, "spec")
    other = client.create(ResourceClaim.from_dict(_claim("d")))
    with pytest.raises(ApiError) as forbidden:
        client.replace(
            ResourceClaimStatus.from_dict(
                {**other.to_dict(), "status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "1"}]}}
            )
        )
    assert (
        "status.reservedFor: Forbidden: may not be specified when `allocated` is not set"
        in status_of(forbidden)["message"]
    )
    again = client.get(ResourceClaim, "c").to_dict()
    again["status"]["allocation"]["devices"]["results"][0]["device"] = "fpga-1"
    with pytest.raises(ApiError) as fixed:
        client.replace(ResourceClaimStatus.from_dict(again))
    assert (
        "status.allocation: Invalid value" in status_of(fixed)["message"]
        and "field is immutable" in status_of(fixed)["message"]
    )


def test_the_scheduler_allocates_from_the_nodes_slices_and_the_driver_reads_it(cluster: ApiServer, client: Any) -> None:
    api, scheduler = cluster, SchedulerStandIn(cluster.storage)
    api.create("resourceclaims", _claim("two", 2, config=True), NS)
    api.create("pods", _pod("p", ["two"]), NS)
    scheduler.schedule(NS, "p", NODE)
    claim = client.get(ResourceClaim, "two", namespace=NS)  # what a DRA driver reads at NodePrepareResources
    results = [(r.request, r.driver, r.pool, r.device) for r in claim.status.allocation.devices.results]
    assert results == [("fpga", DRIVER, NODE, "fpga-0"), ("fpga", DRIVER, NODE, "fpga-1")]
    configs = [(c.source, c.requests, c.opaque.parameters) for c in claim.status.allocation.devices.config]
    assert configs == [
        ("FromClass", ["fpga"], {"mode": "exclusive"}),
        ("FromClaim", ["fpga"], {"bitstream": "claim.gbs"}),
    ]
    pod = api.get("pods", "p", NS)
    assert [(r.resource, r.name, r.uid) for r in claim.status.reservedFor] == [("pods", "p", pod["metadata"]["uid"])]
    assert claim.metadata.finalizers == [FINALIZER] and pod["spec"]["nodeName"] == NODE
    terms = claim.status.allocation.nodeSelector.nodeSelectorTerms
    assert [(f.key, f.operator, f.values) for f in terms[0].matchFields] == [("metadata.name", "In", [NODE])]
    api.create("resourceclaims", _claim("one"), NS)
    api.create("pods", _pod("q", ["one"]), NS)
    assert [
        r["device"] for r in scheduler.schedule(NS, "q", NODE)[0]["status"]["allocation"]["devices"]["results"]
    ] == ["fpga-2"]
    api.create("resourceclaims", _claim("none"), NS)
    api.create("pods", _pod("r", ["none"]), NS)
    with pytest.raises(SchedulingError, match=r"wants 1 device.* node node-a has 0 free"):
        scheduler.schedule(NS, "r", NODE)
    api.create("deviceclasses", _class("odd", "device.capacity['x'].memory > 1"))
    api.create("resourceclaims", _claim("odd", cls="odd"), NS)
    api.create("pods", _pod("s", ["odd"]), NS)
    with pytest.raises(SchedulingError, match="does not model the CEL selector"):
        scheduler.schedule(NS, "s", NODE)


def test_an_extended_resource_gets_a_claim_made_for_the_pod_kep_5004(cluster: ApiServer) -> None:
    api, scheduler = cluster, SchedulerStandIn(cluster.storage)
    api.create("deviceclasses", _class("fpga-ext", extendedResourceName="example.com/fpga"))
    api.create("pods", _pod("legacy", resources={"cpu": "1", "example.com/fpga": "2"}), NS)
    (claim,) = scheduler.schedule(NS, "legacy", NODE)
    pod = api.get("pods", "legacy", NS)
    meta = claim["metadata"]
    assert meta["name"].startswith("legacy-extended-resources-") and meta["annotations"] == {
        EXTENDED_CLAIM_ANNOTATION: "true"
    }
    assert meta["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "legacy", "uid": pod["metadata"]["uid"], "controller": True}
    ]
    assert claim["spec"]["devices"]["requests"] == [
        {
            "name": "container-0-request-1",
            "exactly": {"deviceClassName": "fpga-ext", "allocationMode": "ExactCount", "count": 2},
        }
    ]
    assert [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]] == ["fpga-0", "fpga-1"]
    assert pod["status"]["extendedResourceClaimStatus"] == {
        "requestMappings": [
            {"containerName": "app", "resourceName": "example.com/fpga", "requestName": "container-0-request-1"}
        ],
        "resourceClaimName": meta["name"],
    }
    api.delete("pods", "legacy", NS, gracePeriodSeconds=0)
    poll_until(
        lambda: api.get("resourceclaims", meta["name"], NS)["metadata"].get("deletionTimestamp"),
        "the GC deleting the claim",
    )
    scheduler.deallocate(NS, meta["name"])  # the resourceclaim controller: the finalizer goes, so does the claim
    assert api.objects("resourceclaims", NS) == []
    device_plugin = api.get("nodes", NODE)
    device_plugin["status"] = {"allocatable": {"example.com/fpga": "4"}}
    api.update("nodes", device_plugin, subresource="status")
    api.create("pods", _pod("dp", resources={"example.com/fpga": "1"}), NS)
    assert scheduler.schedule(NS, "dp", NODE) == [], "the node's device plugin offers the resource: no claim"
