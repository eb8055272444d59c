"""A :class:`devplug.testing.vm.VmSuite` boots its guest once per run also when its test files are spread over
pytest-xdist's workers, as ``make test TEST_WORKERS=3`` runs them: a boot under TCG costs a core for minutes, so the
workers share one boot's verdicts instead of each booting its own.

The runner here keeps the runner contract (``missing_assets()``, ``run(results, pytest_args, timeout)`` writing
``<results>/junit.xml`` from a pytest run with ``DEVPLUG_VM_GUEST=1``) but runs that pytest on the host instead of
in QEMU, and counts its boots: what is checked is the suite's side, not a kernel."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

RUNNER = """
import os
import subprocess
import sys
from pathlib import Path


def missing_assets():
    return []


def run(results, pytest_args, timeout, **options):
    with open(os.environ["BOOTS_FILE"], "a") as boots:
        boots.write("boot\\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["DEVPLUG_VM_GUEST"] = "1"
    args = [sys.executable, "-m", "pytest", "-p", "no:xdist", f"--junitxml={Path(results) / 'junit.xml'}", *pytest_args]
    return subprocess.run(args, env=env, timeout=timeout, capture_output=True, check=False).returncode
"""

CONFTEST = """
from pathlib import Path

import pytest

from devplug.testing.vm import VmSuite

HERE = Path(__file__).parent
SUITE = VmSuite("fake", runner=HERE / "runner.py", tests=HERE)


class Kernel:
    name = "kernel"

    def reset(self):
        pass


class Model:
    name = "model"


@pytest.fixture(scope="session")
def vm_run(tmp_path_factory):
    return SUITE.run(tmp_path_factory)


@pytest.fixture(params=SUITE.params())
def backend(request):
    yield from SUITE.backend(request, model=Model, kernel=Kernel)
"""

TEST = """
def test_scenario(backend):
    assert backend.name in ("model", "kernel")
"""


def test_the_workers_of_one_run_share_one_boot(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "runner.py").write_text(textwrap.dedent(RUNNER))
    (suite / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    for name in ("a", "b", "c"):  # three files, three workers: pytest-xdist's loadfile gives each worker one first
        (suite / f"test_{name}.py").write_text(textwrap.dedent(TEST))
    boots = tmp_path / "boots"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["BOOTS_FILE"] = str(boots)
    args = ["-p", "no:cacheprovider", "--rootdir", str(suite), "-n", "3", "--dist", "loadfile", str(suite)]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *args], capture_output=True, text=True, cwd=suite, env=env, timeout=300
    )
    output = done.stdout[-4000:] + done.stderr[-2000:]
    assert done.returncode == 0, output
    assert "6 passed" in done.stdout, output
    assert boots.read_text().count("boot") == 1, f"the guest booted {boots.read_text().count('boot')} times\n{output}"
    said = re.findall(r"fake real-kernel suite: 3 cases ran in one VM boot", done.stdout)
    assert len(said) == 1, f"the boot is said by the worker that booted it, once:\n{output}"
