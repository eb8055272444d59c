"""The walls of the house: who may import what, and who may exit or print."""

from __future__ import annotations

import ast
import importlib
import io
import re
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

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


def _core_imports(path: Path) -> Iterator[tuple[int, str]]:
    """The modules a core source imports, relative imports resolved (``from .x import y`` in devplug/a/b.py is
    devplug.a.x)."""
    package = list(path.relative_to(CORE.parent).with_suffix("").parts)[:-1]  # a module's, or __init__'s own
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            yield node.lineno, ".".join([*base, *([node.module] if node.module else [])])


def _sources(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*.py") if "tests" not in p.parts and "gen" not in p.parts]


def _public(module: str) -> bool:
    return module == "devplug" or any(module == m or module.startswith(m + ".") for m in PUBLIC_MODULES[1:])


def test_drivers_use_only_the_public_surface() -> None:
    """Shipped drivers, and the driver guide's worked example (examples/: what a vendor copies), whose tests too."""
    forbidden = ("grpc", "google.protobuf")
    example = list((ROOT / "examples").rglob("*.py"))
    assert example, "the worked example is gone from examples/"
    offences = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in [*_sources(ROOT / "drivers"), *example]
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
    """Collaborators arrive through constructors: no ``other.attr = self.method`` or ``= lambda`` in the engine, the
    daemon or a front end."""
    offences = []
    for path in [*_sources(CORE / "engine"), *_sources(CORE / "daemon"), *_sources(CORE / "frontends")]:
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
        if "/sys/" in text or "devplug.host.sysfs" in text
    ]
    assert offences == []


def test_only_the_cli_exits_or_prints() -> None:
    offences = []
    for path in _sources(CORE):
        if path.relative_to(CORE).as_posix() in ("cli/commands.py", "cli/run.py", "__main__.py"):
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


#: Runtime code: the core without the test kit and the dev kubelet, and the shipped drivers' packages.
def _runtime_sources() -> list[Path]:
    test_only = (CORE / "testing", CORE / "devkubelet")
    drivers = [p for p in ROOT.glob("drivers/*/devplug_*") if p.is_dir() and "." not in p.name]
    return [
        path
        for path in [*_sources(CORE), *(s for d in drivers for s in _sources(d))]
        if not any(path.is_relative_to(folder) for folder in test_only)
    ]


