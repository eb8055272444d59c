"""Killing containers as the kubelet does, and the removal window (issue 23), with real processes in real cgroups.

* graceful deletion: SIGTERM, the grace period, SIGKILL; the pod stays in the pod manager (and PodResources)
  while it terminates;
* the removal window: a static pod's manifest removed, or a pod force-deleted, leaves the pod manager, PodResources
  and the checkpoint at once, its device goes to the next pod's Allocate, while its container still runs;
* a DeviceSpec that is not a device node fails the container (CreateContainerError), not the pod.

Waits are on the dev kubelet's state changes; the only clock read is the recorded events' times, to check that a
process lived at least as long as its grace period (a lower bound, which a slow machine cannot break).
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from devplug.api.checkpoint import CHECKPOINT_FILE
from devplug.devkubelet import ContainerSpec, ContainerStartError, DevKubelet, KubeletEvent, PodPhase, PodSpec
from devplug.devkubelet.cgroups import CgroupLayout
from devplug.devkubelet.checkpointing import load_checkpoint
from devplug.testing.devnodes import make_char_device
from tests.devkubelet.fakeplugin import Behaviour, devs, gpu, list_pods, plugin_on, running_kubelet

GPU = "example.com/gpu"
FOREVER = math.inf  # ignores SIGTERM: only SIGKILL ends it


def event(kubelet: DevKubelet, kind: str, text: str) -> KubeletEvent:
    """The one event of ``kind`` whose detail holds ``text``."""
    (found,) = [e for e in kubelet.events_of(kind) if text in e.detail]
    return found


def test_a_container_trapping_sigterm_outlives_a_graceful_kill_until_its_grace_ends(
    cgroups_by_version: CgroupLayout, plugin_dir: Path
) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir, cgroups=cgroups_by_version) as kubelet:
            plugin = await plugin_on(kubelet, devs("a"))
            spec = PodSpec(
                "p",
                [
                    ContainerSpec("stubborn", {GPU: 1}, stop_delay=FOREVER),
                    ContainerSpec("slow", stop_delay=1.0),
                    ContainerSpec("polite"),
                ],
                termination_grace_period=3,
            )
            await kubelet.admit_pod(spec)
            stubborn = kubelet.container_pids("p", "stubborn")

            await kubelet.remove_pod("p", wait=False)

            assert kubelet.pod_phase("p") == PodPhase.TERMINATING
            await kubelet.wait_for(
                lambda k: k.running_containers("p") == ["stubborn"], 10, what="the two others to exit"
            )
            # still terminating: in the pod manager, in PodResources with its device, the device not free
            assert kubelet.pod_phase("p") == PodPhase.TERMINATING
            assert (await list_pods(kubelet))["default/p"]["stubborn"] == ["a"]
            assert gpu(kubelet).in_use == {"a"}
            assert kubelet.container_pids("p", "stubborn") == stubborn

            await kubelet.wait_containers_exited("p", timeout=30)
            await kubelet.wait_for(lambda k: k.pod_phase("p") == PodPhase.DELETED, 30, what="p deleted")

            assert "SIGKILL after 3s" in event(kubelet, "container-stopping", "p/stubborn").detail
            killed = event(kubelet, "container-exited", "p/stubborn")
            assert killed.detail.endswith("(exit code 137)")  # SIGKILL, at the end of its grace period
            assert killed.time - event(kubelet, "container-stopping", "p/stubborn").time >= 3.0
            slow = event(kubelet, "container-exited", "p/slow")
            assert slow.detail.endswith("(exit code 143)")  # its own SIGTERM handler, a second later
            assert slow.time - event(kubelet, "container-stopping", "p/slow").time >= 1.0
            assert event(kubelet, "container-exited", "p/polite").detail.endswith("(exit code 143)")
            assert kubelet.pod_cleaned_up("p")
            assert "default/p" not in await list_pods(kubelet)
            await plugin.stop()

    asyncio.run(body())


@pytest.mark.parametrize("how", ["static", "force"])
def test_the_removal_window(how: str, cgroups_by_version: CgroupLayout, plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir, cgroups=cgroups_by_version) as kubelet:
            plugin = await plugin_on(kubelet, devs("a"))
            # the static pod's own grace is 2 s; the force-deleted pod's is 30 s, of which the kubelet gives 2
            grace = 2 if how == "static" else 30
            old = await kubelet.admit_pod(
                PodSpec("old", [ContainerSpec("app", {GPU: 1}, stop_delay=FOREVER)], termination_grace_period=grace)
            )
            running = kubelet.container_pids("old", "app")
            assert running

            if how == "static":
                await kubelet.remove_static_pod("old")
            else:
                await kubelet.force_delete_pod("old")

            # at once: the kubelet forgot the pod, its container runs on
            assert kubelet.pod_phase("old") == PodPhase.DELETED
            assert kubelet.container_pids("old", "app") == running
            assert "default/old" not in await list_pods(kubelet)
            assert "SIGKILL after 2s" in event(kubelet, "pod-removed", "default/old").detail

            new = await kubelet.admit_pod(PodSpec("new", [ContainerSpec("app", {GPU: 1})]))

            assert new.container("app").devices[GPU] == ("a",)
            assert list(plugin.requests("Allocate")[-1].container_requests[0].devices_ids) == ["a"]
            assert kubelet.container_pids("old", "app") == running  # the same device, two running containers
            on_disk, _ = load_checkpoint(plugin_dir / CHECKPOINT_FILE)
            assert on_disk is not None
            assert {e.pod_uid for e in on_disk.entries} == {new.uid}
            assert old.uid not in {e.pod_uid for e in kubelet.pod_device_entries()}

            await kubelet.wait_containers_exited("old", timeout=20)  # well before the force-deleted pod's 30 s
            assert event(kubelet, "container-exited", "old/app").detail.endswith("(exit code 137)")
            await kubelet.wait_pod_cleaned_up("old", timeout=20)
            assert not any(p.exists() for p in kubelet.pod_cgroup_paths("old"))
            # the order it happened in: the device handed on, then the old container killed
            handed_on = kubelet.events.index(event(kubelet, "allocate", "default/new/app"))
            assert handed_on < kubelet.events.index(event(kubelet, "container-exited", "old/app"))
            await plugin.stop()

    asyncio.run(body())


def test_a_force_deletion_shortens_a_graceful_one(host_cgroups: CgroupLayout, plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir, cgroups=host_cgroups) as kubelet:
            await kubelet.admit_pod(
                PodSpec("p", [ContainerSpec("app", stop_delay=FOREVER)], termination_grace_period=60)
            )
            await kubelet.remove_pod("p", wait=False)
            await kubelet.wait_for(lambda k: bool(k.events_of("container-stopping")), 10, what="the SIGTERM")
            assert "SIGKILL after 60s" in event(kubelet, "container-stopping", "p/app").detail
            assert kubelet.pod_phase("p") == PodPhase.TERMINATING

            await kubelet.force_delete_pod("p")

            assert kubelet.pod_phase("p") == PodPhase.DELETED
            await kubelet.wait_containers_exited("p", timeout=30)  # the grace period shrank to 2 s
            stops = [e.detail for e in kubelet.events_of("container-stopping")]
            assert [d.rsplit(" ", 1)[-1] for d in stops] == ["60s", "2s"]
            assert event(kubelet, "container-exited", "p/app").detail.endswith("(exit code 137)")
            await kubelet.wait_pod_cleaned_up("p", timeout=20)
            assert kubelet.events_of("pod-finished") == []  # it never finished: it was forgotten

    asyncio.run(body())


def test_a_grace_period_of_zero_is_a_force_deletion(host_cgroups: CgroupLayout, plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir, cgroups=host_cgroups) as kubelet:
            await kubelet.admit_pod(
                PodSpec("p", [ContainerSpec("app", stop_delay=FOREVER)], termination_grace_period=0)
            )
            await kubelet.remove_pod("p", wait=False)
            assert kubelet.pod_phase("p") == PodPhase.DELETED  # the API server deleted it at once
            assert kubelet.containers_running("p")
            assert "grace period of 0" in event(kubelet, "pod-removed", "default/p").detail
            await kubelet.wait_containers_exited("p", timeout=20)

    asyncio.run(body())


@pytest.mark.parametrize("with_cgroups", [True, False], ids=["processes", "no-processes"])
def test_a_device_that_is_no_device_node_fails_the_container_not_the_pod(
    with_cgroups: bool, request: pytest.FixtureRequest, plugin_dir: Path
) -> None:
    layout: CgroupLayout | None = request.getfixturevalue("host_cgroups") if with_cgroups else None

    async def body() -> None:
        async with running_kubelet(plugin_dir, cgroups=layout) as kubelet:
            plugin = await plugin_on(kubelet, devs("a"), behaviour=Behaviour(regular_files=True))
            with pytest.raises(ContainerStartError) as refused:
                await kubelet.admit_pod(PodSpec("p", [ContainerSpec("app", {GPU: 1})]))
            assert refused.match(
                r"^container default/p/app failed to start: CreateContainerError: failed to generate container "
                r'"[0-9a-f]{64}" spec: failed to generate spec: not a device node$'
            )
            # the pod stays admitted, with its device; the container never ran
            assert kubelet.pod_phase("p") == PodPhase.RUNNING
            assert [pod.spec.name for pod in kubelet.pods()] == ["p"]
            assert kubelet.attributed(GPU) == {"a": ("default/p", "app")}
            assert not kubelet.containers_running("p")
            assert kubelet.container_pids("p", "app") == set()
            assert kubelet.container_cgroup_paths("p", "app") == ()
            failure = kubelet.container_failure("p", "app")
            assert failure is not None and failure.startswith("CreateContainerError: ")
            assert event(kubelet, "container-failed", "default/p/app").detail.endswith("not a device node")
            if layout is not None:
                assert len(kubelet.pod_pids("p")) == 1  # the sandbox alone

            make_char_device(plugin.dev_root / "a")  # now a char device: the kubelet's retry starts it
            await kubelet.start_container("p", "app")

            assert kubelet.containers_running("p")
            assert kubelet.container_failure("p", "app") is None
            if layout is not None:
                assert len(kubelet.container_pids("p", "app")) == 2
            await plugin.stop()

    asyncio.run(body())
