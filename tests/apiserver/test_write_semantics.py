"""Write semantics of the stand-in in process: managedFields encoding, keyed lists and sets in server-side apply,
patches, dry runs, finalizers and foreground deletion."""

from __future__ import annotations

from typing import Any

import pytest

from devplug.testing.apiserver import ApiServer, ApiStatusError
from devplug.testing.apiserver.storage import JSON_PATCH_MEDIA, MERGE_MEDIA, STRATEGIC_MEDIA, Writer
from devplug.testing.conformance import poll_until

from .conftest import node, slice_of


def test_apply_owns_keyed_list_items_and_set_items_in_fields_v1(api: ApiServer) -> None:
    owner = api.create("nodes", node())
    applied = slice_of("s", owner, ["a"])
    applied["metadata"]["finalizers"] = ["example.com/keep"]
    stored = api.apply("resourceslices", applied, "driver")
    uid = owner["metadata"]["uid"]
    (entry,) = stored["metadata"]["managedFields"]
    meta = entry["fieldsV1"]["f:metadata"]
    assert meta["f:finalizers"] == {'v:"example.com/keep"': {}}
    item = meta["f:ownerReferences"][f'k:{{"uid":"{uid}"}}']
    assert item["."] == {} and set(item) == {".", "f:apiVersion", "f:kind", "f:name", "f:uid", "f:controller"}
    assert entry["fieldsV1"]["f:spec"]["f:devices"] == {}, "spec.devices is an atomic list: one field"
    assert set(entry["fieldsV1"]["f:spec"]["f:pool"]) == {"f:name", "f:generation", "f:resourceSliceCount"}
    other = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s", "finalizers": ["x.io/y"]},
    }
    both = api.apply("resourceslices", other, "admin")
    assert both["metadata"]["finalizers"] == ["example.com/keep", "x.io/y"], "a set: each manager its own items"
    del applied["metadata"]["finalizers"]
    dropped = api.apply("resourceslices", applied, "driver")
    assert dropped["metadata"]["finalizers"] == ["x.io/y"]


def test_patches_dry_runs_and_unsupported_media(api: ApiServer) -> None:
    api.create("nodes", node(labels={"a": "1"}))
    storage, nodes = api.storage, api.resource("nodes")
    patched = storage.patch(nodes, "", "node-a", {"metadata": {"labels": {"a": None, "b": "2"}}}, MERGE_MEDIA)
    assert patched["metadata"]["labels"] == {"b": "2"}
    patched = storage.patch(
        nodes, "", "node-a", [{"op": "add", "path": "/metadata/labels/c", "value": "3"}], JSON_PATCH_MEDIA
    )
    assert patched["metadata"]["labels"] == {"b": "2", "c": "3"}
    with pytest.raises(ApiStatusError) as failed:
        storage.patch(nodes, "", "node-a", [{"op": "remove", "path": "/metadata/labels/zz"}], JSON_PATCH_MEDIA)
    assert failed.value.code == 422
    assert (
        storage.patch(nodes, "", "node-a", {"metadata": {"labels": {"d": "4"}}}, STRATEGIC_MEDIA)["metadata"]["labels"][
            "d"
        ]
        == "4"
    )
    with pytest.raises(ApiStatusError) as refused:
        storage.patch(nodes, "", "node-a", {"spec": {"taints": []}}, STRATEGIC_MEDIA)
    assert refused.value.code == 415
    before = storage.revision
    dry = storage.patch(
        nodes, "", "node-a", {"metadata": {"labels": {"e": "5"}}}, MERGE_MEDIA, Writer("x", dry_run=True)
    )
    assert dry["metadata"]["labels"]["e"] == "5" and storage.revision == before
    assert "e" not in api.get("nodes", "node-a")["metadata"]["labels"], "a dry run stores nothing"


def test_finalizers_hold_a_deleted_object_and_foreground_deletion_waits_for_dependents(api: ApiServer) -> None:
    held = slice_of("held", None, ["a"])
    held["metadata"]["finalizers"] = ["example.com/keep"]
    api.create("resourceslices", held)
    marked = api.delete("resourceslices", "held")
    assert marked["metadata"]["deletionTimestamp"] and api.get("resourceslices", "held")
    with pytest.raises(ApiStatusError) as refused:
        api.update(
            "resourceslices",
            {**marked, "metadata": {**marked["metadata"], "finalizers": ["example.com/keep", "x.io/more"]}},
        )
    assert refused.value.code == 422 and "no new finalizers can be added" in str(refused.value)
    api.update("resourceslices", {**marked, "metadata": {**marked["metadata"], "finalizers": []}})
    with pytest.raises(ApiStatusError):
        api.get("resourceslices", "held")
    owner = api.create("nodes", node())
    api.create("resourceslices", slice_of("dep", owner, ["a"]))
    pending = api.delete("nodes", "node-a", propagationPolicy="Foreground")
    assert pending["metadata"]["finalizers"] == ["foregroundDeletion"]
    poll_until(lambda: not api.objects("nodes") and not api.objects("resourceslices"), "the node and its slice gone")
    deleted = [(e.type, e.resource.plural) for e in api.storage._history if e.type == "DELETED"]
    assert deleted[-2:] == [("DELETED", "resourceslices"), ("DELETED", "nodes")], "foreground: dependents first"


def test_device_classes_and_the_status_of_a_node(api: ApiServer, client: Any) -> None:
    from lightkube.resources.resource_v1 import DeviceClass

    made = client.create(
        DeviceClass.from_dict(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "fpga"},
                "spec": {"extendedResourceName": "example.com/fpga"},
            }
        )
    )
    assert made.metadata.generation == 1 and [c.metadata.name for c in client.list(DeviceClass)] == ["fpga"]
    with pytest.raises(ApiStatusError) as refused:
        api.create(
            "deviceclasses",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "x"},
                "spec": {"extendedResourceName": "cpu"},
            },
        )
    assert 'spec.extendedResourceName: Invalid value: "cpu": must be a valid extended resource name' in str(
        refused.value
    )
    api.create("nodes", {**node(), "status": {"allocatable": {"cpu": "4"}}})
    relabelled = api.get("nodes", "node-a")
    relabelled["metadata"]["labels"] = {"zone": "a"}
    relabelled["status"] = {}
    kept = api.update("nodes", relabelled)
    assert kept["status"] == {"allocatable": {"cpu": "4"}}, "a node's update keeps its status"


def test_deletecollection_deletes_what_the_selectors_select(api: ApiServer, client: Any) -> None:
    from lightkube.resources.resource_v1 import ResourceSlice

    for name, driver in (("a", "one.example.com"), ("b", "two.example.com"), ("c", "two.example.com")):
        api.create("resourceslices", slice_of(name, None, ["d"], driver=driver))
    gone = api.storage.delete_collection(
        api.resource("resourceslices"), None, field_selector="spec.driver=two.example.com"
    )
    assert [i["metadata"]["name"] for i in gone["items"]] == ["b", "c"]
    assert [s["metadata"]["name"] for s in api.objects("resourceslices")] == ["a"]
    client.deletecollection(ResourceSlice)
    assert api.objects("resourceslices") == [] and api.count("deletecollection", "resourceslices", 200) == 1
