"""Container liveness (issue 23) read from real cgroups: the kubelet's pod cgroup layouts (cgroupfs and systemd
drivers, cgroup v1 and v2) built under a cgroup root of the test's own, with real processes in them.

This machine (and CI) has cgroup v1 hierarchies under /sys/fs/cgroup and a v2 hierarchy at
/sys/fs/cgroup/unified. A test that cannot create cgroups (not root) skips, unless DEVPLUG_REQUIRE_CGROUPS=1.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from devplug.config import LivenessConfig
from devplug.daemon.podliveness import ContainerLiveness, find_pod_cgroups, read_pod
from devplug.engine.liveness import PodState
from devplug.host.cgroups import kubepods_name, literal_path, pod_name
from devplug.testing.waiting import poll_until

CGROUP_FS = Path("/sys/fs/cgroup")
V2_MOUNT = CGROUP_FS / "unified"
V1_HIERARCHIES = ("pids", "memory", "freezer")  # enough for the reader, which reads the first it finds


def _can_make(folder: Path) -> bool:
    probe = folder / f"devplug-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError:
        return False
    return True


def _require(mount: Path) -> None:
    if not _can_make(mount):
        if os.environ.get("DEVPLUG_REQUIRE_CGROUPS") == "1":
            pytest.fail(f"cannot create cgroups under {mount} (DEVPLUG_REQUIRE_CGROUPS=1)")
        pytest.skip(f"cannot create cgroups under {mount} (not root?)")


@dataclass
class Layout:
    """A kubelet-like pod cgroup layout under a cgroup root of this test's own, with real processes."""

    version: int
    driver: str
    root: str  # the kubelet's --cgroup-root, e.g. "/devplug-test-1234"
    hierarchies: list[Path] = field(default_factory=list)  # the cgroup hierarchies read and written
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def top_folder(self) -> str:
        """The one folder of each hierarchy everything of this layout is under (removed at the end)."""
        return literal_path(kubepods_name(self.root), self.driver).lstrip("/").split("/")[0]

    @property
    def mount(self) -> Path:
        return V2_MOUNT if self.version == 2 else CGROUP_FS

    def config(self, **extra: object) -> LivenessConfig:
        return LivenessConfig(cgroup_mount=self.mount, cgroup_root=self.root, cgroup_driver=self.driver, **extra)  # type: ignore[arg-type]

    def pod_path(self, uid: str, qos: str) -> Path:
        """The pod's cgroup, relative to a hierarchy, as the kubelet names it (devplug.host.cgroups)."""
        return Path(literal_path(pod_name(self.root, qos, uid), self.driver).lstrip("/"))

    def start_kubepods(self) -> None:
        for hierarchy in self.hierarchies:
            (hierarchy / literal_path(kubepods_name(self.root), self.driver).lstrip("/")).mkdir(parents=True)

    def run_container(self, uid: str, qos: str = "besteffort") -> subprocess.Popen[bytes]:
        """A process in a container cgroup of the pod (in every hierarchy), before it does anything else."""
        procs = []
        for hierarchy in self.hierarchies:
            container = hierarchy / self.pod_path(uid, qos) / "ctr"
            container.mkdir(parents=True, exist_ok=True)
            procs.append(str(container / "cgroup.procs"))
        script = "".join(f'echo $$ > "{p}" && ' for p in procs) + "exec sleep 600"
        process = subprocess.Popen(["/bin/sh", "-c", script])
        self.processes.append(process)
        joined = lambda: all(Path(p).read_text().strip() for p in procs)  # noqa: E731
        poll_until(joined, "the container process to join its cgroup", 10, interval=0.005)
        return process

    def remove_pod(self, uid: str, qos: str = "besteffort") -> None:
        for hierarchy in self.hierarchies:
            pod = hierarchy / self.pod_path(uid, qos)
            for child in sorted(pod.rglob("*"), reverse=True):
                if child.is_dir():
                    child.rmdir()
            pod.rmdir()

    def cleanup(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()
        for hierarchy in self.hierarchies:
            top = hierarchy / self.top_folder
            if top.exists():
                for child in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                    child.rmdir()
                top.rmdir()


@pytest.fixture(
    params=[(2, "cgroupfs"), (2, "systemd"), (1, "cgroupfs"), (1, "systemd")], ids=lambda p: f"v{p[0]}-{p[1]}"
)
def layout(request: pytest.FixtureRequest) -> Iterator[Layout]:
    version, driver = request.param
    mount = V2_MOUNT if version == 2 else CGROUP_FS / V1_HIERARCHIES[0]
    _require(mount)
    root = f"/devplug-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    found = Layout(version, driver, root)
    if version == 2:
        found.hierarchies = [V2_MOUNT]
    else:
        found.hierarchies = [CGROUP_FS / h for h in V1_HIERARCHIES if (CGROUP_FS / h).is_dir()]
    try:
        yield found
    finally:
        found.cleanup()


def test_the_layout_is_found_and_reads_every_qos_class(layout: Layout) -> None:
    layout.start_kubepods()
    cgroups = find_pod_cgroups(layout.config())
    assert (cgroups.version, cgroups.driver) == (layout.version, layout.driver)
    for qos in ("guaranteed", "burstable", "besteffort"):
        uid = str(uuid.uuid4())
        assert read_pod(cgroups, uid).state is PodState.EXITED  # no cgroup: no process
        process = layout.run_container(uid, qos)
        answer = read_pod(cgroups, uid)
        assert answer.state is PodState.RUNNING, answer
        process.kill()
        process.wait()
        answer = read_pod(cgroups, uid)
        assert answer.state is PodState.EXITED, answer
        assert "no process left" in answer.detail
        layout.remove_pod(uid, qos)
        assert read_pod(cgroups, uid).state is PodState.EXITED


def test_auto_finds_either_driver(layout: Layout) -> None:
    layout.start_kubepods()
    auto = LivenessConfig(cgroup_mount=layout.mount, cgroup_root=layout.root, cgroup_driver="auto")
    assert find_pod_cgroups(auto).driver == layout.driver


def test_the_exit_of_the_last_process_is_reported(layout: Layout) -> None:
    """On v2 from inotify on cgroup.events, on v1 by polling: a callback once the last process is gone."""
    layout.start_kubepods()
    uid = str(uuid.uuid4())
    first = layout.run_container(uid)
    second_uid = str(uuid.uuid4())
    layout.run_container(second_uid)

    async def scenario() -> tuple[float, list[str]]:
        liveness = ContainerLiveness(layout.config())
        liveness.start()
        try:
            assert liveness.mode == f"cgroup v{layout.version}"
            loop = asyncio.get_running_loop()
            exited: asyncio.Future[float] = loop.create_future()
            other: list[str] = []
            liveness.on_exit(uid, lambda answer: exited.set_result(loop.time()))
            liveness.on_exit(second_uid, lambda answer: other.append(answer.detail))
            await asyncio.sleep(0.3)
            assert not exited.done(), "reported gone while its process runs"
            killed = loop.time()
            first.kill()
            await asyncio.to_thread(first.wait)
            reported = await asyncio.wait_for(exited, 5)
            assert liveness.pod(uid).state is PodState.EXITED
            assert liveness.pod(second_uid).state is PodState.RUNNING
            return reported - killed, other
        finally:
            liveness.close()

    latency, other = asyncio.run(scenario())
    assert other == [], "another pod's wait ended while its process runs"
    print(f"cgroup v{layout.version} {layout.driver}: exit reported {latency * 1000:.1f} ms after the kill")


def test_wait_exited_times_out_while_a_process_runs(layout: Layout) -> None:
    layout.start_kubepods()
    uid = str(uuid.uuid4())
    layout.run_container(uid)

    async def scenario() -> PodState:
        liveness = ContainerLiveness(layout.config())
        liveness.start()
        try:
            return (await liveness.wait_exited(uid, 0.3)).state
        finally:
            liveness.close()

    assert asyncio.run(scenario()) is PodState.RUNNING


def test_missing_cgroups_are_unknown_with_the_reason(tmp_path: Path) -> None:
    missing = LivenessConfig(cgroup_mount=tmp_path / "nowhere")

    async def scenario(config: LivenessConfig) -> tuple[str, str, str | None]:
        liveness = ContainerLiveness(config)
        liveness.start()
        try:
            answer = liveness.pod(str(uuid.uuid4()))
            return answer.state, answer.detail, liveness.problem
        finally:
            liveness.close()

    state, detail, problem = asyncio.run(scenario(missing))
    assert state is PodState.UNKNOWN
    assert problem is not None and "nowhere does not exist" in problem and "cgroup_mount" in problem
    assert "container liveness unknown" in detail

    (tmp_path / "empty").mkdir()
    state, _, problem = asyncio.run(scenario(LivenessConfig(cgroup_mount=tmp_path / "empty")))
    assert state is PodState.UNKNOWN and problem is not None and "cgroup_mount" in problem
    assert "not cgroup2, cgroup or a tmpfs" in problem


def test_a_cgroup_root_without_kubepods_names_the_keys_to_set(layout: Layout) -> None:
    async def scenario() -> str | None:
        liveness = ContainerLiveness(layout.config())
        liveness.start()
        liveness.close()
        return liveness.problem

    problem = asyncio.run(scenario())
    assert problem is not None and "cgroup_root" in problem and layout.root in problem
    # The kubelet starts later: found at the next look, without a restart.
    layout.start_kubepods()
    assert find_pod_cgroups(layout.config()).kubepods.is_dir()


def test_an_unknown_pod_uid_is_unknown() -> None:
    liveness = ContainerLiveness(LivenessConfig())
    answer = liveness.pod(None)
    assert answer.state is PodState.UNKNOWN and "UID is unknown" in answer.detail
