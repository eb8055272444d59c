"""After a kubelet restart: PodResources answers before the main loop has loaded the pods."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import grpc.aio
import pytest

from devplug.api.gen.podresources.v1 import api_pb2 as pr
from devplug.api.gen.podresources.v1 import api_pb2_grpc as pr_grpc
from devplug.devkubelet import ContainerSpec, DevKubeletThread, PodPhase, PodSpec
from devplug.testing.plugin import cgroup_layout_for
from tests.devkubelet.fakeplugin import FakePlugin, devs, list_pods, node_dev_root, plugin_on, running_kubelet

GPU = "example.com/gpu"


def one(name: str, count: int) -> PodSpec:
    return PodSpec(name, [ContainerSpec("main", {GPU: count})])


def test_list_answers_no_pods_during_the_window_while_the_pods_keep_their_devices(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir, pod_resources_get=True) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b"))
            admitted = await kubelet.admit_pod(one("p", 1))
            await plugin.stop()

            await kubelet.restart(pod_list_delay=600)
            assert not kubelet.pod_list_loaded
            assert not kubelet.sources_ready
            assert await list_pods(kubelet) == {}  # a successful answer, with no pods
            async with grpc.aio.insecure_channel(f"unix:{kubelet.pod_resources_socket}") as channel:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await pr_grpc.PodResourcesListerStub(channel).Get(
                        pr.GetPodResourcesRequest(pod_name="p", pod_namespace="default"), timeout=10
                    )
            assert info.value.code() == grpc.StatusCode.UNKNOWN
            assert info.value.details() == "pod p in namespace default not found"
            assert kubelet.pods() == [admitted]  # the pod runs on
            assert kubelet.attributed(GPU) == {"a": ("default/p", "main")}  # and the kubelet still holds "a"
            assert [e.pod for e in kubelet.pod_device_entries()] == ["default/p"]  # List freed nothing

            assert kubelet.load_pods()
            assert not kubelet.load_pods()  # nothing left to end
            assert kubelet.sources_ready
            assert await list_pods(kubelet) == {"default/p": {"main": ["a"]}}

    asyncio.run(body())


def test_the_window_ends_by_itself_after_the_delay(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir, pod_list_delay=0.3) as kubelet:
            plugin = await plugin_on(kubelet, devs("a"))
            await kubelet.admit_pod(one("p", 1))
            await kubelet.restart()  # the constructor's delay
            assert not kubelet.pod_list_loaded
            await kubelet.wait_for(lambda k: k.pod_list_loaded, timeout=10, what="the pods loaded")
            assert await list_pods(kubelet) == {"default/p": {"main": ["a"]}}
            assert [e.kind for e in kubelet.events][-1] == "pods-loaded"
            await kubelet.restart(pod_list_delay=0)  # no window at all
            assert kubelet.pod_list_loaded and kubelet.sources_ready
            await plugin.stop()

    asyncio.run(body())


def test_nothing_is_freed_until_the_sources_are_ready(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b"))
            await kubelet.admit_pod(one("p", 1))
            await kubelet.finish_pod("p")  # its entry is still in podDevices, and in the checkpoint
            await plugin.stop()

            await kubelet.restart(pod_list_delay=600)
            again = FakePlugin(plugin_dir, GPU, devs("a", "b"))
            await again.start()
            await again.register(kubelet.kubelet_socket)
            await kubelet.wait_for(lambda k: (v := k.resource(GPU)) is not None and v.allocatable == 2)
            # the new pod arrives with the main loop's first pod list: sources are not ready during its admission
            taken = await kubelet.admit_pod(one("q", 1))
            assert taken.containers[0].devices[GPU] == ("b",)  # "a" was not freed
            assert kubelet.sources_ready  # ...and are right after it
            assert kubelet.pod_phase("p") == PodPhase.FINISHED
            assert await list_pods(kubelet) == {"default/p": {"main": []}, "default/q": {"main": ["b"]}}
            assert [e.pod for e in kubelet.pod_device_entries()] == ["default/q"]
            await again.stop()

    asyncio.run(body())


def test_the_threaded_wrapper_has_the_new_methods(plugin_dir: Path) -> None:
    with DevKubeletThread(
        plugin_dir,
        pod_resources_rate=None,
        pod_resources_get=True,
        dev_root=node_dev_root(plugin_dir),
        cgroups=cgroup_layout_for(None),
    ) as kubelet:
        plugin = asyncio.run_coroutine_threadsafe(
            FakePlugin(plugin_dir, GPU, devs("a", "b")).serve_and_register(kubelet.kubelet_socket), kubelet.loop
        ).result(30)
        kubelet.wait_for(lambda k: (v := k.resource(GPU)) is not None and v.capacity == 2)
        admitted = kubelet.admit_pod(one("p", 1))
        assert kubelet.attributed(GPU) == {"a": ("default/p", "main")}
        kubelet.finish_pod("p")
        assert kubelet.pod_phase("p") == PodPhase.FINISHED
        assert [p.uid for p in kubelet.known_pods()] == [admitted.uid]
        assert [e.pod_uid for e in kubelet.pod_device_entries()] == [admitted.uid]
        assert kubelet.checkpoint_writes >= 2
        assert kubelet.last_checkpoint is not None
        assert kubelet.checkpoint_path == plugin_dir / "kubelet_internal_checkpoint"
        assert kubelet.pod_resources_get
        kubelet.list_active_pods_only = True
        assert kubelet.list_active_pods_only
        assert [r.name for r in kubelet.resources()] == [GPU]
        kubelet.restart(pod_list_delay=600)
        assert not kubelet.pod_list_loaded
        assert not kubelet.sources_ready
        assert kubelet.load_pods()
        assert kubelet.pod_list_loaded
        assert kubelet.events_of("pods-loaded")
        asyncio.run_coroutine_threadsafe(plugin.stop(), kubelet.loop).result(30)
