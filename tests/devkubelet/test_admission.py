"""Pod admission, container start and pod removal, as the kubelet's device manager does them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from devplug.devkubelet import ContainerSpec, ContainerStartError, PodPhase, PodSpec
from devplug.errors import KubeletError
from devplug.types import ContainerAllocation, DeviceSpec
from tests.devkubelet.fakeplugin import Behaviour, Dev, devs, gpu, plugin_on, running_kubelet

GPU = "example.com/gpu"


def pod(name: str, *containers: ContainerSpec) -> PodSpec:
    return PodSpec(name, containers)


def app(name: str, count: int, resource: str = GPU) -> ContainerSpec:
    return ContainerSpec(name, {resource: count})


def init(name: str, count: int) -> ContainerSpec:
    return ContainerSpec(name, {GPU: count}, init=True)


def test_one_allocate_per_container_with_its_answer(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b", "c"))
            admitted = await kubelet.admit_pod(pod("p", app("one", 1), app("two", 2)))
            requests = plugin.requests("Allocate")
            assert len(requests) == 2
            assert [len(r.container_requests) for r in requests] == [1, 1]
            assert [list(r.container_requests[0].devices_ids) for r in requests] == [["a"], ["b", "c"]]
            one, two = admitted.containers
            assert one.devices == {GPU: ("a",)}
            assert two.devices == {GPU: ("b", "c")}
            assert two.allocations[GPU] == ContainerAllocation(
                envs={"DEVICES": "b,c"},
                devices=(DeviceSpec("/dev/b", "/dev/b"), DeviceSpec("/dev/c", "/dev/c")),
            )
            assert kubelet.pods() == [admitted]
            assert gpu(kubelet).in_use == {"a", "b", "c"}
            kinds = [e.kind for e in kubelet.events if e.kind not in ("register", "list-and-watch")]
            assert kinds == ["allocate", "allocate", "pod-admitted", "container-started", "container-started"]
            await plugin.stop()

    asyncio.run(body())


def test_unhealthy_and_taken_devices_are_not_offered(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, [Dev("a"), Dev("b", "Unhealthy"), Dev("c"), Dev("d")])
            await kubelet.admit_pod(pod("first", app("main", 1)))
            assert (gpu(kubelet).allocatable, gpu(kubelet).free) == (3, 2)  # allocatable counts held devices
            second = await kubelet.admit_pod(pod("second", app("main", 2)))
            assert second.containers[0].devices[GPU] == ("c", "d")
            assert (gpu(kubelet).allocatable, gpu(kubelet).free) == (3, 0)
            with pytest.raises(KubeletError) as info:
                await kubelet.admit_pod(pod("third", app("main", 1)))
            assert "requested number of devices unavailable for example.com/gpu. Requested: 1, Available: 0" in str(
                info.value
            )
            assert [p.spec.name for p in kubelet.pods()] == ["first", "second"]
            assert kubelet.events[-1].kind == "pod-rejected"
            await plugin.stop()

    asyncio.run(body())


def test_preferred_allocation_is_used_and_a_shortfall_filled(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            behaviour = Behaviour(preferred_available=True, preferred=["d", "unknown", "b"])
            plugin = await plugin_on(kubelet, devs("a", "b", "c", "d"), behaviour=behaviour)
            await kubelet.admit_pod(pod("taken", app("main", 1)))  # takes "d" (preferred first), "b" ignored
            assert plugin.requests("Allocate")[0].container_requests[0].devices_ids == ["d"]

            admitted = await kubelet.admit_pod(pod("p", app("main", 3)))
            request = plugin.requests("GetPreferredAllocation")[1]
            assert len(request.container_requests) == 1
            creq = request.container_requests[0]
            assert list(creq.available_deviceIDs) == ["a", "b", "c"]
            assert list(creq.must_include_deviceIDs) == []
            assert creq.allocation_size == 3
            # "d" is taken and "unknown" does not exist: ignored; "b" kept; the rest filled in order
            assert admitted.containers[0].devices[GPU] == ("b", "a", "c")
            assert [e.kind for e in kubelet.events].count("preferred-allocation") == 2
            await plugin.stop()

    asyncio.run(body())


def test_preferred_allocation_error_rejects_the_pod(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            behaviour = Behaviour(preferred_available=True, preferred_error="topology is on fire")
            plugin = await plugin_on(kubelet, devs("a", "b"), behaviour=behaviour)
            with pytest.raises(KubeletError, match="topology is on fire"):
                await kubelet.admit_pod(pod("p", app("main", 1)))
            assert plugin.requests("Allocate") == []
            assert kubelet.pods() == []
            await plugin.stop()

    asyncio.run(body())


def test_no_preferred_allocation_call_unless_advertised(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b"), behaviour=Behaviour(preferred=["b"]))
            admitted = await kubelet.admit_pod(pod("p", app("main", 1)))
            assert plugin.requests("GetPreferredAllocation") == []
            assert admitted.containers[0].devices[GPU] == ("a",)
            await plugin.stop()

    asyncio.run(body())


def test_allocate_error_rejects_the_pod_which_stays_known_and_whose_devices_go_to_the_next_pod(
    plugin_dir: Path,
) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            behaviour = Behaviour(allocate_errors={2: "device b is wedged"})
            plugin = await plugin_on(kubelet, devs("a", "b", "c"), behaviour=behaviour)
            with pytest.raises(KubeletError, match="device b is wedged") as info:
                await kubelet.admit_pod(pod("p", app("one", 1), app("two", 1)))
            assert "pod default/p rejected: UnexpectedAdmissionError: Allocate failed due to rpc error: " in str(
                info.value
            )
            assert kubelet.pods() == []
            assert kubelet.pod_phase("p") == PodPhase.REJECTED
            (rejected,) = kubelet.known_pods()
            assert rejected.phase == PodPhase.REJECTED
            assert rejected.container("one").devices == {GPU: ("a",)}
            # the kubelet keeps container one's entry until its next UpdateAllocatedDevices...
            entries = [(e.pod, e.container, e.device_ids) for e in kubelet.pod_device_entries()]
            assert entries == [("default/p", "one", ("a",))]
            assert kubelet.attributed(GPU) == {}  # ...but no live container holds it
            assert gpu(kubelet).in_use == frozenset()
            assert kubelet.events[-1].kind == "pod-rejected"
            # the next pod's allocation drops the rejected pod's entry and takes its device at once
            admitted = await kubelet.admit_pod(pod("q", app("main", 3)))
            assert admitted.containers[0].devices[GPU] == ("a", "b", "c")
            assert [e.pod for e in kubelet.pod_device_entries()] == ["default/q"]
            assert plugin.requests("Deallocate") == []  # stock mode calls nothing
            await plugin.stop()

    asyncio.run(body())


def test_plugin_dying_mid_allocate_rejects_the_pod(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            behaviour = Behaviour(allocate_gate=asyncio.Event())
            plugin = await plugin_on(kubelet, devs("a", "b"), behaviour=behaviour)
            admission = asyncio.ensure_future(kubelet.admit_pod(pod("p", app("main", 1))))
            await plugin.wait_calls("Allocate")
            plugin.end_streams()  # the plugin goes away while its Allocate is in flight
            with pytest.raises(KubeletError, match="connection to the plugin closed"):
                await admission
            assert kubelet.pods() == []
            assert behaviour.allocate_gate is not None
            behaviour.allocate_gate.set()
            await plugin.stop()

    asyncio.run(body())


def test_init_container_devices_are_reused_by_app_containers(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            behaviour = Behaviour(preferred_available=True)
            plugin = await plugin_on(kubelet, devs("a", "b", "c", "d"), behaviour=behaviour)
            # listed after the app container, but init containers are handled first
            admitted = await kubelet.admit_pod(pod("p", app("main", 3), init("setup", 2)))
            assert [c.name for c in admitted.containers] == ["setup", "main"]
            setup, main = admitted.containers
            assert setup.devices[GPU] == ("a", "b")
            assert main.devices[GPU][:2] == ("a", "b")  # the same IDs allocated twice, nothing released
            assert main.devices[GPU] == ("a", "b", "c")
            allocs = [list(r.container_requests[0].devices_ids) for r in plugin.requests("Allocate")]
            assert allocs == [["a", "b"], ["a", "b", "c"]]
            creq = plugin.requests("GetPreferredAllocation")[1].container_requests[0]
            assert list(creq.must_include_deviceIDs) == ["a", "b"]
            assert list(creq.available_deviceIDs) == ["a", "b", "c", "d"]
            assert creq.allocation_size == 3
            assert gpu(kubelet).in_use == {"a", "b", "c"}
            await plugin.stop()

    asyncio.run(body())


def test_app_containers_do_not_share_reused_devices(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b", "c"))
            admitted = await kubelet.admit_pod(pod("p", init("setup", 2), app("one", 1), app("two", 1)))
            assert admitted.container("one").devices[GPU] == ("a",)
            assert admitted.container("two").devices[GPU] == ("b",)
            assert plugin.requests("GetPreferredAllocation") == []  # reuse covered it; not advertised anyway
            await plugin.stop()

    asyncio.run(body())


def test_pre_start_on_every_container_start(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b", "c"), behaviour=Behaviour(pre_start_required=True))
            await kubelet.admit_pod(pod("p", init("setup", 1), app("main", 2)))
            starts = [list(r.devices_ids) for r in plugin.requests("PreStartContainer")]
            assert starts == [["a"], ["a", "b"]]
            await kubelet.start_container("p", "main")  # a container restart: PreStart again, no Allocate
            assert [list(r.devices_ids) for r in plugin.requests("PreStartContainer")][-1] == ["a", "b"]
            assert len(plugin.requests("PreStartContainer")) == 3
            assert len(plugin.requests("Allocate")) == 2
            with pytest.raises(KubeletError, match="no container 'nope'"):
                await kubelet.start_container("p", "nope")
            await plugin.stop()

    asyncio.run(body())


def test_no_pre_start_unless_required(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a"))
            await kubelet.admit_pod(pod("p", app("main", 1)))
            await kubelet.start_container("p", "main")
            assert plugin.requests("PreStartContainer") == []
            await plugin.stop()

    asyncio.run(body())


def test_pre_start_failure_fails_the_start_but_keeps_the_pod(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            behaviour = Behaviour(pre_start_required=True, pre_start_error="firmware not loaded")
            plugin = await plugin_on(kubelet, devs("a"), behaviour=behaviour)
            with pytest.raises(ContainerStartError, match="firmware not loaded") as info:
                await kubelet.admit_pod(pod("p", app("main", 1)))
            assert info.value.container == "main"
            assert [p.spec.name for p in kubelet.pods()] == ["p"]
            behaviour.pre_start_error = None
            await kubelet.start_container("p", "main")
            assert len(plugin.requests("PreStartContainer")) == 2
            await plugin.stop()

    asyncio.run(body())


def test_stock_mode_removal_calls_nothing_and_frees_devices(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            behaviour = Behaviour(post_stop_required=True, deallocate_available=True)
            plugin = await plugin_on(kubelet, devs("a", "b"), behaviour=behaviour)
            await kubelet.admit_pod(pod("p", app("main", 2)))
            await kubelet.remove_pod("p")
            assert plugin.requests("PostStopContainer") == []
            assert plugin.requests("Deallocate") == []
            assert kubelet.pods() == []
            assert gpu(kubelet).in_use == frozenset()
            assert kubelet.events[-1].kind == "pod-removed"
            again = await kubelet.admit_pod(pod("q", app("main", 2)))
            assert again.containers[0].devices[GPU] == ("a", "b")
            with pytest.raises(KubeletError, match="no admitted pod default/p"):
                await kubelet.remove_pod("p")
            await plugin.stop()

    asyncio.run(body())


def test_kep_mode_removal_calls_post_stop_per_container_then_deallocate_once(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir, kep_mode=True) as kubelet:
            behaviour = Behaviour(post_stop_required=True, deallocate_available=True)
            plugin = await plugin_on(kubelet, devs("a", "b", "c"), behaviour=behaviour)
            await kubelet.admit_pod(pod("p", init("setup", 1), app("main", 2)))
            await kubelet.admit_pod(pod("other", app("main", 1)))
            await kubelet.remove_pod("p")
            assert [list(r.devices_ids) for r in plugin.requests("PostStopContainer")] == [["a"], ["a", "b"]]
            assert [list(r.devices_ids) for r in plugin.requests("Deallocate")] == [["a", "b"]]
            kinds = [e.kind for e in kubelet.events][-7:]
            assert kinds == [
                "pod-finished",
                "post-stop",
                "post-stop",
                "deallocate",
                "container-exited",  # the sandbox, stopped after the containers
                "pod-cleaned-up",
                "pod-removed",
            ]
            assert gpu(kubelet).in_use == {"c"}
            await plugin.stop()

    asyncio.run(body())


def test_kep_mode_calls_only_what_the_plugin_advertises(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            kubelet.kep_mode = True
            plugin = await plugin_on(kubelet, devs("a"), behaviour=Behaviour(deallocate_available=True))
            await kubelet.admit_pod(pod("p", app("main", 1)))
            await kubelet.remove_pod("p")
            assert plugin.requests("PostStopContainer") == []
            assert [list(r.devices_ids) for r in plugin.requests("Deallocate")] == [["a"]]
            await plugin.stop()

    asyncio.run(body())


def test_kep_mode_rejection_deallocates_what_was_allocated(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir, kep_mode=True) as kubelet:
            behaviour = Behaviour(deallocate_available=True, allocate_errors={2: "no"})
            plugin = await plugin_on(kubelet, devs("a", "b"), behaviour=behaviour)
            with pytest.raises(KubeletError):
                await kubelet.admit_pod(pod("p", app("one", 1), app("two", 1)))
            assert [list(r.devices_ids) for r in plugin.requests("Deallocate")] == [["a"]]
            await plugin.stop()

    asyncio.run(body())


def test_pods_are_rejected_for_unknown_resources_and_duplicates(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b"))
            with pytest.raises(KubeletError) as info:
                await kubelet.admit_pod(pod("p", app("main", 1, "example.com/fpga")))
            # the device manager skips a resource no plugin serves; the predicate admit handler rejects the pod
            assert "Node didn't have enough resource: example.com/fpga, requested: 1, used: 0, capacity: 0" in str(
                info.value
            )
            assert kubelet.pod_phase("p") == PodPhase.REJECTED
            await kubelet.admit_pod(pod("p", app("main", 1)))
            with pytest.raises(KubeletError, match="already admitted"):
                await kubelet.admit_pod(pod("p", app("main", 1)))  # a running pod's name
            other_ns = await kubelet.admit_pod(PodSpec("p", [app("main", 1)], namespace="prod"))
            assert other_ns.containers[0].devices[GPU] == ("b",)
            await plugin.stop()

    asyncio.run(body())


def test_pod_spec_checks_itself() -> None:
    with pytest.raises(ValueError, match="used twice"):
        PodSpec("p", [app("x", 1), app("x", 1)])
    with pytest.raises(ValueError, match="device count"):
        ContainerSpec("x", {GPU: -1})
