"""A core upgrade never breaks a driver (issue 25): a driver written against hook contract 1.0 (no declared
contract, hooks with only the arguments 1.0 had, device nodes no test machine has) and a subclass of the shipped
mock calling its hooks the 1.0 way, kept as a project under tests/fixtures, are installed as a wheel into a fresh
virtual environment beside this checkout's core and pass the driver conformance class there, and go through every
CLI command (drivers, check-config, kubelet, run, status: issue 38), on every change of the core. The drivers
outside authors wrote are tests/test_field_drivers.py's."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "devplug-legacy"
#: The conformance checks each legacy driver class passes (those needing slow_release or bad_options skip).
CONFORMANCE_CHECKS = 6
#: The tests of devplug-legacy/tests/test_legacy_cli.py: drivers, check-config, run with kubelet and status.
CLI_TESTS = 3


def test_a_driver_written_against_contract_1_0_passes_the_conformance_class_and_every_cli_command(
    tmp_path: Path, fresh_venv: Callable[[Path], Path], installed_project: Callable[[Path, Path, str], None]
) -> None:
    project = tmp_path / "devplug-legacy"
    shutil.copytree(FIXTURE, project)
    python = fresh_venv(tmp_path / "venv")
    installed_project(python, project, "devplug_legacy")  # only the installed wheel can be imported
    tests = subprocess.run(
        [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "tests"],
        capture_output=True,
        text=True,
        cwd=project,
        timeout=600,
    )
    output = tests.stdout + tests.stderr
    assert tests.returncode == 0, output
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|skipped|failed|error)", output)}
    assert counts.get("passed", 0) == 2 * CONFORMANCE_CHECKS + CLI_TESTS, output
    # Its devices are no device nodes: the dev kubelet took them, warning (until devplug 1.0, as it promised).
    assert "DeviceNodeDeprecationWarning: DeviceSpec host path /dev/devplug-legacy-absent-legacy" in output, output
    assert "failed" not in counts and "error" not in counts, output
