"""Today's tree against another commit, on one machine: ``python -m bench.compare REF [--rounds N] [--only FIGURES]
[--quick] [--json PATH] [--keep]`` (``make bench-compare REF=<commit>``).

``make bench`` says where today's figures are; this says what changed. The
harness is today's benchmark code (this process, the floors and the clients);
what is measured for REF is REF's daemon: a ``git worktree`` of REF whose
``core/`` and ``drivers/*/`` come first on its daemons' ``PYTHONPATH``
(:mod:`bench.trees`), checked afterwards from what every daemon imported (a
daemon of either side that ran code from outside its tree fails the run).

Both sides see the same moments of the machine:

- Allocate (``allocate``: p50, p99 and their ratios to the bare grpcio floor) runs both daemons in one series,
  interleaved in blocks with the floors (:mod:`bench.sidebyside`, as :mod:`bench.decompose` does);
- every other part of ``make bench`` (:data:`bench.run.SCENARIOS`: ``speed``, ``lifecycle``, ``release``,
  ``exit``, ``holds``, ``flood``, ``handover``, ``dra``, ``dra-handover``, ``shared``) runs whole for one side
  then the other, the order turned round each round (today REF, REF today, ...: A B B A).

Each figure is reported with today's and REF's medians over the rounds, the
median of the rounds' ratios today/REF (each round's today against the same
round's REF) and their spread (min-max): pairing the rounds takes out what
the machine did to both sides alike, which each side's own spread over the
rounds (also shown, max/min - 1) keeps. A figure is flagged when the whole
spread of its ratio lies beyond the band of noise around 1
(:data:`NOISE_FLOOR`, 5 %), every round's ratio the same way; with one round
there is no spread, and nothing is flagged. Higher is worse for every figure
but counts (:data:`COUNTS`). A report, not a test: nothing is compared with a
goal.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.machine import machine_info
from bench.report import CONTEXT_KEYS, GOAL_KEYS
from bench.run import SCENARIOS, compile_bytecode
from bench.settings import FULL, QUICK, Settings
from bench.sidebyside import FIGURES as ALLOCATE_FIGURES
from bench.sidebyside import allocate_side_by_side
from bench.trees import REPOSITORY, Tree, check_ran, checkout, today
from bench.workspace import Workspace

__all__ = [
    "COUNTS",
    "DERIVED",
    "GROUPS",
    "NOISE_FLOOR",
    "Figure",
    "Selection",
    "compare",
    "figure_group",
    "format_report",
    "main",
    "selection",
]

Log = Callable[[str], None]

#: The finely interleaved Allocate comparison (:mod:`bench.sidebyside`).
ALLOCATE = "allocate"
#: Every group of figures, in the order a round runs them.
GROUPS: tuple[str, ...] = (ALLOCATE, *SCENARIOS)

#: Results keys by the group that gives them: the longest prefix wins (the Allocate keys of ``allocate`` first).
_PREFIXES: dict[str, str] = {
    "allocate_": "speed",
    "preferred_": "speed",
    "law_": "speed",
    "unix_": "speed",
    "churn_": "speed",
    "startup_": "lifecycle",
    "idle_": "lifecycle",
    "reregister_": "lifecycle",
    "release_": "release",
    "exit_release_": "exit",
    "hold_": "holds",
    "withhold_": "holds",
    "flood_": "flood",
    "handover": "handover",
    "dra_": "dra",
    "dra_handover": "dra-handover",
    "shared_": "shared",
}

#: Ratios of two figures of one run that ``make bench`` shows (or the issue asks for) but results.json lacks:
#: name -> (numerator, denominator).
DERIVED: dict[str, tuple[str, str]] = {
    "startup_ratio": ("startup_to_registered_ms", "startup_floor_ms"),
    "idle_rss_ratio": ("idle_rss_mb", "idle_floor_rss_mb"),
    "idle_rss_anon_ratio": ("idle_rss_anon_mb", "idle_floor_rss_anon_mb"),
}

#: Figures that count something (how many handovers, restarts, rounds, events per second): neither side is worse.
COUNTS = frozenset({"handovers", "dra_handovers", "reregister_restarts", "dra_rounds"})

#: The band of noise around a ratio of 1 (5 %): a figure whose every round's ratio is beyond it is flagged.
NOISE_FLOOR = 0.05


def figure_group(key: str) -> str | None:
    """The group whose run gives the results key ``key`` (or a :data:`DERIVED` ratio), or None."""
    if key in ALLOCATE_FIGURES:
        return ALLOCATE
    if key in DERIVED:
        return "lifecycle"
    matches = [prefix for prefix in _PREFIXES if key.startswith(prefix)]
    return _PREFIXES[max(matches, key=len)] if matches else None


def _known_figures() -> frozenset[str]:
    """The figures ``--only`` may name one by one: those of ``make bench``'s table, and the derived ratios."""
    return frozenset({k.name for k in (*GOAL_KEYS, *CONTEXT_KEYS)} | set(DERIVED) | set(ALLOCATE_FIGURES))


