"""Sphinx extension: the documentation quotes ``make bench``'s figures of record (``bench/record.json``), never by hand.

``make bench`` writes each run to ``bench/results.json`` (not committed) and records it in ``bench/record.json``
(``python -m bench.record``), which is committed. From that file the build renders, in any page:

- ``{bench}`idle_rss_mb```: the key's figure as the bench's own table prints it (``44.5``), in an ``<abbr>`` whose
  title names the key and the run; ``{bench}`allocate_p50_ms_threaded - allocate_p50_ms``` the difference of two
  keys (what the hook thread adds); ``{bench}`recorded``` the run's date and time, ``{bench}`machine``` its machine;
- a ``{bench-figures}`` directive: the report's two tables, each goal beside its figure and verdict, then the floors
  and diagnostics measured in the same run.

A key the record does not have, or has without a figure, is an error naming it (the build runs with ``-W``), so a
renamed key cannot leave a page quoting nothing. The record is a dependency of every page quoting it: a new record
rebuilds them. ``bench_record`` (docs/conf.py) is its path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective, SphinxRole

__all__ = ["Record", "fmt", "setup"]


def fmt(value: float) -> str:
    """A figure as bench/report.py prints it: three decimals below 10, one from 10 up."""
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


@dataclass(frozen=True)
class Record:
    """One ``bench/record.json``: when and where the run was, and every key's row, goals first."""

    path: Path
    data: Mapping[str, Any]

    @staticmethod
    @cache
    def _load(path: Path, mtime_ns: int) -> Record:
        data = json.loads(path.read_text(encoding="utf-8"))
        for field in ("recorded", "machine", "goals", "context"):
            if field not in data:
                raise ValueError(f"{path}: no {field!r}: not a record written by python -m bench.record")
        return Record(path, data)

    @classmethod
    def load(cls, path: Path) -> Record:
        return cls._load(path, path.stat().st_mtime_ns)

    @property
    def rows(self) -> dict[str, Mapping[str, Any]]:
        return {row["key"]: row for row in (*self.data["goals"], *self.data["context"])}

    def figure(self, key: str) -> float:
        row = self.rows.get(key)
        if row is None:
            raise KeyError(f"bench/record.json has no key {key!r} (python -m bench.record writes the report's keys)")
        if not isinstance(row["figure"], (int, float)):
            raise KeyError(f"bench/record.json has no figure for {key!r} (the recorded run did not measure it)")
        return float(row["figure"])

    @property
    def machine(self) -> str:
        m = self.data["machine"]
        return (
            f"{m.get('cpu_model')}, {m.get('cores')} cores, Python {m.get('python')}, grpcio {m.get('grpcio')}, "
            f"protobuf {m.get('protobuf')}, Linux {m.get('kernel')}"
        )

    def quote(self, text: str) -> str:
        """What ``{bench}`text``` shows: a key's figure, the difference of two keys, the run's date or machine."""
        text = text.strip()
        if text == "recorded":
            return str(self.data["recorded"])
        if text == "machine":
            return self.machine
        if " - " in text:
            left, right = (part.strip() for part in text.split(" - ", 1))
            return fmt(self.figure(left) - self.figure(right))
        return fmt(self.figure(text))

    def tables(self) -> list[str]:
        """The report's two tables as Markdown (bench/report.py's format_markdown, from the record)."""

        def cell(value: Any) -> str:
            return str(value).replace("|", "\\|")

        def figure(row: Mapping[str, Any]) -> str:
            value = row["figure"]
            return fmt(float(value)) if isinstance(value, (int, float)) else "-"

        verdicts = {True: "met", False: "MISSED", None: ""}
        lines = ["| key | figure | goal | | what |", "| --- | ---: | --- | --- | --- |"]
        lines += [
            f"| `{row['key']}` | {figure(row)} | {cell(row['goal'])} | {verdicts[row['met']]} | {cell(row['what'])} |"
            for row in self.data["goals"]
        ]
        lines += ["", "| floor or diagnostic | figure | what |", "| --- | ---: | --- |"]
        lines += [f"| `{row['key']}` | {figure(row)} | {cell(row['what'])} |" for row in self.data["context"]]
        return lines


def _record(env_config: Any, srcdir: Path) -> Record:
    return Record.load((srcdir / env_config.bench_record).resolve())


class BenchRole(SphinxRole):
    """``{bench}`key```: a figure of record."""

    def run(self) -> tuple[list[nodes.Node], list[nodes.system_message]]:
        try:
            record = _record(self.config, Path(self.env.srcdir))
            self.env.note_dependency(str(record.path))
            shown = record.quote(self.text)
        except (OSError, ValueError, KeyError) as exc:
            message = exc.args[0] if isinstance(exc, KeyError) else str(exc)
            error = self.inliner.reporter.error(f"{{bench}}`{self.text}`: {message}", line=self.lineno)
            return [self.inliner.problematic(self.rawtext, self.rawtext, error)], [error]
        title = f"{self.text.strip()}: make bench of {record.data['recorded']} (bench/record.json)"
        return [nodes.abbreviation(self.rawtext, shown, explanation=title, classes=["bench-figure"])], []


class BenchFigures(SphinxDirective):
    """``{bench-figures}``: every figure of the record in the report's two tables."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        try:
            record = _record(self.config, Path(self.env.srcdir))
        except (OSError, ValueError) as exc:
            raise self.error(f"bench-figures: {exc}") from exc
        self.env.note_dependency(str(record.path))
        container = nodes.container(classes=["bench-figures"])
        self.state.nested_parse(StringList(record.tables()), self.content_offset, container)
        return [container]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_config_value("bench_record", "../bench/record.json", "env", types=[str])
    app.add_role("bench", BenchRole())
    app.add_directive("bench-figures", BenchFigures)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
