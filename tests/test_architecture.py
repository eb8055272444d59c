"""The walls of the house: who may import what, and who may exit or print."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "core" / "devplug"


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module


def _sources(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*.py") if "tests" not in p.parts and "gen" not in p.parts]


def test_drivers_use_only_the_public_surface() -> None:
    forbidden = ("grpc", "google.protobuf", "devplug.api", "devplug.engine", "devplug.devkubelet", "devplug.cli")
    offences = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _sources(ROOT / "drivers")
        for line, module in _imports(path)
        if module.startswith(forbidden)
    ]
    assert offences == []


#: What a driver may import from devplug (README, "Writing a driver").
PUBLIC_SURFACE = (
    "devplug",
    "devplug.hookspecs",
    "devplug.types",
    "devplug.options",
    "devplug.atomic",
    "devplug.allocation",
    "devplug.watch",
    "devplug.sysfs",
    "devplug.pci",
    "devplug.testing",
)


def test_drivers_import_from_devplug_only_its_public_surface() -> None:
    offences = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _sources(ROOT / "drivers")
        for line, module in _imports(path)
        if (module == "devplug" or module.startswith("devplug."))
        and not any(module == m or (m == "devplug.testing" and module.startswith(m + ".")) for m in PUBLIC_SURFACE)
    ]
    assert offences == []


def test_only_engine_devkubelet_and_api_import_generated_code() -> None:
    allowed = {"engine", "devkubelet", "api"}
    offences = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in _sources(CORE)
        for line, module in _imports(path)
        if module.startswith(("devplug.api.gen", "grpc")) and path.relative_to(CORE).parts[0] not in allowed
    ]
    assert offences == []


def test_the_engine_never_touches_sysfs() -> None:
    offences = [
        f"{path.relative_to(ROOT)}:{i}"
        for path in _sources(CORE / "engine")
        for i, text in enumerate(path.read_text().splitlines(), 1)
        if "/sys/" in text or "devplug.sysfs" in text
    ]
    assert offences == []


def test_only_the_cli_exits_or_prints() -> None:
    offences = []
    for path in _sources(CORE):
        if path.name in ("cli.py", "__main__.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                owner = getattr(func.value, "id", "") if isinstance(func, ast.Attribute) else ""
                if name == "print" or (owner == "sys" and name == "exit") or (owner == "os" and name == "_exit"):
                    offences.append(
                        f"{path.relative_to(ROOT)}:{node.lineno} calls {owner + '.' if owner else ''}{name}"
                    )
    assert offences == []
