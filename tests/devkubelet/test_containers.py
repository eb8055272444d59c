"""Containers as real processes in real cgroups: the kubelet's layout, both drivers and both versions, and clean-up.

Every check reads the host's cgroup file systems and ``/proc`` directly: the
paths the kubelet names, the processes in them, ``populated`` on v2.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from devplug.devkubelet import ContainerSpec, DevKubelet, PodPhase, PodSpec
from devplug.devkubelet.cgroups import CgroupDriver, CgroupLayout, cgroup_of
from tests.devkubelet.fakeplugin import running_kubelet

ID = re.compile(r"[0-9a-f]{64}")


def expected_pod_cgroup(layout: CgroupLayout, qos: str, uid: str) -> str:
    """The pod cgroup's path, spelled out from the kubelet's rules (not through the model's functions)."""
    root = layout.root.strip("/")
    if layout.driver is CgroupDriver.CGROUPFS:
        qos_part = "" if qos == "guaranteed" else f"/{qos}"
        return f"/{root}/kubepods{qos_part}/pod{uid}"
    r = root.replace("-", "_")
    slices = [r, f"{r}-kubepods"]
    if qos != "guaranteed":
        slices.append(f"{r}-kubepods-{qos}")
    slices.append(f"{slices[-1]}-pod{uid.replace('-', '_')}")
    return "".join(f"/{s}.slice" for s in slices)


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def v1_mounts() -> set[Path]:
    """Every cgroup v1 hierarchy mounted right under /sys/fs/cgroup, from /proc/self/mountinfo."""
    found = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        if tail.split()[0] == "cgroup" and Path(fields.split()[4]).parent == Path("/sys/fs/cgroup"):
            found.add(Path(fields.split()[4]))
    return found


def assert_in_cgroup(layout: CgroupLayout, pid: int, literal: str) -> None:
    """``/proc/<pid>/cgroup`` puts the process at ``literal`` in every hierarchy of the layout."""
    lines = cgroup_of(pid)
    if layout.version == 2:
        assert lines[""] == literal
        return
    for hierarchy in layout.hierarchies:
        (key,) = [k for k in lines if k and set(k.split(",")) == set(hierarchy.controllers)]
        assert lines[key] == literal, f"{pid} in {hierarchy.path}: {lines[key]}"


def test_the_kubelets_layout_with_processes_in_it(cgroups: CgroupLayout, plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir, cgroups=cgroups) as kubelet:
            spec = PodSpec(
                "p",
                [
                    ContainerSpec("setup", init=True),
                    ContainerSpec("side", init=True, restartable=True),
                    ContainerSpec("main"),
                ],
                qos="burstable",
            )
            pod = await kubelet.admit_pod(spec)
            literal = expected_pod_cgroup(cgroups, "burstable", pod.uid)
            paths = kubelet.pod_cgroup_paths("p")
            assert paths == tuple(h.path / literal.lstrip("/") for h in cgroups.hierarchies)
            assert all(p.is_dir() for p in paths)
            if cgroups.version == 1:
                assert {p.parents[len(Path(literal).parts) - 2] for p in paths} == v1_mounts()
                assert len(paths) >= 2
            else:
                assert paths[0].is_relative_to(cgroups.mount)
                assert (paths[0] / "cgroup.events").read_text().splitlines()[0] == "populated 1"
            everyone: set[int] = set()
            for name in ("side", "main"):
                own = kubelet.container_cgroup_paths("p", name)
                assert [p.parent for p in own] == list(paths)  # right inside the pod cgroup, in every hierarchy
                assert all(p.is_dir() for p in own)
                leaf = own[0].name
                if cgroups.driver is CgroupDriver.SYSTEMD:
                    assert leaf.startswith("cri-containerd-") and leaf.endswith(".scope")
                    assert ID.fullmatch(leaf[len("cri-containerd-") : -len(".scope")])
                else:
                    assert ID.fullmatch(leaf)
                pid = kubelet.container_pid("p", name)
                assert pid is not None
                pids = kubelet.container_pids("p", name)
                assert pid in pids and len(pids) == 2  # its init and the child it started
                for each in pids:
                    assert_in_cgroup(cgroups, each, f"{literal}/{leaf}")
                everyone |= pids
            # the init container ran to completion: its processes and its cgroup are gone
            assert not kubelet.container_pids("p", "setup")
            assert not any(p.exists() for p in kubelet.container_cgroup_paths("p", "setup"))
            assert any("p/setup (exit code 0)" in e.detail for e in kubelet.events_of("container-exited"))
            sandbox = kubelet.pod_pids("p") - everyone
            assert len(sandbox) == 1  # the pod's sandbox, in its own cgroup of the pod cgroup
            everyone |= sandbox

            await kubelet.finish_pod("p")

            assert kubelet.pod_phase("p") == PodPhase.FINISHED
            assert not any(alive(pid) for pid in everyone)
            assert not any(p.exists() for p in paths)  # SyncTerminatedPod destroyed the pod cgroup
            assert kubelet.pod_pids("p") == set()
            exits = [e.detail for e in kubelet.events_of("container-exited")]
            assert any("p/main (exit code 0)" in d for d in exits)
            assert any("p/side (exit code 0)" in d for d in exits)
        assert not any(p.exists() for p in cgroups.paths(cgroups.root))  # close() removed the root too

    asyncio.run(body())


def test_guaranteed_and_besteffort_pods_sit_where_the_kubelet_puts_them(
    cgroups_by_version: CgroupLayout, plugin_dir: Path
) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir, cgroups=cgroups_by_version) as kubelet:
            for name, qos in (("g", "guaranteed"), ("b", "besteffort")):
                pod = await kubelet.admit_pod(PodSpec(name, [ContainerSpec("c")], qos=qos))
                literal = expected_pod_cgroup(cgroups_by_version, qos, pod.uid)
                assert kubelet.pod_cgroup_paths(name)[0] == cgroups_by_version.hierarchies[0].path / literal[1:]
                pid = kubelet.container_pid(name, "c")
                assert pid is not None
                assert_in_cgroup(
                    cgroups_by_version, pid, f"{literal}/{kubelet.container_cgroup_paths(name, 'c')[0].name}"
                )

    asyncio.run(body())


