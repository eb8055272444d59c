"""The stand-in validates issue 41's fields as ``pkg/apis/resource/validation/validation.go`` (1.36) does: capacity
request policies, counter sets and consumption, ``status.devices`` and share IDs, and the admin-access namespace
label (``pkg/registry/resource/authz.go``). Writes go over HTTP; each refusal names the field path."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from devplug.testing.apiserver import ApiServer
from devplug.testing.apiserver.admin import LABEL

from .conftest import DRIVER, NODE

NS = "default"
SHARE = "0b0f3c0e-8e8a-4c59-9d69-6a1f4c7e0a11"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"


@pytest.fixture
def http(api: ApiServer) -> Any:
    with httpx2.Client(base_url=api.url, timeout=10.0, trust_env=False) as client:
        yield client


def causes(answer: Any) -> list[tuple[str, str]]:
    """(field, message) of each cause of a 422."""
    assert answer.status_code == 422, answer.text
    return [(c["field"], c["message"]) for c in answer.json()["details"]["causes"]]


def a_slice(
    devices: list[dict[str, Any]] | None = None, counters: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": DRIVER,
        "nodeName": NODE,
        "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
    }
    if devices is not None:
        spec["devices"] = devices
    if counters is not None:
        spec["sharedCounters"] = counters
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"}, "spec": spec}


def shared(policy: dict[str, Any], value: str = "8", multiple: bool = True) -> list[dict[str, Any]]:
    device: dict[str, Any] = {"name": "fpga-0", "capacity": {"shares": {"value": value, "requestPolicy": policy}}}
    if multiple:
        device["allowMultipleAllocations"] = True
    return [device]


POLICY = "spec.devices[0].capacity[shares].requestPolicy"


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ({"default": "1", "validRange": {"min": "1", "max": "8", "step": "1"}}, []),
        ({"default": "2", "validValues": ["1", "2", "4"]}, []),
        ({"default": "1"}, []),
        (
            {"default": "1", "validValues": ["1"], "validRange": {"min": "1"}},
            [
                (
                    POLICY,
                    "Forbidden: exactly one policy can be specified, "
                    'cannot specify "validValues" and "validRange" at the same time',
                )
            ],
        ),
        ({"validValues": ["1"]}, [(f"{POLICY}.default", "Required value: required when validValues is defined")]),
        ({"validRange": {"min": "1"}}, [(f"{POLICY}.default", "Required value: required when validRange is defined")]),
        (
            {"default": "2", "validValues": ["4", "2"]},
            [(f"{POLICY}.validValues[1]", 'Invalid value: "2": values must be sorted in ascending order')],
        ),
        (
            {"default": "3", "validValues": ["1", "2"]},
            [
                (
                    f"{POLICY}.validValues",
                    'Invalid value: "3": default value is not valid according to the requestPolicy',
                )
            ],
        ),
        (
            {"default": "1", "validValues": ["1", "16"]},
            [(f"{POLICY}.validValues[1]", 'Invalid value: "16": option is larger than capacity value: 8')],
        ),
        ({"default": "1", "validValues": ["1", "1"]}, [(f"{POLICY}.validValues[1]", 'Duplicate value: "1"')]),
        (
            {"default": "1", "validValues": [str(i) for i in range(1, 12)]},
            [  # validateSet short-circuits, so the default is never found among them
                (f"{POLICY}.validValues", "Too many: 11: must have at most 10 items"),
                (
                    f"{POLICY}.validValues",
                    'Invalid value: "1": default value is not valid according to the requestPolicy',
                ),
            ],
        ),
        (
            {"default": "1", "validRange": {"min": "4", "max": "2"}},
            [
                (f"{POLICY}.validRange.default", 'Invalid value: "1": default is less than min: 4'),
                (f"{POLICY}.validRange.max", 'Invalid value: "4": min is larger than max: 2'),
            ],
        ),
        (
            {"default": "1", "validRange": {"min": "1", "step": "0"}},
            [(f"{POLICY}.validRange.step", 'Invalid value: "0": must be greater than zero')],
        ),
        (
            {"default": "2", "validRange": {"min": "1", "step": "2"}},
            [(f"{POLICY}.validRange.step", 'Invalid value: "2": value is not a multiple of a given step (2) from (1)')],
        ),
        (
            {"default": "1", "validRange": {"min": "1", "step": "8"}},
            [(f"{POLICY}.validRange.step", 'Invalid value: "8": one step 9 is larger than capacity value: 8')],
        ),
        (
            {"default": "1", "validRange": {}},
            [(f"{POLICY}.validRange.min", "Required value: required when validRange is defined")],
        ),
    ],
)
def test_a_request_policy_is_checked_as_validate_request_policy_does(
    http: Any, policy: dict[str, Any], expected: list[tuple[str, str]]
) -> None:
    answer = http.post(SLICES, json=a_slice(shared(policy)))
    if not expected:
        assert answer.status_code == 201, answer.text
    else:
        assert causes(answer) == expected


def test_a_request_policy_needs_multiple_allocations(http: Any) -> None:
    answer = http.post(SLICES, json=a_slice(shared({"default": "1"}, multiple=False)))
    assert causes(answer) == [(POLICY, "Forbidden: allowMultipleAllocations must be true")]


def test_counter_sets_and_consumption_are_checked(http: Any) -> None:
    card = {"name": "card", "counters": {"slots": {"value": "2"}}}
    assert http.post(SLICES, json=a_slice(counters=[card])).status_code == 201
    both = a_slice([{"name": "x"}], [card])
    both["metadata"]["name"] = "both"
    assert ("spec", 'Invalid value: "": only one of `sharedCounters` or `devices` is allowed') in causes(
        http.post(SLICES, json=both)
    )
    bad = a_slice(counters=[card, {"name": "Card_1", "counters": {}}, card])
    bad["metadata"]["name"] = "bad"
    found = causes(http.post(SLICES, json=bad))
    assert ("spec.sharedCounters[1].counters", "Required value") in found
    assert any(f == "spec.sharedCounters[1].name" and "RFC 1123 label" in m for f, m in found)
    assert ("spec.sharedCounters[2]", 'Duplicate value: "card"') in found
    many = a_slice(counters=[{"name": f"s{i}", "counters": {"c": {"value": "1"}}} for i in range(9)])
    many["metadata"]["name"] = "many"
    assert causes(http.post(SLICES, json=many)) == [("spec.sharedCounters", "Too many: 9: must have at most 8 items")]
    three = [{"counterSet": f"s{i}", "counters": {"c": {"value": "1"}}} for i in range(3)]
    parts = a_slice([{"name": "p", "consumesCounters": three}])
    parts["metadata"]["name"] = "parts"
    assert causes(http.post(SLICES, json=parts)) == [
        ("spec.devices[0].consumesCounters", "Too many: 3: must have at most 2 items")
    ]
    too_many_counters = {f"c{i}": {"value": "1"} for i in range(33)}
    wide = a_slice(counters=[{"name": "card", "counters": too_many_counters}])
    wide["metadata"]["name"] = "wide"
    assert causes(http.post(SLICES, json=wide)) == [
        ("spec.sharedCounters[0].counters", "Too many: 33: must have at most 32 items")
    ]


def test_per_device_node_fields_need_per_device_node_selection(http: Any) -> None:
    answer = http.post(SLICES, json=a_slice([{"name": "p", "nodeName": NODE}]))
    assert causes(answer) == [
        (
            "spec.devices[0]",
            "Invalid value: null: `nodeName`, `nodeSelector` and `allNodes` can only be set if "
            "`perDeviceNodeSelection` is set to true in the ResourceSlice spec",
        )
    ]


def claim(admin: bool = False) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "fpga"}
    if admin:
        exactly["adminAccess"] = True
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": exactly}]}},
    }


def namespace(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}


def test_admin_access_needs_the_namespace_label(api: ApiServer, http: Any) -> None:
    """``AuthorizedForAdmin``: no namespace -> an internal field error; unlabelled -> Forbidden; labelled -> created."""
    path = "spec.devices.requests[0].adminAccess"
    assert causes(http.post(CLAIMS, json=claim(admin=True))) == [
        (path, 'Internal error: could not retrieve namespace to verify admin access: namespaces "default" not found')
    ]
    created = http.post("/api/v1/namespaces", json=namespace(NS))
    assert created.status_code == 201, created.text
    assert created.json()["status"] == {"phase": "Active"}
    assert created.json()["metadata"]["labels"] == {"kubernetes.io/metadata.name": NS}
    assert causes(http.post(CLAIMS, json=claim(admin=True))) == [
        (path, f"Forbidden: admin access to devices requires the `{LABEL}: true` label on the containing namespace")
    ]
    assert http.post(CLAIMS, json=claim()).status_code == 201, "a claim without admin access needs no label"
    http.delete(f"{CLAIMS}/c")
    labelled = http.patch(
        f"/api/v1/namespaces/{NS}",
        content=json.dumps({"metadata": {"labels": {LABEL: "true"}}}),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert labelled.status_code == 200, labelled.text
    assert http.post(CLAIMS, json=claim(admin=True)).status_code == 201
    assert [n["metadata"]["name"] for n in http.get("/api/v1/namespaces").json()["items"]] == [NS]


def test_an_admin_access_result_needs_the_label_too(api: ApiServer) -> None:
    """``AuthorizedForAdminStatus``: a claim created before the label came off still cannot get an admin result."""
    api.create("namespaces", namespace(NS, {LABEL: "true"}))
    api.create("resourceclaims", claim(admin=True), NS)
    ns = api.get("namespaces", NS)
    api.update("namespaces", {**ns, "metadata": {**ns["metadata"], "labels": {}}})
    stored = api.get("resourceclaims", "c", NS)
    result = {"request": "r", "driver": DRIVER, "pool": NODE, "device": "fpga-0", "adminAccess": True}
    stored["status"] = {"allocation": {"devices": {"results": [result]}}}
    with pytest.raises(Exception, match=r"status\.allocation\.devices\.results\[0\]\.adminAccess: Forbidden"):
        api.update("resourceclaims", stored, NS, "kube-scheduler", "status")


def allocated(api: ApiServer, **result: Any) -> dict[str, Any]:
    api.create("resourceclaims", claim(), NS)
    stored = api.get("resourceclaims", "c", NS)
    entry = {"request": "r", "driver": DRIVER, "pool": NODE, "device": "fpga-0", **result}
    stored["status"] = {"allocation": {"devices": {"results": [entry]}}}
    return api.update("resourceclaims", stored, NS, "kube-scheduler", "status")


def status_write(api: ApiServer, http: Any, claim_obj: dict[str, Any], devices: list[dict[str, Any]]) -> Any:
    meta = {k: v for k, v in claim_obj["metadata"].items() if k != "resourceVersion"}  # an unconditional update
    body = {**claim_obj, "metadata": meta, "status": {**claim_obj["status"], "devices": devices}}
    return http.put(f"{CLAIMS}/c/status", json=body)


def test_a_share_id_must_be_a_lowercase_uid(api: ApiServer) -> None:
    with pytest.raises(Exception, match=r"results\[0\]\.shareID: Invalid value: \"ABC\": error validating uid"):
        allocated(api, shareID="ABC")
    api.delete("resourceclaims", "c", NS)
    with pytest.raises(Exception, match="RFC 4122 normalized form"):
        allocated(api, shareID=SHARE.upper())


def test_status_devices_must_name_allocated_devices(api: ApiServer, http: Any) -> None:
    written = allocated(api, shareID=SHARE)
    ok = status_write(api, http, written, [{"driver": DRIVER, "pool": NODE, "device": "fpga-0", "shareID": SHARE}])
    assert ok.status_code == 200, ok.text
    written = ok.json()
    wrong = status_write(api, http, written, [{"driver": DRIVER, "pool": NODE, "device": "fpga-1"}])
    assert causes(wrong) == [
        ("status.devices[0]", f'Invalid value: "{DRIVER}/{NODE}/fpga-1": must be an allocated device in the claim')
    ]
    no_share = status_write(api, http, written, [{"driver": DRIVER, "pool": NODE, "device": "fpga-0"}])
    assert causes(no_share)[0][1].endswith("must be an allocated device in the claim"), (
        "the share ID is part of the key"
    )
    entry = {"driver": DRIVER, "pool": NODE, "device": "fpga-0", "shareID": SHARE}
    twice = status_write(api, http, written, [entry, entry])
    assert ("status.devices[1]", f'Duplicate value: "{DRIVER}/{NODE}/fpga-0/{SHARE}"') in causes(twice)


def test_status_devices_without_an_allocation_are_refused(api: ApiServer) -> None:
    api.create("resourceclaims", claim(), NS)
    stored = api.get("resourceclaims", "c", NS)
    stored["status"] = {"devices": [{"driver": DRIVER, "pool": NODE, "device": "fpga-0"}]}
    with pytest.raises(Exception, match=r"status\.devices\[0\]: Invalid value: .*must be an allocated device"):
        api.update("resourceclaims", stored, NS, DRIVER, "status")


def test_device_status_conditions_data_and_network_data_are_checked(api: ApiServer, http: Any) -> None:
    written = allocated(api)
    base = {"driver": DRIVER, "pool": NODE, "device": "fpga-0"}
    condition = {"type": "Ready", "status": "True", "reason": "Loaded", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    good = {
        **base,
        "conditions": [condition],
        "data": {"image": "blue"},
        "networkData": {
            "interfaceName": "net1",
            "hardwareAddress": "02:00:00:00:00:01",
            "ips": ["10.0.0.2/24", "2001:db8::2/64"],
        },
    }
    assert status_write(api, http, written, [good]).status_code == 200
    bad = {
        **base,
        "conditions": [dict(condition, type=f"T{i}") for i in range(9)],
        "data": ["not", "an", "object"],
        "networkData": {
            "interfaceName": "n" * 257,
            "hardwareAddress": "a" * 129,
            "ips": ["10.0.0.2", "2001:DB8::2/64", "10.0.0.3/24", "10.0.0.3/24"],
        },
    }
    found = causes(status_write(api, http, written, [bad]))
    at = "status.devices[0]"
    assert (f"{at}.conditions", "Too many: 9: must have at most 8 items") in found
    assert (f"{at}.data", 'Invalid value: "<value omitted>": must be a valid JSON object') in found
    assert (f"{at}.networkData.interfaceName", "Too long: may not be more than 256 bytes") in found
    assert (f"{at}.networkData.hardwareAddress", "Too long: may not be more than 128 bytes") in found
    assert (
        f"{at}.networkData.ips[0]",
        'Invalid value: "10.0.0.2": must be a valid address in CIDR form, (e.g. 10.9.8.7/24 or 2001:db8::1/64)',
    ) in found
    assert (
        f"{at}.networkData.ips[1]",
        'Invalid value: "2001:DB8::2/64": must be in canonical form ("2001:db8::2/64")',
    ) in found
    assert (f"{at}.networkData.ips[3]", 'Duplicate value: "10.0.0.3/24"') in found
    big = {**base, "data": {"blob": "x" * (10 * 1024)}}
    assert (f"{at}.data", "Too long: may not be more than 10240 bytes") in causes(
        status_write(api, http, written, [big])
    )
    long_type = {**base, "conditions": [dict(condition, type="R" * 64)]}
    assert (
        f"{at}.conditions[0].type",
        f'Invalid value: "{"R" * 64}": name part must be no more than 63 characters',
    ) in causes(status_write(api, http, written, [long_type]))
    mapped = {**base, "networkData": {"ips": ["::ffff:a00:1/120"]}}
    assert causes(status_write(api, http, written, [mapped])) == [
        (f"{at}.networkData.ips[0]", 'Invalid value: "::ffff:a00:1/120": must be in canonical form ("10.0.0.1/24")')
    ]
    no_reason = {**base, "conditions": [{k: v for k, v in condition.items() if k != "reason"}]}
    assert (f"{at}.conditions[0].reason", "Required value: must be set") in causes(
        status_write(api, http, written, [no_reason])
    )
    seventeen = {**base, "networkData": {"ips": [f"10.0.0.{i}/24" for i in range(17)]}}
    assert causes(status_write(api, http, written, [seventeen])) == [
        (f"{at}.networkData.ips", "Too many: 17: must have at most 16 items")
    ]
