"""One narrow door to sysfs and /dev, for drivers that bind and unbind devices.

A driver that reads device attributes and writes ``driver_override``,
``unbind`` or ``drivers_probe`` does it only through a :class:`SysfsAccess`:
:class:`HostSysfs` in production (real file I/O under configurable roots, so
the daemon runs in a container with the host's ``/sys`` mounted elsewhere),
and a kernel model such as :class:`devplug.testing.pcisysfs.PciSysfsModel` in
tests. Paths are absolute and lie under :attr:`SysfsAccess.sysfs_root` or
:attr:`SysfsAccess.dev_root`; a driver builds them from those roots.

Errors are :class:`OSError` (or a subclass chosen by errno) whose ``filename``
is the path, so a message always says which attribute refused what.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = ["HostSysfs", "SysfsAccess", "check_roots"]


@runtime_checkable
class SysfsAccess(Protocol):
    """What a bind/unbind driver may do with sysfs and /dev."""

    @property
    def sysfs_root(self) -> Path:
        """Where sysfs is mounted (``/sys`` on a host)."""
        ...

    @property
    def dev_root(self) -> Path:
        """Where the device nodes are (``/dev`` on a host)."""
        ...

    def read_text(self, path: Path) -> str:
        """The attribute's content, stripped of surrounding whitespace."""
        ...

    def write_text(self, path: Path, data: str) -> None:
        """Write ``data`` to the attribute in one ``write(2)``, as the kernel expects."""
        ...

    def exists(self, path: Path) -> bool:
        """True when the path exists (symlinks followed)."""
        ...

    def is_dir(self, path: Path) -> bool:
        """True when the path is a folder (symlinks followed)."""
        ...

    def listdir(self, path: Path) -> list[str]:
        """The entry names of a folder, sorted."""
        ...

    def link_name(self, path: Path) -> str | None:
        """The last component of a symlink's target (``driver`` -> ``e1000e``), or ``None`` if absent."""
        ...

    def writable(self, path: Path) -> bool:
        """True when this process may write the attribute (read-only mounts say no)."""
        ...


def _oserror(exc: OSError, path: Path, action: str) -> OSError:
    """``exc`` again, with ``path`` and the attempted action in its message."""
    code = exc.errno if exc.errno is not None else errno.EIO
    return OSError(code, f"{action}: {exc.strerror or os.strerror(code)}", str(path))


class HostSysfs:
    """Real file I/O on the host's sysfs and /dev (or wherever they are mounted)."""

    def __init__(self, sysfs_root: Path = Path("/sys"), dev_root: Path = Path("/dev")) -> None:
        self._sysfs_root = Path(sysfs_root)
        self._dev_root = Path(dev_root)

    def __repr__(self) -> str:
        return f"HostSysfs(sysfs_root={str(self._sysfs_root)!r}, dev_root={str(self._dev_root)!r})"

    @property
    def sysfs_root(self) -> Path:
        """Where sysfs is mounted."""
        return self._sysfs_root

    @property
    def dev_root(self) -> Path:
        """Where the device nodes are."""
        return self._dev_root

    def read_text(self, path: Path) -> str:
        """The attribute's content, stripped."""
        try:
            with open(path, "rb") as handle:
                return handle.read().decode("utf-8", errors="replace").strip()
        except OSError as exc:
            raise _oserror(exc, path, "read") from exc

    def write_text(self, path: Path, data: str) -> None:
        """One ``write(2)`` of ``data``; a short write is an ``EIO`` error."""
        raw = data.encode()
        try:
            fd = os.open(path, os.O_WRONLY)
        except OSError as exc:
            raise _oserror(exc, path, f"open to write {data.strip()!r}") from exc
        try:
            written = os.write(fd, raw)
        except OSError as exc:
            raise _oserror(exc, path, f"write {data.strip()!r}") from exc
        finally:
            os.close(fd)
        if written != len(raw):
            raise OSError(errno.EIO, f"short write of {data.strip()!r} ({written}/{len(raw)} bytes)", str(path))

    def exists(self, path: Path) -> bool:
        """True when the path exists."""
        return os.path.exists(path)

    def is_dir(self, path: Path) -> bool:
        """True when the path is a folder."""
        return os.path.isdir(path)

    def listdir(self, path: Path) -> list[str]:
        """Sorted entry names."""
        try:
            return sorted(os.listdir(path))
        except OSError as exc:
            raise _oserror(exc, path, "list") from exc

    def link_name(self, path: Path) -> str | None:
        """The symlink target's last component, or ``None``."""
        try:
            return os.path.basename(os.readlink(path))
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # not a symlink
                return None
            raise _oserror(exc, path, "readlink") from exc

    def writable(self, path: Path) -> bool:
        """``access(2)`` with ``W_OK``: false on a read-only mount."""
        return os.access(path, os.W_OK)


def check_roots(sysfs_root: Path, dev_root: Path) -> None:
    """For a driver's ``Options``: ``ValueError`` naming the option when ``sysfs_root`` lies in ``/proc`` or
    ``/dev``, or ``dev_root`` in ``/proc`` or ``/sys`` (see :func:`devplug.options.refuse_kernel_trees`)."""
    from devplug.options import refuse_kernel_trees

    refuse_kernel_trees(sysfs_root, "sysfs_root", allowed=Path("/sys"))
    refuse_kernel_trees(dev_root, "dev_root", allowed=Path("/dev"))