def test_a_restarted_container_is_a_new_container_and_the_old_one_is_gone(
    host_cgroups: CgroupLayout, plugin_dir: Path
) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir, cgroups=host_cgroups) as kubelet:
            await kubelet.admit_pod(PodSpec("p", [ContainerSpec("c")]))
            old_pids = kubelet.container_pids("p", "c")
            old_cgroup = kubelet.container_cgroup_paths("p", "c")
            await kubelet.start_container("p", "c")  # as after a crash: the kubelet starts it again
            assert not any(alive(pid) for pid in old_pids)
            assert not any(p.exists() for p in old_cgroup)
            assert kubelet.container_cgroup_paths("p", "c") != old_cgroup
            assert len(kubelet.container_pids("p", "c")) == 2

    asyncio.run(body())


def test_containers_outlive_a_kubelet_restart(host_cgroups: CgroupLayout, plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir, cgroups=host_cgroups) as kubelet:
            await kubelet.admit_pod(PodSpec("p", [ContainerSpec("c")]))
            pids = kubelet.pod_pids("p")
            await kubelet.restart()
            assert kubelet.pod_pids("p") == pids
            assert all(alive(pid) for pid in pids)
            assert kubelet.containers_running("p")

    asyncio.run(body())


def test_close_kills_everything_and_leaves_no_cgroup(cgroups_by_version: CgroupLayout, plugin_dir: Path) -> None:
    async def body() -> list[int]:
        kubelet = DevKubelet(plugin_dir, cgroups=cgroups_by_version)
        await kubelet.start()
        try:
            await kubelet.admit_pod(PodSpec("p", [ContainerSpec("c", stop_delay=float("inf"))]))
            stubborn = ContainerSpec("c", stop_delay=float("inf"))
            await kubelet.admit_pod(PodSpec("q", [stubborn], termination_grace_period=60))
            await kubelet.remove_static_pod("q")  # its kill runs in the background when close() comes
            pids = sorted(kubelet.pod_pids("p") | kubelet.pod_pids("q"))
            assert kubelet.containers_running("p") and kubelet.containers_running("q")
            assert len(pids) >= 4  # two sandboxes, two containers (and their children)
            raise RuntimeError("a test failing here")
        except RuntimeError:
            return pids
        finally:
            await kubelet.close()
            await kubelet.close()  # idempotent

    pids = asyncio.run(body())
    assert not any(alive(pid) for pid in pids)
    assert not any(p.exists() for p in cgroups_by_version.paths(cgroups_by_version.root))


_ABANDONED = textwrap.dedent(
    """
    import asyncio, json, sys
    from pathlib import Path
    from devplug.devkubelet import ContainerSpec, DevKubelet, PodSpec
    from devplug.devkubelet.cgroups import CgroupLayout

    async def main():
        layout = CgroupLayout.detect(int(sys.argv[2]))
        kubelet = DevKubelet(Path(sys.argv[1]), cgroups=layout)
        await kubelet.start()
        await kubelet.admit_pod(PodSpec("p", [ContainerSpec("c", stop_delay=float("inf"))]))
        print(json.dumps({"root": [str(p) for p in layout.paths(layout.root)], "pids": sorted(kubelet.pod_pids("p"))}))
        # no close(): the process ends with its pod running

    asyncio.run(main())
    """
)


def test_a_process_that_never_closed_its_kubelet_leaves_nothing(
    cgroups_by_version: CgroupLayout, plugin_dir: Path
) -> None:
    version = str(cgroups_by_version.version)
    done = subprocess.run(
        [sys.executable, "-c", _ABANDONED, str(plugin_dir), version], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["pids"]
    assert not [pid for pid in found["pids"] if alive(pid)]
    assert not [path for path in found["root"] if os.path.exists(path)]