@dataclass(frozen=True)
class Selection:
    """What ``--only`` asks for: the groups to run (in :data:`GROUPS` order), those shown whole, and single
    figures (results keys) shown besides."""

    groups: tuple[str, ...]
    whole: frozenset[str]
    keys: frozenset[str]

    def shows(self, key: str) -> bool:
        return key in self.keys or figure_group(key) in self.whole


def selection(only: str | None) -> Selection:
    """The :class:`Selection` of ``--only``: a comma-separated list of group names and results keys (``ValueError``
    for anything else); every group when empty."""
    if not only:
        return Selection(GROUPS, frozenset(GROUPS), frozenset())
    whole: set[str] = set()
    keys: set[str] = set()
    for item in (part.strip() for part in only.split(",")):
        if item in GROUPS:
            whole.add(item)
        elif item:
            if item not in _known_figures() or figure_group(item) is None:
                raise ValueError(
                    f"{item!r} is neither a group ({', '.join(GROUPS)}) nor a figure of one (a key of make bench's "
                    f"table, bench/report.py, or one of {', '.join(DERIVED)}; a whole group shows every key it gives)"
                )
            keys.add(item)
    wanted = whole | {str(figure_group(k)) for k in keys}
    return Selection(tuple(g for g in GROUPS if g in wanted), frozenset(whole), frozenset(keys))


@dataclass
class Figure:
    """One figure's values over the rounds, each side's in the same round order."""

    key: str
    today: list[float] = field(default_factory=list)
    ref: list[float] = field(default_factory=list)

    def ratios(self) -> list[float]:
        return [t / r for t, r in zip(self.today, self.ref, strict=True) if r]

    def side_spread(self) -> float | None:
        """The larger of each side's own spread over the rounds (max/min - 1): the machine's drift and noise, which
        the rounds' ratios pair away (None when a side has no positive value)."""
        spreads = [max(v) / min(v) - 1 for v in (self.today, self.ref) if v and min(v) > 0]
        return max(spreads) if len(spreads) == 2 else None

    def flag(self) -> str:
        """``higher``/``lower`` when every round's ratio is beyond :data:`NOISE_FLOOR` that way (``a count`` added
        for counts); never with fewer than two rounds, which have no spread."""
        ratios = self.ratios()
        if len(ratios) < 2 or len(ratios) != len(self.today):
            return ""
        word = ""
        if min(ratios) > 1 + NOISE_FLOOR:
            word = "higher"
        elif max(ratios) < 1 / (1 + NOISE_FLOOR):
            word = "lower"
        if word and self.key in COUNTS:
            return f"{word} (a count)"
        return word

    def summary(self) -> dict[str, Any]:
        ratios = self.ratios()
        return {
            "today": self.today,
            "ref": self.ref,
            "ratios": ratios,
            "today_median": statistics.median(self.today),
            "ref_median": statistics.median(self.ref),
            "ratio_median": statistics.median(ratios) if ratios else None,
            "ratio_min": min(ratios) if ratios else None,
            "ratio_max": max(ratios) if ratios else None,
            "side_spread": self.side_spread(),
            "flag": self.flag(),
        }


