"""The dev kubelet's DRA manager against a real DRA plugin: prepare and unprepare as the kubelet calls them.

Per-claim errors, claims left out of an answer, answers for claims not asked
for, call errors and time-outs, and how each is retried; claims shared by
pods; the pod's timeline (nothing runs before its claims are prepared, it
stays terminating until they are unprepared); ``dra_manager_state`` and the
kubelet's restart with unprepare calls owed.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from devplug.devkubelet import ClaimPrepareError, ClaimUnprepareError, PodPhase
from devplug.devkubelet.dra.checkpoint import load_claims
from devplug.errors import KubeletError
from tests.devkubelet.draplugin import DRIVER, FAST, DRAPlugin, claim_pod, device, dra_kubelet, registered


def _checkpoint_entries(plugin_dir: Path) -> list[dict[str, object]]:
    outer = json.loads((plugin_dir.parent / "dra_manager_state").read_bytes())
    inner = json.loads(outer["Data"])
    assert inner["kind"] == "DRACheckpoint"
    assert inner["apiVersion"] == "checkpoint.dra.kubelet.k8s.io/v1"
    entries: list[dict[str, object]] = inner["Entries"]
    return entries


def test_a_pods_claims_are_prepared_before_it_runs_and_unprepared_when_it_ends(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                plugin.answers.devices["uid-a"] = [device("pool-0", "gpu-3", "example.com/gpu=gpu-3", share_id="s1")]
                await kubelet.admit_pod(claim_pod("p", "pod-1", ("claim-a", "uid-a")))
                method, request = plugin.requests[0]
                assert method == "prepare"
                assert request.DESCRIPTOR.full_name == "k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourcesRequest"
                [claim] = request.claims
                assert (claim.namespace, claim.uid, claim.name) == ("default", "uid-a", "claim-a")
                [state] = kubelet.dra_claims()
                assert (state.name, state.uid, state.pod_uids, state.prepared) == (
                    "claim-a",
                    "uid-a",
                    frozenset({"pod-1"}),
                    True,
                )
                [dev] = state.devices[DRIVER]
                assert (dev.pool_name, dev.device_name, dev.cdi_device_ids, dev.share_id) == (
                    "pool-0",
                    "gpu-3",
                    ("example.com/gpu=gpu-3",),
                    "s1",
                )
                assert kubelet.container_cdi_devices("p", "app") == ["example.com/gpu=gpu-3"]
                [entry] = _checkpoint_entries(plugin_dir)
                assert entry["ClaimUID"] == "uid-a"
                assert entry["PodUIDs"] == {"pod-1": {}}
                assert [e.detail.split(" ")[0] for e in kubelet.events_of("container-started")] == ["default/p/app"]
                assert kubelet.events.index(kubelet.events_of("pod-claims-prepared")[0]) < kubelet.events.index(
                    kubelet.events_of("container-started")[0]
                )

                await kubelet.finish_pod("p")
                assert plugin.calls == [("prepare", ["uid-a"]), ("unprepare", ["uid-a"])]
                assert kubelet.dra_claims() == []
                assert _checkpoint_entries(plugin_dir) == []
                assert kubelet.pod_phase("p") is PodPhase.FINISHED
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_a_shared_claim_is_prepared_once_and_unprepared_after_its_last_pod(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                await kubelet.admit_pod(claim_pod("p1", "pod-1", ("shared", "uid-s")))
                await kubelet.admit_pod(claim_pod("p2", "pod-2", ("shared", "uid-s")))
                assert plugin.calls_of("prepare") == [["uid-s"]]  # already prepared for the second pod
                assert kubelet.dra_claims()[0].pod_uids == {"pod-1", "pod-2"}
                await kubelet.finish_pod("p1")
                assert plugin.calls_of("unprepare") == []  # another pod still uses it
                assert kubelet.dra_claims()[0].pod_uids == {"pod-2"}
                await kubelet.finish_pod("p2")
                assert plugin.calls_of("unprepare") == [["uid-s"]]
                assert kubelet.dra_claims() == []
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_a_claims_error_leaves_the_pod_waiting_and_the_next_sync_sends_every_claim_again(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                plugin.answers.prepare_errors["uid-b"] = "no such device"
                pod = claim_pod("p", "pod-1", ("claim-a", "uid-a"), ("claim-b", "uid-b"))
                with pytest.raises(ClaimPrepareError) as info:
                    await kubelet.admit_pod(pod)
                assert "prepare dynamic resources: NodePrepareResources failed for ResourceClaim claim-b: " in str(
                    info.value
                )
                assert str(info.value).endswith("no such device")
                assert plugin.calls == [("prepare", ["uid-a", "uid-b"])]  # one call per driver instance
                assert [p.spec.name for p in kubelet.pods()] == ["p"]  # admitted ...
                assert kubelet.running_containers("p") == []  # ... but nothing runs
                assert not kubelet.events_of("container-started")
                claims = {c.name: c for c in kubelet.dra_claims()}
                assert not claims["claim-a"].prepared and not claims["claim-b"].prepared
                assert claims["claim-a"].pod_uids == {"pod-1"}  # checkpointed before the call

                plugin.answers.prepare_errors.clear()
                assert await kubelet.sync_pod("p") is True
                assert plugin.calls[-1] == ("prepare", ["uid-a", "uid-b"])
                assert all(c.prepared for c in kubelet.dra_claims())
                assert kubelet.events_of("container-started")
                assert await kubelet.sync_pod("p") is False  # nothing left to do
            finally:
                await plugin.stop()

    asyncio.run(body())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("skip", "NodePrepareResources skipped 1 ResourceClaims"),
        ("extra", "NodePrepareResources returned result for unknown claim UID uid-stranger"),
        ("call", "NodePrepareResources: rpc error: code = INTERNAL desc = the plugin failed the call"),
    ],
)
def test_an_answer_missing_a_claim_naming_another_or_failing_fails_the_prepare(
    plugin_dir: Path, change: str, message: str
) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                if change == "skip":
                    plugin.answers.skip.add("uid-b")
                elif change == "extra":
                    plugin.answers.extra = "uid-stranger"
                else:
                    plugin.answers.call_error = grpc.StatusCode.INTERNAL
                with pytest.raises(ClaimPrepareError, match=message):
                    await kubelet.admit_pod(claim_pod("p", "pod-1", ("claim-a", "uid-a"), ("claim-b", "uid-b")))
                assert not any(c.prepared for c in kubelet.dra_claims())
                plugin.answers.skip.clear()
                plugin.answers.extra = None
                plugin.answers.call_error = None
                await kubelet.sync_pod("p")
                assert plugin.calls_of("prepare") == [["uid-a", "uid-b"], ["uid-a", "uid-b"]]
                assert all(c.prepared for c in kubelet.dra_claims())
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_a_call_has_the_kubelets_timeout(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir, replace(FAST, call_timeout=0.3)) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                plugin.answers.delay = 2.0
                with pytest.raises(ClaimPrepareError, match="code = DEADLINE_EXCEEDED"):
                    await kubelet.admit_pod(claim_pod("p", "pod-1", ("claim-a", "uid-a")))
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_a_missing_driver_fails_the_prepare_and_leaves_no_trace(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir) as kubelet:
            with pytest.raises(
                ClaimPrepareError, match=f"prepare dynamic resources: DRA driver {DRIVER} is not registered"
            ):
                await kubelet.admit_pod(claim_pod("p", "pod-1", ("claim-a", "uid-a")))
            assert kubelet.dra_claims() == []
            assert load_claims(plugin_dir.parent / "dra_manager_state") == []

    asyncio.run(body())


def test_a_claim_name_known_with_another_uid_is_refused(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                await kubelet.admit_pod(claim_pod("p1", "pod-1", ("claim-a", "uid-old")))
                with pytest.raises(ClaimPrepareError) as info:
                    await kubelet.admit_pod(claim_pod("p2", "pod-2", ("claim-a", "uid-new")))
                assert (
                    "old ResourceClaim with same name claim-a and different UID uid-old still exists "
                    "(previous pod force-deleted?!)"
                ) in str(info.value)
                assert plugin.calls_of("prepare") == [["uid-old"]]
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_a_failed_unprepare_keeps_the_pod_terminating_until_a_later_sync_succeeds(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                await kubelet.admit_pod(claim_pod("p", "pod-1", ("claim-a", "uid-a")))
                plugin.answers.unprepare_errors["uid-a"] = "device busy"
                with pytest.raises(
                    ClaimUnprepareError, match="NodeUnprepareResources failed for ResourceClaim claim-a"
                ):
                    await kubelet.finish_pod("p")
                assert kubelet.pod_phase("p") is PodPhase.TERMINATING  # still active: the pod worker is not done
                assert kubelet.dra_claims()[0].pod_uids == {"pod-1"}
                plugin.answers.unprepare_errors.clear()
                assert await kubelet.sync_pod("p") is True
                await kubelet.wait_for(lambda k: k.pod_phase("p") is PodPhase.FINISHED, what="the pod to finish")
                assert plugin.calls_of("unprepare") == [["uid-a"], ["uid-a"]]
                assert kubelet.dra_claims() == []
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_a_pod_deleted_while_its_claims_wait_to_be_unprepared_leaves_once_they_are(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                await kubelet.admit_pod(claim_pod("p", "pod-1", ("claim-a", "uid-a")))
                plugin.answers.unprepare_errors["uid-a"] = "device busy"
                with pytest.raises(ClaimUnprepareError):
                    await kubelet.finish_pod("p")
                await kubelet.remove_pod("p", wait=False)
                assert kubelet.pod_phase("p") is PodPhase.TERMINATING
                plugin.answers.unprepare_errors.clear()
                await kubelet.sync_pod("p")
                await kubelet.wait_for(lambda k: k.pod_phase("p") is PodPhase.DELETED, what="the pod to be deleted")
                assert kubelet.dra_claims() == []
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_the_synchronous_face_drives_dra_too(plugin_dir: Path) -> None:
    from devplug.devkubelet import DevKubeletThread

    with DevKubeletThread(plugin_dir, dra=FAST, pod_resources_rate=None) as kubelet:
        assert kubelet.plugins_registry == plugin_dir.parent / "plugins_registry"

        async def serve() -> DRAPlugin:
            return await DRAPlugin(plugin_dir.parent).start()

        plugin = asyncio.run_coroutine_threadsafe(serve(), kubelet.loop).result(10)
        try:
            kubelet.wait_for(lambda k: bool(k.dra_plugins(DRIVER)) and k.dra_plugins(DRIVER)[0].connected)
            kubelet.admit_pod(claim_pod("p", "pod-1", ("claim-a", "uid-a")))
            assert [c.uid for c in kubelet.dra_claims()] == ["uid-a"]
            assert kubelet.container_cdi_devices("p", "app") == ["example.com/gpu=uid-a"]
            assert kubelet.sync_pod("p") is False
            assert kubelet.reconcile_dra() == []
            assert kubelet.dra_plugins()[0].driver == DRIVER
            assert kubelet.allocated_resources_status("p", "app")[0].name == "claim:claim-a"
            assert kubelet.device_health(DRIVER, "pool-0", "dev-uid-a").health.value == "Unknown"
        finally:
            asyncio.run_coroutine_threadsafe(plugin.stop(), kubelet.loop).result(10)


def test_a_failed_unprepare_is_retried_after_the_pod_workers_backoff(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir, replace(FAST, pod_sync_backoff=0.2)) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                await kubelet.admit_pod(claim_pod("p", "pod-1", ("claim-a", "uid-a")))
                plugin.answers.call_error = grpc.StatusCode.UNAVAILABLE
                with pytest.raises(ClaimUnprepareError):
                    await kubelet.finish_pod("p")
                await plugin.wait_for(lambda p: len(p.calls_of("unprepare")) >= 2, what="a retry after the back-off")
                plugin.answers.call_error = None
                await kubelet.wait_for(lambda k: k.pod_phase("p") is PodPhase.FINISHED, what="the pod to finish")
                assert kubelet.dra_claims() == []
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_after_a_restart_the_kubelet_makes_the_unprepare_calls_it_owes(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                await kubelet.admit_pod(claim_pod("p", "pod-1", ("claim-a", "uid-a")))
                plugin.answers.unprepare_errors["uid-a"] = "driver upgrading"
                await kubelet.force_delete_pod("p")  # the pod leaves the pod manager; its unprepare fails
                await plugin.wait_for(lambda p: len(p.calls_of("unprepare")) == 1, what="the failed unprepare")
                await kubelet.wait_for(lambda k: bool(k.events_of("pod-unprepare-failed")), what="its failure")

                await kubelet.restart(pod_list_delay=30.0)  # a new kubelet process; sources not ready yet
                [state] = kubelet.dra_claims()  # read back from dra_manager_state
                assert (state.uid, state.pod_uids, state.prepared) == ("uid-a", frozenset({"pod-1"}), False)
                await registered(kubelet, plugin)
                plugin.answers.unprepare_errors.clear()
                assert await kubelet.reconcile_dra() == []  # sources not ready: nothing is decided
                assert len(plugin.calls_of("unprepare")) == 1
                kubelet.load_pods()
                assert await kubelet.reconcile_dra() == []
                assert plugin.calls_of("unprepare") == [["uid-a"], ["uid-a"]]
                assert kubelet.dra_claims() == []
                assert _checkpoint_entries(plugin_dir) == []
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_the_reconcile_loop_retries_a_failing_owed_unprepare(plugin_dir: Path) -> None:
    async def body() -> None:
        config = replace(FAST, manager_reconcile_period=0.2)
        async with dra_kubelet(plugin_dir, config) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                await kubelet.admit_pod(claim_pod("p", "pod-1", ("claim-a", "uid-a")))
                plugin.answers.unprepare_errors["uid-a"] = "busy"
                await kubelet.force_delete_pod("p")
                await plugin.wait_for(lambda p: len(p.calls_of("unprepare")) >= 3, what="the reconcile loop's retries")
                assert kubelet.events_of("dra-reconcile-failed")
                plugin.answers.unprepare_errors.clear()
                await kubelet.wait_for(lambda k: k.dra_claims() == [], what="the owed unprepare to succeed")
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_after_a_restart_a_restored_claim_is_prepared_again(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                await kubelet.admit_pod(claim_pod("p1", "pod-1", ("shared", "uid-s")))
                await kubelet.restart()
                await registered(kubelet, plugin)
                assert not kubelet.dra_claims()[0].prepared
                await kubelet.admit_pod(claim_pod("p2", "pod-2", ("shared", "uid-s")))
                assert plugin.calls_of("prepare") == [["uid-s"], ["uid-s"]]  # the plugin must be idempotent
                [state] = kubelet.dra_claims()
                assert state.pod_uids == {"pod-1", "pod-2"}
                # devices are appended, never replaced (addDevice): the checkpoint's and the new answer's
                assert [d.device_name for d in state.devices[DRIVER]] == ["dev-uid-s", "dev-uid-s"]
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_a_pod_with_claims_is_refused_by_a_kubelet_without_dra(plugin_dir: Path) -> None:
    async def body() -> None:
        from devplug.devkubelet import DevKubelet

        async with DevKubelet(plugin_dir, pod_resources_rate=None) as kubelet:
            with pytest.raises(KubeletError, match="uses resource claims, but this dev kubelet runs without DRA"):
                await kubelet.admit_pod(claim_pod("p", "pod-1", ("claim-a", "uid-a")))
            assert kubelet.known_pods() == []

    asyncio.run(body())
