"""Device nodes for kernel models and drivers standing for devices (the mock), so container runtimes take them.

A container runtime refuses a ``DeviceSpec`` whose host path is not a device
node (see :mod:`devplug.devkubelet.devicespecs`): a model that stands for a
character device must make one. :func:`make_char_device` makes a real
character device with ``mknod(2)`` (which needs ``CAP_MKNOD``); where the
process may not, it makes a symlink to ``/dev/null`` instead, which a runtime
resolves to that character device before it looks (containerd's
``ResolveSymbolicLink``), so allocations still start containers.

The default number is ``/dev/null``'s (1:3, ``Documentation/admin-guide/devices.txt``):
opening such a node reads nothing and writes nowhere, whatever a test does with it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

__all__ = ["NULL_DEVICE", "is_device_node", "make_char_device", "mknod_char_device"]

#: ``/dev/null``'s (major, minor).
NULL_DEVICE = (1, 3)


def mknod_char_device(path: Path, device: tuple[int, int] = NULL_DEVICE, mode: int = 0o666) -> None:
    """Make ``path`` a character device numbered ``device`` with ``mknod(2)``, replacing what is there.

    Raises :class:`PermissionError` (``EPERM``) where the process may not make device nodes.
    """
    path = Path(path)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    os.mknod(path, stat.S_IFCHR | mode, os.makedev(*device))
    os.chmod(path, mode)  # mknod's mode is masked by the umask


def make_char_device(path: Path, device: tuple[int, int] = NULL_DEVICE, mode: int = 0o666) -> bool:
    """Make ``path`` a character device numbered ``device`` (replacing what is there).

    Returns True for a real node; False when ``mknod`` was refused
    (``EPERM``) and a symlink to ``/dev/null`` was made instead.
    """
    try:
        mknod_char_device(path, device, mode)
    except PermissionError as exc:
        if exc.errno != errno.EPERM:
            raise
        Path(path).symlink_to("/dev/null")
        return False
    return True


def is_device_node(path: Path) -> bool:
    """True when ``path`` (followed, if a symlink) is a character or block device."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
