"""NodePrepareResources and NodeUnprepareResources called directly on a real daemon's DRA socket, as the kubelet
calls them (v1 and v1beta1): per-claim errors beside prepared claims, repeated calls, unknown claims."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Mapping
from typing import Any

import grpc
import grpc.aio

from devplug.api.gen.dra.v1 import api_pb2 as v1
from devplug.api.gen.dra.v1 import api_pb2_grpc as v1_grpc
from devplug.api.gen.dra.v1beta1 import api_pb2 as v1beta1
from devplug.api.gen.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from devplug.testing.apiserver import ApiServer
from devplug.testing.process import DaemonProcess
from tests.frontends.dra.conftest import NODE, run
from tests.frontends.dra.dranode import DRIVER, NS, DraNode, dra_node, eventually


def _claim(name: str, uid: str, ns: str = NS) -> Any:
    return v1.Claim(namespace=ns, name=name, uid=uid)


def _allocate_by_hand(lab: DraNode, name: str, devices: list[str], pool: str = NODE) -> dict[str, Any]:
    """A claim allocated to ``devices`` of ``pool`` as a scheduler would write it (for what the stand-in never
    does: another pool, a device another claim holds)."""
    claim = lab.make_claim(name, count=len(devices))
    status = {
        "allocation": {
            "devices": {"results": [{"request": "dev", "driver": DRIVER, "pool": pool, "device": d} for d in devices]},
            "nodeSelector": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}]
            },
        }
    }
    return lab.api.update("resourceclaims", {**claim, "status": status}, NS, "kube-scheduler", "status")


def _tainted(lab: DraNode, name: str) -> bool:
    """Whether the published slices show the device tainted (the daemon saw it unhealthy)."""
    return any(d["name"] == name and d.get("taints") for s in lab.slices() for d in s["spec"].get("devices") or ())


def _uid(claim: Mapping[str, Any]) -> str:
    return str(claim["metadata"]["uid"])


def test_each_claim_gets_its_devices_or_its_own_error(api: ApiServer) -> None:
    async def scenario() -> None:
        async with dra_node(api, {"mock0": "", "mock1": "", "mock2": "", "mock3": ""}) as lab:
            await lab.published(4)
            good = _allocate_by_hand(lab, "good", ["mock0"])
            elsewhere = _allocate_by_hand(lab, "elsewhere", ["mock1"], pool="node-b")
            sick = _allocate_by_hand(lab, "sick", ["mock2"])
            (lab.folder / "mock2").write_text("unhealthy=fan stopped\n")
            first = _allocate_by_hand(lab, "first", ["mock3"])
            second = _allocate_by_hand(lab, "second", ["mock3"])
            missing, other = str(uuid.uuid4()), str(uuid.uuid4())
            async with grpc.aio.insecure_channel(lab.service_target()) as channel:
                stub = v1_grpc.DRAPluginStub(channel)
                await stub.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=[_claim("first", _uid(first))]))
                await eventually(lambda: _tainted(lab, "mock2"), "mock2 tainted unavailable in the slices")
                answer = await stub.NodePrepareResources(
                    v1.NodePrepareResourcesRequest(
                        claims=[
                            _claim("good", _uid(good)),
                            _claim("missing", missing),
                            _claim("good", other),
                            _claim("elsewhere", _uid(elsewhere)),
                            _claim("sick", _uid(sick)),
                            _claim("second", _uid(second)),
                        ]
                    )
                )
            claims = answer.claims
            assert set(claims) == {_uid(good), missing, other, _uid(elsewhere), _uid(sick), _uid(second)}
            [dev] = claims[_uid(good)].devices
            assert claims[_uid(good)].error == ""
            assert (list(dev.request_names), dev.pool_name, dev.device_name) == (["dev"], NODE, "mock0")
            assert list(dev.cdi_device_ids) == [f"{DRIVER}/claim={_uid(good)}-dev"]
            assert "not found" in claims[missing].error and "default/missing" in claims[missing].error
            assert other in claims[other].error and _uid(good) in claims[other].error
            assert f"driver {DRIVER} in pool {NODE}" in claims[_uid(elsewhere)].error
            assert "node-b" in claims[_uid(elsewhere)].error
            assert "mock2" in claims[_uid(sick)].error and "unhealthy" in claims[_uid(sick)].error
            assert "held by claim default/first" in claims[_uid(second)].error
            for uid in (missing, other, _uid(elsewhere), _uid(sick), _uid(second)):
                assert not claims[uid].devices, uid
            assert sorted(tuple(c["device_ids"]) for c in lab.calls("allocate")) == [("mock0",), ("mock3",)]
            assert sorted(r["claim"] for r in lab.records()) == ["default/first", "default/good"]

    run(scenario, 90)


def test_prepare_and_unprepare_are_idempotent_through_both_versions(api: ApiServer) -> None:
    async def scenario() -> None:
        async with dra_node(api) as lab:
            await lab.published(3)
            claim = _allocate_by_hand(lab, "c", ["mock1"])
            uid = _uid(claim)
            async with grpc.aio.insecure_channel(lab.service_target()) as channel:
                stub = v1_grpc.DRAPluginStub(channel)
                beta = v1beta1_grpc.DRAPluginStub(channel)
                request = v1.NodePrepareResourcesRequest(claims=[_claim("c", uid)])
                first = await stub.NodePrepareResources(request)
                again = await stub.NodePrepareResources(request)
                old = await beta.NodePrepareResources(
                    v1beta1.NodePrepareResourcesRequest(claims=[v1beta1.Claim(namespace=NS, name="c", uid=uid)])
                )
                assert first == again
                assert [(d.device_name, list(d.cdi_device_ids)) for d in old.claims[uid].devices] == [
                    (d.device_name, list(d.cdi_device_ids)) for d in first.claims[uid].devices
                ]
                assert len(lab.calls("allocate")) == 1

                never = str(uuid.uuid4())
                undo = v1.NodeUnprepareResourcesRequest(claims=[_claim("c", uid), _claim("never", never)])
                done = await stub.NodeUnprepareResources(undo)
                assert {k: v.error for k, v in done.claims.items()} == {uid: "", never: ""}
                done = await beta.NodeUnprepareResources(
                    v1beta1.NodeUnprepareResourcesRequest(claims=[v1beta1.Claim(namespace=NS, name="c", uid=uid)])
                )
                assert done.claims[uid].error == ""
            assert [c["device_ids"] for c in lab.calls("post_stop")] == [["mock1"]]
            assert [c["device_ids"] for c in lab.calls("deallocate")] == [["mock1"]]
            assert lab.records() == []

    run(scenario, 90)


def test_a_failing_release_is_the_claims_unprepare_error_and_is_retried(api: ApiServer) -> None:
    async def scenario() -> None:
        async with dra_node(api) as lab:
            await lab.published(3)
            claim = _allocate_by_hand(lab, "c", ["mock0"])
            uid = _uid(claim)
            async with grpc.aio.insecure_channel(lab.service_target()) as channel:
                stub = v1_grpc.DRAPluginStub(channel)
                await stub.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=[_claim("c", uid)]))
                (lab.folder / "mock0").write_text("fail=deallocate\n")
                done = await stub.NodeUnprepareResources(v1.NodeUnprepareResourcesRequest(claims=[_claim("c", uid)]))
                assert "mock0" in done.claims[uid].error and "releasing its devices failed" in done.claims[uid].error
                [record] = lab.records()
                assert record["releasing"] is True
                (lab.folder / "mock0").write_text("")
                await eventually(lambda: lab.records() == [], "the release retried until it succeeded", details=lab.log)
                done = await stub.NodeUnprepareResources(v1.NodeUnprepareResourcesRequest(claims=[_claim("c", uid)]))
                assert done.claims[uid].error == ""
            assert [c["device_ids"] for c in lab.calls("post_stop")] == [["mock0"]]
            assert [c.get("retry", False) for c in lab.calls("deallocate")][-1] is True

    run(scenario, 90)


def test_an_api_server_that_fails_the_read_is_that_claims_error_and_the_kubelets_retry_prepares_it(
    api: ApiServer,
) -> None:
    async def scenario() -> None:
        async with dra_node(api) as lab:
            await lab.published(3)
            claim = _allocate_by_hand(lab, "c", ["mock2"])
            uid = _uid(claim)
            async with grpc.aio.insecure_channel(lab.service_target()) as channel:
                stub = v1_grpc.DRAPluginStub(channel)
                request = v1.NodePrepareResourcesRequest(claims=[_claim("c", uid)])
                api.faults.fail(503, verb="get", resource="resourceclaims")
                failed = await stub.NodePrepareResources(request)
                assert "default/c" in failed.claims[uid].error and "503" in failed.claims[uid].error
                assert not failed.claims[uid].devices and lab.calls("allocate") == [] and lab.records() == []
                again = await stub.NodePrepareResources(request)
                assert again.claims[uid].error == ""
                assert [d.device_name for d in again.claims[uid].devices] == ["mock2"]

    run(scenario, 90)


def test_each_request_of_a_claim_is_a_cdi_device_of_its_own_devices(api: ApiServer) -> None:
    async def scenario() -> None:
        async with dra_node(api) as lab:
            await lab.published(3)
            spec = {
                "devices": {
                    "requests": [
                        {"name": req, "exactly": {"deviceClassName": lab.device_class, "count": n}}
                        for req, n in (("one", 1), ("two", 2))
                    ]
                }
            }
            body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"}}
            claim = lab.api.create("resourceclaims", {**body, "spec": spec}, NS)
            results = [
                {"request": req, "driver": DRIVER, "pool": NODE, "device": dev}
                for req, dev in (("one", "mock0"), ("two", "mock1"), ("two", "mock2"))
            ]
            status = {"allocation": {"devices": {"results": results}}}
            claim = lab.api.update("resourceclaims", {**claim, "status": status}, NS, "kube-scheduler", "status")
            uid = _uid(claim)
            async with grpc.aio.insecure_channel(lab.service_target()) as channel:
                answer = await v1_grpc.DRAPluginStub(channel).NodePrepareResources(
                    v1.NodePrepareResourcesRequest(claims=[_claim("c", uid)])
                )
            devices = [
                (list(d.request_names), d.device_name, list(d.cdi_device_ids)) for d in answer.claims[uid].devices
            ]
            assert devices == [
                (["one"], "mock0", [f"{DRIVER}/claim={uid}-one"]),
                (["two"], "mock1", [f"{DRIVER}/claim={uid}-two"]),
                (["two"], "mock2", []),  # the request's CDI device is named once: the kubelet gathers by request
            ]
            by_name = {d["name"]: d["containerEdits"] for d in lab.spec_of(uid)["devices"]}
            assert sorted(by_name) == [f"{uid}-one", f"{uid}-two"]
            one, two = by_name[f"{uid}-one"], by_name[f"{uid}-two"]
            assert [n["path"] for n in one["deviceNodes"]] == ["/dev/mock/mock0"]
            assert [n["path"] for n in two["deviceNodes"]] == ["/dev/mock/mock1", "/dev/mock/mock2"]
            # the driver's allocate answers once for the claim: every request gets that part
            assert "MOCK_DEVICES=mock0,mock1,mock2" in one["env"] and "MOCK_DEVICES=mock0,mock1,mock2" in two["env"]

    run(scenario, 90)


def test_a_claim_recorded_before_a_crash_but_never_given_its_cdi_spec_is_prepared_afresh(api: ApiServer) -> None:
    """A daemon killed between the ledger's record of a claim and the claim's CDI spec never answered the kubelet,
    which asks again: the claim is not answered as prepared without its CDI devices (its container would start
    without them) but released and prepared afresh."""

    async def scenario() -> None:
        async with dra_node(api) as lab:
            await lab.published(3)
            claim = _allocate_by_hand(lab, "c", ["mock1"])
            uid = _uid(claim)
            request = v1.NodePrepareResourcesRequest(claims=[_claim("c", uid)])
            async with grpc.aio.insecure_channel(lab.service_target()) as channel:
                first = await v1_grpc.DRAPluginStub(channel).NodePrepareResources(request)
            [device] = first.claims[uid].devices
            assert list(device.cdi_device_ids), "the mock's devices describe what a container gets"
            assert lab.daemon is not None
            os.kill(lab.daemon.pid, signal.SIGKILL)
            lab.daemon.wait(10.0)
            written = [p for p in lab.root.rglob(f"*{uid}*.json")]  # the spec and its kept copy
            assert len(written) == 2, written
            for path in written:  # as if the run had ended before writing them
                path.unlink()
            old = lab.service_target()
            lab.daemon = DaemonProcess(lab.config_path, lab.root / "daemon-2.log", env=lab.env).start()

            def new_endpoint() -> str | None:
                views = [v for v in lab.kubelet.dra_plugins(DRIVER) if v.connected and f"unix:{v.endpoint}" != old]
                return f"unix:{views[0].endpoint}" if len(views) == 1 else None

            target = await eventually(new_endpoint, "the restarted daemon connected", details=lab.daemon.log_text)
            async with grpc.aio.insecure_channel(target) as channel:
                again = await v1_grpc.DRAPluginStub(channel).NodePrepareResources(request)
            assert again.claims[uid].error == ""
            assert [list(d.cdi_device_ids) for d in again.claims[uid].devices] == [list(device.cdi_device_ids)]
            assert all(p.exists() for p in written), "the spec and its kept copy written this time"
            hooks = [c["hook"] for c in lab.calls() if c["hook"] in ("allocate", "post_stop", "deallocate")]
            assert hooks == ["allocate", "post_stop", "deallocate", "allocate"], hooks
            assert "prepare ended before its CDI spec was written" in lab.daemon.log_text()

    run(scenario, 90)
