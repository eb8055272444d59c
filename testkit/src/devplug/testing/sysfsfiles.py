"""A :class:`devplug.host.sysfs.SysfsAccess` on kernel models kept as real files (``root/sys`` standing for ``/sys``,
``root/dev`` for ``/dev``): what the PCI, DFL, class-tree and bus models share, and the base of a model of
your own.

Reads go through :class:`devplug.host.sysfs.HostSysfs` on the model's folders, so a
driver reads a model exactly as it reads a host. Writes are those of a tree of
plain attributes, as sysfs treats them (``Documentation/filesystems/sysfs.rst``,
"Reading/Writing Attribute Data"; ``fs/kernfs/file.c``, ``kernfs_fop_open``):
an attribute without write permission (mode 0444: no store method) refuses a
write with ``EACCES``, even for root; a writable one (0644) shows the value
written. A model overrides :meth:`SysfsFiles.write_text` for the attributes
whose writes do something (``bind``, ``unbind``, ...) and calls it for the rest::

    class MyModel(SysfsFiles):
        def write_text(self, path: Path, data: str) -> None:
            if path.name == "reset":
                ...                               # what the kernel does
            else:
                super().write_text(path, data)
"""

from __future__ import annotations

import contextlib
import errno
import os
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from devplug.host.sysfs import HostSysfs

__all__ = ["SysfsFiles"]


class SysfsFiles:
    """A model's ``sys/`` and ``dev/`` under ``root``, read as a host's: a :class:`devplug.host.sysfs.SysfsAccess`.
    ``_lock`` guards each call (a model that redraws its tree in place sets a lock of its own; files replaced
    atomically need none)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._sys = self.root / "sys"
        self._dev = self.root / "dev"
        self._reader = HostSysfs(self._sys, self._dev)
        self._lock: AbstractContextManager[Any] = contextlib.nullcontext()

    @property
    def sysfs_root(self) -> Path:
        """The model's sysfs mount point (its ``/sys``)."""
        return self._sys

    @property
    def dev_root(self) -> Path:
        """The model's ``/dev``."""
        return self._dev

    def read_text(self, path: Path) -> str:
        """The attribute's content, stripped."""
        with self._lock:
            return self._reader.read_text(path)

    def exists(self, path: Path) -> bool:
        """True when the path exists (symlinks followed)."""
        with self._lock:
            return self._reader.exists(path)

    def is_dir(self, path: Path) -> bool:
        """True when the path is a folder (symlinks followed)."""
        with self._lock:
            return self._reader.is_dir(path)

    def listdir(self, path: Path) -> list[str]:
        """Sorted entry names."""
        with self._lock:
            return self._reader.listdir(path)

    def link_name(self, path: Path) -> str | None:
        """The symlink target's last component, or ``None``."""
        with self._lock:
            return self._reader.link_name(path)

    def writable(self, path: Path) -> bool:
        """True for an existing attribute with write permission (mode 0644), whoever the caller is."""
        with self._lock:
            return _has_write_permission(path)

    def write_text(self, path: Path, data: str) -> None:
        """A write to a plain attribute: ``FileNotFoundError`` when absent, ``EACCES`` when read-only (0444),
        else the attribute holds ``data``. Models override it for the attributes whose writes do more."""
        with self._lock:
            if not os.path.isfile(path):
                raise FileNotFoundError(errno.ENOENT, "open to write: No such file or directory", str(path))
            if not _has_write_permission(path):
                raise PermissionError(errno.EACCES, "open to write: Permission denied (read-only attribute)", str(path))
            real = os.path.realpath(path)
            scratch = os.path.join(os.path.dirname(real), f".{os.path.basename(real)}.new")
            with open(scratch, "w") as handle:
                handle.write(data)
            os.chmod(scratch, os.stat(real).st_mode & 0o777)
            os.replace(scratch, real)


def _has_write_permission(path: Path) -> bool:
    try:
        return os.path.isfile(path) and bool(os.stat(path).st_mode & 0o200)
    except OSError:
        return False
