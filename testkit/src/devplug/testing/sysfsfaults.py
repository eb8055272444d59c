"""Faults put between a driver and its sysfs: a crash after the n-th write, writes that wait.

A driver that reaches the machine only through a :class:`devplug.host.sysfs.SysfsAccess`
(its ``access``) can be handed one of these wrappers around the real door or a
kernel model (:class:`devplug.testing.pcisysfs.PciSysfsModel`, ...):

* :class:`CrashingSysfs` -- counts the writes that went through (:attr:`CrashingSysfs.done`)
  and, once armed, lets ``n`` more writes through and then dies at the next
  operation of any kind with :class:`SimulatedCrash`: the process dying between
  two sysfs writes, for tests of what the driver finishes after a restart;
* :class:`SlowWrites` -- writes to one attribute (``unbind`` by default) wait
  while a flag file exists: a slow kernel operation (an unbind waiting for user
  space to close the device) that a test can stretch, and end by removing the
  file. The flag file lists the written values to slow (device addresses, one a
  line), or is empty to slow them all; other processes (a daemon under test)
  see the same file.
"""

from __future__ import annotations

import time
from pathlib import Path

from devplug.host.sysfs import SysfsAccess

__all__ = ["CrashingSysfs", "SimulatedCrash", "SlowWrites", "SysfsWrapper"]


class SimulatedCrash(BaseException):
    """The process dying: not an :class:`Exception`, so no ``except Exception`` in a driver cleans up after it."""


class SysfsWrapper:
    """A :class:`~devplug.host.sysfs.SysfsAccess` passing every operation to ``inner``; subclasses change some."""

    def __init__(self, inner: SysfsAccess) -> None:
        self.inner = inner

    @property
    def sysfs_root(self) -> Path:
        return self.inner.sysfs_root

    @property
    def dev_root(self) -> Path:
        return self.inner.dev_root

    def before(self, operation: str, path: Path) -> None:
        """Called before every operation (``read_text``, ``write_text``, ``exists``, ...) on ``path``."""

    def read_text(self, path: Path) -> str:
        self.before("read_text", path)
        return self.inner.read_text(path)

    def write_text(self, path: Path, data: str) -> None:
        self.before("write_text", path)
        self.inner.write_text(path, data)

    def exists(self, path: Path) -> bool:
        self.before("exists", path)
        return self.inner.exists(path)

    def is_dir(self, path: Path) -> bool:
        self.before("is_dir", path)
        return self.inner.is_dir(path)

    def listdir(self, path: Path) -> list[str]:
        self.before("listdir", path)
        return self.inner.listdir(path)

    def link_name(self, path: Path) -> str | None:
        self.before("link_name", path)
        return self.inner.link_name(path)

    def writable(self, path: Path) -> bool:
        self.before("writable", path)
        return self.inner.writable(path)


class CrashingSysfs(SysfsWrapper):
    """Counts writes; after :meth:`arm` (or the constructor's ``writes``), dies at the first operation past them."""

    def __init__(self, inner: SysfsAccess, writes: int | None = None) -> None:
        super().__init__(inner)
        #: Every write that went through: (path relative to the sysfs root, data).
        self.done: list[tuple[str, str]] = []
        self.allowed = writes if writes is not None else 10**9

    def arm(self, writes: int) -> None:
        """Die after ``writes`` more writes."""
        self.allowed = len(self.done) + writes

    def before(self, operation: str, path: Path) -> None:
        if len(self.done) >= self.allowed:
            raise SimulatedCrash(f"crash after {len(self.done)} sysfs writes (at {operation} {path})")

    def write_text(self, path: Path, data: str) -> None:
        super().write_text(path, data)
        self.done.append((str(Path(path).relative_to(self.sysfs_root)), data))


class SlowWrites(SysfsWrapper):
    """Writes to attributes named ``attribute`` wait while ``flag`` exists (at most ``limit`` seconds): those of
    the values the flag file names (one a line), or all of them when it is empty."""

    def __init__(self, inner: SysfsAccess, flag: Path, attribute: str = "unbind", limit: float = 300.0) -> None:
        super().__init__(inner)
        self.flag = Path(flag)
        self.attribute = attribute
        self.limit = limit

    def write_text(self, path: Path, data: str) -> None:
        if Path(path).name == self.attribute and self._slowed(data):
            deadline = time.monotonic() + self.limit
            while self.flag.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        super().write_text(path, data)

    def _slowed(self, value: str) -> bool:
        try:
            named = self.flag.read_text().split()
        except FileNotFoundError:
            return False
        return not named or value.strip() in named
