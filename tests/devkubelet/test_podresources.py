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
from tests.devkubelet.fakeplugin import Dev, devs, plugin_on, running_kubelet

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
        async with running_kubelet(plugin_dir) as kubelet:
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


def test_get_unknown_pod_is_not_found(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call(kubelet, "Get", pr.GetPodResourcesRequest(pod_name="ghost", pod_namespace="default"))
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
            assert info.value.details() == "pod ghost in namespace default not found"

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
    from devplug.devkubelet.podresources import TokenBucket

    now = [0.0]
    bucket = TokenBucket(2.0, 2, clock=lambda: now[0])
    assert [bucket.take(), bucket.take(), bucket.take()] == [True, True, False]
    now[0] = 0.5  # one token back
    assert [bucket.take(), bucket.take()] == [True, False]
    now[0] = 100.0  # never more than the burst
    assert [bucket.take(), bucket.take(), bucket.take()] == [True, True, False]