def _numbers(results: Mapping[str, Any]) -> dict[str, float]:
    """The numeric figures of one run of a group, with the :data:`DERIVED` ratios it allows."""
    out = {k: float(v) for k, v in results.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    for name, (top, bottom) in DERIVED.items():
        if top in out and out.get(bottom):
            out[name] = out[top] / out[bottom]
    return out


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _add(figures: dict[str, Figure], sides: Mapping[str, Mapping[str, float]], one_sided: set[str]) -> None:
    """Add one round's figures of a group, those both sides gave; the names of the others to ``one_sided``."""
    today, ref = sides["today"], sides["ref"]
    for key in today.keys() & ref.keys():
        figure = figures.setdefault(key, Figure(key))
        figure.today.append(today[key])
        figure.ref.append(ref[key])
    one_sided.update(today.keys() ^ ref.keys())


def _run_group(
    group: str, trees: Mapping[str, Tree], order: Sequence[str], settings: Settings, keep: bool, log: Log
) -> dict[str, dict[str, float]]:
    """One run of ``group`` for each side (``order``: the sides' names in the order they run); each side's figures."""
    envs = {side: tree.daemon_env() for side, tree in trees.items()}
    if group == ALLOCATE:
        with Workspace(keep=keep) as ws:
            log(f"bench.compare: Allocate, {' and '.join(order)} interleaved, in {ws.root}")
            both = allocate_side_by_side(ws, settings, envs, order)
        return {side: _numbers(figures) for side, figures in both.items()}
    out: dict[str, dict[str, float]] = {}
    for side in order:
        results: dict[str, Any] = {}
        with Workspace(keep=keep, daemon_env=envs[side]) as ws:
            log(f"bench.compare: {group} for {side} ({trees[side].label}) in {ws.root}")
            SCENARIOS[group](ws, settings, results, log)
        numbers = _numbers(results)
        if group == "speed":  # the allocate group's series measures these, both sides in one series
            numbers = {k: v for k, v in numbers.items() if k not in ALLOCATE_FIGURES}
        out[side] = numbers
    return out


def _head() -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPOSITORY, capture_output=True, text=True, check=False)
    return done.stdout.strip()


