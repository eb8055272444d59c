"""Issue 39: front ends and resources are whole when built, the engine reads no host itself, and the daemon assembles
only the front ends its resources use.

"Filled in later" is what the style guide forbids: an attribute ``x: T | None = None`` in ``__init__`` that another
method assigns once the parts exist (``started()``), guarded by ``assert self.x is not None`` wherever it is used.
What comes and goes is not that: a running handle (a task, an event, a gRPC server) made when something starts and
reset to None when it stops, or a fact not known yet (``last_error: str | None``). So an attribute is flagged when

* ``__init__`` annotates it ``T | None`` (or ``Optional[T]``) and assigns None,
* some other method of the class assigns it something else, and none assigns None again,
* and ``T`` names a part (a class), not a fact (``str``, ``int``, ``float``, ``bool``, ``Path``, a tuple, a
  container, a frozen dataclass, enum or alias of a fact of the module) nor a running handle (asyncio's tasks,
  futures, events and timer handles; gRPC servers and channels).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from devplug.config import load_config
from tests.support.daemonprobe import after_building_daemon, one_mock_config

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "core" / "devplug"

#: The front ends, the resource and the device-plugin reconciler: built whole.
BUILT_WHOLE = sorted(
    {
        *(CORE / "frontends").rglob("*.py"),
        CORE / "engine" / "resource.py",
        CORE / "frontends" / "deviceplugin" / "reconciler.py",
    }
)
#: Facts: values a class may not know yet.
FACTS = {"str", "int", "float", "bool", "bytes", "Path", "tuple", "dict", "list", "set", "frozenset", "Mapping"}
#: Running handles: made when something starts, reset when it stops.
HANDLES = {"Task", "Future", "Event", "TimerHandle", "Handle", "Server", "Channel"}


def _alternatives(annotation: ast.expr) -> list[str] | None:
    """The names of an annotation's alternatives other than None; None when None is not one of them."""
    names: list[str] = []
    optional = False

    def walk(node: ast.expr) -> None:
        nonlocal optional
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            walk(node.left)
            walk(node.right)
        elif isinstance(node, ast.Constant) and node.value is None:
            optional = True
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value).split(".")[-1] == "Optional":
            optional = True
            walk(node.slice)
        elif isinstance(node, ast.Subscript):
            names.append(ast.unparse(node.value).split(".")[-1])
        else:
            names.append(ast.unparse(node).split(".")[-1])

    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    walk(annotation)
    return names if optional else None


def _values(tree: ast.Module) -> set[str]:
    """The module's own value types: frozen dataclasses, named tuples, enums, and aliases of facts."""
    out = set()
    for statement in tree.body:  # ``_Stamp = tuple[int, int, int]``
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
            base = value.value if isinstance(value, ast.Subscript) else value
            if isinstance(target, ast.Name) and ast.unparse(base).split(".")[-1] in FACTS:
                out.add(target.id)
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        frozen = any(
            isinstance(d, ast.Call) and any(k.arg == "frozen" for k in d.keywords) for d in node.decorator_list
        )
        bases = {ast.unparse(b).split(".")[-1] for b in node.bases}
        if frozen or bases & {"NamedTuple", "Enum", "StrEnum", "IntEnum"}:
            out.add(node.name)
    return out


def _self_assignments(node: ast.AST) -> list[tuple[str, ast.expr | None]]:
    """``self.<name> = <value>`` in ``node`` (its value, None when a tuple's part cannot be told)."""
    if isinstance(node, ast.AnnAssign):
        pairs: list[tuple[ast.expr, ast.expr | None]] = [(node.target, node.value)]
    elif isinstance(node, ast.Assign):
        pairs = []
        for target in node.targets:
            if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                pairs += list(zip(target.elts, node.value.elts, strict=False))
            elif isinstance(target, ast.Tuple):
                pairs += [(element, None) for element in target.elts]
            else:
                pairs.append((target, node.value))
    else:
        return []
    return [
        (target.attr, value)
        for target, value in pairs
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
    ]


def _is_none(value: ast.expr | None) -> bool:
    return isinstance(value, ast.Constant) and value.value is None


