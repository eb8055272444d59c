"""``kubelet_internal_checkpoint``: its contents, and exactly when the kubelet writes it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from devplug.api.checkpoint import CHECKPOINT_FILE, KubeletCheckpoint, read_checkpoint
from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.devkubelet import ContainerSpec, PodSpec
from tests.devkubelet.fakeplugin import Dev, devs, list_pods, plugin_on, push_list, running_kubelet

GPU = "example.com/gpu"


def read(path: Path) -> KubeletCheckpoint:
    checkpoint = read_checkpoint(path)
    assert checkpoint is not None, f"{path} is missing"
    return checkpoint


def test_the_checkpoint_holds_pod_devices_in_the_kubelets_format(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(
                kubelet, [Dev("g0", numa=(0,)), Dev("g1"), Dev("g2", numa=(0, 1)), Dev("g3", "Unhealthy")]
            )
            admitted = await kubelet.admit_pod(
                PodSpec("p", [ContainerSpec("setup", {GPU: 1}, init=True), ContainerSpec("main", {GPU: 3})])
            )
            checkpoint = read(plugin_dir / CHECKPOINT_FILE)
            assert kubelet.last_checkpoint == checkpoint
            entries = [(e.pod_uid, e.container, e.resource, dict(e.devices_by_numa)) for e in checkpoint.entries]
            assert entries == [
                (admitted.uid, "setup", GPU, {0: ("g0",)}),
                (admitted.uid, "main", GPU, {0: ("g0", "g2"), -1: ("g1",), 1: ("g2",)}),
            ]
            # AllocResp is the ContainerAllocateResponse the plugin answered
            answer = dp.ContainerAllocateResponse.FromString(checkpoint.entries[1].alloc_response)
            assert dict(answer.envs) == {"DEVICES": "g0,g1,g2"}
            assert [d.host_path for d in answer.devices] == ["/dev/g0", "/dev/g1", "/dev/g2"]
            assert dict(checkpoint.registered_devices) == {GPU: ("g0", "g1", "g2")}  # healthy devices only
            await plugin.stop()

    asyncio.run(body())


def test_every_device_list_rewrites_the_checkpoint_as_a_new_inode(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b"))
            await kubelet.admit_pod(PodSpec("p", [ContainerSpec("main", {GPU: 1})]))
            path = kubelet.checkpoint_path
            before = (path.stat().st_ino, path.read_bytes())
            await push_list(kubelet, plugin)  # the very same list
            after = (path.stat().st_ino, path.read_bytes())
            assert after[0] != before[0]  # written to a temp file and renamed over the old one
            assert after[1] == before[1]
            assert sorted(p.name for p in plugin_dir.iterdir()) == ["fake.sock", "kubelet.sock", CHECKPOINT_FILE]
            await push_list(kubelet, plugin, devs("a", "b", "c"))
            assert dict(read(path).registered_devices) == {GPU: ("a", "b", "c")}
            await plugin.stop()

    asyncio.run(body())


def test_allocation_writes_once_per_container_that_needed_an_allocate(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b"))
            writes = kubelet.checkpoint_writes
            await kubelet.admit_pod(
                PodSpec("p", [ContainerSpec("one", {GPU: 1}), ContainerSpec("log"), ContainerSpec("two", {GPU: 1})])
            )
            assert kubelet.checkpoint_writes == writes + 2
            await plugin.stop()

    asyncio.run(body())


def test_entries_of_finished_pods_stay_in_the_checkpoint_until_update_allocated_devices(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b"))
            finished = await kubelet.admit_pod(PodSpec("p", [ContainerSpec("main", {GPU: 1})]))
            await kubelet.finish_pod("p")
            await push_list(kubelet, plugin)
            assert [e.pod_uid for e in read(kubelet.checkpoint_path).entries] == [finished.uid]  # still there
            assert await list_pods(kubelet) == {"default/p": {"main": []}}  # List drops it in memory only...
            assert [e.pod_uid for e in read(kubelet.checkpoint_path).entries] == [finished.uid]
            await push_list(kubelet, plugin)  # ...until the next write
            assert read(kubelet.checkpoint_path).entries == ()
            await plugin.stop()

    asyncio.run(body())


def test_write_checkpoint_false_never_touches_the_file_but_a_restart_still_restores(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir, write_checkpoint=False) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b"))
            await kubelet.admit_pod(PodSpec("p", [ContainerSpec("main", {GPU: 1})]))
            assert not kubelet.checkpoint_path.exists()
            assert kubelet.checkpoint_writes == 0
            assert kubelet.last_checkpoint is not None
            await kubelet.restart()
            assert not kubelet.checkpoint_path.exists()
            assert kubelet.attributed(GPU) == {"a": ("default/p", "main")}
            await plugin.stop()

    asyncio.run(body())
