"""The figures of record: the last full ``make bench`` run, committed as ``bench/record.json``, quoted by the docs.

``bench/results.json`` is each run's output and is not committed; ``make bench`` ends with ``python -m bench.record``,
which copies that run's figures, with each key's description and goal and whether the goal was met, into
``bench/record.json``. The documentation's build reads that file (tools/docs/benchfigures.py): the Performance
page's tables and every bench figure another page quotes (``{bench}`idle_rss_mb```) come from it, never by hand, so
a new run and its commit change them all at once. A ``--quick`` run's figures mean nothing and are refused.

    python -m bench.record [RESULTS] [--out RECORD]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.report import CONTEXT_KEYS, GOAL_KEYS, Key, verdicts

__all__ = ["RECORD", "RESULTS", "dumps", "make_record", "main"]

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results.json"
RECORD = HERE / "record.json"


def _commit(where: Path) -> str | None:
    """The checkout's commit, ``+`` when it had uncommitted changes; None outside a git checkout."""
    try:
        head = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+" if dirty else "")


def _row(key: Key, results: Mapping[str, Any], met: Mapping[str, bool], goal: bool) -> dict[str, Any]:
    value = results.get(key.name)
    row: dict[str, Any] = {"key": key.name, "figure": value if isinstance(value, (int, float)) else None}
    if goal:
        row["goal"] = key.goal
        row["met"] = met.get(key.name)
    row["what"] = key.what
    return row


def make_record(results: Mapping[str, Any], recorded: datetime, commit: str | None) -> dict[str, Any]:
    """The record of one full run: when, on what, and every key of the report's two tables in their order."""
    if results.get("quick"):
        raise ValueError("a --quick run's figures are not meaningful: run `make bench` for the figures of record")
    if not isinstance(results.get("machine"), Mapping):
        raise ValueError("the results name no machine: not a results.json of `python -m bench`")
    met = results.get("met")
    if not isinstance(met, Mapping):
        met = verdicts(results)
    return {
        "recorded": recorded.strftime("%Y-%m-%d %H:%M"),
        "commit": commit,
        "source": "make bench: bench/results.json, recorded by python -m bench.record",
        "machine": dict(results["machine"]),
        "goals": [_row(k, results, met, goal=True) for k in GOAL_KEYS],
        "context": [_row(k, results, met, goal=False) for k in CONTEXT_KEYS if k.name in results],
    }


def dumps(record: Mapping[str, Any]) -> str:
    """The record as JSON, one key's row a line (a new run's diff reads figure by figure)."""
    lines = []
    for name, value in record.items():
        if isinstance(value, list):
            rows = ",\n".join(f"  {json.dumps(row)}" for row in value)
            lines.append(f" {json.dumps(name)}: [\n{rows}\n ]")
        else:
            lines.append(f" {json.dumps(name)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.record", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="?", type=Path, default=RESULTS, help="a full run's results.json")
    parser.add_argument("--out", type=Path, default=RECORD, help="the record to write (bench/record.json)")
    args = parser.parse_args(argv)
    try:
        results = json.loads(args.results.read_text())
        recorded = datetime.fromtimestamp(args.results.stat().st_mtime)
        record = make_record(results, recorded, _commit(HERE))
    except (OSError, ValueError) as exc:
        print(f"bench.record: {args.results}: {exc}", file=sys.stderr)
        return 1
    args.out.write_text(dumps(record))
    print(f"bench.record: the figures of {record['recorded']} written to {args.out} (commit it: the docs quote it)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
