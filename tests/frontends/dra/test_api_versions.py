"""DRA on every control plane from 1.32 (issue 37, items 3 to 5): the resource.k8s.io version found by discovery (v1,
v1beta2, v1beta1: the newest served), device taints known before the first write (a dry run), slices and claims
through that version, discovery again after an upgrade or a 404, a refusal at start naming what the server serves,
and a claim allocated for another node refused. Against the API server stand-in as each release serves it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import grpc.aio
import pytest

from devplug.api.gen.dra.v1 import api_pb2 as v1
from devplug.api.gen.dra.v1 import api_pb2_grpc as v1_grpc
from devplug.daemon.status import read_status
from devplug.engine.devicetable import DeviceTable
from devplug.errors import KubeApiError, StateError
from devplug.frontends.dra.apiversions import DraApi, DraApiVersionError, discover_or_close, probe_name
from devplug.frontends.dra.claims import ClaimNodeMismatchError, ClaimReader, ClaimRef
from devplug.frontends.dra.nodeselector import NodeLabels, NodeSelector
from devplug.frontends.dra.slices import SlicePublisher
from devplug.kube.client import make_client
from devplug.testing.apiserver import ApiServer
from devplug.testing.scheduler import SchedulerStandIn
from devplug.types import Device, Health

from .conftest import DRIVER, NODE, NS, eventually, node, run, write_kubeconfig
from .dranode import DRIVER as MOCK_DRIVER
from .dranode import dra_node
from .dranode import eventually as eventually_on_node

MANAGER = f"devplug-{DRIVER}"


def table_of(*devices: Device) -> DeviceTable:
    table = DeviceTable()
    table.replace(devices)
    return table


def published(api: ApiServer) -> dict[str, dict[str, Any]]:
    """The node's devices of DRIVER as stored (the v1 form), by name."""
    return {
        d["name"]: d
        for s in api.objects("resourceslices")
        if s["spec"]["driver"] == DRIVER
        for d in s["spec"].get("devices") or ()
    }


def paths(api: ApiServer, resource: str) -> set[str]:
    """The versions the requests on ``resource`` went to (``v1beta1``, ...)."""
    return {r.path.split("/")[3] for r in api.requests if r.resource == resource and r.path.startswith("/apis/")}


class Lab:
    """A stand-in of a control-plane release, a client of it, and the front end's discovery on it."""

    def __init__(self, api: ApiServer, tmp_path: Path) -> None:
        self.api = api
        self.kubeconfig = write_kubeconfig(api, tmp_path / f"kubeconfig-{id(api)}")
        api.create("nodes", node())

    async def discover(self) -> tuple[Any, DraApi]:
        client = make_client(self.kubeconfig, field_manager=MANAGER)
        return client, await DraApi.discover(client, node=NODE, driver=DRIVER, pool=NODE)


@pytest.mark.parametrize(
    ("release", "versions", "chosen", "taints", "why"),
    [
        ("1.32", None, "v1beta1", False, "has no device taints (it refused the field)"),
        ("1.33", None, "v1beta2", False, "DRADeviceTaints is off"),  # served: v1beta1 (preferred) and v1beta2
        ("1.34", None, "v1", False, "DRADeviceTaints is off"),
        ("1.34", ("v1beta1",), "v1beta1", False, "DRADeviceTaints is off"),
        ("1.36", ("v1", "v1beta2", "v1beta1"), "v1", True, "kept by the API server"),
    ],
)
def test_discovery_takes_the_newest_version_served_and_a_dry_run_tells_the_taints(
    tmp_path: Path, release: str, versions: tuple[str, ...] | None, chosen: str, taints: bool, why: str
) -> None:
    with ApiServer(release=release, resource_versions=versions) as api:
        lab = Lab(api, tmp_path)

        async def go() -> DraApi:
            client, found = await lab.discover()
            await client.close()
            return found

        found = run(go)
        assert found.version == chosen and found.choice.served == api.resource_versions
        assert found.choice.taints is taints and why in found.choice.taints_reason
        assert api.objects("resourceslices") == [], "the dry run stores nothing"
        probes = [r for r in api.requests if r.verb == "patch"]
        # one dry run; two on 1.33, whose versions refuse consumable capacity's fields (none of them in 1.33's
        # types) while taints and counters are left to ask about without them (issue 41)
        assert len(probes) == (2 if release == "1.33" else 1)
        for probe in probes:
            assert probe.query.get("dryRun") == "All" and probe.name == probe_name(NODE, DRIVER)
            assert probe.path.startswith(f"/apis/resource.k8s.io/{chosen}/")
        assert found.describe()["version"] == f"resource.k8s.io/{chosen}"


