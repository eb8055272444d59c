"""Issue 41, KEP-5018 on the node: admin-access claims prepared on a real daemon through its DRA socket as the kubelet
calls them: without exclusivity (a device another claim holds), without any driver hook, the device's own description
in the claim's CDI spec, only in a namespace labelled ``resource.kubernetes.io/admin-access: "true"``; kept across a
kill -9, forgotten by the reconciliation once the claim is gone.

The claims are allocated as kube-scheduler's allocator allocates an admin-access request (the device whether or not
another claim holds it, the result with ``adminAccess: true``: ``allocateDevice`` in
``k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go``), written through the
stand-in's status subresource; the namespace is a core/v1 Namespace of the stand-in, labelled as a cluster admin does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import grpc
import grpc.aio

from devplug.api.gen.dra.v1 import api_pb2 as v1
from devplug.api.gen.dra.v1 import api_pb2_grpc as v1_grpc
from devplug.cli.statusview import format_status
from devplug.daemon.status import read_status
from devplug.frontends.dra.adminaccess import ADMIN_NAMESPACE_LABEL
from devplug.testing.apiserver import ApiServer
from tests.frontends.dra.conftest import NODE, run
from tests.frontends.dra.dranode import DRIVER, NS, DraNode, allocated_by_hand, dra_node, eventually
from tests.frontends.dra.test_kep41_prepare_shares import restarted

ADMIN_HOOKS = ("allocate", "pre_start", "post_stop", "deallocate")


def _claim(name: str, claim: Mapping[str, Any]) -> Any:
    return v1.Claim(namespace=NS, name=name, uid=str(claim["metadata"]["uid"]))


def _uid(claim: Mapping[str, Any]) -> str:
    return str(claim["metadata"]["uid"])


def label_namespace(api: ApiServer, labels: Mapping[str, str]) -> None:
    """The test namespace with exactly ``labels`` (made when missing)."""
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "labels": dict(labels)}}
    try:
        found = api.get("namespaces", NS)
    except Exception:
        found = None
    if found is None:
        api.create("namespaces", body)
    else:
        found["metadata"]["labels"] = dict(labels)
        api.update("namespaces", found, "", "kubectl")


def allocate(lab: DraNode, name: str, devices: list[tuple[str, str, bool]]) -> dict[str, Any]:
    """A claim of one request per ``(request, device, admin)``, allocated those devices (admin access where asked)."""
    requests = []
    for request, _, admin in devices:
        exactly: dict[str, Any] = {"deviceClassName": lab.device_class, "count": 1}
        if admin:
            exactly["adminAccess"] = True
        requests.append({"name": request, "exactly": exactly})
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": requests}},
    }
    claim = lab.api.create("resourceclaims", body, NS)
    results = []
    for request, device, admin in devices:
        result: dict[str, Any] = {"request": request, "driver": DRIVER, "pool": NODE, "device": device}
        if admin:
            result["adminAccess"] = True
        results.append(result)
    stored = allocated_by_hand(lab, claim, results)
    assert [bool(r.get("adminAccess")) for r in stored["status"]["allocation"]["devices"]["results"]] == [
        admin for _, _, admin in devices
    ], "the stand-in kept adminAccess (DRAAdminAccess on)"
    return dict(stored)


def hooks(lab: DraNode) -> list[tuple[str, list[str]]]:
    return [(c["hook"], c["device_ids"]) for c in lab.calls() if c["hook"] in ADMIN_HOOKS]


def admin_file(lab: DraNode) -> dict[str, Any]:
    path = lab.state_dir / "dra-admin-claims.json"
    return dict(json.loads(path.read_text())["claims"]) if path.exists() else {}


def edits(spec: Mapping[str, Any], name: str) -> dict[str, Any]:
    [device] = [d for d in spec["devices"] if d["name"] == name]
    return dict(device["containerEdits"])


def test_a_monitoring_claim_over_a_held_device_is_prepared_with_no_hook_and_the_other_claim_untouched(
    api: ApiServer,
) -> None:
    async def scenario() -> None:
        async with dra_node(api) as lab:
            await lab.published(3)
            label_namespace(api, {ADMIN_NAMESPACE_LABEL: "true"})
            work = allocate(lab, "work", [("dev", "mock0", False)])
            watch = allocate(lab, "watch", [("monitor", "mock0", True)])
            async with grpc.aio.insecure_channel(lab.service_target()) as channel:
                stub = v1_grpc.DRAPluginStub(channel)
                first = await stub.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=[_claim("work", work)]))
                assert first.claims[_uid(work)].error == ""
                before = hooks(lab)
                records = lab.records()
                answer = await stub.NodePrepareResources(
                    v1.NodePrepareResourcesRequest(claims=[_claim("watch", watch)])
                )
                entry = answer.claims[_uid(watch)]
                assert entry.error == "", entry.error
                [dev] = entry.devices
                assert (dev.device_name, list(dev.request_names)) == ("mock0", ["monitor"])
                assert list(dev.cdi_device_ids) == [f"{DRIVER}/claim={_uid(watch)}-monitor"]
                spec = edits(lab.spec_of(_uid(watch)), f"{_uid(watch)}-monitor")
                assert [d["path"] for d in spec["deviceNodes"]] == ["/dev/mock/mock0"], spec
                assert not any("MOCK_DEVICES" in e for e in spec.get("env", ())), "no allocate answer in it"
                assert hooks(lab) == before, "no driver hook ran for the admin-access claim"
                assert lab.records() == records, "no ledger record: the work claim holds mock0 as before"
                assert admin_file(lab) == {_uid(watch): {"claim": f"{NS}/watch", "devices": ["mock0"]}}

                def shown() -> Any:
                    [entry] = read_status(lab.root / "state")["resources"]
                    return entry.get("frontend", {}).get("claims", {}).get("admin_access") or None

                listed = await eventually(shown, "the admin-access claim in devplug status", details=lab.log)
                assert listed == [{"claim": f"{NS}/watch", "uid": _uid(watch), "devices": ["mock0"]}]
                shown_text = format_status(read_status(lab.root / "state"))
                assert f"{NS}/watch (uid {_uid(watch)}): admin access to mock0" in shown_text, shown_text
                again = await stub.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=[_claim("watch", watch)]))
                assert again == answer, "a repeated prepare answers the same"

                done = await stub.NodeUnprepareResources(
                    v1.NodeUnprepareResourcesRequest(claims=[_claim("watch", watch)])
                )
                assert done.claims[_uid(watch)].error == ""
                assert not (lab.root / "cdi" / f"dra-{DRIVER}-{_uid(watch)}.json").exists()
                assert admin_file(lab) == {}
                assert hooks(lab) == before and lab.records() == records, "its unprepare called no hook either"
                assert (lab.root / "cdi" / f"dra-{DRIVER}-{_uid(work)}.json").exists(), "the work claim's spec stays"

    run(scenario, 120)


def test_admin_access_in_a_namespace_without_the_label_is_refused_naming_the_namespace_and_the_label(
    api: ApiServer,
) -> None:
    async def scenario() -> None:
        async with dra_node(api) as lab:
            await lab.published(3)
            label_namespace(api, {ADMIN_NAMESPACE_LABEL: "true"})  # as when the claim was made and allocated
            watch = allocate(lab, "watch", [("monitor", "mock1", True)])
            label_namespace(api, {})  # a cluster admin took it back since
            async with grpc.aio.insecure_channel(lab.service_target()) as channel:
                stub = v1_grpc.DRAPluginStub(channel)
                answer = await stub.NodePrepareResources(
                    v1.NodePrepareResourcesRequest(claims=[_claim("watch", watch)])
                )
            error = answer.claims[_uid(watch)].error
            assert f"namespace {NS}" in error and ADMIN_NAMESPACE_LABEL in error and "default/watch" in error, error
            assert not answer.claims[_uid(watch)].devices
            assert admin_file(lab) == {} and hooks(lab) == []
            assert not (lab.root / "cdi" / f"dra-{DRIVER}-{_uid(watch)}.json").exists()

    run(scenario, 120)


def test_a_claim_with_a_normal_and_an_admin_part_survives_a_kill_and_is_forgotten_once_deleted(
    api: ApiServer,
) -> None:
    async def scenario() -> None:
        async with dra_node(api) as lab:
            await lab.published(3)
            label_namespace(api, {ADMIN_NAMESPACE_LABEL: "true"})
            both = allocate(lab, "both", [("dev", "mock2", False), ("monitor", "mock0", True)])
            alone = allocate(lab, "alone", [("monitor", "mock1", True)])
            prepare = v1.NodePrepareResourcesRequest(claims=[_claim("both", both), _claim("alone", alone)])
            async with grpc.aio.insecure_channel(lab.service_target()) as channel:
                first = await v1_grpc.DRAPluginStub(channel).NodePrepareResources(prepare)
            assert {k: v.error for k, v in first.claims.items()} == {_uid(both): "", _uid(alone): ""}
            assert [c["device_ids"] for c in lab.calls("allocate")] == [["mock2"]], "the normal part alone"
            assert [r["devices"] for r in lab.records()] == [["mock2"]]
            assert set(admin_file(lab)) == {_uid(both), _uid(alone)}
            spec = lab.root / "cdi" / f"dra-{DRIVER}-{_uid(alone)}.json"
            assert spec.exists()
            # "alone" is deleted while the daemon is down: the kubelet will not unprepare it, the reconciliation does
            target = await restarted(lab, lambda: api.delete("resourceclaims", "alone", NS))
            async with grpc.aio.insecure_channel(target) as channel:
                stub = v1_grpc.DRAPluginStub(channel)
                again = await stub.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=[_claim("both", both)]))
                assert again.claims[_uid(both)] == first.claims[_uid(both)], "prepared again after a kill: the same"
                assert len(lab.calls("allocate")) == 1
                await eventually(lambda: set(admin_file(lab)) == {_uid(both)} and not spec.exists(), "alone forgotten")
                done = await stub.NodeUnprepareResources(
                    v1.NodeUnprepareResourcesRequest(claims=[_claim("both", both)])
                )
                assert done.claims[_uid(both)].error == ""
            assert [c["device_ids"] for c in lab.calls("deallocate")] == [["mock2"]], "only the normal part's"
            assert admin_file(lab) == {} and lab.records() == []
            assert not (lab.root / "cdi" / f"dra-{DRIVER}-{_uid(both)}.json").exists()

    run(scenario, 150)


def test_a_daemon_not_allowed_to_read_the_namespace_says_so_and_the_kubelets_retry_prepares_the_claim(
    api: ApiServer,
) -> None:
    """A ClusterRole without ``get`` on namespaces (an RBAC 403): the claim's error names the missing permission and
    nothing is prepared; it is an API error, not a refusal, so the kubelet's next call prepares it."""

    async def scenario() -> None:
        async with dra_node(api) as lab:
            await lab.published(3)
            label_namespace(api, {ADMIN_NAMESPACE_LABEL: "true"})
            watch = allocate(lab, "watch", [("monitor", "mock1", True)])
            request = v1.NodePrepareResourcesRequest(claims=[_claim("watch", watch)])
            api.faults.fail(403, verb="get", resource="namespaces")
            async with grpc.aio.insecure_channel(lab.service_target()) as channel:
                stub = v1_grpc.DRAPluginStub(channel)
                denied = await stub.NodePrepareResources(request)
                error = denied.claims[_uid(watch)].error
                assert "403" in error and "get on namespaces" in error and "default/watch" in error, error
                assert admin_file(lab) == {}
                again = await stub.NodePrepareResources(request)
            assert again.claims[_uid(watch)].error == ""
            assert admin_file(lab) == {_uid(watch): {"claim": f"{NS}/watch", "devices": ["mock1"]}}

    run(scenario, 120)
