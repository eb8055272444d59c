"""Container liveness against files that are not cgroups (issue 36, items 5 and 9): a ``[liveness] cgroup_mount``
on a folder that is no cgroup file system, FIFOs where cgroup files belong, pod folders that are links or FIFOs,
pod UIDs that would climb out of the kubepods cgroup.

Real FIFOs and links on the test's own folders (an ext4 or other disk folder, and a tmpfs: ``/dev/shm``), and the
real cgroup v2 hierarchy where a UID's ``..`` would reach another pod's cgroup. A read that blocks is a failure,
never a hang: each read runs in a thread given a few seconds, after which the test opens the FIFO's other end to
let it go.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from devplug.config import LivenessConfig
from devplug.daemon import podliveness as liveness_module
from devplug.daemon.podliveness import (
    ContainerLiveness,
    LivenessUnavailable,
    PodCgroups,
    find_pod_cgroups,
    read_pod,
)
from devplug.engine.liveness import PodLiveness, PodState
from devplug.host.cgroups import literal_path, pod_name
from devplug.testing.waiting import poll_until

T = TypeVar("T")

V2_MOUNT = Path("/sys/fs/cgroup/unified")
SHM = Path("/dev/shm")


def _bounded(call: Callable[[], T], fifos: list[Path], seconds: float = 5.0) -> T:
    """``call()`` in a thread; a failure naming the FIFO when it has not answered within ``seconds`` (the FIFOs are
    then opened for writing, which lets a blocked ``open`` go)."""
    answer: list[T] = []
    worker = threading.Thread(target=lambda: answer.append(call()), daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        for fifo in fifos:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        worker.join(5)
        pytest.fail(f"reading liveness blocked for {seconds:g} s on a FIFO ({', '.join(map(str, fifos))})")
    return answer[0]


def _fake_v2(root: Path, uid: str) -> Path:
    """A folder that looks like a cgroup2 mount with the kubelet's layout, the pod's cgroup.events a FIFO."""
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    pod = root / literal_path(pod_name("/", "besteffort", uid), "cgroupfs").lstrip("/")
    pod.mkdir(parents=True)
    os.mkfifo(pod / "cgroup.events")
    return pod / "cgroup.events"


def _fake_v1(root: Path, uid: str) -> Path:
    """A folder that looks like /sys/fs/cgroup on a v1 host: a ``pids`` hierarchy, its files FIFOs."""
    pids = root / "pids"
    pod = pids / literal_path(pod_name("/", "besteffort", uid), "cgroupfs").lstrip("/")
    pod.mkdir(parents=True)
    os.mkfifo(pids / "cgroup.procs")
    os.mkfifo(pod / "cgroup.procs")
    return pod / "cgroup.procs"


@pytest.fixture
def shm_folder() -> Iterator[Path]:
    if not SHM.is_dir():
        pytest.skip(f"no {SHM} (a tmpfs) on this machine")
    folder = SHM / f"devplug-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


@pytest.mark.parametrize("where", ["disk", "tmpfs"])
@pytest.mark.parametrize("fake", [_fake_v2, _fake_v1], ids=["v2-like", "v1-like"])
def test_a_cgroup_mount_that_is_no_cgroup_file_system_is_refused_and_nothing_blocks(
    tmp_path: Path, shm_folder: Path, where: str, fake: Callable[[Path, str], Path]
) -> None:
    """The event loop once blocked opening a FIFO planted as cgroup.events; the mount's type is now checked when
    the layout is looked for, and liveness is unknown, naming the key and the type found."""
    root = tmp_path if where == "disk" else shm_folder
    uid = str(uuid.uuid4())
    fifo = fake(root, uid)
    config = LivenessConfig(cgroup_mount=root, cgroup_driver="cgroupfs")

    async def scenario() -> tuple[PodLiveness, str | None]:
        liveness = ContainerLiveness(config)
        liveness.start()
        try:
            answer = liveness.pod(uid)
            woken: list[PodLiveness] = []
            liveness.on_exit(uid, woken.append)
            await asyncio.sleep(0.1)  # the loop runs its checks: none may block
            return answer, liveness.problem
        finally:
            liveness.close()

    answer, problem = _bounded(lambda: asyncio.run(scenario()), [fifo])
    assert answer.state is PodState.UNKNOWN, answer
    assert problem is not None and "[liveness] cgroup_mount" in problem and str(root) in problem, problem
    assert (liveness_module.fs_name(liveness_module.fs_type(root)) if where == "disk" else "tmpfs") in problem, problem


def test_the_host_cgroups_are_still_accepted() -> None:
    """The type check keeps the node's own cgroups: v2 (its cgroup2 mount) and v1 (the tmpfs of hierarchies)."""
    for mount in (V2_MOUNT, Path("/sys/fs/cgroup")):
        if not mount.is_dir():
            continue
        with pytest.raises(LivenessUnavailable, match="no kubepods cgroup"):  # no kubelet here, for that only
            find_pod_cgroups(LivenessConfig(cgroup_mount=mount, cgroup_root="/devplug-absent-root"))


def _layout_over(root: Path) -> PodCgroups:
    """The reader's layout over a folder of the test's own (what a layout check let through would read)."""
    kubepods = root / "kubepods"
    kubepods.mkdir(exist_ok=True)
    return PodCgroups(2, "cgroupfs", kubepods, root)


