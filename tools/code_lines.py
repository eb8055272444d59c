"""Code lines of Python packages, as the driver guide counts them: no docstrings, no comments, no blank lines.

A line counts when it holds at least one token of code (Python's own
tokenizer decides, so a ``#`` inside a string is code and a line that only
continues a bracket is counted once, where its tokens are). Docstrings are
string literals standing alone as a statement (a module's, class's or
function's, and the attribute docstrings that follow an assignment): all their
lines are left out. Every line of any other multi-line string counts.

Run as a script it prints a Markdown table: ``python tools/code_lines.py`` for
each shipped driver's package (``drivers/*/devplug_*/``) and each example driver
(``examples/*/*.py``), or for the folders and files it is given.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_NOT_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}


def _docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def count_source(source: str) -> int:
    """The code lines of one module's source."""
    docstrings = _docstring_lines(ast.parse(source))
    code: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _NOT_CODE:
            code.update(range(token.start[0], token.end[0] + 1))
    return len(code - docstrings)


def python_files(target: Path) -> list[Path]:
    """``target`` itself when it is a file, else every ``.py`` under it (caches left out), sorted."""
    if target.is_file():
        return [target]
    return sorted(p for p in target.rglob("*.py") if "__pycache__" not in p.parts)


def count(target: Path) -> tuple[int, int]:
    """(code lines, files) of a file or a package folder."""
    files = python_files(target)
    return sum(count_source(p.read_text(encoding="utf-8")) for p in files), len(files)


def default_targets(root: Path = ROOT) -> list[Path]:
    """Each shipped driver's package, then each example driver's module."""
    drivers = sorted(p.parent for p in (root / "drivers").glob("*/devplug_*/__init__.py"))
    examples = sorted(p for p in (root / "examples").glob("*/*.py"))
    return [*drivers, *examples]


def table(targets: Iterable[Path], root: Path = ROOT) -> str:
    """The Markdown table of ``targets``: path, files, code lines."""
    rows = ["| package | files | code lines |", "| --- | ---: | ---: |"]
    for target in targets:
        lines, files = count(target)
        shown = target.relative_to(root) if target.is_relative_to(root) else target
        rows.append(f"| `{shown}{'/' if target.is_dir() else ''}` | {files} | {lines} |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    targets = [Path(a).resolve() for a in args] or default_targets()
    missing = [str(t) for t in targets if not t.exists()]
    if missing:
        print(f"code_lines: no such file or folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    print(table(targets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
