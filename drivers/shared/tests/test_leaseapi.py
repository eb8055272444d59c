"""The Lease API model behaves as the API server does for what the kubernetes backend relies on."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import devplug_shared
from devplug.testing.leaseapi import LeaseApiServer, match_labels

NS = "/apis/coordination.k8s.io/v1/namespaces/lm/leases"


def _call(api: LeaseApiServer, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(api.url + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _rbac_verbs(kind: str = "Role", resource: str = "leases") -> set[str]:
    import yaml  # type: ignore[import-untyped]

    text = (Path(devplug_shared.__file__).parent / "rbac.yaml").read_text()
    (role,) = [doc for doc in yaml.safe_load_all(text) if doc["kind"] == kind]
    return {verb for rule in role["rules"] if resource in rule["resources"] for verb in rule["verbs"]}


def _lease(name: str, holder: str = "n1", **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, **meta},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 10},
    }


@pytest.fixture
def api() -> Any:
    with LeaseApiServer() as server:
        yield server


def test_create_get_and_already_exists(api: LeaseApiServer) -> None:
    code, created = _call(api, "POST", NS, _lease("a", labels={"app": "x"}))
    assert code == 201 and created["metadata"]["resourceVersion"] and created["metadata"]["uid"]
    code, status = _call(api, "POST", NS, _lease("a"))
    assert (code, status["reason"], status["kind"]) == (409, "AlreadyExists", "Status")
    assert status["message"] == 'leases.coordination.k8s.io "a" already exists'
    code, got = _call(api, "GET", NS + "/a")
    assert code == 200 and got["spec"]["holderIdentity"] == "n1"
    code, status = _call(api, "GET", NS + "/missing")
    assert (code, status["reason"]) == (404, "NotFound")


def test_update_is_optimistic_on_resource_version(api: LeaseApiServer) -> None:
    _, created = _call(api, "POST", NS, _lease("a"))
    first = created["metadata"]["resourceVersion"]
    code, updated = _call(api, "PUT", NS + "/a", _lease("a", "n2", resourceVersion=first))
    assert code == 200 and int(updated["metadata"]["resourceVersion"]) > int(first)
    code, status = _call(api, "PUT", NS + "/a", _lease("a", "n3", resourceVersion=first))  # stale
    assert (code, status["reason"]) == (409, "Conflict")
    assert "the object has been modified; please apply your changes to the latest version" in status["message"]
    assert _call(api, "GET", NS + "/a")[1]["spec"]["holderIdentity"] == "n2"
    code, _ = _call(api, "PUT", NS + "/a", _lease("a", "n4"))  # no resourceVersion: unconditional for Leases
    assert code == 200
    assert _call(api, "PUT", NS + "/missing", _lease("missing"))[0] == 404  # no create on update
    assert _call(api, "PUT", NS + "/a", _lease("b"))[0] == 400  # body names another object


def test_delete_with_preconditions_and_validation(api: LeaseApiServer) -> None:
    _, created = _call(api, "POST", NS, _lease("a"))
    code, status = _call(api, "DELETE", NS + "/a", {"preconditions": {"resourceVersion": "1"}})
    assert (code, status["reason"]) == (409, "Conflict") and "Precondition failed" in status["message"]
    code, status = _call(api, "DELETE", NS + "/a", {"preconditions": created["metadata"]})
    assert (code, status["status"]) == (200, "Success")
    assert _call(api, "DELETE", NS + "/a")[0] == 404
    bad = _lease("b")
    bad["spec"]["leaseDurationSeconds"] = 0
    code, status = _call(api, "POST", NS, bad)
    assert (code, status["reason"]) == (422, "Invalid") and "spec.leaseDurationSeconds" in status["message"]
    assert _call(api, "POST", NS, _lease("Not_A_Name"))[0] == 422


def test_list_by_label_selector(api: LeaseApiServer) -> None:
    _call(api, "POST", NS, _lease("a", labels={"r": "x"}))
    _call(api, "POST", NS, _lease("b", labels={"r": "y"}))
    code, listed = _call(api, "GET", NS + "?labelSelector=r%3Dx")
    assert code == 200 and listed["kind"] == "LeaseList" and [i["metadata"]["name"] for i in listed["items"]] == ["a"]
    assert match_labels({"a": "1"}, "a=1,b!=2,!c") and not match_labels({"a": "1"}, "a==2")


def test_the_backend_loses_a_race_with_409_and_names_the_winner(api: LeaseApiServer, tmp_path: Any) -> None:
    from devplug_shared.backends import build_backend, parse_coordination
    from devplug_shared.slots import SlotTakenError

    kind, options = parse_coordination({"backend": "kubernetes", "server": api.url, "namespace": "race"}, "c")
    a = build_backend(kind, options, node="node-a", resource="example.com/x", state_dir=tmp_path)
    b = build_backend(kind, options, node="node-b", resource="example.com/x", state_dir=tmp_path)
    a.claim(["dev-0"])
    b.claim(["dev-9"])
    # dev-0 is a's already, dev-2 is taken first, then dev-9 is node-b's: dev-2 is given back, dev-0 kept.
    with pytest.raises(SlotTakenError, match=r"slot dev-9 of example\.com/x is held by node node-b"):
        a.claim(["dev-0", "dev-2", "dev-9"])
    assert {s: c.holder for s, c in a.holders().items()} == {"dev-0": "node-a", "dev-9": "node-b"}
    methods = {(m, code) for m, ns, _, code in api.store.requests if ns == "race"}
    assert ("POST", 201) in methods and ("PUT", 200) in methods
    a.release(["dev-0"])
    verbs = {
        {"POST": "create", "PUT": "update", "DELETE": "delete"}.get(m, "get" if name else "list")
        for m, ns, name, _ in api.store.requests
        if ns == "race"
    }
    assert verbs <= _rbac_verbs(), "the backend needs only what rbac.yaml grants"
    a.close()
    b.close()


# --- pods and node Leases (issue 24 item 6): what the kubernetes backend reads to tell a live node


PODS = "/api/v1/namespaces/p1/pods"


def _pod(name: str, node: str = "n1", resource: str = "example.com/x", **status: Any) -> dict[str, Any]:
    container = {"name": "app", "resources": {"limits": {resource: "1"}}}
    return {"metadata": {"name": name}, "spec": {"nodeName": node, "containers": [container]}, "status": status}


def test_a_created_pod_is_pending_whatever_status_was_sent(api: LeaseApiServer) -> None:
    code, created = _call(api, "POST", PODS, _pod("a", phase="Running"))
    assert code == 201 and created["status"] == {"phase": "Pending"} and created["metadata"]["uid"]
    assert _call(api, "POST", PODS, _pod("a"))[1]["reason"] == "AlreadyExists"
    code, status = _call(api, "POST", PODS, {"metadata": {"name": "b"}, "spec": {"containers": []}})
    assert (code, status["reason"]) == (422, "Invalid") and "spec.containers: Required value" in status["message"]
    code, updated = _call(api, "PUT", PODS + "/a/status", {**created, "status": {"phase": "Running"}})
    assert code == 200 and updated["status"]["phase"] == "Running"
    stale = {**created, "status": {"phase": "Failed"}}
    assert _call(api, "PUT", PODS + "/a/status", stale)[1]["reason"] == "Conflict"


def test_pods_are_listed_across_namespaces_by_field_selector(api: LeaseApiServer) -> None:
    _call(api, "POST", PODS, _pod("a", "n1"))
    _call(api, "POST", "/api/v1/namespaces/p2/pods", _pod("b", "n2"))
    _call(api, "POST", "/api/v1/namespaces/p2/pods", _pod("c", "n1"))
    code, listed = _call(api, "GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1")
    assert code == 200 and listed["kind"] == "PodList"
    assert sorted((i["metadata"]["namespace"], i["metadata"]["name"]) for i in listed["items"]) == [
        ("p1", "a"),
        ("p2", "c"),
    ]
    code, listed = _call(api, "GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1,status.phase!%3DPending")
    assert listed["items"] == []
    code, status = _call(api, "GET", "/api/v1/pods?fieldSelector=spec.containers%3Dx")
    assert (code, status["reason"]) == (400, "BadRequest")
    assert status["message"] == "field label not supported: spec.containers"


def test_deleting_a_running_bound_pod_is_graceful_until_the_kubelet_deletes_it_with_grace_0(
    api: LeaseApiServer,
) -> None:
    _call(api, "POST", PODS, _pod("a"))
    api.pods.set_phase("p1", "a", "Running")
    code, marked = _call(api, "DELETE", PODS + "/a")
    assert code == 200 and marked["metadata"]["deletionTimestamp"]
    assert marked["metadata"]["deletionGracePeriodSeconds"] == 30
    assert _call(api, "GET", PODS + "/a")[0] == 200, "still there: its containers may still run"
    assert _call(api, "DELETE", PODS + "/a", {"gracePeriodSeconds": 0})[0] == 200
    assert _call(api, "GET", PODS + "/a")[0] == 404
    _call(api, "POST", PODS, {"metadata": {"name": "u"}, "spec": {"containers": [{"name": "c"}]}})
    assert _call(api, "DELETE", PODS + "/u")[0] == 200 and _call(api, "GET", PODS + "/u")[0] == 404, "unbound: at once"


def test_the_node_lease_heartbeat_creates_then_renews_the_nodes_lease(api: LeaseApiServer) -> None:
    from devplug.testing.nodelease import NODE_LEASE_NAMESPACE, NodeLeaseHeartbeat

    heartbeat = NodeLeaseHeartbeat(api.store, "n1", duration=40)
    assert heartbeat.renew_interval == 10.0, "a quarter of nodeLeaseDurationSeconds"
    heartbeat.sync()
    first = api.store.get(NODE_LEASE_NAMESPACE, "n1")
    assert first["spec"]["holderIdentity"] == "n1" and first["spec"]["leaseDurationSeconds"] == 40
    heartbeat.sync()
    second = api.store.get(NODE_LEASE_NAMESPACE, "n1")
    assert int(second["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])
    assert second["spec"]["renewTime"] >= first["spec"]["renewTime"]
    api.store.update(NODE_LEASE_NAMESPACE, "n1", second)  # someone else wrote it: the next renewal gets it again
    heartbeat.sync()
    assert heartbeat.renewals == 3


def test_the_backend_keeps_an_expired_claim_while_the_holders_node_lives_and_its_pod_runs(
    api: LeaseApiServer, tmp_path: Any
) -> None:
    from devplug.testing.nodelease import NodeLeaseHeartbeat
    from devplug_shared.backends import build_backend, parse_coordination
    from devplug_shared.slots import SlotTakenError

    table = {"backend": "kubernetes", "server": api.url, "namespace": "keep", "lease_ttl": 2.0}
    kind, options = parse_coordination(table, "c")
    a = build_backend(kind, options, node="node-a", resource="example.com/x", state_dir=tmp_path)
    b = build_backend(kind, options, node="node-b", resource="example.com/x", state_dir=tmp_path)
    heartbeat = NodeLeaseHeartbeat(api.store, "node-a", duration=40)
    heartbeat.sync()
    api.pods.create("keep", _pod("p", "node-a"))
    api.pods.set_phase("keep", "p", "Running")
    a.claim(["dev-0"])
    stored = api.store.get("keep", "devplug-shared.example.com.x.dev-0")
    stored["spec"]["renewTime"] = "2000-01-01T00:00:00.000000Z"  # node-a's daemon stopped renewing long ago
    api.store.update("keep", stored["metadata"]["name"], stored)
    with pytest.raises(SlotTakenError, match=r"kept: node node-a's daemon stopped renewing its claim, but its kubelet"):
        b.claim(["dev-0"])
    assert b.holders()["dev-0"].kept is not None
    api.pods.set_phase("keep", "p", "Succeeded")  # its pod finished: nothing of node-a can use the slot
    b.claim(["dev-0"])
    assert {s: c.holder for s, c in b.holders().items()} == {"dev-0": "node-b"}
    verbs = {(m, ns, name is None) for m, ns, name, _ in api.pods.requests}
    assert verbs == {("GET", "*", True)}, "pods are only listed, across namespaces"
    assert _rbac_verbs("ClusterRole", "pods") == {"list"}, "rbac.yaml grants what the check needs: list pods"
    node_lease_verbs = {m for m, ns, _, _ in api.store.requests if ns == "kube-node-lease"}
    assert node_lease_verbs == {"GET"} and _rbac_verbs("ClusterRole", "leases") == {"get"}
    a.close()
    b.close()
