"""The test kit's deprecation path (issue 39): a driver whose tests use the kit without listing devplug-testing
keeps working until devplug 1.0 (devplug depends on the kit until then), its run warned with a DeprecationWarning;
a driver that lists it is not warned."""

from __future__ import annotations

import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from devplug.testing.declared import UndeclaredTestKitWarning, undeclared_test_kit

DRIVER = """\
[project]
name = "devplug-acme"
version = "0.1.0"
dependencies = ["devplug>=0.1,<0.2"]
{extras}
[project.entry-points."devplug.drivers"]
acme = "devplug_acme:AcmeDriver"
"""


def _project(folder: Path, extras: str = "") -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "pyproject.toml").write_text(DRIVER.format(extras=extras))
    return folder


@pytest.mark.parametrize(
    "extras",
    [
        '[project.optional-dependencies]\ntest = ["pytest>=8", "devplug-testing>=0.1,<0.2"]\n',
        "[project.optional-dependencies]\ntest = [\"Devplug_Testing[extra] ; python_version >= '3.10'\"]\n",
        '[dependency-groups]\ntest = ["devplug-testing"]\n',
    ],
)
def test_a_driver_declaring_the_kit_anywhere_is_not_judged(tmp_path: Path, extras: str) -> None:
    assert undeclared_test_kit(_project(tmp_path, extras)) is None


def test_a_driver_listing_only_devplug_is_named(tmp_path: Path) -> None:
    assert undeclared_test_kit(_project(tmp_path, '[project.optional-dependencies]\ntest = ["pytest>=8"]\n')) == (
        "devplug-acme"
    )
    assert issubclass(UndeclaredTestKitWarning, DeprecationWarning)


def test_what_is_no_driver_project_is_not_judged(tmp_path: Path) -> None:
    assert undeclared_test_kit(tmp_path) is None  # no pyproject.toml
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "not-a-driver"\nversion = "1"\n')
    assert undeclared_test_kit(tmp_path) is None
    (tmp_path / "pyproject.toml").write_text("[project\n")
    assert undeclared_test_kit(tmp_path) is None
    (tmp_path / "pyproject.toml").write_text(
        DRIVER.format(extras="").replace("[project]\n", "[project]\n" + 'dynamic = ["dependencies"]\n')
    )
    assert undeclared_test_kit(tmp_path) is None


TEST = """\
from devplug.testing.recorder import read_hook_calls


def test_uses_the_kit(tmp_path):
    assert read_hook_calls(tmp_path) == []
"""


@pytest.mark.parametrize("declared", [False, True])
def test_a_drivers_own_run_is_warned_until_it_declares_the_kit(
    tmp_path: Path, run_pytest: Callable[..., subprocess.CompletedProcess[str]], declared: bool
) -> None:
    extras = '"pytest>=8", "devplug-testing>=0.1,<0.2"' if declared else '"pytest>=8"'
    project = _project(tmp_path / "devplug-acme", f"[project.optional-dependencies]\ntest = [{extras}]\n")
    (project / "tests").mkdir()
    (project / "tests" / "test_acme.py").write_text(textwrap.dedent(TEST))
    result = run_pytest(project)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "1 passed" in output, output
    assert ("UndeclaredTestKitWarning" in output) is not declared, output
    if not declared:
        assert "devplug-acme does not list it among its requirements" in output, output
