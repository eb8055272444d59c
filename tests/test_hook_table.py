"""The driver guide's hook table (docs/driver/hooks.md, "The hook table") keeps step with ``devplug.hookspecs``: the
same hooks, in the contract's order, each with its exact signature and something in each column."""

from __future__ import annotations

import re
from pathlib import Path

from devplug.drivers import HOOK_NAMES
from devplug.sdk.hookstubs import hook_signature

HOOKS = (Path(__file__).resolve().parent.parent / "docs" / "driver" / "hooks.md").read_text()


def _section(title: str) -> str:
    start = HOOKS.index(f"\n{title}\n") + len(title) + 2
    following = re.search(r"\n##+ ", HOOKS[start:])  # the next heading (code comments have one #)
    return HOOKS[start : start + following.start()] if following else HOOKS[start:]


def _hook_table() -> list[list[str]]:
    """The rows of the table whose header starts with ``| hook |``, cells split on unescaped pipes."""
    lines = _section("## The hook table").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| hook |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        rows.append(cells)
    return rows


def test_the_hook_table_lists_every_hook_in_order_with_its_signature() -> None:
    rows = _hook_table()
    assert [row[0] for row in rows] == [f"`{hook_signature(name)}`" for name in HOOK_NAMES]


def test_every_row_says_when_the_hook_is_called_and_what_it_returns() -> None:
    for row in _hook_table():
        assert len(row) == 3, row
        assert all(row), row
