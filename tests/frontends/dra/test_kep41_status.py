"""Device status in the claim (KEP-4817), through a real daemon and the API server stand-in: what the mock's
``allocate`` says of its devices (``device_status`` option) is written into the claim's ``status.devices`` by
server-side apply as the DRA driver's field manager, written again after a ``kill -9`` and a repeated prepare,
removed at unprepare while another driver's entry stays; an entry the server refuses (422) does not fail the
prepare, and a server that drops the field is noted once and not written to again."""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpc.aio

from devplug.api.gen.dra.v1 import api_pb2 as v1
from devplug.api.gen.dra.v1 import api_pb2_grpc as v1_grpc
from devplug.cli.statusview import format_status
from devplug.daemon.status import read_status
from devplug.testing.apiserver import ApiServer
from devplug.testing.dranode import dra_node as node_with
from devplug.testing.process import DaemonProcess
from devplug_mock.features import mock_network_data
from tests.frontends.dra.conftest import NODE, run
from tests.frontends.dra.dranode import DRIVER, NS, RESOURCE, DraNode, allocated_by_hand, eventually, short_root

#: Another DRA driver of the same claims, writing its own entry of ``status.devices``.
OTHER = "gpu.other.example.com"
OTHER_POOL = "other-pool"


@contextlib.asynccontextmanager
async def _node(
    api: ApiServer, mode: str, devices: Mapping[str, str] | None = None, published: int = 3
) -> AsyncIterator[DraNode]:
    """A node serving the mock (``devices``: file name -> content, default three plain ones), whose ``allocate``
    returns a device status per device (``device_status = mode``), once ``published`` devices are."""
    with short_root() as scratch:
        folder = scratch / "mock"
        folder.mkdir()
        for name, content in (devices or {f"mock{i}": "" for i in range(3)}).items():
            (folder / name).write_text(content)
        table = {"driver": "mock", "options": {"directory": str(folder), "device_status": mode}}
        async with node_with(api, RESOURCE, table, folder, driver=DRIVER) as node:
            await node.published(published)
            yield node


def _allocate(
    lab: DraNode, name: str, devices: list[str], *, other: bool = False, shares: Mapping[str, str] | None = None
) -> str:
    """A claim allocated to ``devices`` of this node (and, with ``other``, a device of another driver), as the
    scheduler writes it (``shares``: each result's shareID, by index, with one share consumed); its UID."""
    claim = lab.make_claim(name, count=len(devices))
    results: list[dict[str, Any]] = [{"request": "dev", "driver": DRIVER, "pool": NODE, "device": d} for d in devices]
    for index, share in (shares or {}).items():
        results[int(index)].update(shareID=share, consumedCapacity={"shares": "1"})
    if other:
        results.append({"request": "dev", "driver": OTHER, "pool": OTHER_POOL, "device": "gpu0"})
    stored = allocated_by_hand(lab, claim, results)
    return str(stored["metadata"]["uid"])


def _entries(lab: DraNode, name: str, driver: str = DRIVER) -> list[dict[str, Any]]:
    devices = (lab.api.get("resourceclaims", name, NS).get("status") or {}).get("devices") or ()
    return [d for d in devices if d.get("driver") == driver]


def _owners(lab: DraNode, name: str) -> dict[str, str]:
    """Each field manager of the claim's status subresource, and how it wrote (Apply, Update)."""
    fields = lab.api.get("resourceclaims", name, NS)["metadata"].get("managedFields") or ()
    return {f["manager"]: f["operation"] for f in fields if f.get("subresource") == "status"}


def _claim_status(lab: DraNode) -> dict[str, Any]:
    """The DRA front end's ``claim_status`` in the daemon's status file."""
    [entry] = read_status(lab.root / "state")["resources"]
    shown: dict[str, Any] = entry.get("frontend", {}).get("claim_status") or {}
    return shown


