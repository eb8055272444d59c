"""Pod objects, phases, active pods and the lazy release of devices (kubelet v1.32 semantics)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.devkubelet import ContainerSpec, PodPhase, PodSpec
from devplug.errors import KubeletError
from tests.devkubelet.fakeplugin import Behaviour, FakePlugin, devs, gpu, list_pods, plugin_on, running_kubelet

GPU = "example.com/gpu"
NIC = "example.com/nic"


def one(name: str, count: int, *, uid: str | None = None, resource: str = GPU) -> PodSpec:
    return PodSpec(name, [ContainerSpec("main", {resource: count})], uid=uid)


def test_every_pod_object_has_a_uid_keying_its_devices(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b"))
            drawn = await kubelet.admit_pod(one("p", 1))
            assert uuid.UUID(drawn.uid).version == 4
            given = await kubelet.admit_pod(one("q", 1, uid="uid-of-q"))
            assert given.uid == "uid-of-q"
            entries = {(e.pod_uid, e.pod, e.container, e.device_ids) for e in kubelet.pod_device_entries()}
            assert entries == {(drawn.uid, "default/p", "main", ("a",)), ("uid-of-q", "default/q", "main", ("b",))}
            with pytest.raises(KubeletError, match="uid-of-q is already used by pod default/q"):
                await kubelet.admit_pod(one("r", 0, uid="uid-of-q"))
            await plugin.stop()

    asyncio.run(body())


def test_a_finished_pod_stays_known_and_its_devices_go_to_the_next_pod_at_once(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b"))
            first = await kubelet.admit_pod(one("p", 2))
            await kubelet.finish_pod("p")
            assert kubelet.pod_phase("p") == PodPhase.FINISHED
            assert kubelet.pods() == []
            assert [(p.spec.name, p.phase) for p in kubelet.known_pods()] == [("p", PodPhase.FINISHED)]
            assert kubelet.attributed(GPU) == {}
            # nothing is freed yet: podDevices keeps the entry until the next UpdateAllocatedDevices
            assert [(e.pod, e.device_ids) for e in kubelet.pod_device_entries()] == [("default/p", ("a", "b"))]
            assert gpu(kubelet).free == 2  # ...which the next admission runs first
            calls = len(plugin.calls)

            second = await kubelet.admit_pod(one("q", 2))
            assert second.containers[0].devices[GPU] == ("a", "b")
            assert [name for name, _ in plugin.calls[calls:]] == ["Allocate"]  # no release of any kind in between
            assert [e.pod for e in kubelet.pod_device_entries()] == ["default/q"]
            (dropped,) = kubelet.events_of("pod-devices-dropped")
            assert first.uid in dropped.detail
            assert kubelet.pod_phase("p") == PodPhase.FINISHED  # the object still exists
            await plugin.stop()

    asyncio.run(body())


def test_a_finished_or_rejected_name_is_re_created_as_a_new_object(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b"))
            old = await kubelet.admit_pod(one("p", 1))
            with pytest.raises(KubeletError, match="already admitted"):
                await kubelet.admit_pod(one("p", 1))
            await kubelet.finish_pod("p")
            new = await kubelet.admit_pod(one("p", 1))
            assert new.uid != old.uid
            assert new.containers[0].devices[GPU] == ("a",)  # the old object's device, at once
            assert [(p.uid, p.phase) for p in kubelet.known_pods()] == [(new.uid, PodPhase.RUNNING)]

            with pytest.raises(KubeletError, match="rejected"):
                await kubelet.admit_pod(one("r", 1, resource="example.com/fpga"))
            rejected = kubelet.known_pods()[-1]
            assert (rejected.spec.name, rejected.phase) == ("r", PodPhase.REJECTED)
            recreated = await kubelet.admit_pod(one("r", 1))
            assert recreated.uid != rejected.uid
            assert kubelet.pod_phase("r") == PodPhase.RUNNING
            await plugin.stop()

    asyncio.run(body())


def test_remove_pod_finishes_a_running_pod_then_deletes_it(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a"))
            await kubelet.admit_pod(one("p", 1))
            await kubelet.remove_pod("p")
            kinds = [e.kind for e in kubelet.events][-7:]
            assert kinds == [
                "pod-terminating",
                "container-stopping",
                "container-exited",
                "pod-finished",
                "container-exited",  # the sandbox, stopped after the containers
                "pod-cleaned-up",
                "pod-removed",
            ]
            assert kubelet.pod_phase("p") == PodPhase.DELETED
            assert kubelet.known_pods() == []
            assert kubelet.pod_phase("never") is None
            with pytest.raises(KubeletError, match="no admitted pod default/p"):
                await kubelet.remove_pod("p")
            with pytest.raises(KubeletError, match="cannot finish pod default/p"):
                await kubelet.finish_pod("p")
            await plugin.stop()

    asyncio.run(body())


def test_finished_init_containers_keep_their_devices_while_the_pod_lives(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b", "c"))
            await kubelet.admit_pod(
                PodSpec("p", [ContainerSpec("setup", {GPU: 2}, init=True), ContainerSpec("main", {GPU: 1})])
            )
            # main reused "a"; "b" stays with the (finished) init container as long as the pod is active
            assert kubelet.attributed(GPU) == {"a": ("default/p", "main"), "b": ("default/p", "setup")}
            assert gpu(kubelet).in_use == {"a", "b"}
            other = await kubelet.admit_pod(one("q", 1))
            assert other.containers[0].devices[GPU] == ("c",)
            await plugin.stop()

    asyncio.run(body())


def test_sidecar_devices_are_listed_and_never_reused(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b", "c", "d"))
            admitted = await kubelet.admit_pod(
                PodSpec(
                    "p",
                    [
                        ContainerSpec("setup", {GPU: 1}, init=True),
                        ContainerSpec("proxy", {GPU: 1}, init=True, restartable=True),
                        ContainerSpec("main", {GPU: 2}),
                    ],
                )
            )
            # the sidecar reuses the finished init container's "a", and takes it out of the reuse pool
            assert [(c.name, c.devices[GPU]) for c in admitted.containers] == [
                ("setup", ("a",)),
                ("proxy", ("a",)),
                ("main", ("b", "c")),
            ]
            assert kubelet.attributed(GPU) == {
                "a": ("default/p", "proxy"),
                "b": ("default/p", "main"),
                "c": ("default/p", "main"),
            }
            # List shows the sidecar (SidecarContainers is on in 1.32), not the plain init container
            assert await list_pods(kubelet) == {"default/p": {"proxy": ["a"], "main": ["b", "c"]}}
            await plugin.stop()

    asyncio.run(body())


def test_a_sidecar_listed_first_keeps_its_devices_from_later_containers(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b", "c"))
            admitted = await kubelet.admit_pod(
                PodSpec(
                    "p",
                    [
                        ContainerSpec("main", {GPU: 2}),
                        ContainerSpec("proxy", {GPU: 1}, init=True, restartable=True),
                        ContainerSpec("setup", {GPU: 1}, init=True),
                    ],
                )
            )
            assert [(c.name, c.devices[GPU]) for c in admitted.containers] == [
                ("proxy", ("a",)),
                ("setup", ("b",)),
                ("main", ("b", "c")),
            ]
            with pytest.raises(ValueError, match="only an init container can be restartable"):
                ContainerSpec("x", {GPU: 1}, restartable=True)
            await plugin.stop()

    asyncio.run(body())


def test_rejection_part_way_keeps_the_first_resource_until_the_next_update(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            gpus = await plugin_on(kubelet, devs("a", "b"))
            nics = await plugin_on(
                kubelet, devs("n0"), resource=NIC, endpoint="nic.sock", behaviour=Behaviour(allocate_errors={1: "no"})
            )
            writes = kubelet.checkpoint_writes
            inode = kubelet.checkpoint_path.stat().st_ino
            with pytest.raises(KubeletError, match="pod default/p rejected"):
                await kubelet.admit_pod(PodSpec("p", [ContainerSpec("main", {GPU: 1, NIC: 1})]))
            # allocateContainerResources returned the NIC's error before writing the checkpoint
            assert kubelet.checkpoint_writes == writes
            assert kubelet.checkpoint_path.stat().st_ino == inode
            assert [(e.pod, e.resource, e.device_ids) for e in kubelet.pod_device_entries()] == [
                ("default/p", GPU, ("a",))
            ]
            assert kubelet.pod_phase("p") == PodPhase.REJECTED
            # List runs UpdateAllocatedDevices first: the rejected pod is listed, without devices
            assert await list_pods(kubelet) == {"default/p": {"main": []}}
            assert kubelet.pod_device_entries() == []
            taken = await kubelet.admit_pod(one("q", 1))
            assert taken.containers[0].devices[GPU] == ("a",)
            await gpus.stop()
            await nics.stop()

    asyncio.run(body())


def test_an_empty_allocate_reply_leaves_the_devices_allocated_to_nobody(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b", "c"), behaviour=Behaviour(allocate_empty={1}))
            with pytest.raises(KubeletError, match="no containers return in allocation response"):
                await kubelet.admit_pod(one("p", 1))
            # allocatedDevices is not rebuilt on this path, and podDevices never got "a"
            assert kubelet.pod_device_entries() == []
            assert gpu(kubelet).in_use == {"a"}
            taken = await kubelet.admit_pod(one("q", 1))
            assert taken.containers[0].devices[GPU] == ("b",)  # nothing to drop, so "a" stays stranded
            await kubelet.finish_pod("q")
            again = await kubelet.admit_pod(one("r", 3))  # dropping q's entry rebuilds allocatedDevices
            assert again.containers[0].devices[GPU] == ("a", "b", "c")
            await plugin.stop()

    asyncio.run(body())


def test_register_request_options_are_ignored_for_get_device_plugin_options(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = FakePlugin(kubelet.device_plugin_dir, GPU, devs("a", "b"))
            await plugin.start()
            claimed = dp.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)
            await plugin.register(kubelet.kubelet_socket, options=claimed)
            await kubelet.wait_for(lambda k: (v := k.resource(GPU)) is not None and v.capacity == 2)
            assert [name for name, _ in plugin.calls][:1] == ["GetDevicePluginOptions"]
            assert not gpu(kubelet).options.pre_start_required
            await kubelet.admit_pod(one("p", 1))
            assert plugin.requests("PreStartContainer") == []
            assert plugin.requests("GetPreferredAllocation") == []
            await plugin.stop()

    asyncio.run(body())


def test_preferred_allocation_is_asked_even_when_exactly_enough_devices_are_free(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b"), behaviour=Behaviour(preferred_available=True))
            await kubelet.admit_pod(one("p", 2))
            # without a topology manager hint devicesToAllocate skips the "needed < aligned.Len()" branch
            (request,) = plugin.requests("GetPreferredAllocation")
            creq = request.container_requests[0]
            assert (list(creq.available_deviceIDs), list(creq.must_include_deviceIDs), creq.allocation_size) == (
                ["a", "b"],
                [],
                2,
            )
            await kubelet.finish_pod("p")
            # an app container covered entirely by its init container's devices: not asked
            await kubelet.admit_pod(
                PodSpec("q", [ContainerSpec("setup", {GPU: 1}, init=True), ContainerSpec("main", {GPU: 1})])
            )
            assert len(plugin.requests("GetPreferredAllocation")) == 2
            assert [list(r.container_requests[0].devices_ids) for r in plugin.requests("Allocate")][1:] == [
                ["a"],
                ["a"],
            ]
            await plugin.stop()

    asyncio.run(body())


def test_kep_mode_calls_post_stop_and_deallocate_when_the_pod_finishes(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir, kep_mode=True) as kubelet:
            behaviour = Behaviour(post_stop_required=True, deallocate_available=True)
            plugin = await plugin_on(kubelet, devs("a", "b"), behaviour=behaviour)
            await kubelet.admit_pod(one("p", 1))
            await kubelet.admit_pod(one("q", 1))
            await kubelet.finish_pod("p")
            assert [list(r.devices_ids) for r in plugin.requests("PostStopContainer")] == [["a"]]
            assert [list(r.devices_ids) for r in plugin.requests("Deallocate")] == [["a"]]
            await kubelet.remove_pod("p")  # already finished: nothing more
            assert len(plugin.requests("PostStopContainer")) == 1
            assert len(plugin.requests("Deallocate")) == 1
            await kubelet.remove_pod("q")  # running: finishes first
            assert [list(r.devices_ids) for r in plugin.requests("Deallocate")] == [["a"], ["b"]]
            await plugin.stop()

    asyncio.run(body())