def filled_later(source: str, where: str) -> list[str]:
    """What ``source`` fills in after construction, and its ``assert ... is not None`` guards."""
    tree = ast.parse(source)
    values = _values(tree)
    found = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        methods = [f for f in cls.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]
        init = next((f for f in methods if f.name == "__init__"), None)
        if init is None:
            continue
        optional: dict[str, int] = {}
        for node in ast.walk(init):
            if isinstance(node, ast.AnnAssign) and _is_none(node.value):
                names = _alternatives(node.annotation)
                if names and not all(n in FACTS | HANDLES | values for n in names):
                    optional.update((attr, node.lineno) for attr, _ in _self_assignments(node))
        filled: set[str] = set()
        reset: set[str] = set()
        for method in (f for f in methods if f is not init):
            for node in ast.walk(method):
                for attr, value in _self_assignments(node):
                    if attr in optional:
                        (reset if _is_none(value) else filled).add(attr)
        found += [f"{where}:{optional[a]}: {cls.name}.{a} is filled in after construction" for a in filled - reset]
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert) and any(
            isinstance(c, ast.Compare)
            and any(isinstance(op, ast.IsNot) for op in c.ops)
            and _is_none(c.comparators[-1])
            for c in ast.walk(node.test)
        ):
            found.append(f"{where}:{node.lineno}: assert {ast.unparse(node.test)}")
    return sorted(found)


def test_the_check_sees_a_part_filled_in_later_and_its_guard() -> None:
    half_built = (
        "class FrontEnd:\n"
        "    def __init__(self) -> None:\n"
        "        self.server: PluginServer | None = None\n"
        "        self.last_error: str | None = None\n"
        "        self._task: asyncio.Task[None] | None = None\n"
        "        self.judge: Optional[Judge] = None\n"
        "    async def started(self) -> None:\n"
        "        self.server = PluginServer()\n"
        "        self.last_error = 'x'\n"
        "        self._task = asyncio.ensure_future(self.run())\n"
        "        self.judge = Judge()\n"
        "    async def stop(self) -> None:\n"
        "        assert self.server is not None\n"
        "        self.judge = None\n"
    )
    assert filled_later(half_built, "x.py") == [
        "x.py:13: assert self.server is not None",
        "x.py:3: FrontEnd.server is filled in after construction",
    ]


def test_front_ends_resources_and_the_reconciler_are_whole_when_built() -> None:
    offences = [line for path in BUILT_WHOLE for line in filled_later(path.read_text(), str(path.relative_to(ROOT)))]
    assert offences == []


#: Host access the engine must be given, never do itself.
HOST_MODULES = ("devplug.host", "ctypes", "inotify_simple")
#: The engine's modules whose host I/O the daemon now gives them: they touch no file at all.
SEAMED = {"cdi.py", "liveness.py"}
#: What the engine's container liveness used to do itself (watch files, ask the kernel of file systems).
HOST_CALLS = {"add_watch", "rm_watch", "inotify_init", "inotify_init1", "fstatfs", "statfs", "add_reader"}


def test_the_engine_imports_no_host_module_and_watches_nothing_itself() -> None:
    offences = []
    for path in sorted((CORE / "engine").glob("*.py")):
        where = path.relative_to(ROOT)
        for node in ast.walk(ast.parse(path.read_text())):
            line = getattr(node, "lineno", 0)
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module]
            else:
                modules = []
            offences += [
                f"{where}:{line} imports {m}"
                for m in modules
                if any(m == h or m.startswith(h + ".") for h in HOST_MODULES)
            ]
            if isinstance(node, ast.Attribute) and node.attr in HOST_CALLS:
                offences.append(f"{where}:{line} calls {node.attr}")
            if path.name in SEAMED:
                offences += [f"{where}:{line} imports {m}" for m in modules if m in ("os", "devplug.atomic")]
    assert offences == []


def test_a_device_plugin_daemon_never_imports_lightkube(tmp_path: Path) -> None:
    printed = after_building_daemon(
        one_mock_config(tmp_path, "device-plugin"),
        "sorted(m for m in sys.modules if m.split('.')[0] == 'lightkube'), daemon.reconciler is not None",
    )
    assert printed == "[] True"