def _other_writes_its_entry(lab: DraNode, name: str) -> None:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "status": {"devices": [{"driver": OTHER, "pool": OTHER_POOL, "device": "gpu0", "data": {"gpu": "ready"}}]},
    }
    lab.api.apply("resourceclaims", body, OTHER, NS, force=True, subresource="status")


def _remove_ours_by_hand(lab: DraNode, name: str) -> None:
    """Someone (an admin's update of the status) takes this driver's entries out."""
    claim = lab.api.get("resourceclaims", name, NS)
    status = dict(claim["status"])
    status["devices"] = [d for d in status.get("devices") or () if d.get("driver") != DRIVER]
    lab.api.update("resourceclaims", {**claim, "status": status}, NS, "an-admin", "status")


async def _restart_after_kill_9(lab: DraNode, run_number: int, *, killed: bool = False) -> None:
    """``kill -9`` the daemon (unless the test ``killed`` it already) and start it again; returns once the kubelet
    has the new instance connected."""
    assert lab.daemon is not None
    if not killed:
        os.kill(lab.daemon.pid, signal.SIGKILL)
        lab.daemon.wait(10.0)
    old = lab.service_target()
    lab.daemon = DaemonProcess(lab.config_path, lab.root / f"daemon-{run_number}.log", env=lab.env).start()

    def connected() -> bool:
        return any(v.connected and f"unix:{v.endpoint}" != old for v in lab.kubelet.dra_plugins(DRIVER))

    await eventually(connected, "the restarted daemon connected", details=lab.log)
    await eventually(lambda: lab.service_target() != old, "the old socket gone", details=lab.log)


async def _prepare(lab: DraNode, name: str, uid: str) -> Any:
    async with grpc.aio.insecure_channel(lab.service_target()) as channel:
        request = v1.NodePrepareResourcesRequest(claims=[v1.Claim(namespace=NS, name=name, uid=uid)])
        answer = await v1_grpc.DRAPluginStub(channel).NodePrepareResources(request)
    assert answer.claims[uid].error == "", answer.claims[uid].error
    return answer.claims[uid]


async def _unprepare(lab: DraNode, name: str, uid: str) -> None:
    async with grpc.aio.insecure_channel(lab.service_target()) as channel:
        request = v1.NodeUnprepareResourcesRequest(claims=[v1.Claim(namespace=NS, name=name, uid=uid)])
        answer = await v1_grpc.DRAPluginStub(channel).NodeUnprepareResources(request)
    assert answer.claims[uid].error == "", answer.claims[uid].error


def _expected(device: str) -> Mapping[str, Any]:
    net = mock_network_data(device)
    return {
        "networkData": {
            "interfaceName": net.interface_name,
            "ips": list(net.ips),
            "hardwareAddress": net.hardware_address,
        },
        "data": {"mockDevice": device, "tenant": f"{NS}/c"},
    }


def test_status_is_written_as_the_driver_and_removed_at_unprepare_leaving_another_drivers(api: ApiServer) -> None:
    async def scenario() -> None:
        async with _node(api, "network") as lab:
            uid = _allocate(lab, "c", ["mock0", "mock2"], other=True)
            _other_writes_its_entry(lab, "c")
            await _prepare(lab, "c", uid)
            entries = await eventually(lambda: len(_entries(lab, "c")) == 2 and _entries(lab, "c"), "our 2 entries")
            by_device = {e["device"]: e for e in entries}
            assert sorted(by_device) == ["mock0", "mock2"]
            for device, entry in by_device.items():
                assert entry["pool"] == NODE and "shareID" not in entry
                assert entry["networkData"] == _expected(device)["networkData"]
                assert entry["data"] == _expected(device)["data"]
                [ready] = entry["conditions"]
                assert (ready["type"], ready["status"]) == ("Ready", "True")
                assert ready["lastTransitionTime"].endswith("Z") and ready["reason"]
            owners = _owners(lab, "c")
            assert owners[DRIVER] == "Apply" and owners[OTHER] == "Apply", owners
            assert len(_entries(lab, "c", OTHER)) == 1

            await _unprepare(lab, "c", uid)
            await eventually(lambda: not _entries(lab, "c"), "our entries removed", details=lab.log)
            assert _entries(lab, "c", OTHER) == [
                {"driver": OTHER, "pool": OTHER_POOL, "device": "gpu0", "data": {"gpu": "ready"}}
            ]
            await eventually(lambda: "removed the device status" in lab.log(), "the removal logged", details=lab.log)
            shown = await eventually(lambda: _claim_status(lab).get("removed") == 1 and _claim_status(lab), "status")
            assert (shown["written"], shown["failures"], shown["invalid"], shown["unsupported"]) == (1, 0, 0, None)
            text = format_status(read_status(lab.root / "state"))
            assert "claims' device status: 1 written, 1 removed, 0 pending, 0 given up, 0 refused as invalid" in text
            assert not list((lab.state_dir / "dra-claim-status").glob("*.json")), "the kept entries are dropped"

    run(scenario, 120)


