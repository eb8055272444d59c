"""The three inotify calls (``inotify_init1``, ``inotify_add_watch``, ``inotify_rm_watch``) through ctypes, and
the event flags of ``<sys/inotify.h>``: shared by the directory watcher (:mod:`devplug.watch`) and the container
liveness watch (:mod:`devplug.engine.liveness`).

Through ctypes rather than a library: the core's dependencies are pluggy, grpcio, protobuf and click, and these
three calls are all that both need (the maintained inotify packages on PyPI wrap the same calls).
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

__all__ = [
    "IN_ATTRIB",
    "IN_CLOSE_WRITE",
    "IN_CREATE",
    "IN_DELETE",
    "IN_DELETE_SELF",
    "IN_IGNORED",
    "IN_MODIFY",
    "IN_MOVED_FROM",
    "IN_MOVED_TO",
    "IN_MOVE_SELF",
    "IN_ONLYDIR",
    "IN_Q_OVERFLOW",
    "IN_UNMOUNT",
    "Inotify",
    "inotify",
]

# From <sys/inotify.h>.
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_UNMOUNT = 0x00002000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = getattr(os, "O_CLOEXEC", 0o2000000)  # inotify takes the O_ flags' values


class Inotify:
    """The three inotify calls, through ctypes; ``None`` from :meth:`load` when unavailable."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        self._init1 = libc.inotify_init1
        self._init1.argtypes = [ctypes.c_int]
        self._init1.restype = ctypes.c_int
        self._add = libc.inotify_add_watch
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._add.restype = ctypes.c_int
        self._rm = libc.inotify_rm_watch
        self._rm.argtypes = [ctypes.c_int, ctypes.c_int]
        self._rm.restype = ctypes.c_int

    @staticmethod
    def load() -> Inotify | None:
        if not sys.platform.startswith("linux"):
            return None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            return Inotify(libc)
        except (OSError, AttributeError):
            return None

    @staticmethod
    def _check(result: int, what: str, path: Path | None = None) -> int:
        if result < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}", None if path is None else str(path))
        return result

    def init(self) -> int:
        return self._check(self._init1(_IN_NONBLOCK | _IN_CLOEXEC), "inotify_init1")

    def add_watch(self, fd: int, path: Path, mask: int) -> int:
        return self._check(self._add(fd, os.fsencode(path), mask), "inotify_add_watch", path)

    def rm_watch(self, fd: int, wd: int) -> None:
        self._rm(fd, wd)  # fails with EINVAL when the kernel already dropped it: fine


#: The inotify calls, or None where there are none (not Linux).
inotify: Inotify | None = Inotify.load()
