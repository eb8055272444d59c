"""A model of the Linux kernel's FPGA Device Feature List (DFL) sysfs, device nodes and ioctls.

For testing FPGA drivers (devplug-fpga, third-party ones) without an FPGA.
:class:`DflModel` keeps the whole machine as real files in a folder, so the
state it describes is shared by every process that opens the same folder: a
test builds cards and injects faults in its own process, while the daemon
under test (a child process) reads sysfs and issues ioctls through its own
:class:`DflModel` on the same folder. Nothing is held in memory.

Layout under ``root`` (as on a host, where ``sys/`` is ``/sys`` and ``dev/`` is ``/dev``)::

    sys/devices/pci0000:00/<pci address>/fpga_region/region<R>/   the card's base region
        dfl-fme.<N>/       ports_num, bitstream_id, bitstream_metadata, dev, errors/, hwmon/hwmon<K>/
            dfl-fme-region.<P>/fpga_region/region<S>/   one PR region per port (no feature devices)
        dfl-port.<M>/      id, afu_id, power_state, dev, errors/
    sys/class/fpga_region/region<R>      -> the region folders above (base and PR regions)
    sys/bus/platform/devices/dfl-fme.<N> -> the FME folder (dfl-port.<M> likewise)
    dev/dfl-fme.<N>, dev/dfl-port.<M>    the character devices
    model/                               fault injections and the ioctl log (not part of the kernel)

What it models, and where the kernel says so (``sysfs-platform-dfl-fme`` and
``sysfs-platform-dfl-port`` are in ``Documentation/ABI/testing/``; ``dfl.rst`` is
``Documentation/fpga/dfl.rst``; the ioctls are ``include/uapi/linux/fpga-dfl.h``):

* Enumeration (dfl.rst, "Device enumeration"): every card is a base FPGA region
  under ``/sys/class/fpga_region/`` holding one ``dfl-fme.n`` and its
  ``dfl-port.m`` children; regions without feature devices (the PR regions the
  FME creates, ``drivers/fpga/dfl-fme-pr.c``) are not cards. FMEs and ports are
  numbered consecutively across cards. Each has a ``dev`` attribute
  (``major:minor``) naming its device node, a character device (dfl.rst: the
  FME and port character devices) of that number; the model makes it with
  :func:`devplug.testing.devnodes.make_char_device` (a symlink to
  ``/dev/null`` where it may not ``mknod``), so that a container runtime takes it
  as a device. The model never opens it.
* FME attributes (sysfs-platform-dfl-fme): ``ports_num`` (ports on the card),
  ``bitstream_id`` (the static region's ID, ``0x%llx``), ``bitstream_metadata``;
  ``errors/{fme_errors,pcie0_errors,pcie1_errors,nonfatal_errors,catfatal_errors}``
  read as ``0x%llx``; writing the value read back to ``fme_errors``,
  ``pcie0_errors`` or ``pcie1_errors`` clears it, another value is ``EINVAL``;
  ``nonfatal_errors`` and ``catfatal_errors`` are read-only. ``hwmon/hwmonX`` of
  name ``dfl_fme_thermal`` has ``temp1_input``, ``temp1_max``, ``temp1_crit`` in
  millidegrees Celsius (read-only); ``dfl_fme_power`` has ``power1_input`` (uW)
  and the writable ``power1_max`` (uW, rounded down to whole watts and clamped
  to 0-127 W).
* Port attributes (sysfs-platform-dfl-port): ``id`` (the port's number on its
  card, the ``port_id`` of a PR), ``afu_id`` (the programmed PR bitstream's
  UUID, 32 hex digits), ``power_state``; ``errors/errors`` reads ``0x%llx``,
  writing the value read clears it, another value is ``EINVAL``.
* Opening a device node (dfl.rst, "FIU - FME" and "AFU"): exclusive; while
  another user holds it (:meth:`DflModel.hold_open`) the open fails with ``EBUSY``.
  A node that is gone is ``ENOENT``. Read-only attributes refuse writes with
  ``EACCES``, as sysfs does for attributes without a store method.
* ``DFL_FPGA_GET_API_VERSION`` (fpga-dfl.h): returns ``DFL_FPGA_API_VERSION``, 0.
* ``DFL_FPGA_FME_PORT_PR`` on an FME (fpga-dfl.h; ``dfl-fme-pr.c``, ``fme_pr``):
  takes ``struct dfl_fpga_fme_port_pr`` (``argsz``, ``flags``, ``port_id``,
  ``buffer_size``, ``buffer_address``; 24 bytes). ``argsz`` below 24 or non-zero
  ``flags`` is ``EINVAL``; a ``port_id`` at or above ``ports_num`` is ``EINVAL``;
  the buffer is read from the caller's memory (this process's, as the kernel
  copies it from user space). A bitstream the hardware rejects is ``EIO``
  ("the HW has detected some errors during PR"). After a successful PR the port's
  ``afu_id`` is the new bitstream's ID. The model's hardware reads that ID from
  the image itself, which must begin with the line
  ``DFL-MODEL-IMAGE afu_id=<32 hex digits>`` (:func:`model_image` writes one);
  a real PR bitstream carries its AFU ID in the same way in hardware.
* ``DFL_FPGA_PORT_RESET`` on a port (fpga-dfl.h; dfl.rst): resets the port and
  its AFU; the programmed ``afu_id`` stays. Recorded in the ioctl log.

Fault injections (files in ``model/``, usable from any process): a PR that fails
with a chosen errno (:meth:`DflModel.fail_pr`), a PR that blocks while a hold
file exists (:meth:`DflModel.hold_pr`, standing for a slow PR, of every port or
of some), a busy node, errors and temperatures set directly (:meth:`set_error`, :meth:`set_temperature`),
a node removed, a card hot-removed (:meth:`remove_card`). Every ioctl that
reached the hardware is logged (:meth:`ioctl_log`).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devplug.atomic import write_atomic
from devplug.testing.devnodes import make_char_device
from devplug.testing.sysfsfiles import SysfsFiles

__all__ = [
    "DFL_FPGA_FME_PORT_PR",
    "DFL_FPGA_GET_API_VERSION",
    "DFL_FPGA_PORT_RESET",
    "PORT_PR_STRUCT",
    "DflModel",
    "ModelCard",
    "model_image",
]

# include/uapi/linux/fpga-dfl.h: _IO(DFL_FPGA_MAGIC 0xB6, base + n), i.e. (0xB6 << 8) | nr.
_MAGIC = 0xB6
DFL_FPGA_GET_API_VERSION = (_MAGIC << 8) | 0x00
DFL_FPGA_PORT_RESET = (_MAGIC << 8) | 0x40
DFL_FPGA_FME_PORT_PR = (_MAGIC << 8) | 0x80
#: struct dfl_fpga_fme_port_pr: __u32 argsz, flags, port_id, buffer_size; __u64 buffer_address.
PORT_PR_STRUCT = struct.Struct("=IIIIQ")

_NAMES = {
    DFL_FPGA_GET_API_VERSION: "DFL_FPGA_GET_API_VERSION",
    DFL_FPGA_PORT_RESET: "DFL_FPGA_PORT_RESET",
    DFL_FPGA_FME_PORT_PR: "DFL_FPGA_FME_PORT_PR",
}
_IMAGE_HEADER = re.compile(rb"^DFL-MODEL-IMAGE afu_id=([0-9a-f]{32})\n")
_CLEARABLE_FME_ERRORS = ("fme_errors", "pcie0_errors", "pcie1_errors")
_READONLY_FME_ERRORS = ("nonfatal_errors", "catfatal_errors", "first_error", "next_error")
_DFL_MAJOR = 240


def model_image(path: Path, afu_id: str, payload: bytes = b"\0" * 60) -> Path:
    """Write a bitstream the model's hardware accepts, whose AFU ID is ``afu_id`` (32 hex digits)."""
    afu = afu_id.lower().replace("-", "")
    if not re.fullmatch(r"[0-9a-f]{32}", afu):
        raise ValueError(f"afu_id must be 32 hex digits, got {afu_id!r}")
    path.write_bytes(b"DFL-MODEL-IMAGE afu_id=" + afu.encode() + b"\n" + payload)
    return path


