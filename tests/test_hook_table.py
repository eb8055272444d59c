"""The driver guide's hook table (docs/driver/hooks.md, "The hook table") keeps step with ``devplug.hookspecs``, the one
hook list: the same hooks as :data:`~devplug.hookspecs.HOOK_NAMES`, in the contract's order, each with its exact
signature and something in each column; and every hook spec's docstring says when the hook is called and what it
returns."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from devplug import hookspecs
from devplug.hookspecs import HOOK_NAMES

HOOKS = (Path(__file__).resolve().parent.parent / "docs" / "driver" / "hooks.md").read_text()


def _signature(name: str) -> str:
    """``name(params) -> returns`` as written in :mod:`devplug.hookspecs` (annotations are strings there)."""
    sig = inspect.signature(getattr(hookspecs, name))
    params = ", ".join(f"{p.name}: {p.annotation}" for p in sig.parameters.values())
    return f"{name}({params}) -> {sig.return_annotation}"


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
    assert [row[0] for row in rows] == [f"`{_signature(name)}`" for name in HOOK_NAMES]


def test_every_row_says_when_the_hook_is_called_and_what_it_returns() -> None:
    for row in _hook_table():
        assert len(row) == 3, row
        assert all(row), row


def test_the_hook_list_is_every_hookspec_in_the_order_of_the_module() -> None:
    specs = [n for n, f in vars(hookspecs).items() if hasattr(f, f"{hookspecs.PROJECT_NAME}_spec")]
    assert list(HOOK_NAMES) == specs
    assert HOOK_NAMES[0] == "start" and HOOK_NAMES[-1] == "deallocate"


def test_every_hookspec_says_when_it_is_called_and_what_it_returns() -> None:
    for name in HOOK_NAMES:
        spec = getattr(hookspecs, name)
        doc = (inspect.getdoc(spec) or "").split("Example::")[0]  # the prose, not the example's code
        assert re.search(r"\bCalled\b", doc), f"hookspecs.{name}: the docstring does not say when it is called"
        if inspect.signature(spec).return_annotation == "None":
            assert "Returns nothing" in doc, f"hookspecs.{name}: the docstring does not say it returns nothing"
        else:
            said = [m for m in re.finditer(r"\b[Rr]eturns?\b", doc) if not doc.startswith("Returns nothing", m.start())]
            assert said, f"hookspecs.{name}: the docstring does not say what it returns"
