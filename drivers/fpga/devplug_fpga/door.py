"""The one door to the kernel: DFL sysfs attributes, device nodes and the DFL ioctls.

Everything the driver reads or changes on the machine goes through a
:class:`DflAccess` (the sysfs door of :mod:`devplug.host.sysfs`, with ``resolve``
and ``ioctl`` added): :class:`HostDfl` on a node (real files under
configurable roots, real ``ioctl(2)`` calls), or
the test kit's ``devplug.testing.dflsysfs.DflModel`` in tests and the demo. The ioctl numbers and the PR argument follow
``include/uapi/linux/fpga-dfl.h``.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
from pathlib import Path
from typing import Protocol, runtime_checkable

from devplug.host.sysfs import HostSysfs, SysfsAccess

__all__ = [
    "DFL_FPGA_FME_PORT_PR",
    "DFL_FPGA_GET_API_VERSION",
    "DFL_FPGA_PORT_RESET",
    "DflAccess",
    "HostDfl",
    "port_pr",
    "port_reset",
]

# _IO(DFL_FPGA_MAGIC, nr) with DFL_FPGA_MAGIC 0xB6; DFL_PORT_BASE 0x40, DFL_FME_BASE 0x80.
DFL_FPGA_GET_API_VERSION = 0xB600
DFL_FPGA_PORT_RESET = 0xB640
DFL_FPGA_FME_PORT_PR = 0xB680
#: struct dfl_fpga_fme_port_pr { __u32 argsz, flags, port_id, buffer_size; __u64 buffer_address; }
_PORT_PR = struct.Struct("=IIIIQ")


@runtime_checkable
class DflAccess(SysfsAccess, Protocol):
    """What the FPGA driver may do with the machine: the sysfs door (:class:`devplug.host.sysfs.SysfsAccess`), plus
    following links and the DFL ioctls."""

    def resolve(self, path: Path) -> Path:
        """The path with every symlink followed."""
        ...

    def ioctl(self, node: Path, request: int, arg: bytes | None = None) -> int:
        """Open ``node`` read-write, issue ``request`` with ``arg`` (a struct, or none), close; raises OSError."""
        ...


class HostDfl(HostSysfs):
    """Real sysfs, /dev and ioctls on the host (or wherever its trees are mounted)."""

    def resolve(self, path: Path) -> Path:
        """``realpath(3)``."""
        return Path(os.path.realpath(path))

    def ioctl(self, node: Path, request: int, arg: bytes | None = None) -> int:
        """One ioctl on a freshly opened node (the DFL nodes are opened exclusively, so never kept open)."""
        try:
            fd = os.open(node, os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            raise OSError(exc.errno or errno.EIO, f"open: {exc.strerror}", str(node)) from exc
        try:
            if arg is None:
                return int(fcntl.ioctl(fd, request, 0))
            buffer = bytearray(arg)
            return int(fcntl.ioctl(fd, request, buffer, True))
        except OSError as exc:
            raise OSError(exc.errno or errno.EIO, f"ioctl {request:#x}: {exc.strerror}", str(node)) from exc
        finally:
            os.close(fd)


def port_pr(access: DflAccess, fme_node: Path, port_id: int, image: bytes) -> None:
    """Partial reconfiguration: load ``image`` into port ``port_id`` of the card through its FME node."""
    buffer = ctypes.create_string_buffer(image, len(image))
    arg = _PORT_PR.pack(_PORT_PR.size, 0, port_id, len(image), ctypes.addressof(buffer))
    access.ioctl(fme_node, DFL_FPGA_FME_PORT_PR, arg)
    del buffer  # kept alive until the kernel copied it


def port_reset(access: DflAccess, port_node: Path) -> None:
    """Reset the port and its AFU."""
    access.ioctl(port_node, DFL_FPGA_PORT_RESET)
