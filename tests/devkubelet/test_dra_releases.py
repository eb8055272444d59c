"""The dev kubelet's DRA side as each kubelet release does it (issue 37), against real plugins on real unix sockets.

A second instance of a driver registering and the first then removing its
socket (1.32 drops the driver by name and wipes its slices at once; 1.33+
keep the second), the service chosen per release (v1alpha4 and its
``v1alpha3.Node`` path included), the claim cache of 1.32 taking a claim
created again under its name with a new UID for the old one, health streams
and what of a report each release reads, the checkpoint's layout, the lazy
connection of 1.32/1.33, the 1.33 wiping delay, and the Node's
``kubeletVersion`` written by ``dra_node``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from devplug.api.gen.dra.v1beta1 import api_pb2 as v1beta1
from devplug.api.gen.drahealth.v1alpha1 import api_pb2 as health_pb
from devplug.devkubelet import ClaimPrepareError, DevKubelet, DRAConfig, PodPhase
from devplug.devkubelet.dra import (
    DRA_RELEASES,
    SERVICE_V1,
    SERVICE_V1ALPHA4,
    SERVICE_V1BETA1,
    DRAKubelet,
    release_rules,
)
from devplug.devkubelet.dra.plugins import choose_service
from devplug.errors import KubeletError
from devplug.testing.apiserver import ApiServer
from devplug.testing.dranode import NODE, TEST_DRA, dra_node
from tests.devkubelet.draplugin import DRIVER, FAST, DRAPlugin, claim_pod, dra_kubelet, health_report

MONITORED = ("1.34", "1.35", "1.36")
ALL_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth")


def _config(release: str, **changes: Any) -> DRAConfig:
    return replace(FAST, release=release, **changes)


def _dra(kubelet: DevKubelet) -> DRAKubelet:
    assert kubelet.dra is not None
    return kubelet.dra


def _endpoints(kubelet: DevKubelet) -> list[str]:
    return [v.endpoint for v in kubelet.dra_plugins(DRIVER)]


async def _registered_as(kubelet: DevKubelet, plugin: DRAPlugin, endpoints: Sequence[DRAPlugin]) -> None:
    """Until the kubelet holds exactly ``endpoints``' instances of the driver, and ``plugin`` heard it registered."""
    wanted = [str(p.service_socket) for p in endpoints]
    await kubelet.wait_for(lambda k: _endpoints(k) == wanted, 5.0, what=f"the driver's instances to be {wanted}")
    await plugin.wait_for(lambda p: (True, "") in p.statuses, 5.0, what="NotifyRegistrationStatus(true)")


class V1Alpha4Plugin(DRAPlugin):
    """A plugin serving only the v1alpha4 service, ``/v1alpha3.Node/...`` (a driver built on the 1.31 helper)."""

    async def start_service(self) -> None:
        self.service_socket.parent.mkdir(parents=True, exist_ok=True)
        self.service_socket.unlink(missing_ok=True)
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((self._v1alpha4_handler(),))
        server.add_insecure_port(f"unix:{self.service_socket}")
        await server.start()
        self._service = server

    def _v1alpha4_handler(self) -> Any:
        async def prepare(request: Any, context: Any) -> Any:
            await self.note("prepare-v1alpha4", request)
            response = v1beta1.NodePrepareResourcesResponse()
            for claim in request.claims:
                response.claims[claim.uid].devices.add(
                    pool_name="pool-0", device_name=f"dev-{claim.uid}", cdi_device_ids=[f"example.com/gpu={claim.uid}"]
                )
            return response

        async def unprepare(request: Any, context: Any) -> Any:
            await self.note("unprepare-v1alpha4", request)
            response = v1beta1.NodeUnprepareResourcesResponse()
            for claim in request.claims:
                response.claims[claim.uid].error = ""
            return response

        return grpc.method_handlers_generic_handler(
            "v1alpha3.Node",
            {
                "NodePrepareResources": grpc.unary_unary_rpc_method_handler(
                    prepare,
                    request_deserializer=v1beta1.NodePrepareResourcesRequest.FromString,
                    response_serializer=v1beta1.NodePrepareResourcesResponse.SerializeToString,
                ),
                "NodeUnprepareResources": grpc.unary_unary_rpc_method_handler(
                    unprepare,
                    request_deserializer=v1beta1.NodeUnprepareResourcesRequest.FromString,
                    response_serializer=v1beta1.NodeUnprepareResourcesResponse.SerializeToString,
                ),
            },
        )