def test_a_server_serving_no_version_devplug_speaks_is_refused_naming_what_it_serves(tmp_path: Path) -> None:
    with ApiServer(release="1.34", resource_versions=()) as api:
        lab = Lab(api, tmp_path)

        async def go() -> tuple[str, bool]:
            client = make_client(lab.kubeconfig, field_manager=MANAGER)
            with pytest.raises(DraApiVersionError) as refused:
                await discover_or_close(client, node=NODE, driver=DRIVER, pool=NODE)
            return str(refused.value), client._client._client.is_closed

        message, closed = run(go)
        assert "the API server (Kubernetes v1.34.0) serves no resource.k8s.io version devplug speaks" in message
        assert "it serves none; devplug needs v1, v1beta2 or v1beta1" in message
        assert "--runtime-config=resource.k8s.io/v1beta1=true" in message
        assert closed, "a failed discovery closes its client"
        assert isinstance(DraApiVersionError("x"), KubeApiError)


def test_a_1_32_control_plane_gets_v1beta1_slices_without_taints_from_the_first_write(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "devplug.frontends.dra")
    with ApiServer(release="1.32") as api:
        lab = Lab(api, tmp_path)
        table = table_of(Device("fpga0"), Device("fpga1", health=Health.UNHEALTHY))
        api.create(
            "deviceclasses",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "fpga"},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
            },
        )
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c1"},
            "spec": {"devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": "fpga"}}]}},
        }
        api.create("resourceclaims", claim, NS)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p1"},
            "spec": {"containers": [{"name": "app"}], "resourceClaims": [{"name": "c1", "resourceClaimName": "c1"}]},
        }
        api.create("pods", pod, NS)

        async def go() -> Any:
            client, found = await lab.discover()
            publisher = SlicePublisher(driver=DRIVER, node=NODE, table=table, client=client, debounce=0.01, api=found)
            publisher.start()
            try:
                await eventually(lambda: publisher.state.in_sync, "the slices published")
                assert (publisher.state.api_version, publisher.state.taints) == ("resource.k8s.io/v1beta1", False)
                assert (publisher.state.omitted, publisher.state.tainted, publisher.state.generation) == (1, 0, 1)
                (stored,) = SchedulerStandIn(api.storage).schedule(NS, "p1", NODE)
                reader = ClaimReader(
                    client,
                    driver=DRIVER,
                    pool=NODE,
                    device_id=publisher.device_id,
                    api=found,
                    node=NodeLabels(client, NODE),
                )
                meta = stored["metadata"]
                return await reader.read(ClaimRef(NS, meta["name"], meta["uid"]))
            finally:
                await publisher.shutdown(last_instance=False)
                await client.close()

        allocation = run(go)
        assert allocation.device_ids == ("fpga0",)
        assert list(published(api)) == ["fpga0"], "the unhealthy device is left out, not tainted"
        assert paths(api, "resourceslices") == {"v1beta1"} and paths(api, "resourceclaims") == {"v1beta1"}
        assert api.count(resource="resourceslices", code=500) == 1, "only the dry run met the unknown field"
        assert "dropped the device taints" not in caplog.text


