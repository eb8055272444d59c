"""The benchmark runs end to end in its tiny mode, so it cannot rot; figures are never asserted."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MACHINE_FIELDS = ("cpu_model", "cores", "python", "grpcio", "protobuf")


def _goal_keys() -> list[str]:
    """The issue's keys, from the benchmark itself (bench/ is not installed: it runs from the checkout)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    report = importlib.import_module("bench.report")
    return [key.name for key in report.GOAL_KEYS]


@pytest.mark.timeout(300)
def test_quick_bench_writes_every_key(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    results = json.loads(out.read_text())
    keys = _goal_keys()
    assert len(keys) == 22  # issue 5's 19, plus the p50 ratio, the held-1000 ratio and the preferred ratio of issue 11
    for key in keys:
        value = results.get(key)
        assert isinstance(value, (int, float)), f"{key} missing or not a number: {value!r}"
        assert not isinstance(value, bool), f"{key} is a bool"
        assert value > 0, f"{key} is not positive: {value!r}"
    machine = results["machine"]
    for field in MACHINE_FIELDS:
        assert machine.get(field), f"machine.{field} missing"
    assert machine["cores"] > 0
    for key in keys:
        assert key in proc.stdout, f"{key} not in the printed table"
