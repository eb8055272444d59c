"""Housekeeping: the restarted kubelet kills a pod it no longer knows, in a turn of its one sync loop.

As in Kubernetes v1.32.10: a static pod whose manifest was removed while the kubelet was down is in none of the
restarted kubelet's pod lists, so its pod manager and pod workers never know it while the runtime still runs it;
its devices come back from the checkpoint (``readCheckpoint``) and the next ``UpdateAllocatedDevices`` prunes them.
``HandlePodCleanups`` (``pkg/kubelet/kubelet_pods.go``), run by ``syncLoopIteration`` on the housekeeping ticker
(``housekeepingPeriod``, 2 s) once the sources are ready, hands it to a pod worker to kill with a grace period of
1 s (``SyncTerminatingRuntimePod``; 2 s in ``killContainer``) and destroys its pod cgroup
(``cleanupOrphanedPodCgroups``). A plugin holding an Allocate holds housekeeping too.

Every wait is on the dev kubelet's state; the clock is read only to compare recorded times with the moment the test
let the held Allocate answer.
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import pytest

from devplug.devkubelet import ContainerSpec, DevKubelet, DevKubeletThread, KubeletEvent, PodPhase, PodSpec
from devplug.devkubelet.cgroups import CgroupLayout
from devplug.errors import KubeletError
from tests.devkubelet.fakeplugin import Behaviour, FakePlugin, devs, list_pods, plugin_on, running_kubelet

GPU = "example.com/gpu"
#: time.time() and time.monotonic() are read a few microseconds apart for one turn.
CLOCK_SLACK = 0.005


def holder(name: str, count: int = 1) -> PodSpec:
    """A pod whose container ignores SIGTERM (only a SIGKILL ends it), holding ``count`` GPUs."""
    return PodSpec(name, [ContainerSpec("main", {GPU: count}, stop_delay=math.inf)], termination_grace_period=30)


def events_about(kubelet: DevKubelet, kind: str, text: str) -> list[KubeletEvent]:
    return [e for e in kubelet.events_of(kind) if text in e.detail]


async def registered_again(kubelet: DevKubelet, plugin_dir: Path, ids: tuple[str, ...]) -> FakePlugin:
    """The plugin registers with the restarted kubelet (its first device list seen)."""
    plugin = FakePlugin(plugin_dir, GPU, devs(*ids))
    await plugin.start()
    await plugin.register(kubelet.kubelet_socket)
    await kubelet.wait_for(lambda k: (v := k.resource(GPU)) is not None and v.allocatable == len(ids))
    return plugin


def test_housekeeping_kills_an_orphan_after_a_restart(plugin_dir: Path, cgroups_by_version: CgroupLayout) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir, cgroups=cgroups_by_version, housekeeping_period=None) as kubelet:
            plugin = await plugin_on(kubelet, devs("a"))
            orphan = await kubelet.admit_pod(holder("orphan"))
            await kubelet.admit_pod(PodSpec("kept", [ContainerSpec("main", stop_delay=math.inf)]))
            pids = kubelet.pod_pids("orphan")
            await plugin.stop()

            await kubelet.restart(pod_list_delay=600, removed_static_pods=("orphan",))
            assert kubelet.pod_phase("orphan") == PodPhase.DELETED
            assert kubelet.running_containers("orphan") == ["main"]
            assert kubelet.pod_pids("orphan") == pids  # nothing happened to it
            assert await kubelet.housekeeping() == ()  # skipped: the sources are not ready
            assert kubelet.running_containers("orphan") == ["main"]
            assert [op.label for op in kubelet.sync_loop_ops("HOUSEKEEPING")] == ["HOUSEKEEPING"]

            again = await registered_again(kubelet, plugin_dir, ("a",))
            assert kubelet.load_pods()
            # its device came back from the checkpoint; the next UpdateAllocatedDevices (List's here) prunes it
            assert [e.pod_uid for e in kubelet.pod_device_entries()] == [orphan.uid]
            listed = await list_pods(kubelet)
            assert "default/orphan" not in listed and "default/kept" in listed
            assert kubelet.pod_device_entries() == []
            taken = await kubelet.admit_pod(PodSpec("next", [ContainerSpec("main", {GPU: 1})]))
            assert taken.containers[0].devices == {GPU: ("a",)}  # while the orphan still runs
            assert events_about(kubelet, "pod-devices-dropped", orphan.uid)
            assert kubelet.running_containers("orphan") == ["main"]

            found = await kubelet.housekeeping()

            assert found == (f"default/orphan (uid {orphan.uid})",)
            await kubelet.wait_pod_cleaned_up("orphan", timeout=30)
            (terminating,) = events_about(kubelet, "pod-terminating", orphan.uid)
            assert "an orphan" in terminating.detail and "SIGKILL after 2s" in terminating.detail
            (stopping,) = events_about(kubelet, "container-stopping", "default/orphan/main")
            assert "SIGTERM, SIGKILL after 2s" in stopping.detail  # grace period 1, raised to 2 by killContainer
            (cleaned,) = events_about(kubelet, "pod-cleaned-up", orphan.uid)
            assert "cleanupOrphanedPodCgroups" in cleaned.detail
            assert kubelet.pod_pids("orphan") == set()
            assert kubelet.running_containers("kept") == ["main"]  # a pod the kubelet knows is left alone
            assert kubelet.running_containers("next") == ["main"]
            assert kubelet.pod_phase("orphan") == PodPhase.DELETED
            assert await kubelet.housekeeping() == ()  # nothing is left to find
            await again.stop()

    asyncio.run(body())


def test_a_held_allocate_delays_housekeeping(plugin_dir: Path) -> None:
    """Housekeeping is a turn of the sync loop: behind a held Allocate, the orphan runs on until it answers."""

    async def body() -> None:
        async with running_kubelet(plugin_dir, housekeeping_period=None) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b"))
            orphan = await kubelet.admit_pod(holder("orphan"))
            await plugin.stop()
            await kubelet.restart(pod_list_delay=0, removed_static_pods=("orphan",))
            gate = asyncio.Event()
            again = FakePlugin(plugin_dir, GPU, devs("a", "b"), behaviour=Behaviour(allocate_gate=gate))
            await again.start()
            await again.register(kubelet.kubelet_socket)
            await kubelet.wait_for(lambda k: (v := k.resource(GPU)) is not None and v.allocatable == 2)

            holding = asyncio.ensure_future(kubelet.admit_pod(PodSpec("p", [ContainerSpec("main", {GPU: 1})])))
            await again.wait_calls("Allocate")
            cleanup = asyncio.ensure_future(kubelet.housekeeping())
            await kubelet.wait_for(lambda k: "HOUSEKEEPING" in k.sync_loop_waiting, what="housekeeping queued")
            assert kubelet.sync_loop_busy == "ADD default/p"
            assert kubelet.running_containers("orphan") == ["main"]
            assert kubelet.events_of("pod-terminating") == []

            released = time.time()
            gate.set()
            await holding
            assert await cleanup == (f"default/orphan (uid {orphan.uid})",)

            (op,) = kubelet.sync_loop_ops("HOUSEKEEPING")
            assert op.behind == "ADD default/p"
            assert op.queued_at + op.waited >= released - CLOCK_SLACK
            (terminating,) = events_about(kubelet, "pod-terminating", orphan.uid)
            assert terminating.time >= released
            await kubelet.wait_containers_exited("orphan", timeout=30)
            await again.stop()

    asyncio.run(body())


def test_the_ticker_runs_housekeeping_once_the_sources_are_ready(plugin_dir: Path) -> None:
    """A tick every period from the start, skipped while the sources are not ready; then one kills the orphan.

    Behind a held Allocate one tick waits for the loop and the next ones are dropped, as a Go ticker drops them.
    """

    async def body() -> None:
        async with running_kubelet(plugin_dir, housekeeping_period=0.05) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b"))
            orphan = await kubelet.admit_pod(holder("orphan"))
            await plugin.stop()
            await kubelet.restart(pod_list_delay=600, removed_static_pods=("orphan",))
            await kubelet.wait_for(lambda k: len(k.sync_loop_ops("HOUSEKEEPING")) >= 3, what="three skipped ticks")
            assert kubelet.running_containers("orphan") == ["main"]
            assert kubelet.events_of("pod-terminating") == []

            gate = asyncio.Event()
            again = FakePlugin(plugin_dir, GPU, devs("a", "b"), behaviour=Behaviour(allocate_gate=gate))
            await again.start()
            await again.register(kubelet.kubelet_socket)
            await kubelet.wait_for(lambda k: (v := k.resource(GPU)) is not None and v.allocatable == 2)
            # admitted with the first pod list, the sources ready right after it: its Allocate is held
            holding = asyncio.ensure_future(kubelet.admit_pod(PodSpec("p", [ContainerSpec("main", {GPU: 1})])))
            await again.wait_calls("Allocate")
            await kubelet.wait_for(lambda k: "HOUSEKEEPING" in k.sync_loop_waiting, what="a tick queued")
            await asyncio.sleep(0.3)  # six more periods: a negative window, the ticks must not pile up
            assert kubelet.sync_loop_waiting == ("HOUSEKEEPING",)
            assert kubelet.running_containers("orphan") == ["main"]

            released = time.time()
            gate.set()
            await holding
            await kubelet.wait_pod_cleaned_up("orphan", timeout=30)
            (terminating,) = events_about(kubelet, "pod-terminating", orphan.uid)
            assert terminating.time >= released
            behind = [op for op in kubelet.sync_loop_ops("HOUSEKEEPING") if op.behind == "ADD default/p"]
            assert len(behind) == 1
            await again.stop()

    asyncio.run(body())


def test_an_orphan_without_processes_is_killed_through_the_threaded_face(plugin_dir: Path) -> None:
    with DevKubeletThread(plugin_dir, cgroups=None, housekeeping_period=None) as kubelet:
        kubelet.admit_pod(PodSpec("orphan", [ContainerSpec("main", stop_delay=math.inf)]))
        kubelet.admit_pod(PodSpec("kept", [ContainerSpec("main")]))
        kubelet.stop()
        kubelet.remove_static_pod_while_stopped("orphan")
        kubelet.start(pod_list_delay=0)
        assert kubelet.pod_phase("orphan") == PodPhase.DELETED
        assert kubelet.containers_running("orphan")

        (found,) = kubelet.housekeeping()

        assert found.startswith("default/orphan (uid ")
        kubelet.wait_for(lambda k: not k.containers_running("orphan"))
        assert kubelet.containers_running("kept")
        assert [op.label for op in kubelet.sync_loop_ops("HOUSEKEEPING")] == ["HOUSEKEEPING"]


def test_what_cannot_be_orphaned(plugin_dir: Path) -> None:
    for period in (0, -1.0, math.inf, math.nan):
        with pytest.raises(KubeletError, match="housekeeping_period"):
            DevKubelet(plugin_dir, housekeeping_period=period)
    with DevKubeletThread(plugin_dir, cgroups=None, housekeeping_period=None) as kubelet:
        kubelet.admit_pod(PodSpec("p", [ContainerSpec("main")]))
        with pytest.raises(KubeletError, match="while stopped: the kubelet runs"):
            kubelet.remove_static_pod_while_stopped("p")
        with pytest.raises(KubeletError, match="default/nope: no such pod"):
            kubelet.restart(removed_static_pods="nope")
        assert kubelet.kubelet.running  # checked before anything stopped
        kubelet.finish_pod("p")
        with pytest.raises(KubeletError, match="default/p: it is finished"):
            kubelet.restart(removed_static_pods=[("default", "p")])