def test_a_v1_server_with_device_taints_off_never_gets_one(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Before discovery the publisher wrote a taint, saw it dropped in the answer and wrote the pool again."""
    caplog.set_level(logging.WARNING, "devplug.frontends.dra")
    with ApiServer(release="1.34") as api:
        lab = Lab(api, tmp_path)
        table = table_of(Device("fpga0"), Device("fpga1", health=Health.UNHEALTHY))

        async def go() -> None:
            client, found = await lab.discover()
            publisher = SlicePublisher(driver=DRIVER, node=NODE, table=table, client=client, debounce=0.01, api=found)
            publisher.start()
            try:
                await eventually(lambda: publisher.state.in_sync, "the slices published")
                assert publisher.state.generation == 1 and publisher.state.taints is False
            finally:
                await publisher.shutdown(last_instance=False)
                await client.close()

        run(go)
        assert list(published(api)) == ["fpga0"]
        writes = [r for r in api.requests if r.verb == "patch" and not r.query.get("dryRun")]
        assert len(writes) == 1, "one write: the pool as it stays"
        assert "dropped the device taints" not in caplog.text


def test_an_upgraded_control_plane_is_found_again_when_the_restart_cuts_the_watch(tmp_path: Path) -> None:
    """1.33 (v1beta2, taints off) restarts as 1.36 (v1 only, taints on): the watch is cut, the resync discovers the
    version again, and the unavailable device, left out so far, is published tainted through v1."""
    with ApiServer(release="1.33") as api:
        lab = Lab(api, tmp_path)
        table = table_of(Device("fpga0"), Device("fpga1", health=Health.UNHEALTHY))

        async def go() -> None:
            client, found = await lab.discover()
            publisher = SlicePublisher(driver=DRIVER, node=NODE, table=table, client=client, debounce=0.01, api=found)
            publisher.start()
            try:
                await eventually(lambda: publisher.state.in_sync and api.count(verb="watch") >= 1, "published, watched")
                assert list(published(api)) == ["fpga0"] and found.version == "v1beta2"
                api.restart(release="1.36")
                await eventually(lambda: "fpga1" in published(api), "the unavailable device published tainted")
                assert published(api)["fpga1"]["taints"][0]["value"] == "unhealthy"
                assert (found.version, found.choice.taints, found.discoveries) == ("v1", True, 2)
                await eventually(lambda: publisher.state.api_version == "resource.k8s.io/v1", "the state says v1")
                await eventually(
                    lambda: any(
                        r.verb == "watch" and r.code == 200 and r.path.startswith("/apis/resource.k8s.io/v1/")
                        for r in api.requests
                    ),
                    "the watch started again through v1",
                )
            finally:
                await publisher.shutdown(last_instance=False)
                await client.close()

        run(go)
        watches = [r.path for r in api.requests if r.verb == "watch" and r.code == 200]
        assert watches[0].startswith("/apis/resource.k8s.io/v1beta2/") and watches[-1].startswith(
            "/apis/resource.k8s.io/v1/"
        )


def test_a_claim_read_that_finds_its_version_gone_discovers_it_again(tmp_path: Path) -> None:
    with ApiServer(release="1.33") as api:
        lab = Lab(api, tmp_path)
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c1"},
            "spec": {"devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": "fpga"}}]}},
        }
        made = api.create("resourceclaims", claim, NS)
        ref = ClaimRef(NS, "c1", made["metadata"]["uid"])

        async def go() -> tuple[str, int, list[str]]:
            client, found = await lab.discover()
            reader = ClaimReader(client, driver=DRIVER, pool=NODE, device_id=lambda n: n, api=found)
            try:
                api.restart(release="1.34")  # v1beta2 gone: the read meets the text 404, discovers v1, reads again
                presence = await reader.presence([ref])
                return found.version, found.discoveries, [p.value for p in presence.values()]
            finally:
                await client.close()

        version, discoveries, presence = run(go)
        assert (version, discoveries, presence) == ("v1", 2, ["deallocated"])
        gets = [r.path.split("/")[3] for r in api.requests if r.verb == "get" and r.resource == "resourceclaims"]
        assert gets == ["v1beta2", "v1"]


def _allocated(api: ApiServer, name: str, selector: dict[str, Any] | None) -> ClaimRef:
    """A claim of device fpga0 in pool NODE, allocated with ``selector`` (None: no node selector)."""
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "dev", "exactly": {"deviceClassName": "fpga"}}]}},
    }
    made = api.create("resourceclaims", claim, NS)
    allocation: dict[str, Any] = {
        "devices": {"results": [{"request": "dev", "driver": DRIVER, "pool": NODE, "device": "fpga0"}]}
    }
    if selector is not None:
        allocation["nodeSelector"] = selector
    api.update("resourceclaims", {**made, "status": {"allocation": allocation}}, NS, "kube-scheduler", "status")
    return ClaimRef(NS, name, made["metadata"]["uid"])


def _by_name(name: str) -> dict[str, Any]:
    return {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [name]}]}]}


def test_a_claim_allocated_for_another_node_is_refused_though_its_pool_matches(tmp_path: Path) -> None:
    with ApiServer() as api:
        lab = Lab(api, tmp_path)
        ours = _allocated(api, "ours", _by_name(NODE))
        theirs = _allocated(api, "theirs", _by_name("node-b"))
        anywhere = _allocated(api, "anywhere", None)  # a network-attached device: no node selector
        rack = {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "example.com/rack", "operator": "In", "values": ["r2"]}]}
            ]
        }
        racked = _allocated(api, "racked", rack)

        async def go() -> dict[str, Any]:
            client = make_client(lab.kubeconfig, field_manager=MANAGER)
            labels = NodeLabels(client, NODE)
            reader = ClaimReader(client, driver=DRIVER, pool=NODE, device_id=lambda n: n, node=labels)
            out: dict[str, Any] = {}
            try:
                out["ours"] = (await reader.read(ours)).device_ids
                out["anywhere"] = (await reader.read(anywhere)).device_ids
                out["reads_by_name"] = labels.reads
                with pytest.raises(ClaimNodeMismatchError) as refused:
                    await reader.read(theirs)
                out["theirs"] = str(refused.value)
                with pytest.raises(ClaimNodeMismatchError) as unlabelled:
                    await reader.read(racked)
                out["racked"] = str(unlabelled.value)
                node_obj = api.get("nodes", NODE)
                node_obj["metadata"]["labels"] = {"example.com/rack": "r2"}
                api.update("nodes", node_obj)  # labelled since: the cached labels say otherwise, a re-read says so
                out["racked_after"] = (await reader.read(racked)).device_ids
                out["reads"] = labels.reads
            finally:
                await client.close()
            return out

        out = run(go)
        assert out["ours"] == ("fpga0",) and out["anywhere"] == ("fpga0",)
        assert out["reads_by_name"] == 0, "a selector of metadata.name alone needs no read of the node"
        assert out["theirs"] == (
            f"resource claim {NS}/theirs (uid {theirs.uid}): allocated for another node: its allocation's node "
            f"selector {{metadata.name In [node-b]}} does not match node {NODE}"
        )
        assert "{example.com/rack In [r2]}" in out["racked"] and "(labels: no example.com/rack)" in out["racked"]
        assert out["racked_after"] == ("fpga0",) and out["reads"] == 3  # read, read again before refusing, again


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ({"nodeSelectorTerms": []}, {}, False),
        ({"nodeSelectorTerms": [{}]}, {}, False),  # an empty term selects nothing
        (
            {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["x"]}]}]},
            {},
            True,
        ),
        ({"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Exists"}]}]}, {"a": ""}, True),
        ({"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}]}, {"a": "1"}, False),
        ({"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}]}, {}, True),
        (
            {"nodeSelectorTerms": [{"matchExpressions": [{"key": "n", "operator": "Gt", "values": ["3"]}]}]},
            {"n": "4"},
            True,
        ),
        (
            {"nodeSelectorTerms": [{"matchExpressions": [{"key": "n", "operator": "Lt", "values": ["3"]}]}]},
            {"n": "x"},
            False,
        ),
        (
            {"nodeSelectorTerms": [{"matchExpressions": [{"key": "n", "operator": "Gt", "values": ["x"]}]}]},
            {"n": "4"},
            False,
        ),
        # terms ORed, requirements ANDed
        (
            {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-b"]}]},
                    {
                        "matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}],
                        "matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}],
                    },
                ]
            },
            {"a": "2"},
            True,
        ),
        ({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "Exists"}]}]}, {}, False),
    ],
)
def test_node_selectors_match_as_the_scheduler_matches_them(
    selector: dict[str, Any], labels: dict[str, str], matches: bool
) -> None:
    assert NodeSelector.parse(selector).matches(NODE, labels) is matches


def test_a_selector_that_does_not_parse_says_why() -> None:
    parsed = NodeSelector.parse(
        {"nodeSelectorTerms": [{"matchExpressions": [{"key": "n", "operator": "Gt", "values": ["x"]}]}]}
    )
    assert parsed.problems() == [
        "nodeSelectorTerms[0].matchExpressions[0].values: for 'Gt', 'Lt' operators, exactly one value, an integer, "
        "is required"
    ]
    assert str(NodeSelector.parse({"nodeSelectorTerms": []})) == "no term (matches no node)"


# --- the daemon


def _status_entry(root: Path) -> dict[str, Any] | None:
    try:
        [entry] = read_status(root / "state")["resources"]
    except (OSError, ValueError, KeyError, StateError):  # not written yet
        return None
    return entry if isinstance(entry, dict) else None


def test_a_daemon_under_a_1_32_control_plane_publishes_through_v1beta1_and_prepares_a_claim() -> None:
    async def scenario() -> None:
        with ApiServer(release="1.32") as api:
            async with dra_node(api, {"mock0": "", "mock1": ""}) as lab:
                await lab.published(2)
                lab.make_claim("c1")
                pod, [claim] = lab.schedule_pod("p1", ["c1"])
                await lab.kubelet.admit_pod(pod)
                assert lab.kubelet.container_cdi_devices("p1", "app") == [
                    f"{MOCK_DRIVER}/claim={claim['metadata']['uid']}-dev"
                ]
                (lab.folder / "mock1").write_text("unhealthy=ECC errors\n")
                await lab.published(1)  # left out: a 1.32 server has no device taints

                def api_shown() -> Any:
                    entry = _status_entry(lab.root)
                    return (entry or {}).get("frontend", {}).get("api")

                shown = await eventually_on_node(api_shown, "the API version in the status", details=lab.log)
                assert shown["version"] == "resource.k8s.io/v1beta1" and shown["served"] == ["v1beta1"]
                assert shown["taints"] is False and "refused the field" in shown["taints_reason"]
                assert paths(api, "resourceslices") == {"v1beta1"} and paths(api, "resourceclaims") == {"v1beta1"}
                await lab.kubelet.finish_pod("p1")

    run(scenario, 120)


def test_a_daemon_under_a_control_plane_without_dra_refuses_to_start_and_starts_once_it_serves_it() -> None:
    async def scenario() -> None:
        with ApiServer(release="1.34", resource_versions=()) as api:
            async with dra_node(api, start=False) as lab:
                lab.start_daemon()

                def refused() -> Any:
                    entry = _status_entry(lab.root)
                    error = (entry or {}).get("last_error") or ""
                    return entry if entry is not None and "serves no resource.k8s.io version" in error else None

                entry = await eventually_on_node(refused, "the refusal in the status", details=lab.log)
                assert entry["state"] == "failed"
                assert "it serves none; devplug needs v1, v1beta2 or v1beta1" in entry["last_error"]
                api.restart(release="1.34")  # the API server restarted with DRA's API: the start's retry finds v1
                await lab.registered()
                await lab.published(3)

    run(scenario, 150)


def test_a_daemon_refuses_a_claim_allocated_for_another_node_naming_it() -> None:
    async def scenario() -> None:
        with ApiServer() as api:
            async with dra_node(api) as lab:
                await lab.published(3)
                made = lab.make_claim("c1")
                status = {
                    "allocation": {
                        "devices": {
                            "results": [{"request": "dev", "driver": MOCK_DRIVER, "pool": NODE, "device": "mock0"}]
                        },
                        "nodeSelector": _by_name("node-b"),
                    }
                }
                api.update("resourceclaims", {**made, "status": status}, NS, "kube-scheduler", "status")
                uid = made["metadata"]["uid"]
                async with grpc.aio.insecure_channel(lab.service_target()) as channel:
                    answer = await v1_grpc.DRAPluginStub(channel).NodePrepareResources(
                        v1.NodePrepareResourcesRequest(claims=[v1.Claim(namespace=NS, name="c1", uid=uid)])
                    )
                error = answer.claims[uid].error
                assert "allocated for another node" in error and f"does not match node {NODE}" in error, error
                assert "metadata.name In [node-b]" in error and f"{NS}/c1" in error
                assert not answer.claims[uid].devices and lab.calls("allocate") == []

    run(scenario, 90)
