"""``bench.compare`` (``make bench-compare REF=...``): today's tree against a commit, each side's daemon running its
own tree's code. Figures are never asserted: a comparison of HEAD with itself says nothing about ratios on a shared
machine, only that the report has its shape and that each side ran what it says."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _bench_module(name: str) -> Any:
    """A module of the benchmark (bench/ is not installed: it runs from the checkout)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(name)


def _bench_env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def _worktrees() -> str:
    return subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True, check=True).stdout


@pytest.mark.timeout(60)
def test_compare_with_head_reports_each_figure_and_each_side_ran_its_own_tree(tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    before = _worktrees()
    command = [sys.executable, "-m", "bench.compare", "HEAD", "--quick", "--rounds", "1"]
    proc = subprocess.run(
        [*command, "--only", "allocate_ratio_p50", "--json", str(out)],
        cwd=ROOT,
        env=_bench_env(),
        capture_output=True,
        text=True,
        timeout=55,
        check=False,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    result = json.loads(out.read_text())
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result["ref_commit"] == head.stdout.strip()
    assert result["groups"] == ["allocate"]
    # each side's daemons imported devplug from its own tree: today's from this checkout, HEAD's from its worktree
    today, ref = result["trees"]["today"], result["trees"]["ref"]
    assert Path(today["root"]) == ROOT
    assert Path(today["devplug"]) == ROOT / "core" / "devplug" / "__init__.py"
    assert Path(ref["devplug"]) == Path(ref["root"]) / "core" / "devplug" / "__init__.py"
    assert not Path(ref["root"]).is_relative_to(ROOT)
    assert int(today["daemons"]) >= 1 and int(ref["daemons"]) >= 1
    figure = result["figures"]["allocate_ratio_p50"]
    assert len(figure["today"]) == len(figure["ref"]) == len(figure["ratios"]) == 1
    assert figure["ratio_median"] == pytest.approx(figure["today"][0] / figure["ref"][0])
    assert figure["ratio_min"] <= figure["ratio_median"] <= figure["ratio_max"]
    # the table: one row per figure asked for, with both sides, the ratio and its spread
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| `")]
    assert [row.split("|")[1].strip() for row in rows] == ["`allocate_ratio_p50`"]
    assert "| today | HEAD | today / HEAD | spread (min-max) |" in proc.stdout
    # the worktree of HEAD is gone
    assert _worktrees() == before
    assert not Path(ref["root"]).exists()


def test_tree_check_refuses_a_daemon_that_ran_another_trees_code(tmp_path: Path) -> None:
    """A real ``python -m devplug`` started with today's tree's daemon environment leaves a record of what it
    imported; checked against another tree, it is refused, naming the stray module."""
    trees = _bench_module("bench.trees")
    records = tmp_path / "records"
    records.mkdir()
    tree = trees.Tree("today", None, trees.REPOSITORY, records)
    subprocess.run(
        [sys.executable, "-m", "devplug", "--help"],
        env=dict(os.environ, **tree.daemon_env()),
        capture_output=True,
        check=True,
        timeout=30,
    )
    assert trees.check_ran(tree)["devplug"] == str(ROOT / "core" / "devplug" / "__init__.py")
    elsewhere = trees.Tree("other", "0" * 40, tmp_path / "other", records)
    with pytest.raises(trees.TreeCheckError, match=r"ran code from outside .*other: devplug"):
        trees.check_ran(elsewhere)
    with pytest.raises(trees.TreeCheckError, match="no daemon of other left a record"):
        trees.check_ran(trees.Tree("other", "0" * 40, tmp_path / "other", tmp_path))


def test_only_takes_groups_and_figures_and_refuses_anything_else() -> None:
    compare = _bench_module("bench.compare")
    chosen = compare.selection("startup_ratio,handover_allocate_wait_max_ms,allocate_ratio_p50,shared")
    assert chosen.groups == ("allocate", "lifecycle", "handover", "shared")
    assert chosen.shows("shared_handover_p50_ms_default") and chosen.shows("startup_ratio")
    assert not chosen.shows("startup_floor_ms")
    assert compare.figure_group("dra_handover_ms") == "dra-handover"
    assert compare.figure_group("dra_prepare_p50_ms") == "dra"
    assert compare.figure_group("exit_release_p99_ms_v2") == "exit"
    with pytest.raises(ValueError, match="'allocate_speed' is neither a group"):
        compare.selection("allocate_speed")
