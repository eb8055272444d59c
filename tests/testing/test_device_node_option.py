"""The ``dev_kubelet`` fixture's device-node check (issue 38): off by default until devplug 1.0, so that drivers'
suites written before the check keep passing; asked for by a test's marker or a suite's pytest config."""

from __future__ import annotations

import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path

SUITE = """
import pytest

def test_default(dev_kubelet):
    assert dev_kubelet.check_device_nodes is {default}

@pytest.mark.devplug_device_nodes
def test_asked(dev_kubelet):
    assert dev_kubelet.check_device_nodes is True

@pytest.mark.devplug_device_nodes(False)
def test_not_asked(dev_kubelet):
    assert dev_kubelet.check_device_nodes is False

@pytest.mark.devplug_device_nodes(check="yes")
def test_misused(dev_kubelet):
    pass
"""


def _run(folder: Path, ini: str, default: bool, run_pytest: Callable[..., subprocess.CompletedProcess[str]]) -> str:
    folder.mkdir()
    (folder / "pytest.ini").write_text(f"[pytest]\n{ini}")
    (folder / "test_suite.py").write_text(textwrap.dedent(SUITE.format(default=default)))
    done = run_pytest(folder, timeout=300)
    assert done.returncode == 1, done.stdout[-4000:]
    assert "3 passed, 1 error" in done.stdout, done.stdout[-4000:]
    assert "devplug_device_nodes: check must be True or False, got 'yes'" in done.stdout, done.stdout[-4000:]
    return done.stdout


def test_the_fixture_checks_where_the_test_or_the_suite_asks(
    tmp_path: Path, run_pytest: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    _run(tmp_path / "default", "", False, run_pytest)
    _run(tmp_path / "suite", "devplug_check_device_nodes = true\n", True, run_pytest)