# -- the release --------------------------------------------------------------------------------------


def test_the_releases_modelled_and_an_unknown_one_refused() -> None:
    assert DRA_RELEASES == ("1.32", "1.33", "1.34", "1.35", "1.36")
    assert DRAConfig().release == "1.36"
    assert [DRAConfig(release=r).kubelet_version for r in DRA_RELEASES] == [
        "v1.32.13",
        "v1.33.13",
        "v1.34.10",
        "v1.35.7",
        "v1.36.3",
    ]
    for bad in ("1.31", "1.37", "v1.32.9", "132", ""):
        with pytest.raises(ValueError, match=r"^DRAConfig\.release: unknown kubelet release") as info:
            DRAConfig(release=bad)
        assert str(info.value) == (
            f"DRAConfig.release: unknown kubelet release {bad!r}: the dev kubelet models 1.32, 1.33, 1.34, 1.35, "
            '1.36 (give the minor release, e.g. "1.32")'
        )


def test_the_health_gate_defaults_to_the_releases() -> None:
    assert [DRAConfig(release=r).health_streams for r in DRA_RELEASES] == [False, False, False, False, True]
    assert [DRAConfig(release=r, resource_health_status=True).health_streams for r in DRA_RELEASES] == [
        False,  # no DRA health before 1.34, whatever the gate
        False,
        True,
        True,
        True,
    ]
    assert DRAConfig(resource_health_status=False).health_streams is False


# -- a second instance, then the first one's socket removed ---------------------------------------------


@pytest.mark.parametrize("release", DRA_RELEASES)
def test_a_second_instance_registers_then_the_first_removes_its_socket(plugin_dir: Path, release: str) -> None:
    """1.32 keeps one plugin per name: the second replaces the first, and the first's socket going deregisters by
    name, dropping the second and wiping the driver's slices at once. 1.33+ keep both and drop the first only."""

    async def body() -> None:
        async with dra_kubelet(plugin_dir, _config(release)) as kubelet:
            first = await DRAPlugin(plugin_dir.parent, instance="aaaa").start()
            second = DRAPlugin(plugin_dir.parent, instance="bbbb")
            try:
                await _registered_as(kubelet, first, [first])
                await second.start()
                if release == "1.32":
                    await _registered_as(kubelet, second, [second])
                    replaced = kubelet.events_of("dra-plugin-registered", DRIVER)[-1]
                    assert replaced.detail == (
                        f"endpoint {second.service_socket}, service v1beta1.DRAPlugin, 1 instance(s), replacing "
                        f"endpoint {first.service_socket} (forgotten by the kubelet till its next restart)"
                    )
                else:
                    await _registered_as(kubelet, second, [first, second])
                wipes_before = len(kubelet.events_of("resource-slices-wiped", DRIVER))
                await first.stop_registration()  # the first instance removes its registration socket
                await kubelet.wait_for(
                    lambda k: bool(k.events_of("dra-plugin-deregistered", DRIVER)), 5.0, what="a deregistration"
                )
                [gone] = kubelet.events_of("dra-plugin-deregistered", DRIVER)
                if release == "1.32":
                    # "Deregister DRA plugin ... endpoint=.../dra-<new instance>.sock", and the slices go at once
                    assert gone.detail.startswith(f"endpoint {second.service_socket}, 0 instance(s) left")
                    assert _endpoints(kubelet) == []
                    await kubelet.wait_for(
                        lambda k: len(k.events_of("resource-slices-wiped", DRIVER)) > wipes_before,
                        5.0,
                        what="the driver's slices wiped",
                    )
                    [wiped] = kubelet.events_of("resource-slices-wiped", DRIVER)
                    assert (
                        wiped.detail
                        == f"DeleteCollection (resource.k8s.io/v1beta1) of the node's ResourceSlices of {DRIVER}"
                    )
                    assert _dra(kubelet).plugins.pending_wipes() == frozenset()
                    with pytest.raises(ClaimPrepareError) as info:
                        await kubelet.admit_pod(claim_pod("p", "pod-1", ("claim-a", "uid-a")))
                    assert (
                        f"failed to get gRPC client for driver {DRIVER}: plugin name {DRIVER} not found in the list "
                        "of registered DRA plugins"
                    ) in str(info.value)
                else:
                    assert gone.detail.startswith(f"endpoint {first.service_socket}, 1 instance(s) left")
                    assert _endpoints(kubelet) == [str(second.service_socket)]
                    assert _dra(kubelet).plugins.pending_wipes() == frozenset()
                    await kubelet.admit_pod(claim_pod("p", "pod-1", ("claim-a", "uid-a")))
                    assert len(second.calls) == 1 and first.calls == []
                    assert kubelet.events_of("resource-slices-wiped", DRIVER) == []
            finally:
                await first.stop()
                await second.stop()

    asyncio.run(body())