def _pod_dir(root: Path, uid: str, qos: str = "besteffort") -> Path:
    return root / literal_path(pod_name("/", qos, uid), "cgroupfs").lstrip("/")


def test_a_fifo_where_cgroup_events_belongs_is_unknown_and_never_opened_blocking(tmp_path: Path) -> None:
    layout = _layout_over(tmp_path)
    uid = str(uuid.uuid4())
    pod = _pod_dir(tmp_path, uid)
    pod.mkdir(parents=True)
    os.mkfifo(pod / "cgroup.events")
    answer = _bounded(lambda: read_pod(layout, uid), [pod / "cgroup.events"])
    assert answer.state is PodState.UNKNOWN and "FIFO" in answer.detail, answer


@pytest.mark.parametrize("kind", ["symlink loop", "dangling symlink", "FIFO", "file", "dangling parent"])
def test_a_pod_folder_that_is_not_a_folder_is_unknown_not_gone(tmp_path: Path, kind: str) -> None:
    """Once "no cgroup" (released at once); now unknown, withheld as for unreadable cgroups."""
    layout = _layout_over(tmp_path)
    uid = str(uuid.uuid4())
    pod = _pod_dir(tmp_path, uid)
    pod.parent.mkdir(parents=True)
    if kind == "symlink loop":
        pod.symlink_to(pod.name)
    elif kind == "dangling symlink":
        pod.symlink_to(tmp_path / "nowhere")
    elif kind == "FIFO":
        os.mkfifo(pod)
    elif kind == "file":
        pod.write_text("populated 0\n")
    else:  # the QoS folder on the way is a dangling link
        pod.parent.rmdir()
        pod.parent.symlink_to(tmp_path / "nowhere")
    answer = _bounded(lambda: read_pod(layout, uid), [pod] if kind == "FIFO" else [])
    assert answer.state is PodState.UNKNOWN, answer
    assert "not a cgroup folder" in answer.detail or "Too many levels" in answer.detail, answer


def test_a_missing_pod_folder_is_still_no_cgroup(tmp_path: Path) -> None:
    layout = _layout_over(tmp_path)
    (tmp_path / "kubepods" / "besteffort").mkdir()
    answer = read_pod(layout, str(uuid.uuid4()))
    assert answer.state is PodState.EXITED and "no cgroup of pod" in answer.detail, answer


def test_a_pod_uid_with_dot_dot_never_names_a_path(tmp_path: Path) -> None:
    """``<uid>/../pod<other>`` once read another pod's cgroup (here a running one: "running"); and the inotify
    watch of a waiting pod is never armed on such a path."""
    layout = _layout_over(tmp_path)
    other = str(uuid.uuid4())
    running = _pod_dir(tmp_path, other)
    running.mkdir(parents=True)
    (running / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    first = str(uuid.uuid4())
    _pod_dir(tmp_path, first).mkdir()
    for forged in (f"{first}/../pod{other}", f"../../kubepods/besteffort/pod{other}"):
        answer = read_pod(layout, forged)
        assert answer.state is PodState.UNKNOWN and "not a Kubernetes UID" in answer.detail, answer
        with pytest.raises(ValueError, match="not a Kubernetes UID"):
            layout.pod_dirs(forged)
    assert read_pod(layout, other).state is PodState.RUNNING  # a real UID still reads


def _can_make(folder: Path) -> bool:
    probe = folder / f"devplug-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError:
        return False
    return True


def test_a_pod_uid_with_dot_dot_on_real_cgroups(tmp_path: Path) -> None:
    """The same on the real cgroup v2 hierarchy, with a real process in the other pod's cgroup."""
    if not _can_make(V2_MOUNT):
        if os.environ.get("DEVPLUG_REQUIRE_CGROUPS") == "1":
            pytest.fail(f"cannot create cgroups under {V2_MOUNT} (DEVPLUG_REQUIRE_CGROUPS=1)")
        pytest.skip(f"cannot create cgroups under {V2_MOUNT} (not root, or no cgroup v2 there)")
    root = f"/devplug-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    config = LivenessConfig(cgroup_mount=V2_MOUNT, cgroup_root=root, cgroup_driver="cgroupfs")
    first, other = str(uuid.uuid4()), str(uuid.uuid4())
    made = [
        V2_MOUNT / literal_path(pod_name(root, "besteffort", uid), "cgroupfs").lstrip("/") for uid in (first, other)
    ]
    for folder in made:
        folder.mkdir(parents=True)
    process = subprocess.Popen(["/bin/sh", "-c", f'echo $$ > "{made[1] / "cgroup.procs"}" && exec sleep 600'])
    try:
        poll_until(
            lambda: (made[1] / "cgroup.procs").read_text().strip(), "the process in its cgroup", 10, interval=0.005
        )
        layout = find_pod_cgroups(config)
        assert read_pod(layout, other).state is PodState.RUNNING
        answer = read_pod(layout, f"{first}/../pod{other}")
        assert answer.state is PodState.UNKNOWN and "not a Kubernetes UID" in answer.detail, answer
    finally:
        process.kill()
        process.wait()
        poll_until(lambda: not (made[1] / "cgroup.procs").read_text().strip(), "the cgroup emptied", 10, interval=0.005)
        top = V2_MOUNT / root.strip("/")
        for folder in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            folder.rmdir()
        top.rmdir()
