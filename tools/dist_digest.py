"""The digest of everything the wheels and sdists under ``dist/`` are built from.

``make dist`` writes it to ``dist/SOURCE-DIGEST``; the installed-wheels test
(``tests/deploy/test_wheels.py``) compares it with the tree it runs in, so it
never tests wheels built from other sources. Run as a script, it prints the
digest of the repository it lives in.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: What goes into the core's and the drivers' distributions (see MANIFEST.in and each pyproject.toml).
TOP_LEVEL = ("pyproject.toml", "MANIFEST.in", "README.md", "config.example.toml", "LICENSE")
TREES = ("core", "proto", "testkit")


def _skipped(path: Path) -> bool:
    return "__pycache__" in path.parts or path.suffix == ".pyc" or any(p.endswith(".egg-info") for p in path.parts)


def source_files(root: Path = ROOT) -> Iterator[Path]:
    """Every file a distribution is built from, in a stable order."""
    for name in TOP_LEVEL:
        if (root / name).is_file():
            yield root / name
    folders = [root / t for t in TREES]
    for pyproject in sorted(root.glob("drivers/*/pyproject.toml")):
        yield pyproject
        folders.extend(sorted(pyproject.parent.glob("devplug_*")))
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not _skipped(path.relative_to(root)):
                yield path


def source_digest(root: Path = ROOT) -> str:
    """SHA-256 over the paths and contents of :func:`source_files`."""
    digest = hashlib.sha256()
    for path in source_files(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


if __name__ == "__main__":
    sys.stdout.write(source_digest() + "\n")
