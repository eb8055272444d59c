"""A model of one ``/sys/bus/<bus>`` of the kernel's driver core: devices, drivers, bind, unbind, driver_override
and drivers_probe, for drivers that move devices between kernel drivers (with :class:`devplug.kit.sysbus.SysBus`
or by hand).

:class:`SysBusModel` lays out real files and symlinks under ``root``
(``root/sys`` is ``/sys``, ``root/dev`` is ``/dev``), shaped as the kernel's,
and keeps its state in that tree and in ``root/model/bus-<bus>.json`` (what a
real kernel keeps in its structures: which driver matches which device), never
in memory: a test lays out the machine in its own process while a daemon under
test, a child process, binds and unbinds through a model of its own on the
same ``root``; a lock file orders their writes::

    sys/devices/<parent>/<name>/           the device: its attributes, and
        driver_override                    (a bus with overrides) "(null)" when unset
        subsystem -> sys/bus/<bus>
        driver    -> sys/bus/<bus>/drivers/<driver>    while a driver holds it
    sys/bus/<bus>/devices/<name>           -> the device folder
    sys/bus/<bus>/drivers/<driver>/        bind, unbind, uevent; <name> -> each device it holds
    sys/bus/<bus>/drivers_probe, drivers_autoprobe, uevent
    dev/<node>                             a character device while the driver that makes it holds the device

What it models, and where the kernel says so (``bus.c`` is ``drivers/base/bus.c``,
``dd.c`` ``drivers/base/dd.c``; the ABI files are under ``Documentation/ABI/``):

* ``drivers/<driver>/bind`` (``bus.c``, ``bind_store``; ``testing/sysfs-bus-pci``,
  ".../bind"): the device is looked up by name (``bus_find_device_by_name``,
  which ignores a trailing newline); ``ENODEV`` when there is none or the driver
  does not match it (``driver_match_device``); ``EBUSY`` when the device already
  has a driver (``dd.c``, ``__driver_probe_device``: ``if (dev->driver) return
  -EBUSY``); a failing probe returns its error (:meth:`SysBusModel.fail_probe`).
* ``drivers/<driver>/unbind`` (``bus.c``, ``unbind_store``; ``testing/sysfs-bus-pci``,
  ".../unbind"): ``ENODEV`` unless the device is bound to that very driver
  (``dev->driver == drv``); then it is detached: its ``driver`` link, the
  driver's link to it and the node the driver made go. A device user space
  holds open makes a real unbind wait until it is released; a test cannot wait,
  so :meth:`SysBusModel.set_busy` makes it fail with ``EBUSY`` instead (a fault
  standing for that wait, as in :mod:`devplug.testing.pcisysfs`).
* ``driver_override`` (``testing/sysfs-bus-pci`` and ``testing/sysfs-bus-platform``,
  "driver_override"; ``drivers/base/driver.c``, ``driver_set_override``), on a
  bus made with ``overrides=True``: while set, the driver of that name alone
  matches the device (``pci_match_device``, ``platform_match``); a write of an
  empty value or a lone newline clears it, a value of 4096 bytes or more is
  ``E2BIG`` (``PAGE_SIZE``); it reads ``(null)`` when unset; writing it neither
  unbinds nor probes. On a bus without it the attribute is absent.
* ``drivers_probe`` (``bus.c``, ``drivers_probe_store`` and
  ``bus_rescan_devices_helper``; ``testing/sysfs-bus-pci``, "/sys/bus/pci/drivers_probe"):
  ``ENODEV`` for an unknown device; for a device without a driver, the drivers
  that match it are tried in the order they were loaded and the first whose
  probe succeeds takes it. A failing probe is *not* reported (``dd.c``,
  ``__device_attach_driver``): the write succeeds and no driver holds the device.
* ``drivers_autoprobe`` (every bus has it: ``bus.c``, ``drivers_autoprobe_store``
  and ``bus_probe_device``): 1 (the default) probes a device as it is added
  and binds a driver as it is loaded to the unbound devices it matches
  (``driver_attach``); 0 leaves them unbound until asked.
* Hot removal (:meth:`SysBusModel.remove_device`; ``drivers/base/core.c``,
  ``device_del``): the driver lets the device go, its links, folder and node go.

Drivers match devices by name patterns (``fnmatch``, standing for a driver's ID
table: ``load_driver("user", matches=["wq*"])``), and a driver may make a node
for each device it holds (``node="dsa/{name}"``: idxd's ``user`` driver makes
``/dev/dsa/wq0.1``). The model is a :class:`devplug.host.sysfs.SysfsAccess`; other
writes are those of :class:`devplug.testing.sysfsfiles.SysfsFiles`.

Checked against a real kernel: the store methods are the driver core's, the same
for every bus, so devplug-vfio's scenario suite checks them on the real ``pci``
bus in a QEMU guest and on the PCI model alike (``EBUSY`` for a bound device,
``ENODEV`` for a driver that does not match or does not hold it, the silent
failed probe through ``drivers_probe``, and :class:`devplug.kit.sysbus.SysBus`
moving a device and back). Older kernels' ``bind_store`` checked
``dev->driver == NULL`` and refused a bound device with ``ENODEV``; the model
follows current kernels (``EBUSY``), as the guest's kernel does.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import fnmatch
import json
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from devplug.testing.devnodes import make_char_device
from devplug.testing.sysfsfiles import SysfsFiles

__all__ = ["SysBusModel"]

_OVERRIDE_MAX = 4096
_UNSET = "(null)"


def _put(path: Path, value: str, *, writable: bool = False) -> None:
    """An attribute: the value and its newline, replaced atomically, mode 0644 or 0444."""
    scratch = path.with_name(f".{path.name}.new")
    scratch.write_text(value if value.endswith("\n") else f"{value}\n")
    scratch.chmod(0o644 if writable else 0o444)
    os.replace(scratch, path)


def _link(link: Path, target: Path) -> None:
    """A relative symlink, as the kernel's are; replaced when it exists."""
    with contextlib.suppress(FileNotFoundError):
        link.unlink()
    link.symlink_to(os.path.relpath(target, link.parent))


