"""tools/code_lines.py, the counter behind the driver guide's "How big a driver is" table: what it counts, that it
runs as a script over the shipped drivers, and that the guide's rows for the example drivers are what it says."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "code_lines.py"

SAMPLE = '''"""A module docstring
over two lines."""

import os  # a comment after code


class Thing:
    """A class docstring."""

    size = 3
    """An attribute docstring."""

    def f(self, a: int,
          b: int) -> str:
        # a comment alone
        text = """a multi-line
string that is code"""
        return text + "#not a comment"
'''


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("devplug_code_lines", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docstrings_comments_and_blank_lines_are_left_out() -> None:
    # import, class, size =, def (2 lines), text = (2 lines), return
    assert _tool().count_source(SAMPLE) == 8


def test_it_runs_as_a_script_over_every_shipped_driver() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60, check=True)
    drivers = sorted(p.parent.name for p in ROOT.glob("drivers/*/devplug_*/__init__.py"))
    assert drivers
    for package in drivers:
        assert re.search(rf"^\| `drivers/\w+/{package}/` \| \d+ \| \d+ \|$", done.stdout, re.M), package
    assert "| `examples/idxd/idxd_example.py` | 1 |" in done.stdout
    missing = subprocess.run([sys.executable, str(SCRIPT), "no/such/folder"], capture_output=True, text=True)
    assert missing.returncode == 2 and "no such file or folder" in missing.stderr


def test_the_guides_example_rows_are_counted_as_the_tool_counts() -> None:
    guide = (ROOT / "docs" / "driver" / "writing.md").read_text()
    tool = _tool()
    for example in sorted(ROOT.glob("examples/*/*.py")):
        lines, files = tool.count(example)
        row = f"| `{example.relative_to(ROOT)}` | {files} | {lines} |"
        assert row in guide, f"docs/driver/writing.md: expected the row {row}"
    # the goal: a driver of the idxd kind in about 100 code lines on the kit
    assert tool.count(ROOT / "examples" / "idxd" / "idxd_example.py")[0] <= 105