def test_status_is_written_again_after_kill_9_and_a_repeated_prepare_and_removed_after_a_restart(
    api: ApiServer,
) -> None:
    async def scenario() -> None:
        async with _node(api, "ready") as lab:
            uid = _allocate(lab, "c", ["mock1"])
            await _prepare(lab, "c", uid)
            [first] = await eventually(lambda: _entries(lab, "c"), "the entry written")
            _remove_ours_by_hand(lab, "c")
            await _restart_after_kill_9(lab, 2)  # the restarted daemon writes the entries of the claims it holds again
            assert await eventually(lambda: _entries(lab, "c"), "the entry written at start", details=lab.log) == [
                first
            ], "the kept entry, its lastTransitionTime too"
            _remove_ours_by_hand(lab, "c")
            await _prepare(lab, "c", uid)  # the kubelet repeats the prepare: the entry is written again
            await eventually(lambda: _entries(lab, "c") == [first], "the entry written again", details=lab.log)
            assert len(lab.calls("allocate")) == 1

            await _restart_after_kill_9(lab, 3)
            await _unprepare(lab, "c", uid)
            await eventually(lambda: not _entries(lab, "c"), "the entry removed after the restart", details=lab.log)

    run(scenario, 150)


def test_a_prepare_killed_before_its_status_was_kept_gets_it_from_the_ledger_when_the_kubelet_asks_again(
    api: ApiServer,
) -> None:
    """A run killed after the ledger's confirmation of a claim and before it kept the claim's status never answered
    the kubelet, which asks again: the confirmation journalled what ``allocate`` said of the devices, so the
    repeated prepare writes it (found by the issue 41 churn test: the status was lost)."""

    def as_if_never_kept(entry: Mapping[str, Any]) -> dict[str, Any]:
        return {**entry, "conditions": [{**c, "lastTransitionTime": None} for c in entry.get("conditions") or ()]}

    async def scenario() -> None:
        async with _node(api, "network") as lab:
            uid = _allocate(lab, "c", ["mock1"])
            await _prepare(lab, "c", uid)
            [first] = await eventually(lambda: _entries(lab, "c"), "the entry written")
            assert lab.daemon is not None
            os.kill(lab.daemon.pid, signal.SIGKILL)
            lab.daemon.wait(10.0)
            [kept] = list(lab.root.rglob(f"dra-claim-status/{uid}.json"))
            kept.unlink()  # as if the run had ended before keeping it (and so before writing it)
            _remove_ours_by_hand(lab, "c")
            await _restart_after_kill_9(lab, 2, killed=True)
            await _prepare(lab, "c", uid)  # the kubelet had no answer: it asks again
            [again] = await eventually(lambda: _entries(lab, "c"), "the entry written from the ledger", details=lab.log)
            assert as_if_never_kept(again) == as_if_never_kept(first)
            assert len(lab.calls("allocate")) == 1, "answered from the ledger's record, not prepared again"
            await _unprepare(lab, "c", uid)
            await eventually(lambda: not _entries(lab, "c"), "the entry removed", details=lab.log)

    run(scenario, 120)


