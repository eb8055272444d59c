"""ResourceSlices and Nodes through lightkube, the client a Python driver uses: apply, list, field selectors,
validation, optimistic concurrency, field managers, the garbage collector."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from lightkube import ApiError
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceSlice

from devplug.testing.apiserver import ApiServer
from devplug.testing.conformance import poll_until

from .conftest import DRIVER, NODE, make_client, node, slice_of, status_of


def _raw(
    api: ApiServer, method: str, path: str, body: Any = None, content_type: str = "application/json"
) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(api.url + path, data=data, method=method)
    request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_driver_applies_its_slice_and_lists_it_by_node_and_driver(api: ApiServer, client: Any) -> None:
    owner = api.create("nodes", node())
    applied = client.apply(ResourceSlice.from_dict(slice_of("a-fpga", owner, ["dev-0", "dev-1"])), field_manager=DRIVER)
    assert applied.metadata.generation == 1 and applied.metadata.uid
    assert [e.manager for e in applied.metadata.managedFields] == [DRIVER]
    assert applied.metadata.managedFields[0].operation == "Apply"
    client.apply(ResourceSlice.from_dict(slice_of("other", None, ["x"], driver="gpu.example.com")), field_manager="gpu")
    by_node = [s.metadata.name for s in client.list(ResourceSlice, fields={"spec.nodeName": NODE})]
    by_driver = [s.metadata.name for s in client.list(ResourceSlice, fields={"spec.driver": DRIVER})]
    assert sorted(by_node) == ["a-fpga", "other"] and by_driver == ["a-fpga"]
    with pytest.raises(ApiError) as refused:
        list(client.list(ResourceSlice, fields={"spec.pool.name": NODE}))  # 1.37's selector; 1.36 has none
    assert (refused.value.status.code, status_of(refused)["message"]) == (
        400,
        "field label not supported: spec.pool.name",
    )
    again = client.apply(ResourceSlice.from_dict(slice_of("a-fpga", owner, ["dev-0", "dev-1"])), field_manager=DRIVER)
    assert again.metadata.resourceVersion == applied.metadata.resourceVersion, (
        "an apply that changes nothing is no write"
    )
    changed = client.apply(
        ResourceSlice.from_dict(slice_of("a-fpga", owner, ["dev-0"], generation=2)), field_manager=DRIVER
    )
    assert changed.metadata.generation == 2, "a spec change bumps metadata.generation"
    assert int(changed.metadata.resourceVersion) > int(applied.metadata.resourceVersion)
    assert [d.name for d in client.get(ResourceSlice, "a-fpga").spec.devices] == ["dev-0"]


def test_invalid_slices_are_422_with_a_cause_per_field(api: ApiServer, client: Any) -> None:
    bad = slice_of("bad", None, ["Dev_0", "ok", "ok"])
    with pytest.raises(ApiError) as refused:
        client.create(ResourceSlice.from_dict(bad))
    status = refused.value.status
    assert (status.code, status.reason) == (422, "Invalid")
    assert status_of(refused)["message"].startswith(
        'ResourceSlice.resource.k8s.io "bad" is invalid: [spec.devices[0].name: Invalid value: "Dev_0"'
    )
    fields = [(c["field"], c["reason"]) for c in status_of(refused)["details"]["causes"]]
    assert fields == [("spec.devices[0].name", "FieldValueInvalid"), ("spec.devices[2]", "FieldValueDuplicate")]
    many = slice_of("many", None, [f"d{i}" for i in range(129)])
    with pytest.raises(ApiError) as too_many:
        client.create(ResourceSlice.from_dict(many))
    assert "spec.devices: Too many: 129: must have at most 128 items" in status_of(too_many)["message"]
    assert client.create(ResourceSlice.from_dict(slice_of("full", None, [f"d{i}" for i in range(128)]))).metadata.name
    none = slice_of("nowhere", None, ["a"])
    del none["spec"]["nodeName"]
    with pytest.raises(ApiError) as no_node:
        client.create(ResourceSlice.from_dict(none))
    assert (
        "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
        in (status_of(no_node)["message"])
    )
    moved = client.get(ResourceSlice, "full")
    moved.spec.driver = "other.example.com"
    with pytest.raises(ApiError) as immutable:
        client.replace(moved)
    assert 'spec.driver: Invalid value: "other.example.com": field is immutable' in status_of(immutable)["message"]
    assert api.objects("resourceslices")[0]["spec"]["driver"] == DRIVER, "a refused write changes nothing"


def test_a_stale_resource_version_is_409_and_generate_name_makes_names(api: ApiServer, client: Any) -> None:
    first = client.create(ResourceSlice.from_dict(slice_of("s", None, ["a"])))
    current = client.get(ResourceSlice, "s")
    current.spec.devices[0].name = "b"
    client.replace(current)
    first.spec.devices[0].name = "c"
    with pytest.raises(ApiError) as stale:
        client.replace(first)
    assert (stale.value.status.code, stale.value.status.reason) == (409, "Conflict")
    assert status_of(stale)["message"] == (
        'Operation cannot be fulfilled on resourceslices.resource.k8s.io "s": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    generated = slice_of("", None, ["a"])
    generated["metadata"] = {"generateName": "node-a-fpga-"}
    made = client.create(ResourceSlice.from_dict(generated))
    assert made.metadata.name.startswith("node-a-fpga-") and len(made.metadata.name) == len("node-a-fpga-") + 5
    with pytest.raises(ApiError) as exists:
        client.create(ResourceSlice.from_dict(slice_of("s", None, ["a"])))
    assert (exists.value.status.code, exists.value.status.reason) == (409, "AlreadyExists")


def test_apply_conflicts_name_the_owner_and_force_takes_the_field_over(api: ApiServer) -> None:
    driver, admin = make_client(api, DRIVER), make_client(api, "admin")
    try:
        mine = slice_of("s", None, ["a"])
        mine["metadata"]["labels"] = {"tier": "1", "team": "x"}
        driver.apply(ResourceSlice.from_dict(mine))
        theirs = slice_of("s", None, ["z"])
        with pytest.raises(ApiError) as conflict:
            admin.apply(ResourceSlice.from_dict(theirs))
        status = status_of(conflict)
        assert (status["code"], status["reason"]) == (409, "Conflict")
        assert status["message"] == f'Apply failed with 1 conflict: conflict with "{DRIVER}": .spec.devices'
        assert [(c["reason"], c["field"]) for c in status["details"]["causes"]] == [
            ("FieldManagerConflict", ".spec.devices")
        ]
        shared = slice_of("s", None, ["a"])  # the same values: a co-owner, no conflict
        admin.apply(ResourceSlice.from_dict(shared))
        forced = admin.apply(ResourceSlice.from_dict(theirs), force=True)
        assert [d.name for d in forced.spec.devices] == ["z"]
        owners = {e.manager: e.fieldsV1 for e in forced.metadata.managedFields}
        assert "f:devices" in owners["admin"]["f:spec"] and "f:devices" not in owners[DRIVER]["f:spec"]
        mine["metadata"]["labels"] = {"tier": "1"}  # the driver stops applying "team": it goes
        del mine["spec"]["devices"]
        left = driver.apply(ResourceSlice.from_dict(mine))
        assert left.metadata.labels == {"tier": "1"} and [d.name for d in left.spec.devices] == ["z"]
    finally:
        driver.close()
        admin.close()
    code, status = _raw(api, "PATCH", "/apis/resource.k8s.io/v1/resourceslices/s", mine, "application/apply-patch+yaml")
    assert (code, status["reason"]) == (422, "Invalid") and "fieldManager: Required value" in status["message"]


def test_deleting_a_node_collects_its_slices_in_the_background(api: ApiServer, client: Any) -> None:
    owner = api.create("nodes", node())
    other = api.create("nodes", node("node-b"))
    client.apply(ResourceSlice.from_dict(slice_of("a-0", owner, ["d"])), field_manager=DRIVER)
    client.apply(ResourceSlice.from_dict(slice_of("a-1", owner, ["d"])), field_manager=DRIVER)
    client.apply(ResourceSlice.from_dict(slice_of("b-0", other, ["d"])), field_manager=DRIVER)
    before = api.storage.revision
    client.delete(Node, NODE)
    poll_until(
        lambda: [s["metadata"]["name"] for s in api.objects("resourceslices")] == ["b-0"], "the GC deleting a-0, a-1"
    )
    deletions = [e for e in api.storage._history if e.revision > before and e.type == "DELETED"]
    assert [e.resource.plural for e in deletions] == ["nodes", "resourceslices", "resourceslices"], "owner first"
    stray = slice_of("late", None, ["d"])  # owned by a node uid that no longer exists
    stray["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": owner["metadata"]["uid"]}
    ]
    client.create(ResourceSlice.from_dict(stray))
    poll_until(
        lambda: "late" not in [s["metadata"]["name"] for s in api.objects("resourceslices")], "the GC deleting late"
    )
    client.delete(Node, "node-b", cascade=__import__("lightkube").types.CascadeType.ORPHAN)
    poll_until(lambda: not [n for n in api.objects("nodes")], "node-b going once orphaned")
    kept = api.get("resourceslices", "b-0")
    assert "ownerReferences" not in kept["metadata"], "orphaned: the reference removed, the slice kept"


def test_node_labels_are_patched_and_watched_by_selector(api: ApiServer, client: Any, watch_thread: Any) -> None:
    api.create("nodes", node(labels={"devplug.io/profile": "fpga"}))
    api.create("nodes", node("node-b"))
    listed = client.list(Node, labels={"devplug.io/profile": "fpga"})
    assert [n.metadata.name for n in listed] == [NODE]
    start = listed.resourceVersion
    watch = watch_thread(lambda: client.watch(Node, labels={"devplug.io/profile": "fpga"}, resource_version=start))
    client.set(Node, "node-b", labels={"devplug.io/profile": "fpga"})  # a merge patch: node-b enters the selector
    assert watch.next()[:2] == ("ADDED", "node-b")
    client.set(Node, NODE, labels={"devplug.io/profile": None})  # the label removed: node-a leaves it
    kind, name, rv = watch.next()
    assert (kind, name) == ("DELETED", NODE) and rv == str(api.storage.revision)
    assert api.get("nodes", NODE)["metadata"].get("labels", {}) == {}
    api.close()


def test_an_unchanged_apply_a_second_later_is_no_write(
    api: ApiServer, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the managedFields timestamp would differ: the apiserver keeps the old entry and writes nothing."""
    from devplug.testing.apiserver import storage

    owner = api.create("nodes", node())
    applied = client.apply(ResourceSlice.from_dict(slice_of("a-fpga", owner, ["dev-0"])), field_manager=DRIVER)
    monkeypatch.setattr(storage, "now_text", lambda: "2099-01-01T00:00:00Z")
    again = client.apply(ResourceSlice.from_dict(slice_of("a-fpga", owner, ["dev-0"])), field_manager=DRIVER)
    assert again.metadata.resourceVersion == applied.metadata.resourceVersion
    assert again.metadata.managedFields[0].time == applied.metadata.managedFields[0].time