def compare(
    ref: str,
    *,
    rounds: int,
    settings: Settings,
    groups: Iterable[str],
    keep: bool = False,
    log: Log = _stderr,
) -> dict[str, Any]:
    """Run ``groups`` for today's tree and ``ref``'s, ``rounds`` times; the comparison as ``--json`` writes it."""
    if rounds < 1:
        raise ValueError("bench.compare: at least one round")
    started = time.monotonic()
    compile_bytecode(log)
    chosen = list(groups)
    figures: dict[str, Figure] = {}
    one_sided: set[str] = set()
    with ExitStack() as stack:
        records = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dpcmp-rec-", dir="/tmp")))
        (records / "today").mkdir()
        (records / "ref").mkdir()
        trees = {"today": today(records / "today"), "ref": stack.enter_context(checkout(ref, records / "ref"))}
        machine = machine_info()
        seen: dict[str, dict[str, str]] = {}
        for round_number in range(rounds):
            order = ("today", "ref") if round_number % 2 == 0 else ("ref", "today")
            log(f"bench.compare: round {round_number + 1} of {rounds} ({' then '.join(order)})")
            for group in chosen:
                _add(figures, _run_group(group, trees, order, settings, keep, log), one_sided)
            seen = {side: check_ran(tree) for side, tree in trees.items()}  # fails as soon as a side ran stray code
    load = os.getloadavg()
    return {
        "ref": ref,
        "ref_commit": trees["ref"].commit,
        "today_head": _head(),
        "rounds": rounds,
        "quick": settings.quick,
        "groups": chosen,
        "trees": {side: {"root": str(trees[side].root), **seen[side]} for side in trees},
        "machine": {**machine, "loadavg_at_end": [round(x, 2) for x in load]},
        "duration_s": round(time.monotonic() - started, 1),
        "figures": {key: figure.summary() for key, figure in sorted(figures.items())},
        "one_sided": sorted(one_sided),
    }


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0 or abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def format_report(result: Mapping[str, Any], shown: Selection | None = None) -> str:
    """The comparison as a Markdown table (the figures ``shown`` selects, or every one), what ran above it."""
    ref, commit = result["ref"], (result["ref_commit"] or "")[:12]
    machine = result["machine"]
    trees = result["trees"]
    lines = [
        f"today's tree (HEAD {result['today_head'][:12]} and the working tree) against {ref} ({commit}), "
        f"{result['rounds']} round(s){' (--quick)' if result['quick'] else ''}, groups: {', '.join(result['groups'])}",
        f"machine: {machine['cpu_model']}, {machine['cores']} cores, load average "
        f"{machine['loadavg_at_start']} at the start and {machine['loadavg_at_end']} at the end "
        f"({result['duration_s']:.0f} s)",
        f"daemons checked: today's imported devplug from {trees['today']['devplug']} "
        f"({trees['today']['daemons']} daemons), {ref}'s from {trees['ref']['devplug']} "
        f"({trees['ref']['daemons']} daemons)",
        "",
        f"| figure | today | {ref} | today / {ref} | spread (min-max) | sides' spread | flag |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for key, stored in result["figures"].items():
        if shown is not None and not shown.shows(key):
            continue
        f = Figure(key, list(stored["today"]), list(stored["ref"])).summary()  # from the values: the rules of now
        spread = f"{_number(f['ratio_min'])}-{_number(f['ratio_max'])}" if f["ratio_min"] is not None else "-"
        sides = "-" if f["side_spread"] is None else f"{100 * f['side_spread']:.0f}%"
        lines.append(
            f"| `{key}` | {_number(f['today_median'])} | {_number(f['ref_median'])} | {_number(f['ratio_median'])} "
            f"| {spread} | {sides} | {f['flag']} |"
        )
    one_sided = [k for k in result.get("one_sided", ()) if shown is None or shown.shows(k)]
    if one_sided:
        lines += ["", "given by one side only (not compared): " + ", ".join(f"`{k}`" for k in one_sided)]
    lines += [
        "",
        "today and REF: medians over the rounds; today / REF: the median of the rounds' ratios (each round's today "
        "over the same round's REF) and their spread; sides' spread: the larger of each side's own (max/min - 1), "
        "what the machine did to both, which the pairing takes out; flag: every round's ratio beyond 1 +- 5 % the "
        "same way (two rounds at least; higher is worse but for counts). The machine's other load is in the load "
        "averages above.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("ref", metavar="REF", help="the commit to compare today's tree with (anything git names)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds, each side run once in each (default 4)")
    parser.add_argument(
        "--only",
        metavar="FIGURES",
        help=f"comma-separated groups ({', '.join(GROUPS)}) or figures (results.json keys, or "
        f"{', '.join(DERIVED)}): run only the groups that give them",
    )
    parser.add_argument("--quick", action="store_true", help="a few iterations of everything (for tests)")
    parser.add_argument("--json", type=Path, help="also write the comparison here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folders (daemon logs)")
    args = parser.parse_args(argv)
    try:
        chosen = selection(args.only)
    except ValueError as exc:
        parser.error(str(exc))
    settings = QUICK if args.quick else FULL
    result = compare(args.ref, rounds=args.rounds, settings=settings, groups=chosen.groups, keep=args.keep)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(format_report(result, chosen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
