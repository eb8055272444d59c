"""The walls of the house: who may import what, and who may exit or print."""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

from devplug import PUBLIC_MODULES

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


def _public(module: str) -> bool:
    return module == "devplug" or any(module == m or module.startswith(m + ".") for m in PUBLIC_MODULES[1:])


def test_drivers_use_only_the_public_surface() -> None:
    forbidden = ("grpc", "google.protobuf")
    offences = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _sources(ROOT / "drivers")
        for line, module in _imports(path)
        if module.startswith(forbidden)
        or ((module == "devplug" or module.startswith("devplug.")) and not _public(module))
    ]
    assert offences == []


def test_the_public_surface_is_one_list() -> None:
    import devplug

    guide = (ROOT / "docs" / "driver" / "kit.md").read_text()
    doc = devplug.__doc__ or ""
    for module in PUBLIC_MODULES:
        assert f"`{module}`" in guide, f"docs/driver/kit.md does not name {module}"
        assert module == "devplug" or f":mod:`{module}`" in doc, f"devplug's docstring does not name {module}"
        importlib.import_module(module)


def _assignments(path: Path) -> Iterator[tuple[int, ast.Attribute, ast.expr]]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute):
                    yield node.lineno, target, node.value


def test_the_engine_assigns_no_callbacks_after_construction() -> None:
    """Collaborators arrive through constructors: no ``other.attr = self.method`` or ``= lambda`` in the engine."""
    offences = []
    for path in _sources(CORE / "engine"):
        for line, target, value in _assignments(path):
            owner = target.value.id if isinstance(target.value, ast.Name) else ""
            bound = isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "self"
            if owner != "self" and (isinstance(value, ast.Lambda) or bound):
                offences.append(f"{path.relative_to(ROOT)}:{line} assigns {owner}.{target.attr}")
    assert offences == []


def test_only_driver_discovery_loads_or_constructs_drivers() -> None:
    offences = [
        f"{path.relative_to(ROOT)}:{i}"
        for path in _sources(CORE)
        if path.relative_to(CORE).as_posix() != "drivers/discovery.py"
        for i, text in enumerate(path.read_text().splitlines(), 1)
        if "entry_points(" in text or re.search(r"(?<!\w)driver_class\(", text) or "importlib.metadata" in text
    ]
    assert offences == []


def test_only_the_driver_facade_calls_pluggy() -> None:
    """One layer between devplug and pluggy: the markers are made in ``devplug`` and ``devplug.hookspecs``, and hooks
    are called only by ``devplug.drivers.facade`` (the engine's ``AsyncDriver`` awaits its calls)."""
    markers = {"__init__.py", "hookspecs.py"}
    offences = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _sources(CORE)
        for line, module in _imports(path)
        if module.split(".")[0] == "pluggy" and path.relative_to(CORE).as_posix() not in {*markers, "drivers/facade.py"}
    ]
    offences += [
        f"{path.relative_to(ROOT)}:{i} calls a hook through the plugin manager"
        for path in _sources(CORE)
        if path.relative_to(CORE).as_posix() != "drivers/facade.py"
        for i, text in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bpm\.hook\b|\.get_hookimpls\(", text)
    ]
    assert offences == []


def test_only_front_ends_devkubelet_and_api_import_generated_code() -> None:
    """The core (engine) knows no wire protocol: generated code and grpc belong to the front ends."""
    allowed = {"frontends", "devkubelet", "api"}
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
        if path.name in ("cli.py", "cli_run.py", "__main__.py"):
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


def test_the_demo_does_not_import_the_test_kit() -> None:
    # What the demo and the kit share (a daemon process, TOML writing, the hook-call record) lives outside it.
    offences = [
        f"core/devplug/demo.py:{line} imports {module}"
        for line, module in _imports(CORE / "demo.py")
        if module == "devplug.testing" or module.startswith("devplug.testing.")
    ]
    assert offences == []


def test_the_test_kit_depends_on_no_driver() -> None:
    offences = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _sources(CORE / "testing")
        for line, module in _imports(path)
        if module.startswith(("devplug_", "devplug-"))
    ]
    assert offences == []


def test_drivers_run_external_commands_only_through_the_kits_runner() -> None:
    """Issue 24: every command a shipped driver runs goes through ``devplug.kit.run_command`` (its own session,
    the whole group killed at the timeout, output capped), never subprocess, a shell or the exec family."""
    spawning = ("system", "popen", "spawnl", "spawnv", "execv", "execl", "posix_spawn", "fork")
    offences = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _sources(ROOT / "drivers")
        for line, module in _imports(path)
        if module in ("subprocess", "pty", "asyncio.subprocess")
    ]
    for path in _sources(ROOT / "drivers"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = getattr(node.func.value, "id", "")
                if owner == "os" and node.func.attr.startswith(spawning):
                    offences.append(f"{path.relative_to(ROOT)}:{node.lineno} calls os.{node.func.attr}")
                if node.func.attr in {"create_subprocess_exec", "create_subprocess_shell"}:
                    offences.append(f"{path.relative_to(ROOT)}:{node.lineno} calls {node.func.attr}")
    assert offences == []
