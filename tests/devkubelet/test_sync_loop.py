"""The kubelet's one sync loop: a held Allocate delays every other pod's admission and removal (issue 35).

As in Kubernetes v1.32.10 (``syncLoopIteration`` in ``pkg/kubelet/kubelet.go``; Allocate with
``context.Background()`` in ``pkg/kubelet/cm/devicemanager/endpoint.go``): while a plugin holds one Allocate, a
pod needing no device, a pod's removal and a crashed container's restart wait; what pod workers already do (a
kill, a container's PreStartContainer) goes on. And the checkpoint is written when the kubelet writes it: after
each container's successful allocation, never for a pod rejected part-way, the inactive pods pruned in memory
before the next write.

Every wait is on the dev kubelet's state; the clock is read only to compare recorded times with the moment the
test let the held Allocate answer (lower bounds, which a slow machine cannot break).
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import pytest

from devplug.api.checkpoint import KubeletCheckpoint, read_checkpoint
from devplug.devkubelet import ContainerSpec, DevKubelet, DevKubeletThread, KubeletEvent, PodPhase, PodSpec
from devplug.errors import KubeletError
from tests.devkubelet.fakeplugin import Behaviour, devs, list_pods, plugin_on, running_kubelet

GPU = "example.com/gpu"
FPGA = "example.com/fpga"
#: time.time() and time.monotonic() are read a few microseconds apart for one turn.
CLOCK_SLACK = 0.005


def pod(name: str, *containers: ContainerSpec, grace: int = 30) -> PodSpec:
    return PodSpec(name, containers, termination_grace_period=grace)


def event(kubelet: DevKubelet, kind: str, text: str) -> KubeletEvent:
    """The one event of ``kind`` whose detail holds ``text``."""
    (found,) = [e for e in kubelet.events_of(kind) if text in e.detail]
    return found


def read(path: Path) -> KubeletCheckpoint:
    checkpoint = read_checkpoint(path)
    assert checkpoint is not None
    return checkpoint


async def queued(kubelet: DevKubelet, turn: str) -> None:
    await kubelet.wait_for(lambda k: turn in k.sync_loop_waiting, what=f"{turn} queued behind the sync loop")


def test_a_pod_needing_no_device_is_admitted_only_when_the_held_allocate_answers(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            gate = asyncio.Event()
            plugin = await plugin_on(kubelet, devs("a"), behaviour=Behaviour(allocate_gate=gate))
            holding = asyncio.ensure_future(kubelet.admit_pod(pod("p", ContainerSpec("main", {GPU: 1}))))
            await plugin.wait_calls("Allocate")
            free = asyncio.ensure_future(kubelet.admit_pod(pod("q", ContainerSpec("main"))))
            await queued(kubelet, "ADD default/q")

            assert kubelet.sync_loop_busy == "ADD default/p"
            assert kubelet.pod_phase("q") is None  # not even in the pod manager: HandlePodAdditions has not run
            assert not free.done()

            released = time.time()
            gate.set()
            await holding
            admitted = await free

            assert admitted.spec.name == "q"
            assert kubelet.pod_phase("q") == PodPhase.RUNNING
            assert event(kubelet, "pod-admitted", "default/q").time >= released
            (op,) = kubelet.sync_loop_ops("ADD", "default/q")
            assert op.behind == "ADD default/p"
            assert op.queued_at + op.waited >= released - CLOCK_SLACK  # it waited for the whole rest of the hold
            (p_op,) = kubelet.sync_loop_ops("ADD", "default/p")
            assert p_op.held >= op.waited - CLOCK_SLACK
            (waited,) = kubelet.events_of("sync-loop-waited")
            assert waited.detail.startswith("ADD default/q waited ")
            assert "behind ADD default/p" in waited.detail
            await plugin.stop()

    asyncio.run(body())


@pytest.mark.parametrize(
    ("how", "turn", "phase"),
    [
        ("force_delete_pod", "REMOVE", PodPhase.DELETED),
        ("remove_static_pod", "REMOVE", PodPhase.DELETED),
        ("remove_pod", "UPDATE", PodPhase.TERMINATING),
    ],
)
def test_a_pods_removal_takes_effect_only_when_the_held_allocate_answers(
    plugin_dir: Path, how: str, turn: str, phase: PodPhase
) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            gate = asyncio.Event()
            plugin = await plugin_on(kubelet, devs("a"), behaviour=Behaviour(allocate_gate=gate))
            await kubelet.admit_pod(pod("r", ContainerSpec("main", stop_delay=math.inf)))
            holding = asyncio.ensure_future(kubelet.admit_pod(pod("p", ContainerSpec("main", {GPU: 1}))))
            await plugin.wait_calls("Allocate")
            if how == "remove_pod":
                removal = asyncio.ensure_future(kubelet.remove_pod("r", wait=False))
            else:
                removal = asyncio.ensure_future(getattr(kubelet, how)("r"))
            await queued(kubelet, f"{turn} default/r")

            # the kubelet has not heard of it: still in the pod manager and PodResources, its container untouched
            assert kubelet.pod_phase("r") == PodPhase.RUNNING
            assert "default/r" in await list_pods(kubelet)
            assert kubelet.running_containers("r") == ["main"]
            assert kubelet.events_of("container-stopping") == []

            released = time.time()
            gate.set()
            await holding
            await removal

            assert kubelet.pod_phase("r") == phase
            await kubelet.wait_for(lambda k: k.events_of("container-stopping") != [], what="r's kill to begin")
            assert event(kubelet, "container-stopping", "default/r/main").time >= released
            (op,) = kubelet.sync_loop_ops(turn, "default/r")
            assert op.behind == "ADD default/p"
            assert op.queued_at + op.waited >= released - CLOCK_SLACK
            await plugin.stop()

    asyncio.run(body())


def test_a_crashed_containers_restart_waits_for_the_held_allocate(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            gate = asyncio.Event()
            plugin = await plugin_on(kubelet, devs("a"), behaviour=Behaviour(allocate_gate=gate))
            await kubelet.admit_pod(pod("r", ContainerSpec("main")))
            holding = asyncio.ensure_future(kubelet.admit_pod(pod("p", ContainerSpec("main", {GPU: 1}))))
            await plugin.wait_calls("Allocate")
            restart = asyncio.ensure_future(kubelet.start_container("r", "main"))  # the PLEG saw it crash
            await queued(kubelet, "PLEG default/r")
            assert len([e for e in kubelet.events_of("container-started") if "default/r/main" in e.detail]) == 1

            released = time.time()
            gate.set()
            await holding
            await restart

            starts = [e for e in kubelet.events_of("container-started") if "default/r/main" in e.detail]
            assert len(starts) == 2
            assert starts[1].time >= released
            await plugin.stop()

    asyncio.run(body())


def test_a_kill_under_way_goes_on_while_an_allocate_is_held(plugin_dir: Path) -> None:
    """The previous tenant's container dies during the hold: the pod worker kills it outside the sync loop.

    The plugin holds the next pod's Allocate until the old container has exited (what a plugin waiting for the
    previous tenant does); that exit comes from the pod worker's kill, which the held loop does not stop.
    """

    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            gate = asyncio.Event()
            plugin = await plugin_on(kubelet, devs("a"))
            await kubelet.admit_pod(pod("old", ContainerSpec("main", {GPU: 1}, stop_delay=math.inf)))
            plugin.behaviour.allocate_gate = gate  # the first Allocate answered; the next one is held
            await kubelet.force_delete_pod("old")  # SIGTERM now, SIGKILL after 2 s, in the pod worker
            holding = asyncio.ensure_future(kubelet.admit_pod(pod("new", ContainerSpec("main", {GPU: 1}))))
            await plugin.wait_calls("Allocate", 2)
            assert kubelet.sync_loop_busy == "ADD default/new"

            await kubelet.wait_containers_exited("old", timeout=30)
            await kubelet.wait_pod_cleaned_up("old", timeout=30)

            assert kubelet.sync_loop_busy == "ADD default/new"  # all of it while the Allocate was held
            assert not holding.done()
            gate.set()
            admitted = await holding
            assert admitted.containers[0].devices == {GPU: ("a",)}
            await plugin.stop()

    asyncio.run(body())


def test_a_held_pre_start_container_does_not_hold_the_sync_loop(plugin_dir: Path) -> None:
    """PreStartContainer runs in the pod worker, with its own 30 s deadline: other pods are admitted meanwhile."""

    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            gate = asyncio.Event()
            behaviour = Behaviour(pre_start_required=True, pre_start_gate=gate)
            plugin = await plugin_on(kubelet, devs("a"), behaviour=behaviour)
            starting = asyncio.ensure_future(kubelet.admit_pod(pod("p", ContainerSpec("main", {GPU: 1}))))
            await plugin.wait_calls("PreStartContainer")
            assert kubelet.sync_loop_busy == ""

            admitted = await asyncio.wait_for(kubelet.admit_pod(pod("q", ContainerSpec("main"))), 10)

            assert admitted.spec.name == "q"
            assert not starting.done()  # p's container still waits for its PreStartContainer
            (op,) = kubelet.sync_loop_ops("ADD", "default/q")
            assert op.behind == ""
            assert kubelet.events_of("sync-loop-waited") == []
            gate.set()
            await starting
            assert kubelet.running_containers("p") == ["main"]
            await plugin.stop()

    asyncio.run(body())


def test_the_checkpoint_is_written_after_each_allocation_and_never_for_a_rejected_pod(plugin_dir: Path) -> None:
    """``allocateContainerResources`` writes at its end; a failed Allocate returns before; the prune is in memory.

    A pod asks for two resources; the first Allocate succeeds, the second fails: the pod is rejected, the file
    never names it, while the device manager's memory keeps its first device until the next allocation's
    ``UpdateAllocatedDevices``, which drops it before that allocation's own write.
    """

    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            gpu = await plugin_on(kubelet, devs("a"), endpoint="gpu.sock")
            fpga = await plugin_on(
                kubelet, devs("f0"), resource=FPGA, endpoint="fpga.sock", behaviour=Behaviour(allocate_errors={1: "no"})
            )
            seen: list[tuple[str, str, int]] = []
            kubelet.add_listener(lambda e: seen.append((e.kind, e.detail, kubelet.checkpoint_writes)))
            before = kubelet.checkpoint_writes

            with pytest.raises(KubeletError, match="UnexpectedAdmissionError"):
                await kubelet.admit_pod(pod("rejected", ContainerSpec("main", {GPU: 1, FPGA: 1})))
            rejected = kubelet.pod_uid("rejected")

            assert [(k, n) for k, _, n in seen] == [
                ("allocate", before),
                ("allocate", before),
                ("pod-rejected", before),
            ]
            assert kubelet.checkpoint_writes == before  # rejected before the write
            assert rejected not in {e.pod_uid for e in read(kubelet.checkpoint_path).entries}
            in_memory = [(e.pod, e.resource, e.device_ids) for e in kubelet.pod_device_entries()]
            assert in_memory == [("default/rejected", GPU, ("a",))]

            seen.clear()
            admitted = await kubelet.admit_pod(pod("next", ContainerSpec("main", {GPU: 1})))
            assert admitted.containers[0].devices == {GPU: ("a",)}  # the rejected pod's device, at once
            kinds = [(k, n) for k, _, n in seen if k != "container-started"]
            assert kinds == [("pod-devices-dropped", before), ("allocate", before), ("pod-admitted", before + 1)]
            on_disk = read(kubelet.checkpoint_path)
            assert [(e.pod_uid, e.resource) for e in on_disk.entries] == [(admitted.uid, GPU)]

            # a finished pod: the file keeps naming it until the next write, the prune in memory comes first
            await kubelet.finish_pod("next")
            writes = kubelet.checkpoint_writes
            assert [e.pod_uid for e in read(kubelet.checkpoint_path).entries] == [admitted.uid]
            seen.clear()
            third = await kubelet.admit_pod(pod("third", ContainerSpec("main", {GPU: 1})))
            kinds = [(k, n) for k, _, n in seen if k != "container-started"]
            assert kinds == [("pod-devices-dropped", writes), ("allocate", writes), ("pod-admitted", writes + 1)]
            assert [e.pod_uid for e in read(kubelet.checkpoint_path).entries] == [third.uid]
            await gpu.stop()
            await fpga.stop()

    asyncio.run(body())


def test_the_threaded_face_shows_the_sync_loops_turns(plugin_dir: Path) -> None:
    with DevKubeletThread(plugin_dir, cgroups=None) as kubelet:
        kubelet.admit_pod(pod("q", ContainerSpec("main")))
        kubelet.remove_pod("q")
        assert [op.label for op in kubelet.sync_loop_ops()] == ["ADD default/q", "UPDATE default/q"]
        assert [op.label for op in kubelet.sync_loop_ops("ADD")] == ["ADD default/q"]
        assert kubelet.sync_loop_busy == ""
        assert kubelet.sync_loop_waiting == ()