def _error(code: int, value: str, path: Path) -> OSError:
    return OSError(code, f"write {value!r}: {os.strerror(code)}", str(path))


class SysBusModel(SysfsFiles):
    """``/sys/bus/<bus>`` under ``root`` (see the module docstring); ``overrides``: its devices have
    ``driver_override``. Opening a model on a ``root`` that has the bus already joins it."""

    def __init__(self, root: Path, bus: str, *, overrides: bool = False) -> None:
        if not bus or "/" in bus or bus in (".", ".."):
            raise ValueError(f"{bus!r} is not a bus name")
        super().__init__(root)
        self.bus = bus
        self.bus_dir = self._sys / "bus" / bus
        self._control = self.root / "model"
        self._state_file = self._control / f"bus-{bus}.json"
        for folder in (self.bus_dir / "devices", self.bus_dir / "drivers", self._sys / "devices", self._dev):
            folder.mkdir(parents=True, exist_ok=True)
        self._control.mkdir(exist_ok=True)
        with self._changing() as state:
            if not state:
                state.update(overrides=overrides, autoprobe=True, devices={}, drivers={}, writes=[])
                _put(self.bus_dir / "drivers_probe", "", writable=True)
                _put(self.bus_dir / "drivers_autoprobe", "1", writable=True)
                _put(self.bus_dir / "uevent", "", writable=True)
        self.overrides = bool(self._state()["overrides"])

    def __repr__(self) -> str:
        return f"SysBusModel({str(self.root)!r}, {self.bus!r})"

    # --- building the machine ---------------------------------------------------------------------------

    def add_device(self, name: str, attributes: Mapping[str, str] = {}, *, parent: str = "platform") -> Path:
        """Plug device ``name`` in, with read-only ``attributes``; with autoprobe on, a matching driver takes it.
        ``parent``: its parent's path under ``/sys/devices``. Returns its folder; ``FileExistsError`` when the
        bus has a device of that name."""
        with self._changing() as state:
            if name in state["devices"]:
                raise FileExistsError(errno.EEXIST, f"bus {self.bus} already has a device {name}", name)
            folder = self._sys / "devices" / parent / name
            folder.mkdir(parents=True)
            for attr, value in attributes.items():
                _put(folder / attr, value)
            _put(folder / "uevent", "", writable=True)
            if state["overrides"]:
                _put(folder / "driver_override", _UNSET, writable=True)
            _link(folder / "subsystem", self.bus_dir)
            _link(self.bus_dir / "devices" / name, folder)
            state["devices"][name] = {"folder": str(folder.relative_to(self._sys)), "busy": False}
            if state["autoprobe"]:
                self._attach(state, name)
            return folder

    def remove_device(self, name: str) -> None:
        """Hot removal: the driver lets the device go; its links, folder and node disappear."""
        with self._changing() as state:
            self._known(state, name)
            self._detach(state, name)
            folder = self._folder(state, name)
            (self.bus_dir / "devices" / name).unlink()
            shutil.rmtree(folder)
            del state["devices"][name]

    def load_driver(self, name: str, matches: Iterable[str] = (), *, node: str | None = None) -> None:
        """Register driver ``name`` matching the devices whose names fit one of ``matches`` (``fnmatch``
        patterns); ``node``: the device node it makes for each device it holds, under the dev root, ``{name}``
        standing for the device's. With autoprobe on it takes the unbound devices it matches. Loading it again
        adds patterns."""
        with self._changing() as state:
            drv = state["drivers"].setdefault(name, {"matches": [], "node": None, "probe_errors": {}})
            drv["matches"] = sorted(set(drv["matches"]) | set(matches))
            drv["node"] = node if node is not None else drv["node"]
            folder = self.bus_dir / "drivers" / name
            folder.mkdir(exist_ok=True)
            _put(folder / "bind", "", writable=True)
            _put(folder / "unbind", "", writable=True)
            _put(folder / "uevent", "", writable=True)
            if state["autoprobe"]:
                for device in state["devices"]:
                    if self._driver(state, device) is None and self._matches(state, name, device):
                        self._probe(state, name, device)

    def unload_driver(self, name: str) -> None:
        """``rmmod``: the driver lets every device it holds go, and its folder disappears."""
        with self._changing() as state:
            if name not in state["drivers"]:
                raise ValueError(f"driver {name} is not loaded on bus {self.bus}")
            for device in state["devices"]:
                if self._driver(state, device) == name:
                    self._detach(state, device)
            shutil.rmtree(self.bus_dir / "drivers" / name)
            del state["drivers"][name]

    def fail_probe(self, driver: str, device: str, code: str | None = "EINVAL") -> None:
        """Make ``driver``'s probe of ``device`` fail with errno ``code`` (its name); ``None`` heals it."""
        with self._changing() as state:
            errors = state["drivers"][driver]["probe_errors"]
            if code is None:
                errors.pop(device, None)
            else:
                errors[device] = getattr(errno, code)

    def set_busy(self, device: str, busy: bool = True) -> None:
        """Make ``unbind`` of the device fail with ``EBUSY`` (user space holds it open), or stop doing so."""
        with self._changing() as state:
            self._known(state, device)["busy"] = busy

    def set_autoprobe(self, enabled: bool) -> None:
        """``drivers_autoprobe``, as an admin writing it."""
        self.write_text(self.bus_dir / "drivers_autoprobe", "1" if enabled else "0")

    # --- what tests ask ---------------------------------------------------------------------------------

    def devices(self) -> list[str]:
        """The devices on the bus, sorted."""
        return sorted(self._state()["devices"])

    def driver_of(self, device: str) -> str | None:
        """The driver holding the device (``None``: none)."""
        state = self._state()
        self._known(state, device)
        return self._driver(state, device)

    def override_of(self, device: str) -> str | None:
        """The device's ``driver_override`` (``None`` when unset or the bus has none)."""
        state = self._state()
        self._known(state, device)
        return self._override(state, device)

    def node(self, device: str) -> Path | None:
        """The node the device's driver made for it (``None``: no driver, or one that makes none)."""
        state = self._state()
        driver = self._driver(state, device)
        return self._node(state, driver, device) if driver is not None else None

    def writes(self) -> list[tuple[str, str]]:
        """Every write to the bus's files (from any process), as (path under the sysfs root, data)."""
        return [(path, data) for path, data in self._state()["writes"]]

    # --- SysfsAccess ------------------------------------------------------------------------------------

    def write_text(self, path: Path, data: str) -> None:
        """A write as the kernel applies it (module docstring); other attributes as :class:`SysfsFiles`."""
        real = Path(os.path.realpath(path))
        if not real.is_file():
            raise FileNotFoundError(errno.ENOENT, "open to write: No such file or directory", str(path))
        with self._changing() as state:
            what = self._what(state, real)
            if what is None:
                return super().write_text(path, data)
            state["writes"].append([str(real.relative_to(os.path.realpath(self._sys))), data])
            # bus_find_device_by_name and the stores compare with sysfs_streq: one trailing newline is ignored
            value = data[:-1] if data.endswith("\n") else data
            kind, target = what
            if kind == "bind":
                self._bind(state, target, value, path)
            elif kind == "unbind":
                self._unbind(state, target, value, path)
            elif kind == "probe":
                if value not in state["devices"]:
                    raise _error(errno.ENODEV, value, path)
                self._attach(state, value)
            elif kind == "autoprobe":
                state["autoprobe"] = value.strip() not in ("0", "")
                _put(real, "1" if state["autoprobe"] else "0", writable=True)
            else:
                if len(data) >= _OVERRIDE_MAX:
                    raise _error(errno.E2BIG, value[:40], path)
                _put(real, value or _UNSET, writable=True)
        return None

    # --- the kernel's side ------------------------------------------------------------------------------

    def _what(self, state: dict[str, Any], real: Path) -> tuple[str, str] | None:
        """Which of the bus's files ``real`` is: ("bind"|"unbind", driver), ("probe"|"autoprobe", ""),
        ("override", device), or ``None``."""
        bus = Path(os.path.realpath(self.bus_dir))
        if real == bus / "drivers_probe":
            return ("probe", "")
        if real == bus / "drivers_autoprobe":
            return ("autoprobe", "")
        if real.parent.parent == bus / "drivers" and real.name in ("bind", "unbind"):
            return (real.name, real.parent.name)
        if real.name == "driver_override" and state["overrides"]:
            for device in state["devices"]:
                if Path(os.path.realpath(self._folder(state, device))) == real.parent:
                    return ("override", device)
        return None

    def _bind(self, state: dict[str, Any], driver: str, device: str, path: Path) -> None:
        """``bind_store``: ENODEV unless the device exists and the driver matches it; EBUSY when bound."""
        if device not in state["devices"] or not self._matches(state, driver, device):
            raise _error(errno.ENODEV, device, path)
        if self._driver(state, device) is not None:
            raise _error(errno.EBUSY, device, path)
        code = self._probe(state, driver, device)
        if code:
            raise _error(code, device, path)

    def _unbind(self, state: dict[str, Any], driver: str, device: str, path: Path) -> None:
        """``unbind_store``: ENODEV unless the device is bound to this driver."""
        if device not in state["devices"] or self._driver(state, device) != driver:
            raise _error(errno.ENODEV, device, path)
        if state["devices"][device]["busy"]:
            raise _error(errno.EBUSY, device, path)
        self._detach(state, device)

    def _matches(self, state: dict[str, Any], driver: str, device: str) -> bool:
        """``driver_match_device``: the override alone decides when set; else the driver's patterns."""
        override = self._override(state, device)
        if override is not None:
            return override == driver
        return any(fnmatch.fnmatchcase(device, p) for p in state["drivers"][driver]["matches"])

    def _probe(self, state: dict[str, Any], driver: str, device: str) -> int:
        """The driver's probe: 0 and the device is bound, or the errno it failed with."""
        code = int(state["drivers"][driver]["probe_errors"].get(device, 0))
        if code:
            return code
        folder = self._folder(state, device)
        _link(folder / "driver", self.bus_dir / "drivers" / driver)
        _link(self.bus_dir / "drivers" / driver / device, folder)
        node = self._node(state, driver, device)
        if node is not None:
            node.parent.mkdir(parents=True, exist_ok=True)
            make_char_device(node)
        return 0

    def _attach(self, state: dict[str, Any], device: str) -> None:
        """``device_attach``: the first matching driver whose probe succeeds takes it; failures are silent."""
        if self._driver(state, device) is not None:
            return
        for driver in state["drivers"]:
            if self._matches(state, driver, device) and self._probe(state, driver, device) == 0:
                return

    def _detach(self, state: dict[str, Any], device: str) -> None:
        driver = self._driver(state, device)
        if driver is None:
            return
        node = self._node(state, driver, device)
        if node is not None:
            with contextlib.suppress(FileNotFoundError):
                node.unlink()
        (self._folder(state, device) / "driver").unlink()
        with contextlib.suppress(FileNotFoundError):
            (self.bus_dir / "drivers" / driver / device).unlink()

    def _driver(self, state: dict[str, Any], device: str) -> str | None:
        link = self._folder(state, device) / "driver"
        return os.path.basename(os.readlink(link)) if link.is_symlink() else None

    def _override(self, state: dict[str, Any], device: str) -> str | None:
        if not state["overrides"]:
            return None
        value = (self._folder(state, device) / "driver_override").read_text().rstrip("\n")
        return None if value in ("", _UNSET) else value

    def _node(self, state: dict[str, Any], driver: str, device: str) -> Path | None:
        pattern = state["drivers"].get(driver, {}).get("node")
        return self._dev / pattern.format(name=device) if pattern else None

    def _folder(self, state: dict[str, Any], device: str) -> Path:
        return self._sys / str(state["devices"][device]["folder"])

    def _known(self, state: dict[str, Any], device: str) -> dict[str, Any]:
        try:
            entry: dict[str, Any] = state["devices"][device]
        except KeyError:
            raise KeyError(f"no device {device} on bus {self.bus} in the model") from None
        return entry

    # --- the state, shared through files ----------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        try:
            state: dict[str, Any] = json.loads(self._state_file.read_text())
        except FileNotFoundError:
            return {}
        return state

    @contextlib.contextmanager
    def _changing(self) -> Iterator[dict[str, Any]]:
        """The state under the model's lock file, saved (atomically) when the block ends, also on an error:
        the tree may have changed before it."""
        with open(self._control / f"bus-{self.bus}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = self._state()
            try:
                yield state
            finally:
                scratch = self._state_file.with_name(self._state_file.name + ".new")
                scratch.write_text(json.dumps(state))
                os.replace(scratch, self._state_file)