def test_a_device_taint_without_time_added_gets_the_time_of_each_write(
    api: ApiServer, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SetDefaults_DeviceTaint``: the time is defaulted on every write, so only a writer that sends it back keeps it
    (and an unchanged apply then writes nothing)."""
    from devplug.testing.apiserver import storage

    owner = api.create("nodes", node())
    body = slice_of("a-fpga", owner, ["dev-0", "dev-1"])
    body["spec"]["devices"][0]["taints"] = [
        {"key": "devplug.io/unavailable", "value": "unhealthy", "effect": "NoSchedule"}
    ]
    monkeypatch.setattr(storage, "now_text", lambda: "2030-01-01T00:00:00Z")
    first = client.apply(ResourceSlice.from_dict(body), field_manager=DRIVER).to_dict()
    assert first["spec"]["devices"][0]["taints"][0]["timeAdded"] == "2030-01-01T00:00:00Z"
    assert "taints" not in first["spec"]["devices"][1]

    monkeypatch.setattr(storage, "now_text", lambda: "2030-01-01T00:00:05Z")
    again = client.apply(ResourceSlice.from_dict(body), field_manager=DRIVER).to_dict()
    assert again["spec"]["devices"][0]["taints"][0]["timeAdded"] == "2030-01-01T00:00:05Z"
    assert again["metadata"]["generation"] == first["metadata"]["generation"] + 1

    body["spec"]["devices"][0]["taints"][0]["timeAdded"] = "2030-01-01T00:00:05Z"
    kept = client.apply(ResourceSlice.from_dict(body), field_manager=DRIVER).to_dict()
    assert kept["metadata"]["resourceVersion"] == again["metadata"]["resourceVersion"]
    body = slice_of("c-fpga", owner, ["dev-3"])
    body["spec"]["devices"][0]["taints"] = [{"key": "k", "effect": "NoExecute"}]
    assert api.create("resourceslices", body)["spec"]["devices"][0]["taints"][0]["timeAdded"] == "2030-01-01T00:00:05Z"


def test_with_device_taints_disabled_taints_are_dropped_unless_the_stored_slice_has_some() -> None:
    """``dropDisabledDRADeviceTaintsFields``: an API server without ``DRADeviceTaints`` (1.33 to 1.35 by default)
    drops new taints, and keeps taints on a slice that already uses them."""
    with ApiServer(disabled_features={"DRADeviceTaints"}) as api:
        owner = api.create("nodes", node())
        body = slice_of("a-fpga", owner, ["dev-0"])
        body["spec"]["devices"][0]["taints"] = [{"key": "k", "value": "v", "effect": "NoSchedule"}]
        stored = api.apply("resourceslices", body, DRIVER)
        assert "taints" not in stored["spec"]["devices"][0]
        assert (
            "taints" not in api.create("resourceslices", {**body, "metadata": {"name": "b-fpga"}})["spec"]["devices"][0]
        )
    with ApiServer() as enabled:  # a slice written while the gate was on keeps its taints after it is turned off
        body = slice_of("a-fpga", enabled.create("nodes", node()), ["dev-0"])
        body["spec"]["devices"][0]["taints"] = [{"key": "k", "value": "v", "effect": "NoSchedule"}]
        kept = enabled.apply("resourceslices", body, DRIVER)
        assert kept["spec"]["devices"][0]["taints"][0]["key"] == "k"
        enabled.storage.disabled_features = frozenset({"DRADeviceTaints"})
        body["spec"]["devices"][0]["taints"][0]["value"] = "w"
        again = enabled.apply("resourceslices", body, DRIVER)
        assert again["spec"]["devices"][0]["taints"][0]["value"] == "w"