def test_on_1_32_a_registration_socket_created_again_under_the_name_replaces_the_plugin(plugin_dir: Path) -> None:
    """No "endpoint already registered" refusal on 1.32: the same endpoint registering again replaces the plugin."""

    async def body() -> None:
        async with dra_kubelet(plugin_dir, _config("1.32")) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            other = DRAPlugin(plugin_dir.parent, registration_name=f"{DRIVER}-again-reg.sock")
            try:
                await _registered_as(kubelet, plugin, [plugin])
                await other.start_registration()  # a second registration socket naming the same endpoint
                await kubelet.wait_for(lambda k: len(k.events_of("dra-plugin-registered", DRIVER)) == 2, 5.0)
                assert "replacing endpoint" in kubelet.events_of("dra-plugin-registered", DRIVER)[-1].detail
                assert _endpoints(kubelet) == [str(plugin.service_socket)]
                await other.wait_for(lambda p: p.statuses == [(True, "")], 5.0, what="registered, not refused")
            finally:
                await other.stop_registration()
                await plugin.stop()

    asyncio.run(body())


# -- services ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("release", "listed", "chosen"),
    [
        ("1.32", ALL_SERVICES, SERVICE_V1BETA1),
        ("1.32", ("v1alpha3.NodeService", "v1beta1.DRAPlugin"), SERVICE_V1BETA1),  # the kubelet's order
        ("1.32", ("v1.DRAPlugin",), SERVICE_V1ALPHA4),  # neither listed: v1alpha4 all the same
        ("1.33", ("v1alpha1.DRAResourceHealth",), SERVICE_V1ALPHA4),
        ("1.34", ("v1beta1.DRAPlugin", "v1.DRAPlugin"), SERVICE_V1BETA1),  # the plugin's order
        ("1.36", ALL_SERVICES, SERVICE_V1),
    ],
)
def test_the_service_each_release_chooses(release: str, listed: Sequence[str], chosen: str) -> None:
    assert choose_service(listed, release_rules(release)) == chosen


def test_only_an_empty_list_is_refused_before_1_34_and_v1alpha4_is_unknown_after() -> None:
    for release in ("1.32", "1.33"):
        with pytest.raises(KubeletError, match=r"^empty list of supported gRPC services"):
            choose_service([], release_rules(release))
    with pytest.raises(KubeletError) as info:
        choose_service(["v1alpha3.NodeService"], release_rules("1.34"))
    assert str(info.value) == (
        'none of services supported by the plugin (["v1alpha3.NodeService"]) are supported by the kubelet '
        '(["v1.DRAPlugin" "v1beta1.DRAPlugin"])'
    )


