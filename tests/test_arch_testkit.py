"""A runtime without the test kit (issue 39): no production file imports ``devplug.testing``, ``devplug.devkubelet``
or ``devplug.demo`` (:data:`devplug.TEST_KIT_MODULES`, the ``devplug-testing`` distribution under testkit/).

Production is every Python file of the core's package (core/devplug/**: the engine, the front ends, the daemon, the
CLI commands an operator runs, the kit) and of every shipped driver's package (drivers/*/devplug_*/**), whatever the
import's spelling: ``import``, ``from ... import``, a relative import, an import under ``if TYPE_CHECKING:`` or
inside a function, ``from devplug import testing``, or ``importlib.import_module`` with a literal name. The test
kit's source tree is apart, so the core's wheel cannot carry it: that is checked on a wheel built from this tree.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from devplug import TEST_KIT_MODULES

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "core" / "devplug"
TEST_KIT_TREE = ROOT / "testkit" / "src" / "devplug"


def production_files(root: Path = ROOT) -> list[Path]:
    """Every Python file of the core's package and of every shipped driver's package (``drivers/*/devplug_*``)."""
    core = root / "core" / "devplug"
    packages = [core, *(p for p in sorted(root.glob("drivers/*/devplug_*")) if p.is_dir())]
    return sorted(path for package in packages for path in package.rglob("*.py") if "__pycache__" not in path.parts)


def _module_of(path: Path, root: Path) -> list[str]:
    """The package parts of the module at ``path`` (``core/devplug/kit/a.py`` -> devplug, kit), for relative
    imports: the folder holding the top-level package is ``core`` or ``drivers/<name>``."""
    parts = path.relative_to(root).with_suffix("").parts
    top = 1 if parts[0] == "core" else 2
    return list(parts[top:-1])


def imported_modules(path: Path, root: Path = ROOT) -> Iterator[tuple[int, str]]:
    """Each module a source imports, with its line: relative imports resolved, ``from x import y`` as both x and
    x.y (y may be a module), ``importlib.import_module``/``__import__`` of a literal name."""
    package = _module_of(path, root)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                yield node.lineno, node.args[0].value


def is_test_kit(module: str) -> bool:
    return any(module == kit or module.startswith(kit + ".") for kit in TEST_KIT_MODULES)


def kit_imports(files: list[Path], root: Path = ROOT) -> list[str]:
    """``path:line imports module`` for every import of the test kit in ``files`` (one per import statement)."""
    offences: dict[tuple[Path, int], str] = {}
    for path in files:
        for line, module in imported_modules(path, root):
            if is_test_kit(module):
                offences.setdefault((path, line), module)
    return [f"{path.relative_to(root)}:{line} imports {module}" for (path, line), module in offences.items()]


def test_no_production_file_imports_the_test_kit() -> None:
    assert kit_imports(production_files()) == []


def test_production_is_every_file_of_the_core_and_of_each_drivers_package() -> None:
    files = {path.relative_to(ROOT).as_posix() for path in production_files()}
    for expected in (
        "core/devplug/__init__.py",
        "core/devplug/cli/commands.py",
        "core/devplug/engine/__init__.py",
        "core/devplug/daemon/process.py",
        "core/devplug/kit/hookrecord.py",
    ):
        assert expected in files, expected
    drivers = sorted(p.parent.name for p in ROOT.glob("drivers/*/pyproject.toml"))
    assert drivers, "no drivers under drivers/"
    for driver in drivers:
        assert any(f.startswith(f"drivers/{driver}/devplug_") for f in files), driver
    assert not any(f.startswith("testkit/") or "/tests/" in f for f in files)
    assert len(files) > 200, len(files)


def test_the_test_kit_is_a_source_tree_of_its_own() -> None:
    for module in TEST_KIT_MODULES:
        relative = Path(*module.split(".")[1:])
        assert not (CORE / relative).exists(), f"core/devplug/{relative} is back in the core's tree"
        assert (TEST_KIT_TREE / relative / "__init__.py").is_file(), f"testkit/src/devplug/{relative} is gone"
    # The kit's devplug/ is a portion of the core's package, never a package of its own that would shadow it.
    assert not (TEST_KIT_TREE / "__init__.py").exists()


@pytest.mark.parametrize(
    ("where", "source"),
    [
        ("core/devplug/engine/a.py", "import devplug.testing.conformance\n"),
        ("core/devplug/engine/a.py", "from devplug.devkubelet import DevKubeletThread\n"),
        ("core/devplug/engine/a.py", "from devplug import demo\n"),
        ("core/devplug/kit/a.py", "from ..testing.recorder import HookRecorder\n"),
        ("core/devplug/cli/a.py", "def f():\n    from devplug.demo.dra import run_dra_demo\n"),
        (
            "drivers/x/devplug_x/a.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from devplug.testing.pcisysfs import M\n",
        ),
        ("drivers/x/devplug_x/a.py", "import importlib\nimportlib.import_module('devplug.testing.dflsysfs')\n"),
    ],
)
def test_the_check_finds_every_spelling_of_an_import(tmp_path: Path, where: str, source: str) -> None:
    path = tmp_path / where
    path.parent.mkdir(parents=True)
    path.write_text(source)
    assert path in production_files(tmp_path)
    assert len(kit_imports([path], tmp_path)) == 1, kit_imports([path], tmp_path)


def test_the_check_passes_what_is_not_the_kit(tmp_path: Path) -> None:
    path = tmp_path / "core" / "devplug" / "kit" / "a.py"
    path.parent.mkdir(parents=True)
    path.write_text("from devplug.kit.hookrecord import HookRecorder\nimport devplug.testingx\nfrom . import demos\n")
    assert kit_imports([path], tmp_path) == []


def test_the_core_wheel_carries_no_test_kit(tmp_path: Path) -> None:
    """Built from this tree as ``make dist`` builds it (setuptools, the core's pyproject.toml and MANIFEST.in)."""
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = tmp_path.glob("devplug-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
        entry_points = next((n for n in names if n.endswith(".dist-info/entry_points.txt")), None)
        points = archive.read(entry_points).decode() if entry_points else ""
    assert "devplug/engine/__init__.py" in names and "devplug/cli/commands.py" in names
    kit = [n for n in names if is_test_kit(n.removesuffix(".py").replace("/", "."))]
    assert kit == [], kit[:10]
    assert "pytest11" not in points, points  # the kit's pytest plugin is declared by devplug-testing
    assert metadata
