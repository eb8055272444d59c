"""Issue 41, KEP-5075 on the node: claims' shares of a device published with consumable capacity, prepared on a real
daemon through its DRA socket as the kubelet calls it (the mock's ``mock0`` shared by 4, published as one device).

Each claim's allocation is written as kube-scheduler's allocator writes it for such a device (a ``shareID`` and
``consumedCapacity`` per result: ``allocateDevice`` in
``k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go``), through the
stand-in's status subresource, so a test can also give the node more shares than it has (the scheduler's view and the
node's differ)."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import grpc
import grpc.aio

from devplug.api.gen.dra.v1 import api_pb2 as v1
from devplug.api.gen.dra.v1 import api_pb2_grpc as v1_grpc
from devplug.testing.apiserver import ApiServer
from devplug.testing.process import DaemonProcess
from tests.frontends.dra.conftest import NODE, run
from tests.frontends.dra.dranode import DRIVER, NS, DraNode, allocated_by_hand, dra_node, eventually

SHARED = {"mock0": "replicas=4\n", "mock1": ""}


def _claim(name: str, uid: str) -> Any:
    return v1.Claim(namespace=NS, name=name, uid=uid)


def _uid(claim: Mapping[str, Any]) -> str:
    return str(claim["metadata"]["uid"])


def unprepare(name: str, claim: Mapping[str, Any]) -> Any:
    return v1.NodeUnprepareResourcesRequest(claims=[_claim(name, _uid(claim))])


def allocate_shares(
    lab: DraNode, name: str, shares: list[str], device: str = "mock0"
) -> tuple[dict[str, Any], list[str]]:
    """A claim given one share of ``device`` per amount in ``shares`` (each its own shareID); the claim and the
    share IDs."""
    claim = lab.make_claim(name, count=len(shares))
    ids = [str(uuid.uuid4()) for _ in shares]
    results = [
        {
            "request": "dev",
            "driver": DRIVER,
            "pool": NODE,
            "device": device,
            "shareID": share,
            "consumedCapacity": {"shares": amount},
        }
        for share, amount in zip(ids, shares, strict=True)
    ]
    stored = allocated_by_hand(lab, claim, results)
    assert [r.get("shareID") for r in stored["status"]["allocation"]["devices"]["results"]] == ids, (
        "the stand-in kept the shares (DRAConsumableCapacity on)"
    )
    return stored, ids


def held(lab: DraNode) -> dict[str, list[str]]:
    """Each prepared claim's devices, from the ledger a restarted daemon would load."""
    return {str(r["claim"]): sorted(r["devices"]) for r in lab.records()}


async def restarted(lab: DraNode, meanwhile: Callable[[], object] = lambda: None) -> str:
    """Kill the daemon with SIGKILL, call ``meanwhile`` and start it again; the new instance's service target."""
    assert lab.daemon is not None
    old = lab.service_target()
    os.kill(lab.daemon.pid, signal.SIGKILL)
    lab.daemon.wait(10.0)
    meanwhile()
    lab.daemon = DaemonProcess(lab.config_path, lab.root / "daemon-2.log", env=lab.env).start()

    def new_endpoint() -> str | None:
        views = [v for v in lab.kubelet.dra_plugins(DRIVER) if v.connected and f"unix:{v.endpoint}" != old]
        return f"unix:{views[0].endpoint}" if len(views) == 1 else None

    target: str = await eventually(new_endpoint, "the restarted daemon connected", details=lab.daemon.log_text)
    return target


def _published_whole(lab: DraNode) -> dict[str, Any]:
    [device] = [d for s in lab.slices() for d in s["spec"].get("devices") or () if d["name"] == "mock0"]
    return dict(device)


def test_two_claims_of_two_shares_get_distinct_replicas_and_a_third_is_refused_as_over_consumed(
    api: ApiServer,
) -> None:
    async def scenario() -> None:
        async with dra_node(api, SHARED) as lab:
            await lab.published(2)
            device = _published_whole(lab)
            assert device.get("allowMultipleAllocations") is True, device  # the consumable form (discovered)
            a, [share_a] = allocate_shares(lab, "a", ["2"])
            b, [share_b] = allocate_shares(lab, "b", ["2"])
            c, [share_c] = allocate_shares(lab, "c", ["1"])
            async with grpc.aio.insecure_channel(lab.service_target()) as channel:
                stub = v1_grpc.DRAPluginStub(channel)
                answer = await stub.NodePrepareResources(
                    v1.NodePrepareResourcesRequest(claims=[_claim("a", _uid(a)), _claim("b", _uid(b))])
                )
                refused = await stub.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=[_claim("c", _uid(c))]))
            for claim, share in ((a, share_a), (b, share_b)):
                entry = answer.claims[_uid(claim)]
                assert entry.error == "", entry.error
                [dev] = entry.devices
                assert (dev.device_name, dev.pool_name, dev.share_id) == ("mock0", NODE, share)
            [spec_a] = lab.spec_of(_uid(a))["devices"]
            assert [d["path"] for d in spec_a["containerEdits"]["deviceNodes"]] == ["/dev/mock/mock0"], spec_a
            replicas = held(lab)
            assert sorted(replicas) == ["default/a", "default/b"]
            assert sorted(replicas["default/a"] + replicas["default/b"]) == [f"mock0::{k}" for k in range(4)]
            assert len(replicas["default/a"]) == len(replicas["default/b"]) == 2
            error = refused.claims[_uid(c)].error
            assert "over-consumed" in error and f"share {share_c} of device mock0" in error, error
            assert "0 of its 4 are free" in error and "default/c" in error, error
            assert not refused.claims[_uid(c)].devices
            assert len(lab.calls("allocate")) == 2, "the over-consumed claim ran no hook"
            assert [c["device_ids"] for c in lab.calls("allocate")] == [["mock0"], ["mock0"]]

    run(scenario, 120)


