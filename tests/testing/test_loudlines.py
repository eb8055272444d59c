"""What a run says loudly at its end (``devplug.testing.loudlines``) reaches the terminal also when the tests ran in
pytest-xdist's worker processes, as ``make test TEST_WORKERS=3`` runs them: a suite that did not run must not go
unsaid there; a line several workers say alike is said once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

CONFTEST = """
import os

import pytest

from devplug.testing.loudlines import loud_source

ran = []


@pytest.fixture(autouse=True)
def _count():
    ran.append(1)


@loud_source
def said():
    where = os.environ.get("PYTEST_XDIST_WORKER", "the only process")
    return [(f"LOUD from {where}: {len(ran)} ran", "red"), ("LOUD alike", "red")] if ran else []
"""


def _run(folder: Path, *args: str) -> str:
    # This test may itself run in a pytest-xdist worker: its child must not take that worker's name for its own.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", str(folder), *args, str(folder)],
        capture_output=True,
        text=True,
        cwd=folder,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    return done.stdout


def test_the_lines_of_every_worker_are_said_by_the_controller(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    for name in ("a", "b", "c"):
        (tmp_path / f"test_{name}.py").write_text("def test_it():\n    pass\n")

    alone = _run(tmp_path, "-n", "0")
    assert re.findall(r"LOUD from (.+): (\d+) ran", alone) == [("the only process", "3")], alone[-3000:]

    spread = _run(tmp_path, "-n", "2", "--dist", "loadfile")
    said = re.findall(r"LOUD from (.+): (\d+) ran", spread)
    assert said, f"no worker's line reached the terminal:\n{spread[-3000:]}"
    assert all(re.fullmatch(r"gw[01]", where) for where, _ in said), said
    assert len({where for where, _ in said}) == len(said), f"a worker's line said twice: {said}"
    assert sum(int(count) for _, count in said) == 3, said
    assert spread.count("LOUD alike") == 1, f"a line several workers say alike is said once:\n{spread[-3000:]}"
