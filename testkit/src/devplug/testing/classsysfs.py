"""A model of a sysfs device class, ``/sys/class/<class>/``: devices as folders of attributes, for drivers that
discover devices there (NVMe controllers, accelerators, ``misc`` devices, ...).

:class:`SysfsClassModel` lays out real files and symlinks under ``root``
(``root/sys`` is ``/sys``, ``root/dev`` is ``/dev``), shaped as the kernel's,
and keeps nothing in memory: a test builds devices and changes them in its own
process while the daemon under test, a child process, reads the same folder
(through :class:`devplug.host.sysfs.HostSysfs` on ``root/sys`` and ``root/dev``, as
it would read the host's, or through a model of its own on ``root``)::

    sys/devices/<parent>/<class>/<name>/   the device: its attributes, and
        dev                                "major:minor\\n" when it has a device node
        uevent                             MAJOR=, MINOR=, DEVNAME= (when it has a node)
        subsystem -> sys/class/<class>     its class
        device    -> sys/devices/<parent>  its parent device (not for a virtual device)
    sys/class/<class>/<name>  -> the device folder above
    dev/<name>                             its character device node
    model/                                 faults the model injects (not part of the kernel)

What it models, and where the kernel says so:

* Layout (``Documentation/admin-guide/sysfs-rules.rst``): every device lives
  under ``/sys/devices``; ``/sys/class/<class>/`` holds only symlinks to
  device folders there ("Classification by subsystem"); a device folder has a
  ``subsystem`` link to its class and, unless it is virtual (under
  ``/sys/devices/virtual``), a ``device`` link to its parent device. A device
  with a node has ``dev`` holding ``major:minor`` ("dev" entry) and its
  ``uevent`` names ``MAJOR``, ``MINOR`` and ``DEVNAME`` (``drivers/base/core.c``,
  ``dev_uevent``); the node is ``/dev/<DEVNAME>``, a character device
  (:func:`devplug.testing.devnodes.make_char_device`).
* Attributes (``Documentation/filesystems/sysfs.rst``, "Attributes" and
  "Reading/Writing Attribute Data"): ASCII text, one value per file, ending in
  a newline. A read-only attribute (mode 0444, no store method) refuses a
  write at open with ``EACCES`` even for root (``fs/kernfs/file.c``,
  ``kernfs_fop_open``); a writable one takes the whole value in one
  ``write(2)``; a value its store method refuses is ``EINVAL`` and changes
  nothing (the model's ``accepts`` lists the values a store takes).
* Hot removal (``drivers/base/core.c``, ``device_del``): the device's class
  link, its folder and its node go at once; an attribute read afterwards is
  ``ENOENT``. A device added later under the same name is a new device.
* Failing reads: a show method may return an error (an NVMe controller that
  does not answer, a device being reset), which ``read(2)`` returns
  (``fs/sysfs/file.c``, ``sysfs_kf_seq_show``); :meth:`SysfsClassModel.fail_reads`
  makes one attribute's reads fail with an errno, through the model's
  :meth:`~SysfsClassModel.read_text`.

The model implements :class:`devplug.host.sysfs.SysfsAccess`, so a driver that
reads and writes through that door gets it in unit tests where it would get
a :class:`~devplug.host.sysfs.HostSysfs`. The ``sysfs_class_tree`` fixture of
devplug's pytest plugin gives a test a fresh one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from devplug.testing.devnodes import NULL_DEVICE, make_char_device
from devplug.testing.sysfsfiles import SysfsFiles

__all__ = ["SysfsClassModel"]

_ERRNOS = {name: getattr(errno, name) for name in ("EIO", "ENODEV", "EBUSY", "EAGAIN", "ETIMEDOUT", "ENXIO")}


def _put(path: Path, value: str) -> None:
    """An attribute's content: the value and the newline sysfs ends it with, replaced atomically (another process
    never reads half of it)."""
    text = value if value.endswith("\n") else f"{value}\n"
    scratch = path.with_name(f".{path.name}.new")
    scratch.write_text(text)
    os.replace(scratch, path)


class SysfsClassModel(SysfsFiles):
    """Devices of sysfs classes as files under ``root`` (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self._control = self.root / "model"
        for folder in (self._sys / "class", self._sys / "devices", self._dev, self._control):
            folder.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"SysfsClassModel({str(self.root)!r})"

    # --- building the machine ---------------------------------------------------------------------------

    def add_device(
        self,
        device_class: str,
        name: str,
        attributes: Mapping[str, str],
        *,
        writable: Mapping[str, Iterable[str] | None] | None = None,
        parent: str | None = None,
        number: tuple[int, int] | None = NULL_DEVICE,
    ) -> Path:
        """Add device ``name`` of ``device_class`` with read-only ``attributes`` (name -> value) and ``writable``
        ones (name -> the values its store accepts, ``None`` for any; their first value is the first accepted
        or empty); returns its folder.

        ``parent``: the parent device's path under ``/sys/devices`` (``"pci0000:00/0000:00:04.0"``), ``None``
        for a virtual device. ``number``: its node's ``(major, minor)``, ``None`` for a device without one.
        :class:`FileExistsError` when the class already has a device of that name.
        """
        link = self.class_dir(device_class) / name
        if link.is_symlink() or link.exists():
            raise FileExistsError(errno.EEXIST, f"{device_class} already has a device {name}", str(link))
        base = self._sys / "devices" / (parent if parent is not None else "virtual")
        folder = base / device_class / name
        folder.mkdir(parents=True)
        for attr, value in attributes.items():
            _put(folder / attr, value)
            (folder / attr).chmod(0o444)
        accepts: dict[str, list[str] | None] = {}
        for attr, values in (writable or {}).items():
            allowed = None if values is None else [str(v) for v in values]
            accepts[attr] = allowed
            if not (folder / attr).exists():
                _put(folder / attr, allowed[0] if allowed else "")
            (folder / attr).chmod(0o644)
        (self._control / f"accepts.{device_class}.{name}.json").write_text(json.dumps(accepts))
        uevent = [] if number is None else [f"MAJOR={number[0]}", f"MINOR={number[1]}", f"DEVNAME={name}"]
        _put(folder / "uevent", "\n".join(uevent))
        if number is not None:
            _put(folder / "dev", f"{number[0]}:{number[1]}")
            make_char_device(self._dev / name, number)
        (folder / "subsystem").symlink_to(os.path.relpath(self.class_dir(device_class), folder))
        if parent is not None:
            # as the kernel's link reads: up, then down to the parent by name (``../../../0000:00:04.0``)
            (folder / "device").symlink_to(os.path.join(os.path.relpath(base.parent, folder), base.name))
        link.symlink_to(os.path.relpath(folder, link.parent))
        return folder

    def remove_device(self, device_class: str, name: str) -> None:
        """Hot removal: the class link, the device's folder and its node go (``ENOENT`` from then on)."""
        link = self.class_dir(device_class) / name
        folder = Path(os.path.realpath(link))
        link.unlink()
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            (self._dev / name).unlink()
        for stale in self._control.glob(f"*.{device_class}.{name}.*"):
            stale.unlink()

    def set_attribute(self, device_class: str, name: str, attr: str, value: str) -> None:
        """The kernel changes what an attribute shows (a controller's ``state`` going ``resetting``, ...)."""
        path = self.attribute(device_class, name, attr)
        mode = path.stat().st_mode & 0o777
        _put(path, value)
        path.chmod(mode)

    def fail_reads(self, device_class: str, name: str, attr: str, code: str = "EIO") -> None:
        """Make reads of the attribute through :meth:`read_text` fail with errno ``code`` (``EIO``, ``ENODEV``,
        ``EBUSY``, ``EAGAIN``, ``ETIMEDOUT``, ``ENXIO``) until :meth:`heal_reads`."""
        if code not in _ERRNOS:
            raise ValueError(f"fail_reads: unknown errno {code!r}; use one of {', '.join(_ERRNOS)}")
        self.attribute(device_class, name, attr)  # the attribute must exist
        (self._control / f"fail-read.{device_class}.{name}.{attr}").write_text(code)

    def heal_reads(self, device_class: str, name: str, attr: str) -> None:
        """Reads of the attribute work again."""
        (self._control / f"fail-read.{device_class}.{name}.{attr}").unlink(missing_ok=True)

    # --- looking at it ------------------------------------------------------------------------------------

    def class_dir(self, device_class: str) -> Path:
        """``/sys/class/<device_class>`` of the model (made when first asked for: a loaded driver's class)."""
        folder = self._sys / "class" / device_class
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def devices(self, device_class: str) -> list[str]:
        """The names of the class's devices, sorted."""
        return sorted(entry.name for entry in self.class_dir(device_class).iterdir())

    def attribute(self, device_class: str, name: str, attr: str) -> Path:
        """The attribute's path through the class link; :class:`FileNotFoundError` when there is none."""
        path = self.class_dir(device_class) / name / attr
        if not path.is_file():
            raise FileNotFoundError(errno.ENOENT, f"{device_class}/{name} has no attribute {attr}", str(path))
        return path

    def node(self, name: str) -> Path:
        """The device's node, ``/dev/<name>`` of the model."""
        return self._dev / name

    # --- the door: devplug.host.sysfs.SysfsAccess ------------------------------------------------------------------

    def _where(self, path: Path) -> tuple[str, str, str] | None:
        """(class, device, attribute) of a path under ``sys/class``, or None."""
        try:
            parts = Path(path).relative_to(self._sys / "class").parts
        except ValueError:
            return None
        return (parts[0], parts[1], parts[2]) if len(parts) == 3 else None

    def read_text(self, path: Path) -> str:
        """The attribute's content, stripped; an injected failure (:meth:`fail_reads`) is raised as the kernel
        returns it."""
        where = self._where(path)
        if where is not None:
            fault = self._control / "fail-read.{}.{}.{}".format(*where)
            with contextlib.suppress(FileNotFoundError):
                code = fault.read_text().strip()
                raise OSError(_ERRNOS[code], f"read: {os.strerror(_ERRNOS[code])}", str(path))
        return super().read_text(path)

    def writable(self, path: Path) -> bool:
        """True for an attribute with a store method (mode 0644), whoever the caller is."""
        real = Path(os.path.realpath(path))
        return real.is_file() and bool(real.stat().st_mode & 0o200)

    def write_text(self, path: Path, data: str) -> None:
        """A sysfs write: ``EACCES`` for a read-only attribute, ``EINVAL`` for a value its store refuses (nothing
        changes), else the attribute shows the value."""
        real = Path(os.path.realpath(path))
        if not real.is_file():
            raise FileNotFoundError(errno.ENOENT, "open to write: No such file or directory", str(path))
        if not self.writable(real):
            raise PermissionError(errno.EACCES, "open to write: Permission denied (read-only attribute)", str(path))
        where = self._where(path)
        value = data.strip()
        if where is not None:
            accepts_file = self._control / f"accepts.{where[0]}.{where[1]}.json"
            allowed = json.loads(accepts_file.read_text()).get(where[2]) if accepts_file.exists() else None
            if allowed is not None and value not in allowed:
                raise OSError(errno.EINVAL, f"write {value!r}: Invalid argument", str(path))
        _put(real, value)
        real.chmod(0o644)