def test_a_share_prepared_again_and_after_a_kill_keeps_its_replicas_and_the_device_is_cleaned_after_its_last(
    api: ApiServer,
) -> None:
    async def scenario() -> None:
        async with dra_node(api, SHARED) as lab:
            await lab.published(2)
            a, [share_a] = allocate_shares(lab, "a", ["2"])
            b, _ = allocate_shares(lab, "b", ["1"])
            prepare_a = v1.NodePrepareResourcesRequest(claims=[_claim("a", _uid(a))])
            async with grpc.aio.insecure_channel(lab.service_target()) as channel:
                stub = v1_grpc.DRAPluginStub(channel)
                first = await stub.NodePrepareResources(prepare_a)
                await stub.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=[_claim("b", _uid(b))]))
                again = await stub.NodePrepareResources(prepare_a)
            assert first == again and first.claims[_uid(a)].devices[0].share_id == share_a
            before = held(lab)
            assert before == {"default/a": ["mock0::0", "mock0::1"], "default/b": ["mock0::2"]}
            target = await restarted(lab)
            async with grpc.aio.insecure_channel(target) as channel:
                stub = v1_grpc.DRAPluginStub(channel)
                after_kill = await stub.NodePrepareResources(prepare_a)
                assert after_kill == first, "the kubelet's repeated call after a restart: the same answer"
                assert held(lab) == before, "the same replicas"
                assert len(lab.calls("allocate")) == 2
                done = await stub.NodeUnprepareResources(
                    v1.NodeUnprepareResourcesRequest(claims=[_claim("a", _uid(a))])
                )
                assert done.claims[_uid(a)].error == ""
                assert held(lab) == {"default/b": ["mock0::2"]}
                assert [c["device_ids"] for c in lab.calls("post_stop")] == [["mock0"]]
                assert lab.calls("deallocate") == [], "mock0 is still shared by claim b: not cleaned"
                done = await stub.NodeUnprepareResources(
                    v1.NodeUnprepareResourcesRequest(claims=[_claim("b", _uid(b))])
                )
                assert done.claims[_uid(b)].error == ""
            assert lab.records() == []
            assert [c["device_ids"] for c in lab.calls("deallocate")] == [["mock0"]], "cleaned after its last share"

    run(scenario, 120)


def test_shares_the_scheduler_stand_in_allocated_are_prepared_on_distinct_replicas(api: ApiServer) -> None:
    """The allocation as the scheduler stand-in makes it from the published slices (the request's amount in
    ``exactly.capacity.requests``), prepared as the kubelet asks for each pod's claim."""

    async def scenario() -> None:
        async with dra_node(api, SHARED) as lab:
            await lab.published(2)
            for name in ("a", "b"):
                exactly = {"deviceClassName": lab.device_class, "count": 1, "capacity": {"requests": {"shares": "2"}}}
                spec = {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}}
                body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name}}
                lab.api.create("resourceclaims", {**body, "spec": spec}, NS)
            claims = [lab.schedule_pod(f"p-{name}", [name])[1][0] for name in ("a", "b")]
            results = [c["status"]["allocation"]["devices"]["results"][0] for c in claims]
            assert [(r["device"], r["consumedCapacity"]) for r in results] == [("mock0", {"shares": "2"})] * 2
            async with grpc.aio.insecure_channel(lab.service_target()) as channel:
                stub = v1_grpc.DRAPluginStub(channel)
                for claim, result in zip(claims, results, strict=True):
                    name = claim["metadata"]["name"]
                    answer = await stub.NodePrepareResources(
                        v1.NodePrepareResourcesRequest(claims=[_claim(name, _uid(claim))])
                    )
                    [dev] = answer.claims[_uid(claim)].devices
                    assert (dev.device_name, dev.share_id) == ("mock0", result["shareID"])
            replicas = held(lab)
            assert sorted(replicas["default/a"] + replicas["default/b"]) == [f"mock0::{k}" for k in range(4)]

    run(scenario, 120)