def test_a_dra_daemon_makes_no_device_plugin_front_end(tmp_path: Path) -> None:
    """Nothing of the device-plugin API: its modules unloaded, no reconciler, no plugin folder."""
    printed = after_building_daemon(
        one_mock_config(tmp_path, "dra"),
        "sorted(m for m in sys.modules if m.startswith('devplug.frontends.deviceplugin')), sorted(daemon.apis)",
    )
    assert printed == "[] ['dra']"


def test_a_running_dra_daemon_leaves_the_device_plugin_folder_alone(tmp_path: Path) -> None:
    """A DRA-only daemon, run until it has started its resource (whose DRA start fails here: no API server), never
    makes nor watches the kubelet's device-plugin folder, never registers there, and runs no release reconciler."""
    path = one_mock_config(tmp_path, "dra")
    plugins = tmp_path / "device-plugins"
    probe = (
        "import asyncio, sys\n"
        "from devplug.config import load_config\n"
        "from devplug.daemon.process import Daemon\n"
        "from devplug.errors import DevplugError\n"
        f"daemon = Daemon(load_config({str(path)!r}))\n"
        "async def main():\n"
        "    running = asyncio.ensure_future(daemon.run())\n"
        "    for _ in range(200):\n"
        "        await asyncio.sleep(0.05)\n"
        "        if daemon.resources[0].last_error:\n"
        "            break\n"
        "    daemon.request_stop()\n"
        "    await running\n"
        "asyncio.run(main())\n"
        "try:\n"
        "    daemon.reconciler\n"
        "except DevplugError as exc:\n"
        "    print('no reconciler:', exc)\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('devplug.frontends.deviceplugin'))\n"
        "print(loaded, daemon.resources[0].last_error is not None)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.splitlines() == [
        "no reconciler: no resource is served through the device-plugin API: no release reconciler runs",
        "[] True",
    ], out.stderr
    assert not plugins.exists()


def test_a_running_device_plugin_daemon_makes_its_folder(tmp_path: Path) -> None:
    """The other side of the test above: served through the device-plugin API, the folder is made and watched."""
    path = one_mock_config(tmp_path, "device-plugin")
    probe = (
        "import asyncio\n"
        "from devplug.config import load_config\n"
        "from devplug.daemon.process import Daemon\n"
        f"daemon = Daemon(load_config({str(path)!r}))\n"
        "async def main():\n"
        "    running = asyncio.ensure_future(daemon.run())\n"
        "    await asyncio.sleep(0.5)\n"
        "    daemon.request_stop()\n"
        "    await running\n"
        "asyncio.run(main())\n"
        "print(daemon.reconciler.polls >= 0, sorted(daemon.apis))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "True ['device-plugin']", out.stderr
    assert (tmp_path / "device-plugins").is_dir()


def test_a_dra_daemon_assembles_the_device_plugin_api_when_a_resource_needs_it(tmp_path: Path) -> None:
    """A reload adding the first device-plugin resource to a DRA-only daemon (``Daemon.start_resource``) makes the
    device-plugin front ends' assembly then: its folder is made and its reconciler runs."""
    path = one_mock_config(tmp_path, "dra")
    (tmp_path / "other").mkdir()
    other = one_mock_config(tmp_path / "other", "device-plugin")
    probe = (
        "import asyncio\n"
        "from devplug.config import load_config\n"
        "from devplug.daemon.process import Daemon\n"
        f"daemon = Daemon(load_config({str(path)!r}))\n"
        f"[added] = load_config({str(other)!r}).resources\n"
        "async def main():\n"
        "    running = asyncio.ensure_future(daemon.run())\n"
        "    await asyncio.sleep(0.3)\n"
        "    before = sorted(daemon.apis), daemon.config.kubelet.device_plugin_dir.exists()\n"
        "    daemon.start_resource(added)\n"
        "    await asyncio.sleep(0.3)\n"
        "    print(before, sorted(daemon.apis), daemon.reconciler.polls >= 0)\n"
        "    daemon.request_stop()\n"
        "    await running\n"
        "asyncio.run(main())\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "(['dra'], False) ['device-plugin', 'dra'] True", out.stderr
    assert (tmp_path / "device-plugins").is_dir()  # the daemon's config's (a reload applies the new one first)


def test_the_config_of_the_probes_is_what_they_say(tmp_path: Path) -> None:
    assert [rc.api for rc in load_config(one_mock_config(tmp_path, "dra")).resources] == ["dra"]