@pytest.mark.parametrize(
    ("release", "service", "prepare", "unprepare"),
    [
        ("1.32", SERVICE_V1BETA1, "prepare-v1beta1", "unprepare-v1beta1"),
        ("1.33", SERVICE_V1BETA1, "prepare-v1beta1", "unprepare-v1beta1"),
        ("1.34", SERVICE_V1, "prepare", "unprepare"),
        ("1.35", SERVICE_V1, "prepare", "unprepare"),
        ("1.36", SERVICE_V1, "prepare", "unprepare"),
    ],
)
def test_the_go_helpers_plugin_is_called_through_the_releases_service(
    plugin_dir: Path, release: str, service: str, prepare: str, unprepare: str
) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir, _config(release)) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent, services=ALL_SERVICES).start()
            try:
                await _registered_as(kubelet, plugin, [plugin])
                [view] = kubelet.dra_plugins(DRIVER)
                assert view.service == service
                # 1.32/1.33 dial at the first call; 1.34+ connect at registration
                await kubelet.wait_for(lambda k: k.dra_plugins(DRIVER)[0].connected or release not in MONITORED, 5.0)
                assert kubelet.dra_plugins(DRIVER)[0].connected is (release in MONITORED)
                await kubelet.admit_pod(claim_pod("p", "pod-1", ("claim-a", "uid-a")))
                assert kubelet.dra_plugins(DRIVER)[0].connected
                await kubelet.finish_pod("p")
                assert [name for name, _ in plugin.calls] == [prepare, unprepare]
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_a_1_32_kubelet_calls_a_v1alpha4_plugin_at_v1alpha3_node(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir, _config("1.32")) as kubelet:
            plugin = await V1Alpha4Plugin(plugin_dir.parent, services=["v1alpha3.NodeService"]).start()
            try:
                await _registered_as(kubelet, plugin, [plugin])
                assert kubelet.dra_plugins(DRIVER)[0].service == SERVICE_V1ALPHA4
                await kubelet.admit_pod(claim_pod("p", "pod-1", ("claim-a", "uid-a")))
                assert kubelet.container_cdi_devices("p", "app") == ["example.com/gpu=uid-a"]
                await kubelet.finish_pod("p")
                assert plugin.calls == [("prepare-v1alpha4", ["uid-a"]), ("unprepare-v1alpha4", ["uid-a"])]
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_a_v1_only_plugin_gets_v1alpha4_calls_from_1_32_and_is_refused_by_none(plugin_dir: Path) -> None:
    """1.32 falls back to v1alpha4 for a plugin listing only v1: registered, but every call is UNIMPLEMENTED."""

    async def body() -> None:
        async with dra_kubelet(plugin_dir, _config("1.32")) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent, services=["v1.DRAPlugin"]).start()
            try:
                await _registered_as(kubelet, plugin, [plugin])
                with pytest.raises(ClaimPrepareError) as info:
                    await kubelet.admit_pod(claim_pod("p", "pod-1", ("claim-a", "uid-a")))
                assert "NodePrepareResources failed: rpc error: code = UNIMPLEMENTED" in str(info.value)
                assert "prepare dynamic resources" not in str(info.value)  # 1.32 returns the manager's error as is
                assert plugin.calls == []
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_a_refusal_is_worded_as_each_release_words_it(plugin_dir: Path) -> None:
    async def body() -> None:
        for release, expected in (
            (
                "1.32",
                f"RegisterPlugin error -- plugin validation failed with err: invalid versions of plugin {DRIVER}: "
                "empty list of supported gRPC services (aka supported versions)",
            ),
            (
                "1.36",
                "RegisterPlugin error -- plugin validation failed with err: invalid supported gRPC versions of DRA "
                f"driver plugin {DRIVER} at endpoint PLUGIN: empty list of supported gRPC services (aka supported "
                "versions)",
            ),
        ):
            async with dra_kubelet(plugin_dir, _config(release)) as kubelet:
                plugin = await DRAPlugin(plugin_dir.parent, services=[]).start()
                try:
                    await plugin.wait_for(lambda p: bool(p.statuses), 5.0, what="a registration status")
                    assert plugin.statuses[0] == (False, expected.replace("PLUGIN", str(plugin.service_socket)))
                    assert kubelet.dra_plugins(DRIVER) == []
                finally:
                    await plugin.stop()

    asyncio.run(body())


# -- the claim cache -------------------------------------------------------------------------------------