@dataclass(frozen=True)
class ModelCard:
    """One card of the model: its PCI address, FME and ports (device names), base region folder."""

    address: str
    fme: str
    ports: tuple[str, ...]
    region: Path


class DflModel(SysfsFiles):
    """The DFL part of a machine, as files under ``root`` (see the module docstring).

    Implements the FPGA driver's door: the :class:`devplug.host.sysfs.SysfsAccess`
    reads, ``write_text`` with the kernel's effects, ``resolve`` and ``ioctl``.
    """

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self._control = self.root / "model"
        for folder in (self._sys / "class/fpga_region", self._sys / "bus/platform/devices", self._dev, self._control):
            folder.mkdir(parents=True, exist_ok=True)

    # --- the door: reads ------------------------------------------------------------

    def writable(self, path: Path) -> bool:
        """True for the attributes the model accepts writes to (``errors``, ``power1_max``: mode 0644 on a host)."""
        real = self.resolve(path)
        name, parent = real.name, real.parent.name
        clearable = parent == "errors" and (name in _CLEARABLE_FME_ERRORS or name == "errors")
        return real.is_file() and (clearable or name == "power1_max")

    def resolve(self, path: Path) -> Path:
        """The path with every symlink followed."""
        return Path(os.path.realpath(path))

    # --- the door: writes --------------------------------------------------------------

    def write_text(self, path: Path, data: str) -> None:
        """A sysfs write with the documented effect (errors cleared, power threshold set)."""
        real = self.resolve(path)
        if not real.is_file():
            raise FileNotFoundError(errno.ENOENT, "open to write: No such file or directory", str(path))
        name, parent = real.name, real.parent.name
        if parent == "errors" and (name in _CLEARABLE_FME_ERRORS or name == "errors"):
            current = real.read_text().strip()
            try:
                value = int(data.strip(), 0)
            except ValueError:
                raise OSError(errno.EINVAL, "write: Invalid argument", str(path)) from None
            if value != int(current, 0):
                raise OSError(errno.EINVAL, "write: Invalid argument (not the error code read)", str(path))
            _put(real, "0x0")
            return
        if name == "power1_max":
            try:
                microwatts = int(data.strip(), 0)
            except ValueError:
                raise OSError(errno.EINVAL, "write: Invalid argument", str(path)) from None
            watts = min(max(microwatts // 1_000_000, 0), 127)
            _put(real, str(watts * 1_000_000))
            return
        raise PermissionError(errno.EACCES, "open to write: Permission denied (read-only attribute)", str(path))

    # --- the door: ioctls ------------------------------------------------------------------

    def ioctl(self, node: Path, request: int, arg: bytes | None = None) -> int:
        """``open(node)``, ``ioctl(fd, request, arg)``, ``close``, with the kernel's checks and effects."""
        name = Path(node).name
        if not Path(node).exists():
            raise FileNotFoundError(errno.ENOENT, "open: No such file or directory", str(node))
        if (self._control / f"busy.{name}").exists():
            raise OSError(errno.EBUSY, "open: Device or resource busy (opened by another user)", str(node))
        if request == DFL_FPGA_GET_API_VERSION:
            return 0
        if request == DFL_FPGA_PORT_RESET and name.startswith("dfl-port."):
            self._log({"node": name, "ioctl": _NAMES[request]})
            return 0
        if request == DFL_FPGA_FME_PORT_PR and name.startswith("dfl-fme."):
            self._port_pr(Path(node), arg or b"")
            return 0
        raise OSError(errno.ENOTTY, f"ioctl {request:#x}: not modelled for {name}", str(node))

    def _port_pr(self, node: Path, arg: bytes) -> None:
        fme = node.name
        if len(arg) < PORT_PR_STRUCT.size:
            raise OSError(errno.EFAULT, "DFL_FPGA_FME_PORT_PR: Bad address (short argument)", str(node))
        argsz, flags, port_id, size, address = PORT_PR_STRUCT.unpack_from(arg)
        if argsz < PORT_PR_STRUCT.size or flags:
            raise OSError(errno.EINVAL, "DFL_FPGA_FME_PORT_PR: Invalid argument (argsz or flags)", str(node))
        fme_dir = self.resolve(self._sys / "bus/platform/devices" / fme)
        if port_id >= int((fme_dir / "ports_num").read_text()):
            raise OSError(errno.EINVAL, f"DFL_FPGA_FME_PORT_PR: Invalid argument (no port {port_id})", str(node))
        image = ctypes.string_at(address, size) if size else b""
        hold = self._control / "pr-hold"
        if self._held(hold, f"{fme}.{port_id}"):  # a slow PR; a test removes the file, or kills the process
            waiting = self._control / f"pr-waiting.{fme}.{port_id}"
            waiting.write_text(str(os.getpid()))
            try:
                while self._held(hold, f"{fme}.{port_id}"):
                    time.sleep(0.01)
            finally:
                waiting.unlink(missing_ok=True)
        port = self._port_of(fme_dir, port_id)
        failure = self._control / f"pr-fail.{fme}"
        match = _IMAGE_HEADER.match(image)
        entry: dict[str, Any] = {"node": fme, "ioctl": _NAMES[DFL_FPGA_FME_PORT_PR], "port_id": port_id}
        if failure.exists() or match is None:
            code = errno.errorcode.get(errno.EIO, "EIO")
            if failure.exists():
                code = failure.read_text().strip() or code
            entry["error"] = code
            self._log(entry)
            if port is not None:  # a failed PR leaves the region unusable: no AFU answers
                _put(port / "afu_id", "0" * 32)
            number = getattr(errno, code, errno.EIO)
            raise OSError(number, f"DFL_FPGA_FME_PORT_PR: {os.strerror(number)}", str(node))
        afu_id = match.group(1).decode()
        if port is not None:
            _put(port / "afu_id", afu_id)
        entry["afu_id"] = afu_id
        self._log(entry)

    def _port_of(self, fme_dir: Path, port_id: int) -> Path | None:
        for entry in sorted(fme_dir.parent.iterdir()):
            if entry.name.startswith("dfl-port.") and int((entry / "id").read_text()) == port_id:
                return entry
        return None

    def _log(self, entry: dict[str, Any]) -> None:
        with open(self._control / "ioctls.jsonl", "a") as handle:
            handle.write(json.dumps(entry) + "\n")

    # --- building the machine -----------------------------------------------------------------

    def cards(self) -> list[ModelCard]:
        """The cards present, in order of their FME numbers."""
        found = []
        for region in sorted((self._sys / "class/fpga_region").iterdir()):
            folder = self.resolve(region)
            if not folder.exists():
                continue
            names = sorted(p.name for p in folder.iterdir())
            fmes = [n for n in names if n.startswith("dfl-fme.")]
            if fmes:
                ports = tuple(n for n in names if n.startswith("dfl-port."))
                found.append(ModelCard(folder.parent.parent.name, fmes[0], ports, folder))
        return sorted(found, key=lambda c: int(c.fme.split(".")[1]))

    def add_card(
        self,
        address: str,
        *,
        ports: int = 2,
        bitstream_id: str = "0x23000410010309",
        afu_id: str = "0" * 32,
        temperature_mc: int = 45000,
    ) -> ModelCard:
        """Plug a card in: its base region, FME (with thermal and power hwmon), ``ports`` ports."""
        cards = self.cards()
        fme_n = 1 + max((int(c.fme.split(".")[1]) for c in cards), default=-1)
        port_n = 1 + max((int(p.split(".")[1]) for c in cards for p in c.ports), default=-1)
        regions = self._sys / "class/fpga_region"
        region_n = 1 + max((int(r.name[len("region") :]) for r in regions.iterdir()), default=-1)
        pci = self._sys / "devices/pci0000:00" / address
        base = pci / "fpga_region" / f"region{region_n}"
        fme = base / f"dfl-fme.{fme_n}"
        _attrs(
            fme,
            {
                "ports_num": str(ports),
                "bitstream_id": bitstream_id,
                "bitstream_metadata": "0x1201a00e3",
                "dev": f"{_DFL_MAJOR}:{fme_n}",
                "errors/fme_errors": "0x0",
                "errors/pcie0_errors": "0x0",
                "errors/pcie1_errors": "0x0",
                "errors/nonfatal_errors": "0x0",
                "errors/catfatal_errors": "0x0",
                "errors/first_error": "0x0",
                "errors/next_error": "0x0",
                f"hwmon/hwmon{2 * fme_n}/name": "dfl_fme_thermal",
                f"hwmon/hwmon{2 * fme_n}/temp1_input": str(temperature_mc),
                f"hwmon/hwmon{2 * fme_n}/temp1_max": "90000",
                f"hwmon/hwmon{2 * fme_n}/temp1_crit": "100000",
                f"hwmon/hwmon{2 * fme_n + 1}/name": "dfl_fme_power",
                f"hwmon/hwmon{2 * fme_n + 1}/power1_input": "40000000",
                f"hwmon/hwmon{2 * fme_n + 1}/power1_max": "127000000",
            },
        )
        _link(self._sys / "bus/platform/devices" / fme.name, fme)
        _link(regions / base.name, base)
        self._make_node(fme.name, f"{_DFL_MAJOR}:{fme_n}")
        names = []
        for i in range(ports):
            port = base / f"dfl-port.{port_n + i}"
            _attrs(
                port,
                {
                    "id": str(i),
                    "afu_id": afu_id,
                    "power_state": "0",
                    "dev": f"{_DFL_MAJOR + 1}:{port_n + i}",
                    "errors/errors": "0x0",
                    "errors/first_error": "0x0",
                    "errors/first_malformed_req": "0x0",
                },
            )
            _link(self._sys / "bus/platform/devices" / port.name, port)
            self._make_node(port.name, f"{_DFL_MAJOR + 1}:{port_n + i}")
            pr_region = fme / f"dfl-fme-region.{port_n + i}" / "fpga_region" / f"region{region_n + 1 + i}"
            pr_region.mkdir(parents=True)
            _link(regions / pr_region.name, pr_region)
            names.append(port.name)
        return ModelCard(address, fme.name, tuple(names), base)

    def card(self, address: str) -> ModelCard:
        """The card at ``address``."""
        for card in self.cards():
            if card.address == address:
                return card
        raise KeyError(f"no card at {address}")

    def remove_card(self, address: str) -> None:
        """Hot-removal: the card's folders, links and device nodes disappear."""
        card = self.card(address)
        names = [card.fme, *card.ports]
        for link in (self._sys / "class/fpga_region").iterdir():
            if str(self.resolve(link)).startswith(str(card.region)):
                link.unlink()
        for name in names:
            (self._sys / "bus/platform/devices" / name).unlink(missing_ok=True)
            (self._dev / name).unlink(missing_ok=True)
        shutil.rmtree(self._sys / "devices/pci0000:00" / address)

    def remove_node(self, name: str) -> None:
        """Delete ``/dev/<name>`` (a device node gone while sysfs stays)."""
        (self._dev / name).unlink()

    def restore_node(self, name: str) -> None:
        """Put ``/dev/<name>`` back (the number its ``dev`` attribute names)."""
        self._make_node(name, self.attribute(name, "dev").read_text().strip())

    def _make_node(self, name: str, number: str) -> None:
        """``/dev/<name>``: the character device ``major:minor``."""
        major, minor = (int(part) for part in number.split(":"))
        make_char_device(self._dev / name, (major, minor))

    def attribute(self, name: str, attr: str) -> Path:
        """The path of ``attr`` of the FME or port ``name`` (e.g. ``dfl-port.0``, ``afu_id``)."""
        return self.resolve(self._sys / "bus/platform/devices" / name) / attr

    def afu_id(self, port: str) -> str:
        """The port's ``afu_id``."""
        return self.attribute(port, "afu_id").read_text().strip()

    def set_afu_id(self, port: str, afu_id: str) -> None:
        """Program the port behind the driver's back (a tenant that reprogrammed its region)."""
        _put(self.attribute(port, "afu_id"), afu_id)

    def set_error(self, name: str, file: str, value: int) -> None:
        """Make the hardware report errors in ``errors/<file>`` of the FME or port ``name``."""
        _put(self.attribute(name, f"errors/{file}"), f"{value:#x}")

    def set_temperature(self, fme: str, millidegrees: int) -> None:
        """The card's thermal sensor reading (``temp1_input``)."""
        hwmon = self.attribute(fme, "hwmon")
        for entry in sorted(hwmon.iterdir()):
            if (entry / "name").read_text().strip() == "dfl_fme_thermal":
                _put(entry / "temp1_input", str(millidegrees))

    def power_max(self, fme: str) -> int:
        """The card's ``power1_max`` (uW)."""
        hwmon = self.attribute(fme, "hwmon")
        for entry in sorted(hwmon.iterdir()):
            if (entry / "name").read_text().strip() == "dfl_fme_power":
                return int((entry / "power1_max").read_text())
        raise KeyError(f"{fme} has no power hwmon")

    # --- fault injection and observation ---------------------------------------------------------

    def fail_pr(self, fme: str, code: str = "EIO") -> None:
        """Make every PR through ``fme`` fail with errno ``code`` (leaving the region without an AFU)."""
        (self._control / f"pr-fail.{fme}").write_text(code)

    def hold_pr(self, *ports: str) -> None:
        """Make PRs block until :meth:`release_pr` (or until the process is killed): those of ``ports``
        (``<fme>.<port_id>``, as :meth:`pr_waiting` names them), or every PR when none is named."""
        (self._control / "pr-hold").write_text("".join(f"{p}\n" for p in ports))

    @staticmethod
    def _held(hold: Path, port: str) -> bool:
        try:
            named = hold.read_text().split()
        except FileNotFoundError:
            return False
        return not named or port in named

    def pr_waiting(self) -> list[str]:
        """The PRs held by :meth:`hold_pr` right now, as ``<fme>.<port_id>`` (a killed caller leaves its entry)."""
        return sorted(p.name[len("pr-waiting.") :] for p in self._control.glob("pr-waiting.*"))

    def release_pr(self) -> None:
        """Let held PRs finish."""
        (self._control / "pr-hold").unlink(missing_ok=True)

    def hold_open(self, name: str, held: bool = True) -> None:
        """Another user holds the node open (exclusive open: the driver's opens get ``EBUSY``)."""
        path = self._control / f"busy.{name}"
        if held:
            path.write_text("")
        else:
            path.unlink(missing_ok=True)

    def ioctl_log(self) -> list[dict[str, Any]]:
        """Every ioctl that reached the hardware, oldest first."""
        try:
            text = (self._control / "ioctls.jsonl").read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def programs(self, port_id: int | None = None, fme: str | None = None) -> list[dict[str, Any]]:
        """The PRs logged (successful or not), optionally of one FME and port number."""
        return [
            e
            for e in self.ioctl_log()
            if e["ioctl"] == "DFL_FPGA_FME_PORT_PR"
            and (fme is None or e["node"] == fme)
            and (port_id is None or e["port_id"] == port_id)
        ]


def _put(path: Path, value: str) -> None:
    """Change an attribute's content atomically (a reader in another process sees old or new)."""
    write_atomic(path, (value + "\n").encode(), mode=0o644)


def _attrs(folder: Path, values: dict[str, str]) -> None:
    for rel, value in values.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(target, link.parent))