def test_the_status_of_a_claim_deleted_without_an_unprepare_goes_with_it(api: ApiServer) -> None:
    """A claim deleted while the daemon was down is found gone by the reconciliation, which releases its devices
    once its pods are gone: its kept status goes at once (the deleted claim took its entries with it)."""

    async def scenario() -> None:
        async with _node(api, "ready") as lab:
            uid = _allocate(lab, "c", ["mock1"])
            await _prepare(lab, "c", uid)
            await eventually(lambda: _entries(lab, "c"), "the entry written")
            [kept] = list(lab.root.rglob(f"dra-claim-status/{uid}.json"))
            assert lab.daemon is not None
            os.kill(lab.daemon.pid, signal.SIGKILL)
            lab.daemon.wait(10.0)
            lab.api.delete("resourceclaims", "c", NS)
            await _restart_after_kill_9(lab, 2, killed=True)
            await eventually(lambda: not kept.exists(), "the kept status dropped", details=lab.log)
            await eventually(lambda: not lab.records(), "the claim's devices released", details=lab.log)

    run(scenario, 120)


def test_a_status_the_server_refuses_does_not_fail_the_prepare(api: ApiServer) -> None:
    async def scenario() -> None:
        async with _node(api, "invalid") as lab:
            uid = _allocate(lab, "c", ["mock0"])
            prepared = await _prepare(lab, "c", uid)
            assert [d.device_name for d in prepared.devices] == ["mock0"]
            line = await eventually(
                lambda: next((ln for ln in lab.log().splitlines() if "refused the device status" in ln), None),
                "the refusal logged",
                details=lab.log,
            )
            assert "mock0" in line and f"{NS}/c" in line and uid in line, line
            assert _entries(lab, "c") == []
            shown = await eventually(lambda: _claim_status(lab).get("invalid") == 1 and _claim_status(lab), "shown")
            assert "mock0" in shown["last_error"] and "invalid" in shown["last_error"]
            await _unprepare(lab, "c", uid)
            assert lab.log().count("refused the device status") == 1

    run(scenario, 120)


def test_a_server_that_drops_the_status_is_noted_once_and_not_written_to_again() -> None:
    async def scenario(api: ApiServer) -> None:
        async with _node(api, "ready") as lab:
            first = _allocate(lab, "a", ["mock0"])
            second = _allocate(lab, "b", ["mock1"])
            await _prepare(lab, "a", first)
            await eventually(
                lambda: "DRAResourceClaimDeviceStatus is off" in lab.log(), "the gate noted", details=lab.log
            )
            await _prepare(lab, "b", second)
            await _unprepare(lab, "a", first)
            await _unprepare(lab, "b", second)
            log = lab.log()
            assert log.count("DRAResourceClaimDeviceStatus is off") == 1, log
            assert "wrote the device status" not in log
            assert _entries(lab, "a") == [] and _entries(lab, "b") == []
            assert "Traceback" not in log
            shown = await eventually(lambda: _claim_status(lab).get("unsupported"), "the gate in the status")
            assert "DRAResourceClaimDeviceStatus is off" in shown
            assert "claims' device status: NOT WRITTEN" in format_status(read_status(lab.root / "state"))

    with ApiServer(disabled_features={"DRAResourceClaimDeviceStatus"}) as gated:
        run(lambda: scenario(gated), 120)


def test_each_share_of_a_consumable_device_gets_its_entry_with_its_share_id(api: ApiServer) -> None:
    """``mock0`` shared by 4, published as one device with consumable capacity (1.36): a claim of two of its shares
    gets two entries of ``mock0``, one per shareID, both with the status the driver gave the physical device."""

    async def scenario() -> None:
        async with _node(api, "ready", {"mock0": "replicas=4\n", "mock1": ""}, published=2) as lab:
            ids = [str(uuid.uuid4()), str(uuid.uuid4())]
            uid = _allocate(lab, "c", ["mock0", "mock0"], shares={"0": ids[0], "1": ids[1]})
            await _prepare(lab, "c", uid)
            entries = await eventually(lambda: len(_entries(lab, "c")) == 2 and _entries(lab, "c"), "two entries")
            assert sorted(e["shareID"] for e in entries) == sorted(ids)
            assert {e["device"] for e in entries} == {"mock0"}
            assert all(e["data"] == {"mockDevice": "mock0", "tenant": f"{NS}/c"} for e in entries), entries
            await _unprepare(lab, "c", uid)
            await eventually(lambda: not _entries(lab, "c"), "both entries removed", details=lab.log)

    run(scenario, 120)


