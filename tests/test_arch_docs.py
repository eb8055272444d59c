"""The architecture page's diagram draws the packages the tree has, no more and no fewer (issue 39).

``docs/diagrams/architecture.dot`` gives each package a box whose Graphviz ID is the package's folder: a node
``"engine/"`` or a cluster ``"cluster frontends/dra/"``. Those IDs are compared with the packages (folders with an
``__init__.py``) of every folder the ``devplug`` package is made of (``devplug.__path__``: the core's
``core/devplug/`` and the test kit's, wherever its distribution keeps it), both ways: a package added without its
box fails, and so does a box whose package is gone. The generated protobuf code (``api/gen/`` and its packages, one
per proto package) is drawn as part of ``api/``.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import devplug

ROOT = Path(__file__).resolve().parent.parent
DIAGRAM = ROOT / "docs" / "diagrams" / "architecture.dot"
#: Packages drawn as part of another box (generated code).
DRAWN_WITHIN = ("api/gen/",)

_FOLDER = r"(?:[a-z_][a-z0-9_]*/)+"
_CLUSTER = re.compile(rf'subgraph\s+"cluster ({_FOLDER})"')
_QUOTED_FOLDER = re.compile(rf'"({_FOLDER})"')


def diagram_packages(source: str) -> set[str]:
    """The folders of the package boxes of a Graphviz source (comments left out): clusters named
    ``"cluster <folder>"``, and nodes whose ID is a folder (declared, or made by an edge; an attribute's value such
    as ``label="kit/"`` is no node)."""
    text = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("//"))
    nodes = {m.group(1) for m in _QUOTED_FOLDER.finditer(text) if not text[: m.start()].rstrip().endswith("=")}
    return nodes | set(_CLUSTER.findall(text))


def tree_packages(folders: list[Path]) -> set[str]:
    """The packages under each of ``folders`` (the ``devplug`` package's folders), as ``a/b/``."""
    found = set()
    for folder in folders:
        for marker in folder.rglob("__init__.py"):
            if marker.parent == folder:
                continue
            name = marker.parent.relative_to(folder).as_posix() + "/"
            if not name.startswith(DRAWN_WITHIN):
                found.add(name)
    return found


def _devplug_folders() -> list[Path]:
    folders = [Path(p).resolve() for p in devplug.__path__]
    return [f for f in dict.fromkeys(folders) if f.is_relative_to(ROOT)]


def test_the_devplug_package_spans_the_core_and_the_test_kit() -> None:
    folders = _devplug_folders()
    assert ROOT / "core" / "devplug" in folders
    testing = importlib.import_module("devplug.testing")
    kit = Path(str(testing.__file__)).resolve().parent.parent
    assert kit in folders, f"the test kit's devplug folder {kit} is not part of the devplug package: {folders}"


def test_the_diagram_draws_every_package_and_only_packages() -> None:
    drawn = diagram_packages(DIAGRAM.read_text())
    packages = tree_packages(_devplug_folders())
    assert sorted(packages - drawn) == [], (
        "packages with no box in docs/diagrams/architecture.dot: give each a node or a cluster with its folder as "
        "its ID ('\"kit/\" [label=...]', 'subgraph \"cluster frontends/dra/\" {...}')"
    )
    assert sorted(drawn - packages) == [], "boxes of docs/diagrams/architecture.dot whose package does not exist"
    assert {"engine/", "frontends/", "frontends/dra/", "devkubelet/", "testing/"} <= drawn  # found at all


def test_the_box_reading_sees_nodes_and_clusters_and_nothing_else() -> None:
    source = "\n".join(
        (
            "digraph d {",
            '  // "gone/" [label="a comment"];',
            '  subgraph "cluster engine/" {',
            '    "kit/" [label="kit/"];',
            '    lifecycle [label="lifecycle.py, see host/"];',
            '    other [label = "host/", tooltip="sdk/"];',
            "  }",
            '  "kit/" -> "text/";',
            '  subgraph cluster_shared { "frontends/dra/" [label="x"]; }',
            "}",
        )
    )
    assert diagram_packages(source) == {"engine/", "kit/", "text/", "frontends/dra/"}  # text/: made by its edge


def test_a_package_is_a_folder_with_an_init_and_generated_code_is_drawn_within_api(tmp_path: Path) -> None:
    for folder in ("engine", "frontends/dra", "api/gen/dra/v1", "notapackage"):
        (tmp_path / folder).mkdir(parents=True)
    for package in ("engine", "frontends/dra", "api", "api/gen", "api/gen/dra", "api/gen/dra/v1"):
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "__init__.py").write_text("")
    assert tree_packages([tmp_path]) == {"engine/", "frontends/dra/", "api/"}
