"""The driver guide stays in step with the kit: every example of "Testing a driver" (docs/driver/testing.md) runs as
written."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

from devplug.testing.conformance import DriverConformance

TESTING = Path(__file__).resolve().parent.parent / "docs" / "driver" / "testing.md"


def _section() -> str:
    text = TESTING.read_text()
    return text[text.index("# Testing a driver") :]


def _examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", _section(), re.S)


def test_every_example_of_the_testing_guide_runs(
    tmp_path: Path, run_pytest: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    examples = _examples()
    assert len(examples) >= 5
    assert any("DriverConformance" in e for e in examples)
    for i, source in enumerate(examples):
        (tmp_path / f"test_example_{i}.py").write_text(source)
    done = run_pytest(tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    # The conformance example's checks ran too (none skipped: the mock can make a release slow).
    assert re.search(r"\b1[0-9] passed\b", done.stdout), done.stdout[-2000:]
    assert "skipped" not in done.stdout


def test_the_conformance_knobs_the_guide_names_exist() -> None:
    section = _section()
    for name in re.findall(r"`(\w+)`", section[section.index("**Conformance.**") : section.index("**Recording")]):
        if name.islower() and "_" in name and name not in ("post_stop", "check_config", "retry"):
            assert hasattr(DriverConformance, name), name


def test_the_guides_device_name_examples_follow_the_rule() -> None:
    """docs/driver/writing.md, "Device IDs and their DRA device names": each example row is what DRA publishes."""
    from devplug.frontends.dra.devicenames import device_name

    guide = (TESTING.parent / "writing.md").read_text()
    section = guide[guide.index("## Device IDs and their DRA device names") :]
    section = section[: section.index("\n## ", 1)]
    rows = re.findall(r"^\| `([^`]+)`(?: \([^)]*\))? \| `([^`]+)` \|$", section, re.M)
    assert len(rows) >= 6
    for device_id, name in rows:
        assert device_name(device_id) == name, device_id