def _self_signals(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Calls that signal the calling process (or its group): ``os.kill``/``os.killpg`` of ``os.getpid()``,
    ``os.getpgrp()``, ``os.getpgid(0)``, ``0`` or a name the module binds to one of them; ``signal.raise_signal``,
    ``signal.pthread_kill`` and ``os.abort``. Either spelling, ``os.kill`` or ``kill`` imported from ``os``."""

    def name_of(func: ast.expr) -> str:
        return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")

    def own(node: ast.expr) -> bool:
        if isinstance(node, ast.Constant):
            return node.value == 0
        if isinstance(node, ast.Name):
            return node.id in own_names
        if isinstance(node, ast.Call):
            name = name_of(node.func)
            return name in ("getpid", "getpgrp") or (name == "getpgid" and bool(node.args) and own(node.args[0]))
        return False

    own_names: set[str] = set()
    for node in ast.walk(tree):  # me = os.getpid(), then os.kill(me, ...)
        if isinstance(node, ast.Assign) and own(node.value) and not isinstance(node.value, ast.Constant):
            own_names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = name_of(node.func)
        owner = getattr(node.func.value, "id", "") if isinstance(node.func, ast.Attribute) else ""
        if (
            (name in ("kill", "killpg") and owner in ("", "os") and node.args and own(node.args[0]))
            or name in ("raise_signal", "pthread_kill")
            or (owner == "os" and name == "abort")
        ):
            yield node.lineno, f"{owner + '.' if owner else ''}{name}"


#: Runtime code that may signal itself, and why: the mock driver's ``crash=<hook>`` line in a device file kills
#: the daemon after that hook (the mock exists for tests and demos: docs/operator/drivers.md).
SELF_SIGNALS_ALLOWED = {"drivers/mock/devplug_mock/driver.py": ["os.kill"]}


def test_runtime_code_never_signals_its_own_process() -> None:
    """Issue 39: fault injection is the tests' (they observe a handover's steps through a hook they install, see
    tests/support/handoverstop.py); the shipped daemon never stops or kills itself, whatever its environment says.
    A process signalling itself is how an exit hides from the exit/print check above."""
    offences = []
    for path in _runtime_sources():
        where = str(path.relative_to(ROOT))
        calls = list(_self_signals(ast.parse(path.read_text())))
        if [call for _, call in calls] != SELF_SIGNALS_ALLOWED.get(where, []):
            offences += [f"{where}:{line} calls {call}" for line, call in calls]
    assert offences == []


def test_the_test_kit_depends_on_no_driver() -> None:
    kit = ROOT / "testkit" / "src" / "devplug"  # the devplug-testing distribution's tree (issue 39)
    assert _sources(kit / "testing"), "the test kit is gone from testkit/src/devplug/testing"
    offences = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in [*_sources(kit / "testing"), *_sources(kit / "devkubelet"), *_sources(kit / "demo")]
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


def _importers(folder: Path, prefixes: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in _sources(folder)
        for line, module in _core_imports(path)
        if any(module == p or module.startswith(p + ".") for p in prefixes)
    ]


def test_the_core_imports_no_front_end_and_nothing_of_the_daemon() -> None:
    """The lifecycle core (devplug.engine) is free of wire protocols and of the process that assembles it: it imports
    no front end and nothing of devplug.daemon (issue 26)."""
    assert _sources(CORE / "engine"), "no core sources found"
    assert _importers(CORE / "engine", ("devplug.frontends", "devplug.daemon")) == []


def test_front_ends_do_not_import_each_other() -> None:
    """A front-end package under devplug/frontends imports no other front end, and nothing of the daemon."""
    packages = sorted(p.parent for p in (CORE / "frontends").glob("*/__init__.py"))
    assert packages, "no front-end package found under devplug/frontends"
    offences = []
    for package in packages:
        others = tuple(f"devplug.frontends.{p.name}" for p in packages if p != package)
        offences += _importers(package, (*others, "devplug.daemon"))
    assert offences == []


#: The most lines of code (docstrings, comments and blank lines not counted) a module of the core, the daemon or a
#: front end may have, and a class anywhere in them: one job per module, small classes (issue 26).
MAX_MODULE_CODE_LINES = 450
MAX_CLASS_CODE_LINES = 400


def _code_lines(source: str, tree: ast.Module) -> set[int]:
    """The lines holding code: not blank, not only a comment, not a docstring."""
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    skipped = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skipped:
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines - docstrings


def test_modules_and_classes_of_the_core_the_daemon_and_front_ends_stay_small() -> None:
    offences = []
    for folder in ("engine", "daemon", "frontends"):
        for path in _sources(CORE / folder):
            source = path.read_text()
            tree = ast.parse(source, str(path))
            lines = _code_lines(source, tree)
            if len(lines) > MAX_MODULE_CODE_LINES:
                offences.append(f"{path.relative_to(ROOT)}: {len(lines)} lines of code")
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    inside = sum(1 for line in lines if node.lineno <= line <= (node.end_lineno or node.lineno))
                    if inside > MAX_CLASS_CODE_LINES:
                        offences.append(f"{path.relative_to(ROOT)}: class {node.name}: {inside} lines of code")
    assert offences == []


def test_the_core_the_daemon_and_each_front_end_name_every_module_in_their_docstring() -> None:
    packages = [CORE / "engine", CORE / "daemon", *sorted(p.parent for p in (CORE / "frontends").glob("*/__init__.py"))]
    missing = []
    for package in packages:
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        missing += [
            f"{path.relative_to(ROOT)}"
            for path in sorted(package.glob("*.py"))
            if path.stem != "__init__" and f"``{path.stem}``" not in doc
        ]
    assert missing == []


def test_code_outside_the_engine_uses_only_its_published_interface() -> None:
    """Issue 39: one engine interface. Front ends, the daemon, the CLI, the test kit and drivers import from
    ``devplug.engine`` itself and only names of its ``__all__``, never from one of its modules; the architecture
    page lists the same names."""
    from devplug import engine

    published = set(engine.__all__)
    offences = []
    sources = [p for p in _sources(CORE) if "engine" not in p.relative_to(CORE).parts[:1]]
    for path in [*sources, *_sources(ROOT / "drivers")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                offences += [f"{where} imports {a.name}" for a in node.names if a.name.startswith("devplug.engine.")]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.startswith("devplug.engine."):
                    offences.append(f"{where} imports from {node.module}, a module of the engine")
                elif node.module == "devplug.engine":
                    offences += [
                        f"{where} imports {a.name}, unpublished" for a in node.names if a.name not in published
                    ]
    assert offences == []
    assert sorted(n for names in engine.PUBLISHED.values() for n in names) == sorted(published)
    for name in published:  # each resolves to what its module defines
        assert getattr(engine, name) is getattr(
            importlib.import_module(f"devplug.engine.{engine._MODULE_OF[name]}"), name
        )
    page = (ROOT / "docs" / "internals" / "architecture.md").read_text()
    listed = set(
        re.findall(r"`([A-Za-z_]+)`", page.split("## The engine's published interface", 1)[-1].split("\n## ")[0])
    )
    assert "## The engine's published interface" in page and listed == published, sorted(listed ^ published)


#: What the package root holds: the driver contract and the small types everything shares (issue 39: a root that
#: shows the architecture); everything else lives in a package named for what it is (host, kit, text, kube, config,
#: cli, engine, frontends, daemon, ...). The deprecated names of moved public modules stay until devplug 1.0.
ROOT_MODULES = {
    "__init__",
    "__main__",
    "allocation",
    "atomic",
    "backoff",
    "context",
    "contract",
    "errors",
    "hookspecs",
    "options",
    "types",
}


def test_the_root_holds_the_contract_and_the_deprecated_names_only() -> None:
    from devplug import DEPRECATED_MODULES

    aliases = {name.removeprefix("devplug.") for name in DEPRECATED_MODULES}
    assert {p.stem for p in CORE.glob("*.py")} == ROOT_MODULES | aliases


def _unit(module: str) -> str | None:
    """The node of the package graph a module belongs to: a package under devplug, or a root module of its own."""
    parts = module.split(".")
    if parts[0] != "devplug" or len(parts) == 1:
        return "devplug" if parts == ["devplug"] else None
    if (CORE / parts[1]).is_dir():
        return parts[1]
    return parts[1] if (CORE / f"{parts[1]}.py").is_file() else None


def _package_graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in CORE.rglob("*.py"):
        if "gen" in path.parts:
            continue
        source = _unit(".".join(path.relative_to(CORE.parent).with_suffix("").parts))
        for _, module in _core_imports(path):
            target = _unit(module)
            if source and target and target != source:
                edges.setdefault(source, set()).add(target)
    return edges


def test_no_package_imports_back_a_package_that_imports_it() -> None:
    edges = _package_graph()
    assert edges["config"] and edges["engine"], edges  # the graph was read
    cycles: list[str] = []
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:  # depth first; an edge back into the path is a cycle
        for target in sorted(edges.get(node, ())):
            if target in path:
                cycles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in done:
                visit(target, [*path, target])
        done.add(node)

    for start in sorted(edges):
        if start not in done:
            visit(start, [start])
    assert cycles == []


@pytest.mark.parametrize("old", sorted(__import__("devplug").DEPRECATED_MODULES))
def test_a_moved_public_module_still_imports_by_its_old_name_with_a_warning(old: str) -> None:
    from devplug import DEPRECATED_MODULES

    code = (
        "import importlib, sys, warnings\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        f"    old = importlib.import_module({old!r})\n"
        f"assert old is importlib.import_module({DEPRECATED_MODULES[old]!r}), old\n"
        "print([str(w.message) for w in caught if w.category is DeprecationWarning])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"{old} is now {DEPRECATED_MODULES[old]}" in proc.stdout, proc.stdout


def test_the_engine_loads_neither_sysfs_nor_the_kits_command_runner() -> None:
    """The engine takes the one device-lock type from the kit; importing it must not load what drivers use the kit
    for (sysfs, external commands) into the daemon: the kit's package imports its names on first use."""
    engine = sorted(f"devplug.engine.{p.stem}" for p in (CORE / "engine").glob("*.py") if p.stem != "__init__")
    code = (
        "import importlib, sys\n"
        f"for name in {engine!r}:\n"
        "    importlib.import_module(name)\n"
        "unwanted = ('devplug.host.sysfs', 'devplug.kit.command', 'devplug.kit.sysbus')\n"
        "print(sorted(m for m in sys.modules if m in unwanted))\n"
        "print('devplug.kit.devicelocks' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["[]", "True"], proc.stdout


def _capped_doublings(path: Path) -> Iterator[tuple[int, str]]:
    """A wait written by hand as a backoff: ``min(x * 2, cap)`` (or ``2 * x``) or ``base * factor ** n``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        doubling = (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", "") == "min"
            and any(
                isinstance(sub, ast.BinOp)
                and isinstance(sub.op, ast.Mult)
                and any(isinstance(o, ast.Constant) and o.value == 2 for o in (sub.left, sub.right))
                for arg in node.args
                for sub in ast.walk(arg)
            )
        )
        power = (
            isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and not isinstance(node.right, ast.Constant)
        )
        if doubling or power:
            yield getattr(node, "lineno", 0), ast.unparse(node)


def test_every_backoff_is_devplugs_one() -> None:
    """Issue 39: the core and the shipped drivers wait by devplug.backoff (drivers through devplug.kit), never by a
    doubling of their own. The test kit's models of the kubelet keep the kubelet's own backoffs (they cite them)."""
    shipped = [*_sources(CORE), *(p for d in (ROOT / "drivers").glob("*/devplug_*") for p in _sources(d))]
    assert len(shipped) > 100, "the shipped sources were not found"
    offences = [
        f"{path.relative_to(ROOT)}:{line} {text}"
        for path in shipped
        if path != CORE / "backoff.py"
        for line, text in _capped_doublings(path)
    ]
    assert offences == []
    assert list(_capped_doublings(CORE / "backoff.py")), "the check no longer recognises the one backoff itself"