@pytest.mark.parametrize("release", ["1.32", "1.33", "1.36"])
def test_a_claim_created_again_under_its_name_with_a_new_uid(plugin_dir: Path, release: str) -> None:
    """While a pod still uses claim-a (uid-old), claim-a is deleted and created again (uid-new) for another pod.
    1.32 and 1.33 key the cache by namespace/name and check no UID: the new claim is taken for the old one, never
    prepared, and the pod gets the old claim's devices. 1.34+ refuse it (PR #131617)."""

    async def body() -> None:
        async with dra_kubelet(plugin_dir, _config(release)) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await _registered_as(kubelet, plugin, [plugin])
                await kubelet.admit_pod(claim_pod("p1", "pod-1", ("claim-a", "uid-old")))
                if release == "1.36":
                    with pytest.raises(ClaimPrepareError, match="old ResourceClaim with same name claim-a"):
                        await kubelet.admit_pod(claim_pod("p2", "pod-2", ("claim-a", "uid-new")))
                    return
                await kubelet.admit_pod(claim_pod("p2", "pod-2", ("claim-a", "uid-new")))
                assert plugin.calls_of("prepare-v1beta1") == [["uid-old"]]  # the new claim is never prepared
                [state] = kubelet.dra_claims()
                assert (state.name, state.uid, state.pod_uids) == ("claim-a", "uid-old", frozenset({"pod-1", "pod-2"}))
                assert kubelet.container_cdi_devices("p2", "app") == ["example.com/gpu=uid-old"]
                await kubelet.finish_pod("p1")
                await kubelet.finish_pod("p2")
                assert plugin.calls_of("unprepare-v1beta1") == [["uid-old"]]  # once, after the last pod, old UID
                assert kubelet.dra_claims() == []
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_on_1_32_a_missing_driver_leaves_the_pod_in_the_cache_and_it_owes_an_unprepare(plugin_dir: Path) -> None:
    """No validation pass before 1.34: the claim is cached with the pod before the driver is looked up, so the
    pod cannot finish until the driver registers, which then unprepares a claim it never prepared."""

    async def body() -> None:
        async with dra_kubelet(plugin_dir, _config("1.32")) as kubelet:
            with pytest.raises(ClaimPrepareError) as info:
                await kubelet.admit_pod(claim_pod("p", "pod-1", ("claim-a", "uid-a")))
            assert (
                f"failed to get gRPC client for driver {DRIVER}: plugin name {DRIVER} not found in the list of "
                "registered DRA plugins"
            ) in str(info.value)
            [state] = kubelet.dra_claims()
            assert (state.uid, state.pod_uids, state.prepared) == ("uid-a", frozenset({"pod-1"}), False)
            await kubelet.remove_pod("p", wait=False)
            await kubelet.wait_for(lambda k: bool(k.events_of("pod-unprepare-failed")), 5.0)
            [failed] = kubelet.events_of("pod-unprepare-failed")
            assert f"get gRPC client for DRA driver {DRIVER}: plugin name {DRIVER} not found" in failed.detail
            assert kubelet.pod_phase("p") is PodPhase.TERMINATING
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await _registered_as(kubelet, plugin, [plugin])
                await kubelet.sync_pod("p")
                await kubelet.wait_for(lambda k: k.pod_phase("p") is PodPhase.DELETED, 5.0, what="the pod deleted")
                assert plugin.calls == [("unprepare-v1beta1", ["uid-a"])]  # a claim it never prepared
                assert kubelet.dra_claims() == []
            finally:
                await plugin.stop()

    asyncio.run(body())


@pytest.mark.parametrize(
    ("release", "list_name", "share_id"), [("1.32", "ClaimInfoStateList", False), ("1.36", "Entries", True)]
)
def test_dra_manager_state_in_each_releases_layout(
    plugin_dir: Path, release: str, list_name: str, share_id: bool
) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir, _config(release)) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await _registered_as(kubelet, plugin, [plugin])
                await kubelet.admit_pod(claim_pod("p", "pod-1", ("claim-a", "uid-a")))
            finally:
                await plugin.stop()
        inner = json.loads(json.loads((plugin_dir.parent / "dra_manager_state").read_bytes())["Data"])
        assert list(inner) == ["kind", "apiVersion", list_name]
        [entry] = inner[list_name]
        [dev] = entry["DriverState"][DRIVER]["Devices"]
        assert ("ShareID" in dev) is share_id
        # the other layout's kubelet reads none of it (Go's decoder ignores the unknown list)
        other = "1.36" if release == "1.32" else "1.32"
        async with dra_kubelet(plugin_dir, _config(other)) as kubelet:
            assert kubelet.dra_claims() == []

    asyncio.run(body())


# -- connections and wipes -----------------------------------------------------------------------------


