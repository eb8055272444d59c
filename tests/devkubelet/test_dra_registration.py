"""The dev kubelet's plugin watcher and DRA plugin manager against a real DRA plugin on real unix sockets.

Registration (GetInfo, the service chosen, NotifyRegistrationStatus), refusals
and their retries, re-registration when the socket is created again,
deregistration when it goes, several instances of one driver (the newest
connected one is called), connection monitoring, ResourceSlice wipes.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from devplug.devkubelet import ContainerSpec, DevKubelet, PodClaim, PodSpec, ResourceClaimRef
from devplug.devkubelet.dra import SERVICE_V1, SERVICE_V1BETA1, DRAKubelet
from devplug.devkubelet.dra.plugins import choose_service
from devplug.errors import KubeletError
from tests.devkubelet.draplugin import DRIVER, FAST, DRAPlugin, dra_kubelet, registered


def _dra(kubelet: DevKubelet) -> DRAKubelet:
    assert kubelet.dra is not None
    return kubelet.dra


def _pod(name: str, uid: str, claim_uid: str, claim: str = "claim-a") -> PodSpec:
    ref = ResourceClaimRef("default", claim, claim_uid, (DRIVER,))
    return PodSpec(
        name,
        [ContainerSpec("app", claims=["gpu"])],
        uid=uid,
        resource_claims=[PodClaim("gpu", ref)],
    )


def test_a_plugin_is_registered_and_told_so(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                [view] = kubelet.dra_plugins(DRIVER)
                assert view.endpoint == str(plugin.service_socket)
                assert view.service == SERVICE_V1  # the first of the plugin's list the kubelet supports
                assert view.connected
                assert plugin.statuses == [(True, "")]
                [entry] = _dra(kubelet).watcher.registered()
                assert (entry.socket, entry.type, entry.name) == (plugin.registration_socket, "DRAPlugin", DRIVER)
                # recorded once NotifyRegistrationStatus has returned, which may be after the plugin saw the call
                await kubelet.wait_for(
                    lambda k: bool(k.events_of("plugin-registered", DRIVER)), 5.0, what="the plugin-registered event"
                )
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_the_service_is_the_first_of_the_plugins_list_the_kubelet_supports() -> None:
    assert choose_service(["v1.DRAPlugin", "v1beta1.DRAPlugin"]) == SERVICE_V1
    assert choose_service(["v1beta1.DRAPlugin", "v1.DRAPlugin"]) == SERVICE_V1BETA1
    assert choose_service(["v1alpha1.DRAResourceHealth", "v1beta1.DRAPlugin"]) == SERVICE_V1BETA1
    with pytest.raises(KubeletError, match=r"^empty list of supported gRPC services \(aka supported versions\)$"):
        choose_service([])
    with pytest.raises(KubeletError) as info:
        choose_service(["v1alpha4.DRAPlugin"])
    assert str(info.value) == (
        'none of services supported by the plugin (["v1alpha4.DRAPlugin"]) are supported by the kubelet '
        '(["v1.DRAPlugin" "v1beta1.DRAPlugin"])'
    )


def test_a_v1beta1_only_plugin_is_called_through_v1beta1(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent, services=["v1beta1.DRAPlugin"]).start()
            try:
                await registered(kubelet, plugin)
                assert kubelet.dra_plugins(DRIVER)[0].service == SERVICE_V1BETA1
                await kubelet.admit_pod(_pod("p", "pod-1", "uid-a"))
                assert plugin.calls == [("prepare-v1beta1", ["uid-a"])]
                _, request = plugin.requests[0]
                assert request.DESCRIPTOR.full_name == "k8s.io.kubelet.pkg.apis.dra.v1beta1.NodePrepareResourcesRequest"
                claim = request.claims[0]
                assert (claim.namespace, claim.name, claim.uid) == ("default", "claim-a", "uid-a")
                [state] = kubelet.dra_claims()
                assert state.devices[DRIVER][0].cdi_device_ids == ("example.com/gpu=uid-a",)
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_unsupported_versions_are_refused_notified_and_retried_with_backoff(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent, services=["v1alpha4.DRAPlugin"], serve=[]).start()
            try:
                await plugin.wait_for(lambda p: len(p.statuses) >= 3, 10.0, what="three refusals (two retries)")
                registered_ok, error = plugin.statuses[0]
                assert registered_ok is False
                assert error == (
                    "RegisterPlugin error -- plugin validation failed with err: invalid supported gRPC versions of "
                    f"DRA driver plugin {DRIVER} at endpoint {plugin.service_socket}: none of services supported by "
                    'the plugin (["v1alpha4.DRAPlugin"]) are supported by the kubelet '
                    '(["v1.DRAPlugin" "v1beta1.DRAPlugin"])'
                )
                assert plugin.statuses[1] == plugin.statuses[2] == plugin.statuses[0]
                assert kubelet.dra_plugins() == []
                assert kubelet.events_of("plugin-registration-failed", DRIVER)
                # no retry before the back-off: 0.5 s after the first failure, then 1 s (lower bounds only)
                first, second, third = plugin.get_info_times[:3]
                assert second - first >= 0.45
                assert third - second >= 0.95
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_a_plugin_of_another_type_is_refused_by_name(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir):
            plugin = await DRAPlugin(plugin_dir.parent, plugin_type="CSIPlugin").start()
            try:
                await plugin.wait_for(lambda p: bool(p.statuses), 5.0, what="a refusal")
                assert plugin.statuses[0] == (
                    False,
                    f"RegisterPlugin error -- no handler registered for plugin type: CSIPlugin at socket "
                    f"{plugin.registration_socket}",
                )
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_names_starting_with_a_dot_are_ignored(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir) as kubelet:
            hidden = await DRAPlugin(plugin_dir.parent, registration_name=".hidden-reg.sock").start()
            visible = await DRAPlugin(plugin_dir.parent, "net.example.com").start()
            try:
                await registered(kubelet, visible)  # registered after the hidden one's socket appeared
                assert hidden.get_info_calls == 0
                assert [v.driver for v in kubelet.dra_plugins()] == ["net.example.com"]
            finally:
                await hidden.stop()
                await visible.stop()

    asyncio.run(body())


def test_a_socket_already_there_at_kubelet_start_is_registered(plugin_dir: Path) -> None:
    async def body() -> None:
        plugin = await DRAPlugin(plugin_dir.parent).start()
        try:
            async with dra_kubelet(plugin_dir) as kubelet:
                await registered(kubelet, plugin)
                assert kubelet.events_of("resource-slices-wiped")[0].detail.endswith("every ResourceSlice of the node")
        finally:
            await plugin.stop()

    asyncio.run(body())


def test_removing_the_socket_deregisters_and_a_new_socket_registers_again(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                await plugin.stop_registration()  # the socket is removed
                await kubelet.wait_for(lambda k: k.dra_plugins() == [], what="the plugin to be deregistered")
                assert kubelet.events_of("dra-plugin-deregistered", DRIVER)
                await plugin.start_registration()  # a new socket at the same path
                await kubelet.wait_for(lambda k: len(k.dra_plugins()) == 1, what="the plugin to register again")
                await plugin.wait_for(lambda p: p.statuses.count((True, "")) == 2, what="a second notification")
                assert len(kubelet.events_of("dra-plugin-registered", DRIVER)) == 2
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_a_socket_created_again_while_registered_is_registered_anew(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir, replace(FAST, reconcile_period=0.5)) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                # a restart of the plugin's registration server: a new socket (new inode) under the same name
                await plugin.stop_registration(remove_socket=False)
                await plugin.start_registration()
                await plugin.wait_for(lambda p: p.statuses.count((True, "")) == 2, what="a second registration")
                assert [
                    e.kind for e in kubelet.events if e.kind.startswith("dra-plugin-") and "register" in e.kind
                ] == [
                    "dra-plugin-registered",
                    "dra-plugin-deregistered",
                    "dra-plugin-registered",
                ]
                assert len(kubelet.dra_plugins()) == 1
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_the_newest_connected_instance_is_called(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir) as kubelet:
            old = await DRAPlugin(plugin_dir.parent, instance="uid-old").start()
            await registered(kubelet, old)
            new = await DRAPlugin(plugin_dir.parent, instance="uid-new").start()
            try:
                await registered(kubelet, new, count=2)
                views = kubelet.dra_plugins(DRIVER)
                assert [v.endpoint for v in views] == [str(old.service_socket), str(new.service_socket)]
                await kubelet.admit_pod(_pod("p1", "pod-1", "uid-1", "claim-1"))
                assert (old.calls, new.calls) == ([], [("prepare", ["uid-1"])])

                # the new instance's process dies (its registration socket stays): the old one is called
                await new.stop_service()
                await kubelet.wait_for(
                    lambda k: not k.dra_plugins(DRIVER)[1].connected, what="the new instance to be disconnected"
                )
                assert len(kubelet.dra_plugins(DRIVER)) == 2  # still registered: no GetInfo pings deregister it
                await kubelet.admit_pod(_pod("p2", "pod-2", "uid-2", "claim-2"))
                assert old.calls == [("prepare", ["uid-2"])]

                # the old one leaves for good: the new one, disconnected, is the only one left and fails
                await old.stop()
                await kubelet.wait_for(lambda k: len(k.dra_plugins(DRIVER)) == 1, what="the old one to deregister")
                with pytest.raises(KubeletError, match="prepare dynamic resources: NodePrepareResources: rpc error"):
                    await kubelet.admit_pod(_pod("p3", "pod-3", "uid-3", "claim-3"))
            finally:
                await new.stop()
                await old.stop()

    asyncio.run(body())


def test_the_newest_instance_leaving_hands_back_to_the_older_one(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir) as kubelet:
            old = await DRAPlugin(plugin_dir.parent, instance="a").start()
            await registered(kubelet, old)
            new = await DRAPlugin(plugin_dir.parent, instance="b").start()
            try:
                await registered(kubelet, new, count=2)
                await new.stop()  # a rolling update rolled back: the newer instance goes away cleanly
                await kubelet.wait_for(lambda k: len(k.dra_plugins(DRIVER)) == 1, what="one instance left")
                await kubelet.admit_pod(_pod("p", "pod-1", "uid-1"))
                assert old.calls == [("prepare", ["uid-1"])]
                assert not kubelet.events_of("resource-slices-wiped", DRIVER)  # the driver never stopped being usable
            finally:
                await old.stop()
                await new.stop()

    asyncio.run(body())


def test_a_driver_without_a_connected_instance_has_its_slices_wiped_after_the_delay(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir, replace(FAST, wiping_delay=0.3)) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                await plugin.stop_service()  # killed: the registration socket stays, the connection goes
                await kubelet.wait_for(lambda k: DRIVER in _dra(k).plugins.pending_wipes(), what="a wipe to be due")
                await kubelet.wait_for(
                    lambda k: bool(k.events_of("resource-slices-wiped", DRIVER)), what="the driver's slices wiped"
                )
                assert len(kubelet.dra_plugins(DRIVER)) == 1  # still registered
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_a_driver_back_within_the_delay_keeps_its_slices(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir, replace(FAST, wiping_delay=30.0)) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                await plugin.stop()  # deregistered: a wipe is due in 30 s
                await kubelet.wait_for(lambda k: DRIVER in _dra(k).plugins.pending_wipes(), what="a wipe to be due")
                kept = len(kubelet.events_of("resource-slices-kept", DRIVER))
                await plugin.start()
                await kubelet.wait_for(
                    lambda k: len(k.events_of("resource-slices-kept", DRIVER)) > kept, what="the wipe cancelled"
                )
                assert DRIVER not in _dra(kubelet).plugins.pending_wipes()
                assert kubelet.dra_plugins(DRIVER)[0].connected
                assert not kubelet.events_of("resource-slices-wiped", DRIVER)
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_a_kubelet_restart_registers_every_plugin_again(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                await kubelet.restart()
                await plugin.wait_for(lambda p: p.statuses.count((True, "")) == 2, what="a registration after restart")
                await kubelet.wait_for(lambda k: len(k.dra_plugins(DRIVER)) == 1, what="one instance after restart")
            finally:
                await plugin.stop()

    asyncio.run(body())
