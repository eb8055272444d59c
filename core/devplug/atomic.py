"""Crash-safe file writes: a file is either its old content or its new content, never a mix."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["read_json", "write_atomic", "write_json_atomic"]

_counter = itertools.count()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = 0o600, *, sync: bool = True) -> None:
    """Replace ``path`` with ``data``: temporary file in the same folder, fdatasync, rename, fsync the folder.

    Crash-safe: ``path`` holds either its old content or ``data``, never a mix.
    ``sync=False`` skips both syncs: still never a mix after ``kill -9``, but a
    power loss may leave the old content (for files that are rewritten often
    and rebuilt anyway, such as the daemon's status).
    """
    path = Path(path)
    # One writer per file and process (the daemon writes state from one thread): the pid and a
    # counter make the name unique; O_EXCL refuses a leftover of a crashed writer with the same pid.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{next(_counter)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            if sync:
                os.fdatasync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if sync:
        _fsync_dir(path.parent)


def write_json_atomic(path: Path, value: Any) -> None:
    """Write ``value`` as JSON with :func:`write_atomic`."""
    write_atomic(path, (json.dumps(value, indent=1, sort_keys=True) + "\n").encode())


def read_json(path: Path) -> Any:
    """Read a JSON file written by :func:`write_json_atomic` (raises ``OSError``/``ValueError``)."""
    return json.loads(Path(path).read_bytes())