def test_1_33_wipes_after_the_delay_once_the_last_instance_left_and_ignores_connections(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir, _config("1.33")) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await _registered_as(kubelet, plugin, [plugin])
                await kubelet.admit_pod(claim_pod("p", "pod-1", ("claim-a", "uid-a")))  # dials the connection
                await plugin.stop_service()  # the plugin dies, its registration socket stays
                await kubelet.wait_for(lambda k: bool(k.events_of("dra-plugin-disconnected", DRIVER)), 5.0)
                assert _dra(kubelet).plugins.pending_wipes() == frozenset()  # nobody watches the connection
                assert _endpoints(kubelet) == [str(plugin.service_socket)]
                await plugin.stop_registration()
                await kubelet.wait_for(lambda k: DRIVER in _dra(k).plugins.pending_wipes(), 5.0)
                again = await DRAPlugin(plugin_dir.parent, instance="again").start()
                try:
                    await _registered_as(kubelet, again, [again])
                    assert _dra(kubelet).plugins.pending_wipes() == frozenset()
                    [kept] = kubelet.events_of("resource-slices-kept", DRIVER)
                    assert kept.detail == "new plugin instance registered"
                    assert kubelet.events_of("resource-slices-wiped", DRIVER) == []
                finally:
                    await again.stop()
            finally:
                await plugin.stop()

    asyncio.run(body())


# -- health ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("release", DRA_RELEASES)
def test_health_streams_are_opened_as_the_release_and_its_gate_say(plugin_dir: Path, release: str) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir, _config(release)) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await _registered_as(kubelet, plugin, [plugin])
                await kubelet.admit_pod(claim_pod("p", "pod-1", ("claim-a", "uid-a")))  # a call went through
                if release == "1.36":
                    await plugin.wait_for(lambda p: p.health_streams > 0, 5.0, what="a health stream")
                else:
                    assert plugin.health_streams == 0
                if release in ("1.32", "1.33"):
                    assert kubelet.allocated_resources_status("p", "app") == ()  # no DRA health before 1.34
                    assert not (plugin_dir.parent / "dra_health_state").exists()
            finally:
                await plugin.stop()

    asyncio.run(body())


@pytest.mark.parametrize(
    ("release", "timeout_key", "message"), [("1.34", False, ""), ("1.35", True, ""), ("1.36", True, "too hot")]
)
def test_what_of_a_health_report_each_release_reads(
    plugin_dir: Path, release: str, timeout_key: bool, message: str
) -> None:
    async def body() -> None:
        config = _config(release, resource_health_status=True)
        async with dra_kubelet(plugin_dir, config) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await _registered_as(kubelet, plugin, [plugin])
                await plugin.wait_for(lambda p: p.open_health_streams > 0, 5.0, what="a health stream")
                plugin.send_health(
                    health_report(("pool-0", "dev-x", health_pb.UNHEALTHY), timeout=600, message="too hot")
                )
                await kubelet.wait_for(
                    lambda k: k.device_health(DRIVER, "pool-0", "dev-x").health.value == "Unhealthy", 5.0
                )
                assert kubelet.device_health(DRIVER, "pool-0", "dev-x").message == message
                saved = json.loads((plugin_dir.parent / "dra_health_state").read_bytes())
                device = saved[DRIVER]["Devices"]["pool-0/dev-x"]
                assert ("HealthCheckTimeout" in device) is timeout_key
                if timeout_key:
                    assert device["HealthCheckTimeout"] == 600 * 10**9
                assert ("Message" in device) is (release == "1.36")
            finally:
                await plugin.stop()

    asyncio.run(body())


# -- the Node a daemon reads -------------------------------------------------------------------------------


@pytest.mark.parametrize("release", ["1.32", "1.36"])
def test_dra_node_writes_the_kubelets_version_into_the_node(tmp_path: Path, release: str) -> None:
    async def body() -> None:
        with ApiServer() as api:
            kubelet_dra = replace(TEST_DRA, release=release)
            async with dra_node(
                api, "example.com/mock", {"driver": "mock"}, tmp_path, kubelet_dra=kubelet_dra, start=False
            ) as node:
                assert node.kubelet.dra is not None and node.kubelet.dra.config.release == release
                status = api.get("nodes", NODE)["status"]
                assert status["nodeInfo"]["kubeletVersion"] == kubelet_dra.kubelet_version
                assert status["nodeInfo"]["kubeletVersion"].startswith(f"v{release}.")

    asyncio.run(body())