def test_each_replica_of_a_device_published_as_n_devices_gets_its_entry() -> None:
    """Without ``DRAConsumableCapacity`` ``mock0`` is published as its 4 replicas: a claim of two of them gets an
    entry for each replica's device name, with the status the driver gave ``mock0``."""

    async def scenario(api: ApiServer) -> None:
        async with _node(api, "ready", {"mock0": "replicas=4\n", "mock1": ""}, published=5) as lab:
            names = sorted(d["name"] for s in lab.slices() for d in s["spec"]["devices"] if d["name"] != "mock1")[:2]
            uid = _allocate(lab, "c", names)
            await _prepare(lab, "c", uid)
            entries = await eventually(lambda: len(_entries(lab, "c")) == 2 and _entries(lab, "c"), "two entries")
            assert sorted(e["device"] for e in entries) == names
            assert all("shareID" not in e and e["data"]["mockDevice"] == "mock0" for e in entries), entries

    with ApiServer(disabled_features={"DRAConsumableCapacity"}) as server:
        run(lambda: scenario(server), 120)


def test_a_failing_write_is_retried_in_the_background_and_the_prepare_answered_at_once(api: ApiServer) -> None:
    """A 500, a 403 (RBAC missing, said so) and a 409: each retried with devplug's backoff, the claim prepared
    meanwhile, the entry written in the end."""

    async def scenario() -> None:
        async with _node(api, "ready") as lab:
            uid = _allocate(lab, "c", ["mock0"])
            for code in (500, 403, 409):
                api.faults.fail(code, verb="patch", resource="resourceclaims")
            await _prepare(lab, "c", uid)
            assert _entries(lab, "c") == [], "answered before the status was written"
            await eventually(lambda: _entries(lab, "c"), "the entry written in the end", details=lab.log)
            retries = [ln for ln in lab.log().splitlines() if "writing the device status of" in ln]
            assert len(retries) == 3 and all("mock0" in ln and f"{NS}/c" in ln for ln in retries), retries
            assert "associated-node:patch on resourceclaims/driver" in retries[1], retries[1]
            await eventually(lambda: _claim_status(lab).get("written") == 1, "the write counted in the status")

    run(scenario, 120)


def test_a_1_33_server_gets_the_status_through_its_beta_and_a_1_32_server_drops_it() -> None:
    """``status.devices`` has one shape in v1, v1beta2 and v1beta1: 1.33 (``DRAResourceClaimDeviceStatus`` beta, on)
    keeps it, written through the version discovery chose; 1.32 (alpha, off) drops it: noted, not written again."""

    async def scenario(api: ApiServer, kept: bool) -> None:
        async with _node(api, "ready") as lab:
            uid = _allocate(lab, "c", ["mock0"])
            await _prepare(lab, "c", uid)
            if kept:
                [entry] = await eventually(lambda: _entries(lab, "c"), "the entry written", details=lab.log)
                assert entry["conditions"][0]["type"] == "Ready"
                await _unprepare(lab, "c", uid)
                await eventually(lambda: not _entries(lab, "c"), "the entry removed", details=lab.log)
            else:
                await eventually(lambda: _claim_status(lab).get("unsupported"), "the gate noted", details=lab.log)
                assert _entries(lab, "c") == []

    for release, kept in (("1.33", True), ("1.32", False)):
        with ApiServer(release=release) as server:
            run(lambda server=server, kept=kept: scenario(server, kept), 120)  # type: ignore[misc]
