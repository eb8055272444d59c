"""The source trees whose daemons ``bench.compare`` measures: today's working tree and a worktree of another commit.

The harness (this process, and the floors and clients it starts) always runs
today's code; only the daemon processes run a :class:`Tree`'s: their
``PYTHONPATH`` puts the tree's ``core/`` and ``drivers/*/`` first (before the
virtual environment's editable installs of today's tree), and
:mod:`bench.treeprobe` first of all, so every daemon writes, as it exits, the
files of the devplug modules it imported. :func:`check_ran` reads those
records and fails unless every module came from the tree: a comparison of a
commit with itself by mistake (a path that did not win) fails loudly instead
of reporting ratios of 1.
"""

from __future__ import annotations

import compileall
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["REPOSITORY", "Tree", "TreeCheckError", "check_ran", "checkout", "today"]

#: The checkout this benchmark belongs to (today's working tree).
REPOSITORY = Path(__file__).resolve().parent.parent
_PROBE = Path(__file__).resolve().parent / "treeprobe"


class TreeCheckError(RuntimeError):
    """A daemon meant to run one tree's code ran another's (or no daemon left a record)."""


@dataclass(frozen=True)
class Tree:
    """A source tree of devplug: ``label`` (``today`` or the commit asked for), ``commit`` (what ``git rev-parse``
    says; ``None`` for today's working tree, whatever it holds uncommitted), ``root`` (its top folder) and
    ``records`` (the folder its daemons' probe records go to)."""

    label: str
    commit: str | None
    root: Path
    records: Path

    def paths(self) -> list[Path]:
        """The folders a daemon of this tree imports devplug and the drivers from, in order: the core, the test kit
        when the tree has one apart (``testkit/`` or ``testkit/src/``, whose ``devplug/`` joins the core's package;
        the mock driver records its calls with it), every driver."""
        kit = [f for f in (self.root / "testkit", self.root / "testkit" / "src") if (f / "devplug").is_dir()]
        drivers = sorted(p for p in (self.root / "drivers").glob("*") if (p / "pyproject.toml").is_file())
        return [self.root / "core", *kit, *drivers]

    def daemon_env(self) -> dict[str, str]:
        """The environment a daemon of this tree is started with (added to this process's)."""
        entries = [str(_PROBE), *(str(p) for p in self.paths())]
        return {"PYTHONPATH": os.pathsep.join(entries), "DEVPLUG_BENCH_PROBE": str(self.records)}


def _git(*args: str, cwd: Path = REPOSITORY) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout.strip()


def _compile(tree: Tree) -> None:
    """Compile the tree's modules once, as ``pip install`` does, so no daemon start pays it (bench.run does the same
    for today's)."""
    for folder in tree.paths():
        compileall.compile_dir(folder, quiet=1)


def today(records: Path) -> Tree:
    """Today's working tree (this checkout, uncommitted changes included)."""
    tree = Tree("today", None, REPOSITORY, records)
    _compile(tree)
    return tree


@contextmanager
def checkout(ref: str, records: Path) -> Iterator[Tree]:
    """A detached ``git worktree`` of ``ref`` in a temporary folder, removed (and pruned) afterwards."""
    commit = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
    folder = Path(tempfile.mkdtemp(prefix="dpcmp-", dir="/tmp"))
    root = folder / "tree"
    _git("worktree", "add", "--detach", str(root), commit)
    try:
        tree = Tree(ref, commit, root, records)
        if not (root / "core" / "devplug" / "__main__.py").is_file():
            raise RuntimeError(f"{ref} ({commit[:12]}) has no core/devplug/__main__.py: not a devplug tree to compare")
        _compile(tree)
        yield tree
    finally:
        _git("worktree", "remove", "--force", str(root))
        shutil.rmtree(folder, ignore_errors=True)


def _is_daemon(argv: list[str]) -> bool:
    return bool(argv) and Path(argv[0]).name == "__main__.py" and Path(argv[0]).parent.name == "devplug"


def check_ran(tree: Tree) -> dict[str, str]:
    """Fail (:class:`TreeCheckError`) unless some daemon of ``tree`` left a record and every devplug or driver module
    any of its processes imported is a file of ``tree``; ``{"devplug": its __file__, "daemons": how many}`` as
    seen."""
    root = tree.root.resolve()
    records = [json.loads(p.read_text()) for p in sorted(tree.records.glob("*.json"))]
    daemons = [r for r in records if _is_daemon(r["argv"])]
    if not daemons:
        raise TreeCheckError(
            f"bench.compare: no daemon of {tree.label} left a record in {tree.records}: cannot tell whose code it ran"
        )
    strays = sorted(
        f"{name} from {where} (pid {r['pid']})"
        for r in records
        for name, where in r["modules"].items()
        if not Path(where).resolve().is_relative_to(root)
    )
    if strays:
        shown = "; ".join(strays[:5]) + (f"; and {len(strays) - 5} more" if len(strays) > 5 else "")
        raise TreeCheckError(f"bench.compare: the daemons of {tree.label} ran code from outside {root}: {shown}")
    first = daemons[0]["modules"].get("devplug")
    if first is None:
        raise TreeCheckError(f"bench.compare: a daemon of {tree.label} never imported devplug: {daemons[0]}")
    return {"devplug": first, "daemons": str(len(daemons))}
