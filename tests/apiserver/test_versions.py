"""resource.k8s.io as each control-plane release serves it: discovery, the versions served (an unserved one is the end
of the handler chain's text 404), the conversions between v1beta1, v1beta2 and the stored v1 form, fields a version
has not (server-side apply refused with a 500, create by ``fieldValidation``), and a restart that changes them."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest
from lightkube import ApiError
from lightkube.resources import resource_v1beta1, resource_v1beta2
from lightkube.resources.resource_v1 import ResourceSlice

from devplug.testing.apiserver import ApiServer
from devplug.testing.scheduler import SchedulerStandIn

from .conftest import DRIVER, NODE, driver_class, make_client, node

APPLY = "application/apply-patch+yaml"


def v1beta1_slice(name: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def raw(api: ApiServer) -> httpx2.Client:
    return httpx2.Client(base_url=api.url, timeout=10.0, trust_env=False)


@pytest.mark.parametrize(
    ("release", "served", "preferred"),
    [
        ("1.32", ["v1beta1"], "v1beta1"),
        ("1.33", ["v1beta1", "v1beta2"], "v1beta1"),  # a 1.33 server prefers the older beta (install.go's priority)
        ("1.34", ["v1"], "v1"),
        ("1.36", ["v1"], "v1"),
    ],
)
def test_discovery_lists_the_versions_each_release_serves_with_its_preferred_version(
    release: str, served: list[str], preferred: str
) -> None:
    with ApiServer(release=release) as api, raw(api) as http:
        group = http.get("/apis/resource.k8s.io").json()
        assert group["kind"] == "APIGroup" and group["name"] == "resource.k8s.io"
        assert [v["version"] for v in group["versions"]] == served
        assert group["preferredVersion"] == {"groupVersion": f"resource.k8s.io/{preferred}", "version": preferred}
        listed = {g["name"]: g for g in http.get("/apis").json()["groups"]}
        assert listed["resource.k8s.io"]["versions"] == group["versions"]
        assert listed["coordination.k8s.io"]["preferredVersion"]["version"] == "v1"
        resources = http.get(f"/apis/resource.k8s.io/{served[0]}").json()
        assert resources["kind"] == "APIResourceList" and resources["groupVersion"] == f"resource.k8s.io/{served[0]}"
        names = {r["name"]: r for r in resources["resources"]}
        assert {"deviceclasses", "resourceclaims", "resourceclaims/status", "resourceslices"} <= set(names)
        assert names["resourceslices"]["namespaced"] is False and names["resourceclaims"]["namespaced"] is True
        assert "watch" in names["resourceslices"]["verbs"] and names["resourceclaims/status"]["verbs"] == [
            "get",
            "patch",
            "update",
        ]
        version = http.get("/version").json()
        assert (version["major"], version["minor"], version["gitVersion"]) == ("1", release[2:], f"v{release}.0")
        assert "nodes" in {r["name"] for r in http.get("/api/v1").json()["resources"]}


def test_a_version_not_served_is_the_text_404_of_the_end_of_the_handler_chain() -> None:
    with ApiServer(release="1.32") as api, raw(api) as http:
        for path in ("/apis/resource.k8s.io/v1", "/apis/resource.k8s.io/v1/resourceslices", "/apis/nothing.example"):
            answer = http.get(path)
            assert (answer.status_code, answer.text) == (404, "404 page not found\n"), path
            assert answer.headers["Content-Type"] == "text/plain; charset=utf-8"
        served_but_unknown = http.get("/apis/resource.k8s.io/v1beta1/gadgets")
        assert served_but_unknown.status_code == 404
        assert served_but_unknown.json()["message"] == "the server could not find the requested resource"
        client = make_client(api)
        with pytest.raises(httpx2.HTTPStatusError) as refused:  # no Status body: no lightkube ApiError
            list(client.list(ResourceSlice))
        assert refused.value.response.status_code == 404 and not isinstance(refused.value, ApiError)
        unserved = [
            r.path for r in api.requests if r.code == 404 and r.verb == "list" and r.resource == "resourceslices"
        ]
        assert unserved == ["/apis/resource.k8s.io/v1/resourceslices"] * 2  # ours above, then lightkube's
    with ApiServer(release="1.34", resource_versions=()) as bare, raw(bare) as http:  # no DRA API at all
        assert http.get("/apis/resource.k8s.io").status_code == 404
        assert "resource.k8s.io" not in {g["name"] for g in http.get("/apis").json()["groups"]}


def test_a_v1beta1_slice_is_stored_in_the_v1_form_and_read_in_every_served_version() -> None:
    with ApiServer(release="1.34", resource_versions=("v1", "v1beta2", "v1beta1")) as api:
        api.create("nodes", node())
        client = make_client(api)
        body = v1beta1_slice("a-fpga", [{"name": "dev-0", "basic": {"attributes": {"model": {"string": "x"}}}}])
        body["spec"]["devices"].append({"name": "bare", "basic": {}})
        applied = client.apply(resource_v1beta1.ResourceSlice.from_dict(body), field_manager=DRIVER)
        assert applied.apiVersion == "resource.k8s.io/v1beta1"
        stored = api.get("resourceslices", "a-fpga")
        assert stored["apiVersion"] == "resource.k8s.io/v1"
        assert stored["spec"]["devices"] == [
            {"name": "dev-0", "attributes": {"model": {"string": "x"}}},
            {"name": "bare"},
        ]
        assert stored["metadata"]["managedFields"][0]["apiVersion"] == "resource.k8s.io/v1beta1"
        as_v1beta2 = client.get(resource_v1beta2.ResourceSlice, "a-fpga").to_dict()
        assert as_v1beta2["apiVersion"] == "resource.k8s.io/v1beta2"
        assert as_v1beta2["spec"]["devices"][0] == {"name": "dev-0", "attributes": {"model": {"string": "x"}}}
        with raw(api) as http:
            listed = http.get("/apis/resource.k8s.io/v1beta1/resourceslices").json()
        assert listed["apiVersion"] == "resource.k8s.io/v1beta1" and listed["kind"] == "ResourceSliceList"
        # Convert_resource_Device_To_v1beta1_Device always sets basic: {} for a bare device
        assert [d["basic"] for d in listed["items"][0]["spec"]["devices"]] == [
            {"attributes": {"model": {"string": "x"}}},
            {},
        ]


def test_claims_keep_their_requests_exact_fields_in_v1beta1_and_under_exactly_in_v1() -> None:
    with ApiServer(release="1.33") as api:
        api.create("nodes", node())
        api.create("deviceclasses", driver_class())
        with raw(api) as http:
            applied = http.patch(
                f"/apis/resource.k8s.io/v1beta1/resourceslices/{NODE}-fpga",
                params={"fieldManager": DRIVER},
                content=json.dumps(v1beta1_slice(f"{NODE}-fpga", [{"name": "dev-0", "basic": {}}])),
                headers={"Content-Type": APPLY},
            )
            assert applied.status_code == 200, applied.text
            claim = {
                "apiVersion": "resource.k8s.io/v1beta1",
                "kind": "ResourceClaim",
                "metadata": {"name": "c1"},
                "spec": {"devices": {"requests": [{"name": "dev", "deviceClassName": "fpga", "count": 1}]}},
            }
            made = http.post("/apis/resource.k8s.io/v1beta1/namespaces/default/resourceclaims", json=claim)
            assert made.status_code == 201, made.text
            assert made.json()["spec"]["devices"]["requests"] == [
                {"name": "dev", "deviceClassName": "fpga", "count": 1}
            ]
            stored = api.get("resourceclaims", "c1", "default")
            assert stored["spec"]["devices"]["requests"] == [
                {"name": "dev", "exactly": {"deviceClassName": "fpga", "count": 1}}
            ]
            api.create(
                "pods",
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "p1"},
                    "spec": {
                        "containers": [{"name": "app"}],
                        "resourceClaims": [{"name": "c1", "resourceClaimName": "c1"}],
                    },
                },
                "default",
            )
            SchedulerStandIn(api.storage).schedule("default", "p1", NODE)  # writes the stored form
            read = http.get("/apis/resource.k8s.io/v1beta2/namespaces/default/resourceclaims/c1").json()
        allocation = read["status"]["allocation"]
        assert allocation["devices"]["results"] == [
            {"request": "dev", "driver": DRIVER, "pool": NODE, "device": "dev-0"}
        ]
        assert "allocationTimestamp" not in allocation, "a field of 1.34's types: a 1.33 server has none"
        assert read["spec"]["devices"]["requests"] == [
            {"name": "dev", "exactly": {"deviceClassName": "fpga", "count": 1}}
        ]


def test_a_1_32_server_refuses_an_apply_with_device_taints_and_create_by_field_validation() -> None:
    with ApiServer(release="1.32") as api, raw(api) as http:
        api.create("nodes", node())
        tainted = {"name": "dev-0", "basic": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}
        body = v1beta1_slice("a-fpga", [tainted])
        for dry_run in ({}, {"dryRun": "All"}):
            refused = http.patch(
                "/apis/resource.k8s.io/v1beta1/resourceslices/a-fpga",
                params={"fieldManager": DRIVER, **dry_run},
                content=json.dumps(body),
                headers={"Content-Type": APPLY},
            )
            assert refused.status_code == 500
            assert refused.json() == {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": "failed to create typed patch object (/a-fpga; resource.k8s.io/v1beta1, "
                "Kind=ResourceSlice): .spec.devices[0].basic.taints: field not declared in schema",
                "code": 500,
            }
        assert api.objects("resourceslices") == []
        two = v1beta1_slice("b-fpga", [tainted, {"name": "dev-1", "basic": {"bindsToNode": True}}])
        refused = http.patch(
            "/apis/resource.k8s.io/v1beta1/resourceslices/b-fpga",
            params={"fieldManager": DRIVER},
            content=json.dumps(two),
            headers={"Content-Type": APPLY},
        )
        assert refused.json()["message"].endswith(
            "errors:\n  .spec.devices[0].basic.taints: field not declared in schema\n"
            "  .spec.devices[1].basic.bindsToNode: field not declared in schema"
        )
        strict = http.post(
            "/apis/resource.k8s.io/v1beta1/resourceslices", params={"fieldValidation": "Strict"}, json=body
        )
        assert (strict.status_code, strict.json()["reason"], strict.json()["message"]) == (
            400,
            "BadRequest",
            'ResourceSlice in version "v1beta1" cannot be handled as a ResourceSlice: strict decoding error: '
            'unknown field "spec.devices[0].basic.taints"',
        )
        warned = http.post("/apis/resource.k8s.io/v1beta1/resourceslices", json=body)  # lightkube sends no directive
        assert warned.status_code == 201
        assert warned.headers.get_list("Warning") == ['299 - "unknown field \\"spec.devices[0].basic.taints\\""']
        assert warned.json()["spec"]["devices"] == [{"name": "dev-0", "basic": {}}]
        ignored = http.post(
            "/apis/resource.k8s.io/v1beta1/resourceslices",
            params={"fieldValidation": "Ignore"},
            json={**body, "metadata": {"name": "c-fpga"}},
        )
        assert ignored.status_code == 201 and not ignored.headers.get_list("Warning")
        # in process, the stored form holds only what 1.32's types have: the taint is gone
        in_process = api.create("resourceslices", {**api.get("resourceslices", "a-fpga"), "metadata": {"name": "d"}})
        assert "taints" not in in_process["spec"]["devices"][0]


def test_a_server_with_the_field_and_the_gate_off_drops_taints_silently_and_one_with_it_on_keeps_them() -> None:
    tainted = {"name": "dev-0", "basic": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}
    with ApiServer(release="1.33") as gate_off, raw(gate_off) as http:  # DRADeviceTaints: alpha, off
        answer = http.patch(
            "/apis/resource.k8s.io/v1beta1/resourceslices/a-fpga",
            params={"fieldManager": DRIVER, "dryRun": "All"},
            content=json.dumps(v1beta1_slice("a-fpga", [tainted])),
            headers={"Content-Type": APPLY},
        )
        assert answer.status_code in (200, 201)
        assert answer.json()["spec"]["devices"] == [{"name": "dev-0", "basic": {}}]
    with ApiServer(release="1.33", disabled_features=()) as gate_on, raw(gate_on) as http:
        answer = http.patch(
            "/apis/resource.k8s.io/v1beta2/resourceslices/a-fpga",
            params={"fieldManager": DRIVER},
            content=json.dumps(
                {
                    **v1beta1_slice("a-fpga", [{"name": "dev-0", "taints": [{"key": "k", "effect": "NoSchedule"}]}]),
                    "apiVersion": "resource.k8s.io/v1beta2",
                }
            ),
            headers={"Content-Type": APPLY},
        )
        assert answer.json()["spec"]["devices"][0]["taints"][0]["key"] == "k"
    with ApiServer(release="1.34") as v1_gate_off:
        assert v1_gate_off.storage.disabled_features == {
            "DRADeviceTaints",
            "DRAPartitionableDevices",
            "DRAConsumableCapacity",
        }


def test_a_restart_as_a_newer_release_cuts_the_watches_and_serves_other_versions(watch_thread: Any) -> None:
    with ApiServer(release="1.33") as api:
        api.create("nodes", node())
        client = make_client(api)
        watch = watch_thread(lambda: client.watch(resource_v1beta2.ResourceSlice))
        api.create("resourceslices", {**v1beta1_slice("a-fpga", []), "apiVersion": "resource.k8s.io/v1"})
        assert watch.next()[:2] == ("ADDED", "a-fpga")
        api.restart(release="1.34")
        assert isinstance(watch.error(), httpx2.HTTPError), "the watch was cut"
        with raw(api) as http:
            assert [v["version"] for v in http.get("/apis/resource.k8s.io").json()["versions"]] == ["v1"]
            assert http.get("/apis/resource.k8s.io/v1beta2/resourceslices").status_code == 404
            assert http.get("/apis/resource.k8s.io/v1/resourceslices/a-fpga").json()["metadata"]["name"] == "a-fpga"
            assert http.get("/version").json()["minor"] == "34"
        with pytest.raises(ValueError, match=r"Kubernetes 1\.32 has no resource\.k8s\.io v1"):
            api.restart(release="1.32", resource_versions=("v1",))
