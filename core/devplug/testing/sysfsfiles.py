"""The read side of :class:`devplug.sysfs.SysfsAccess` for kernel models kept as real files (``root/sys`` standing
for ``/sys``, ``root/dev`` for ``/dev``): what the PCI, DFL and class-tree models share.

Reads go through :class:`devplug.sysfs.HostSysfs` on the model's folders, so a
driver reads a model exactly as it reads a host; each model adds the writes
(and the faults) of the kernel part it stands for.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from devplug.sysfs import HostSysfs

__all__ = ["SysfsFiles"]


class SysfsFiles:
    """A model's ``sys/`` and ``dev/`` under ``root``, read as a host's. ``_lock`` guards each read (a model that
    redraws its tree in place sets a lock of its own; files replaced atomically need none)."""

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
