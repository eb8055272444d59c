"""Shared fixtures for devplug's own tests (the dev kubelet and daemon fixtures come from devplug.testing)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devplug.testing.process import DaemonProcess


@pytest.fixture(scope="session", autouse=True)
def _no_daemon_outlives_the_tests() -> Iterator[None]:
    """A daemon a test started and never stopped runs on after it, burning the machine's CPU under every later
    test: at the end each one left is killed, and the run fails naming them."""
    yield
    left = DaemonProcess.left_running()
    for daemon in left:
        daemon.kill()
    assert not left, "daemons left running by the tests: " + ", ".join(
        f"pid {d.pid} ({d.config_path}, {d.env.get('DEVPLUG_INSTANCE', 'no instance')})" for d in left
    )


@pytest.fixture
def fake_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, str, str], Path]]:
    """Install a throw-away distribution on sys.path: ``make(dist_name, module_source, entry_points_ini)``.

    It is real package metadata (a ``.dist-info`` folder), so importlib.metadata
    and therefore devplug's driver discovery find it, in this process and in
    child processes started with the returned folder on PYTHONPATH.
    """
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", f"{site}:{':'.join(sys.path)}")

    def make(dist: str, module_source: str, entry_points: str) -> Path:
        module = dist.replace("-", "_")
        (site / f"{module}.py").write_text(textwrap.dedent(module_source))
        info = site / f"{module}-1.2.3.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.2.3\n")
        (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
        import importlib

        importlib.invalidate_caches()
        return site

    yield make
    for name in list(sys.modules):
        if name.startswith("devplug_test_"):
            del sys.modules[name]


def install_project(python: Path, project: Path, package: str) -> None:
    """``pip install`` the driver project at ``project`` into ``python``'s environment (no index, no build
    isolation), then move its source package ``package`` away so that only the installed copy can be imported."""
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-index", "--no-deps", "--no-build-isolation", str(project)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    (project / package).rename(project / "source-moved-away")


def run_pytest_on(folder: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """pytest run on ``folder`` in a child process (``folder`` its rootdir and working folder, no cache), its
    output captured: for tests of what a driver author's suite sees."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(folder), str(folder)],
        capture_output=True,
        text=True,
        cwd=folder,
        timeout=timeout,
    )


@pytest.fixture
def run_pytest() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run_pytest(folder, timeout=300)``: see :func:`run_pytest_on`."""
    return run_pytest_on


@pytest.fixture
def installed_project() -> Callable[[Path, Path, str], None]:
    """``installed_project(python, project, package)``: see :func:`install_project`."""
    return install_project


@pytest.fixture
def fresh_venv() -> Callable[[Path], Path]:
    """``fresh_venv(where)``: a virtual environment with its own site-packages that also sees this one's (devplug
    and its test kit, devplug-testing, as this venv installed them: editable, their finders and .pth files run by
    ``site.addsitedir``; pytest, pip and setuptools: without pip of its own, the ensurepip copies would shadow
    them); its python."""

    def make(where: Path) -> Path:
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=300, capture_output=True
        )
        python = where / "bin" / "python"
        purelib = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        ours = sysconfig.get_paths()["purelib"]
        assert Path(purelib) != Path(ours)
        (Path(purelib) / "zz_devplug_test_parent.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
        return python

    return make
