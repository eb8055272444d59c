"""The ``dev_kubelet`` fixture's cgroups: which ones a test gets, that nothing is left behind, and the fallback.

The fallback is seen for real: a pytest run as ``nobody`` (util-linux's ``setpriv``) may not make cgroups.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devplug.devkubelet import ContainerSpec, DevKubeletThread, PodSpec
from devplug.devkubelet.cgroups import CgroupDriver


def _host_version() -> int | None:
    """The cgroup version a kubelet would use here (None: no cgroup fs), from /proc/self/mountinfo."""
    kinds = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        kinds[fields.split()[4]] = tail.split()[0]
    if kinds.get("/sys/fs/cgroup") == "cgroup2":
        return 2
    return 1 if any(k == "cgroup" for k in kinds.values()) else None


def test_by_default_a_test_gets_the_hosts_kind_with_its_own_root(dev_kubelet: DevKubeletThread) -> None:
    layout = dev_kubelet.cgroup_layout
    if os.geteuid() != 0 or _host_version() is None:
        assert layout is None  # and a DevplugCgroupsWarning said so
        return
    assert layout is not None
    assert layout.version == _host_version()
    assert layout.driver is CgroupDriver.CGROUPFS
    assert layout.root.startswith("/devplug-")
    assert dev_kubelet.liveness_config() == {
        "cgroup_mount": str(layout.mount),
        "cgroup_root": layout.root,
        "cgroup_driver": "cgroupfs",
    }
    dev_kubelet.admit_pod(PodSpec("p", [ContainerSpec("c")]))
    paths = dev_kubelet.pod_cgroup_paths("p")
    assert paths and all(p.is_dir() and p.is_relative_to(layout.mount) for p in paths)


@pytest.mark.devplug_cgroups("v2", driver="systemd")
def test_a_marker_asks_for_v2_and_the_systemd_names(dev_kubelet: DevKubeletThread) -> None:
    layout = dev_kubelet.cgroup_layout
    assert layout is not None
    assert (layout.version, layout.driver) == (2, CgroupDriver.SYSTEMD)
    config = dev_kubelet.liveness_config()
    assert config["cgroup_driver"] == "systemd"
    pod = dev_kubelet.admit_pod(PodSpec("p", [ContainerSpec("c")]))
    (path,) = dev_kubelet.pod_cgroup_paths("p")
    assert path.name == f"{layout.root[1:].replace('-', '_')}-kubepods-besteffort-pod{pod.uid.replace('-', '_')}.slice"
    assert path.is_relative_to(Path(config["cgroup_mount"]))
    assert (path / "cgroup.events").read_text().startswith("populated 1")


@pytest.mark.devplug_cgroups("off")
def test_a_marker_turns_processes_off(dev_kubelet: DevKubeletThread) -> None:
    assert dev_kubelet.cgroup_layout is None
    dev_kubelet.admit_pod(PodSpec("p", [ContainerSpec("c")]))
    assert dev_kubelet.containers_running("p")
    assert dev_kubelet.container_pids("p", "c") == set()
    assert dev_kubelet.liveness_config() == {}  # no cgroups to read


_INNER = textwrap.dedent(
    """
    import json, os
    from pathlib import Path
    import pytest
    from devplug.devkubelet import ContainerSpec, PodSpec

    def test_leaves_a_trace(dev_kubelet):
        layout = dev_kubelet.cgroup_layout
        report = {"layout": None if layout is None else [str(p) for p in layout.paths(layout.root)]}
        dev_kubelet.admit_pod(PodSpec("p", [ContainerSpec("c", stop_delay=float("inf"))]))
        report["pids"] = sorted(dev_kubelet.pod_pids("p"))
        Path(os.environ["INNER_REPORT"]).write_text(json.dumps(report))
        assert False, "this test fails with its pod running"

    @pytest.mark.devplug_cgroups("v2")
    def test_wants_v2(dev_kubelet):
        assert dev_kubelet.cgroup_layout is not None
    """
)


@pytest.fixture
def inner_dir() -> Iterator[Path]:
    """A folder any user may read, for an inner pytest run."""
    folder = Path(tempfile.mkdtemp(prefix="dp-inner-", dir="/tmp"))
    folder.chmod(0o777)
    (folder / "test_inner.py").write_text(_INNER)
    (folder / "test_inner.py").chmod(0o644)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _inner(
    folder: Path, *, user: list[str], env: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    report = folder / "report.json"
    command = [*user, sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rsw", "test_inner.py"]
    environment = {**os.environ, "INNER_REPORT": str(report), **env}
    environment.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, env=environment, timeout=120)
    return done, json.loads(report.read_text()) if report.exists() else {}


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_failing_test_leaves_no_process_and_no_cgroup(inner_dir: Path) -> None:
    if os.geteuid() != 0 or _host_version() is None:
        pytest.skip("needs a dev kubelet with cgroups (root)")
    done, report = _inner(inner_dir, user=[], env={"DEVPLUG_REQUIRE_CGROUPS": "1"})
    assert "1 failed" in done.stdout, done.stdout
    assert "this test fails with its pod running" in done.stdout
    assert report["layout"] and report["pids"]
    assert not [p for p in report["layout"] if Path(p).exists()]
    assert not [pid for pid in report["pids"] if _alive(pid)]


def _as_nobody() -> list[str]:
    if os.geteuid() != 0:
        return []  # already unprivileged
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is needed to run pytest as nobody")
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]


def test_without_cgroups_the_fixture_warns_and_runs_no_processes(inner_dir: Path) -> None:
    done, report = _inner(inner_dir, user=_as_nobody(), env={"DEVPLUG_REQUIRE_CGROUPS": "0"})
    assert report == {"layout": None, "pids": []}, done.stdout + done.stderr
    assert "DevplugCgroupsWarning" in done.stdout
    assert "WITHOUT processes" in done.stdout
    assert "not running as root" in done.stdout
    assert "1 failed, 1 skipped" in done.stdout  # the test that asked for v2 is skipped, not run without


def test_devplug_require_cgroups_makes_the_fallback_a_failure(inner_dir: Path) -> None:
    done, report = _inner(inner_dir, user=_as_nobody(), env={"DEVPLUG_REQUIRE_CGROUPS": "1"})
    assert report == {}  # the test never ran
    assert "DEVPLUG_REQUIRE_CGROUPS=1" in done.stdout
    assert "2 errors" in done.stdout, done.stdout
