"""PodResources v1: List, Get, GetAllocatableResources contents, outage and rate limit."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from devplug.api.gen.podresources.v1 import api_pb2 as pr
from devplug.api.gen.podresources.v1 import api_pb2_grpc as pr_grpc
from devplug.devkubelet import ContainerSpec, DevKubelet, PodSpec
from devplug.errors import KubeletError
from tests.devkubelet.fakeplugin import Behaviour, Dev, devs, list_pods, plugin_on, running_kubelet

GPU = "example.com/gpu"
NIC = "example.com/nic"


def entries(devices: Any) -> list[tuple[str, list[str], list[int]]]:
    return [(d.resource_name, list(d.device_ids), [n.ID for n in d.topology.nodes]) for d in devices]


async def call(kubelet: DevKubelet, method: str, request: Any) -> Any:
    async with grpc.aio.insecure_channel(f"unix:{kubelet.pod_resources_socket}") as channel:
        return await getattr(pr_grpc.PodResourcesListerStub(channel), method)(request, timeout=10)


def test_default_socket_follows_the_device_plugin_folder(plugin_dir: Path) -> None:
    kubelet = DevKubelet(plugin_dir)
    assert kubelet.pod_resources_socket == plugin_dir.parent / "pod-resources" / "kubelet.sock"


def test_list_get_and_allocatable(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir, pod_resources_get=True) as kubelet:
            gpus = await plugin_on(kubelet, [Dev("g0", numa=(0,)), Dev("g1", numa=(1,)), Dev("g2", "Unhealthy")])
            nics = await plugin_on(kubelet, [Dev("n0"), Dev("n1", numa=(0, 1))], resource=NIC, endpoint="nic.sock")
            await kubelet.admit_pod(
                PodSpec(
                    "web",
                    [
                        ContainerSpec("setup", {GPU: 1}, init=True),
                        ContainerSpec("main", {GPU: 2, NIC: 1}),
                        ContainerSpec("sidecar", {}),
                    ],
                    namespace="prod",
                )
            )
            await kubelet.admit_pod(PodSpec("db", [ContainerSpec("main", {NIC: 1})]))

            listed = await call(kubelet, "List", pr.ListPodResourcesRequest())
            pods = {(p.namespace, p.name): p for p in listed.pod_resources}
            assert set(pods) == {("prod", "web"), ("default", "db")}
            web = pods["prod", "web"]
            assert [c.name for c in web.containers] == ["main", "sidecar"]  # init containers have finished
            # one entry per device (per NUMA node), like the kubelet
            assert entries(web.containers[0].devices) == [
                (GPU, ["g0"], [0]),
                (GPU, ["g1"], [1]),
                (NIC, ["n0"], []),
            ]
            assert list(web.containers[1].devices) == []
            assert entries(pods["default", "db"].containers[0].devices) == [(NIC, ["n1"], [0]), (NIC, ["n1"], [1])]

            got = await call(kubelet, "Get", pr.GetPodResourcesRequest(pod_name="web", pod_namespace="prod"))
            assert got.pod_resources == web

            allocatable = await call(kubelet, "GetAllocatableResources", pr.AllocatableResourcesRequest())
            assert entries(allocatable.devices) == [
                (GPU, ["g0"], [0]),
                (GPU, ["g1"], [1]),
                (NIC, ["n0"], []),
                (NIC, ["n1"], [0]),
                (NIC, ["n1"], [1]),
            ]

            await kubelet.remove_pod("web", "prod")
            listed = await call(kubelet, "List", pr.ListPodResourcesRequest())
            assert [p.name for p in listed.pod_resources] == ["db"]
            await gpus.stop()
            await nics.stop()

    asyncio.run(body())


def test_get_is_disabled_by_default_with_the_kubelets_plain_error(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a"))
            await kubelet.admit_pod(PodSpec("p", [ContainerSpec("main", {GPU: 1})]))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call(kubelet, "Get", pr.GetPodResourcesRequest(pod_name="p", pod_namespace="default"))
            assert info.value.code() == grpc.StatusCode.UNKNOWN  # a plain Go error, not a status
            assert info.value.details() == "PodResources API Get method disabled"
            await plugin.stop()

    asyncio.run(body())


def test_get_unknown_pod_is_unknown_not_not_found(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir, pod_resources_get=True) as kubelet:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call(kubelet, "Get", pr.GetPodResourcesRequest(pod_name="ghost", pod_namespace="default"))
            assert info.value.code() == grpc.StatusCode.UNKNOWN
            assert info.value.details() == "pod ghost in namespace default not found"

    asyncio.run(body())


async def three_pods(kubelet: DevKubelet) -> None:
    """Running q (device b), finished p (had a), rejected r (its second container's Allocate failed)."""
    await kubelet.admit_pod(PodSpec("p", [ContainerSpec("main", {GPU: 1})]))
    await kubelet.admit_pod(PodSpec("q", [ContainerSpec("main", {GPU: 1})]))
    await kubelet.finish_pod("p")
    with pytest.raises(KubeletError):
        await kubelet.admit_pod(PodSpec("r", [ContainerSpec("one", {GPU: 1}), ContainerSpec("two", {GPU: 1})]))


def test_list_shows_finished_and_rejected_pods_without_devices_but_not_deleted_ones(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b", "c"), behaviour=Behaviour(allocate_errors={4: "no"}))
            await three_pods(kubelet)
            assert await list_pods(kubelet) == {
                "default/p": {"main": []},
                "default/q": {"main": ["b"]},
                "default/r": {"one": [], "two": []},
            }
            await kubelet.remove_pod("p")
            await kubelet.remove_pod("r")
            assert await list_pods(kubelet) == {"default/q": {"main": ["b"]}}
            await plugin.stop()

    asyncio.run(body())


def test_list_active_pods_only_as_kubelets_from_1_34(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir, list_active_pods_only=True) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b", "c"), behaviour=Behaviour(allocate_errors={4: "no"}))
            await three_pods(kubelet)
            assert await list_pods(kubelet) == {"default/q": {"main": ["b"]}}
            kubelet.list_active_pods_only = False
            assert set(await list_pods(kubelet)) == {"default/p", "default/q", "default/r"}
            await plugin.stop()

    asyncio.run(body())


def test_get_returns_a_finished_pod_with_devices_until_an_update_drops_them(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir, pod_resources_get=True) as kubelet:
            plugin = await plugin_on(kubelet, devs("a"))
            await kubelet.admit_pod(PodSpec("p", [ContainerSpec("main", {GPU: 1})]))
            await kubelet.finish_pod("p")
            request = pr.GetPodResourcesRequest(pod_name="p", pod_namespace="default")
            got = await call(kubelet, "Get", request)  # Get does not call UpdateAllocatedDevices
            assert entries(got.pod_resources.containers[0].devices) == [(GPU, ["a"], [])]
            await call(kubelet, "List", pr.ListPodResourcesRequest())  # List does
            got = await call(kubelet, "Get", request)
            assert got.pod_resources.name == "p"
            assert list(got.pod_resources.containers[0].devices) == []
            await plugin.stop()

    asyncio.run(body())


def test_outage_answers_unavailable(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a"))
            await kubelet.admit_pod(PodSpec("p", [ContainerSpec("main", {GPU: 1})]))
            kubelet.pod_resources_available = False
            for method, request in (
                ("List", pr.ListPodResourcesRequest()),
                ("GetAllocatableResources", pr.AllocatableResourcesRequest()),
                ("Get", pr.GetPodResourcesRequest(pod_name="p", pod_namespace="default")),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call(kubelet, method, request)
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE, method
            kubelet.pod_resources_available = True
            listed = await call(kubelet, "List", pr.ListPodResourcesRequest())
            assert [p.name for p in listed.pod_resources] == ["p"]
            await plugin.stop()

    asyncio.run(body())


def test_rate_limit_answers_resource_exhausted_past_the_burst(plugin_dir: Path) -> None:
    async def body() -> None:
        # one token per 1000 s: after the burst of 3, no refill can happen during the test
        async with running_kubelet(plugin_dir, pod_resources_rate=(0.001, 3)) as kubelet:
            for _ in range(3):
                await call(kubelet, "List", pr.ListPodResourcesRequest())
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call(kubelet, "GetAllocatableResources", pr.AllocatableResourcesRequest())
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert info.value.details() == "rejected by rate limit"

    asyncio.run(body())


def test_no_rate_limit_when_disabled(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir, pod_resources_rate=None) as kubelet:
            for _ in range(30):  # well past the kubelet's burst of 10
                await call(kubelet, "List", pr.ListPodResourcesRequest())

    asyncio.run(body())


def test_token_bucket_refills_at_its_rate() -> None:
    from devplug.devkubelet.podresources_server import TokenBucket

    now = [0.0]
    bucket = TokenBucket(2.0, 2, clock=lambda: now[0])
    assert [bucket.take(), bucket.take(), bucket.take()] == [True, True, False]
    now[0] = 0.5  # one token back
    assert [bucket.take(), bucket.take()] == [True, False]
    now[0] = 100.0  # never more than the burst
    assert [bucket.take(), bucket.take(), bucket.take()] == [True, True, False]
