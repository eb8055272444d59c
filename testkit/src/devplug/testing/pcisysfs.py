"""A model of the Linux kernel's PCI sysfs, for testing drivers that bind and unbind devices.

:class:`PciSysfsModel` lays out a tree of real files and symlinks in a
folder, shaped like the kernel's (``bus/pci/devices/<addr>`` links to
``devices/pci0000:00/<addr>``, which holds ``vendor``, ``device``, ``class``,
``numa_node``, ``driver_override`` and the ``iommu_group`` and ``driver``
links; ``bus/pci/drivers/<name>/{bind,unbind,new_id,remove_id}``;
``bus/pci/drivers_probe``; ``kernel/iommu_groups/<n>/devices``; and a dev
root with ``vfio/vfio`` and ``vfio/<group>``). It implements
:class:`devplug.host.sysfs.SysfsAccess`: reads see the files, and every write is
applied synchronously with the effect the kernel documents, after which the
tree is redrawn. A driver under test gets the model where it would get a
:class:`devplug.host.sysfs.HostSysfs`.

What it models, and where the kernel says so (``sysfs-bus-pci`` is
``Documentation/ABI/testing/sysfs-bus-pci``):

* ``driver_override`` (sysfs-bus-pci, "driver_override"): when set, only the
  driver of that name may bind the device; an empty write (or a lone newline)
  clears it; it reads ``(null)`` when unset. Writing it never unbinds nor
  probes by itself.
* ``drivers/<name>/unbind`` (sysfs-bus-pci, ".../unbind"): writing a device's
  address detaches it from that driver: its ``driver`` link and the driver's
  link to it disappear. ``ENODEV`` when the device is not bound to that driver.
* ``drivers/<name>/bind`` (sysfs-bus-pci, ".../bind"): the driver attempts to
  bind the address. It must match the device (its ``driver_override``, or its
  static or dynamic ID table): ``ENODEV`` otherwise; ``EBUSY`` when the device
  already has a driver; a failing probe returns the probe's error.
* ``drivers_probe`` (``drivers/base/bus.c``, ``drivers_probe_store``): writing
  an address makes the driver core look for a driver for it, if it has none.
  ``ENODEV`` for an unknown address. A probe that fails is *not* reported: the
  write succeeds and no ``driver`` link appears, which is how a bind to
  vfio-pci without an IOMMU looks on a real kernel.
* ``drivers/<name>/new_id`` (sysfs-bus-pci, ".../new_id"): adds a dynamic
  ``VVVV DDDD`` ID and probes unbound matching devices (modelled so tests can
  see a driver that uses it; drivers should prefer ``driver_override``).
* ``remove`` (sysfs-bus-pci, ".../remove") and :meth:`PciSysfsModel.remove_device`:
  hot-removal; the device, its links and its group membership disappear.
  ``bus/pci/rescan`` (sysfs-bus-pci, "/sys/bus/pci/rescan") re-discovers
  removed devices: they come back fresh (no ``driver_override``) and are probed.
* ``numa_node`` (sysfs-bus-pci, ".../numa_node"): the node, ``-1`` when unknown.
* IOMMU groups (``Documentation/ABI/testing/sysfs-kernel-iommu_groups``):
  ``kernel/iommu_groups/<n>/devices`` links the group's devices, and each
  device has an ``iommu_group`` link. Without an IOMMU the folder is empty and
  the links are absent.
* vfio-pci (``Documentation/driver-api/vfio.rst``; ``drivers/vfio/pci/vfio_pci.c``):
  its ID table is empty, so it binds only through ``driver_override`` or
  ``new_id``; its probe fails with ``EINVAL`` for a device without an IOMMU
  group or that is not a normal (type 0 header) function, such as a bridge.
  ``/dev/vfio/<group>`` exists while at least one device of the group is bound
  to vfio-pci (the vfio group is created by the first device registered in
  it; the group is only *usable* once every member is bound to vfio-pci or
  left without a driver). ``/dev/vfio/vfio`` exists while vfio is loaded.
  Both are character devices (vfio.rst: the container ``/dev/vfio/vfio`` and
  one group character device per group), and so are the RDMA nodes below;
  the model makes them with :func:`devplug.testing.devnodes.make_char_device`,
  numbered as ``/dev/null`` (the group numbers are dynamic in the kernel, and
  nothing reads them), so that a container runtime takes them as devices.
* Busy devices: a real unbind of a device that user space holds open blocks
  until it is released (vfio-pci asks the user to release it). A test cannot
  wait forever, so :meth:`PciSysfsModel.set_busy` makes ``unbind`` fail with
  ``EBUSY`` instead: a fault injection standing for that wait.

Shared across processes: with ``state_file``, the model loads its state
from that JSON file when it exists and saves it after every change, so a
daemon under test in a child process (and its successor after a
``kill -9``) sees one machine. One process at a time may change it.


* SR-IOV (:meth:`PciSysfsModel.enable_sriov` gives a physical function the
  capability):

  - ``sriov_totalvfs`` (sysfs-bus-pci, ".../sriov_totalvfs"): read-only, the
    most VFs the PF supports;
  - ``sriov_numvfs`` (sysfs-bus-pci, ".../sriov_numvfs"; errors as
    ``drivers/pci/iov.c``, ``sriov_numvfs_store``): reads the enabled count.
    Writing the current count changes nothing and succeeds; writing 0
    removes every VF; writing N > 0 creates VFs 0..N-1 when none exist. A
    change between two non-zero counts is refused with ``EBUSY`` ("Disable
    before enabling"), a count above ``sriov_totalvfs`` with ``ERANGE``, and
    any write while the PF has no driver with ``ENOENT``;
  - ``virtfn<N>`` on the PF and ``physfn`` on each VF: links between the two
    (``drivers/pci/iov.c``, ``pci_iov_sysfs_link``); a VF's address is the PF's
    routing ID plus ``sriov_offset`` + N x ``sriov_stride``, its device ID
    ``sriov_vf_device``, each VF in an IOMMU group of its own (as QEMU's);
  - ``sriov_drivers_autoprobe`` (sysfs-bus-pci, ".../sriov_drivers_autoprobe"):
    1 (the default) probes drivers for VFs as they are created; 0 leaves new
    VFs without a driver until one is bound explicitly. It applies to VFs
    created after the write.
  - Hot-removing a PF (``remove``): a PF driver that disables SR-IOV in its
    remove callback (igb: ``igb_remove`` calls ``igb_disable_sriov``;
    ``enable_sriov(..., disabled_on_remove=True)``) takes its VFs away with
    it; one that does not (nvme, as QEMU's controller shows) leaves them, and
    the kernel only warns (``drivers/pci/iov.c``, ``pci_iov_remove``: "driver
    left SR-IOV enabled after remove"). A rescan brings the PF back with its
    SR-IOV capability, no VFs and autoprobe 1 (``pci_iov_init`` on the new
    device).
  - Network VFs: with ``netdev`` a PF on a driver shows ``net/<netdev>``, and a
    VF bound to its VF driver shows ``net/<netdev>v<N>``; with ``rdma`` such a
    VF also shows ``infiniband_verbs/uverbs<M>`` and the dev root gets
    ``infiniband/uverbs<M>`` (and ``infiniband/rdma_cm``).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from devplug.host.sysfs import SysfsAccess
from devplug.testing.devnodes import make_char_device
from devplug.testing.sysfsfiles import SysfsFiles

__all__ = [
    "SLOW_UNBIND_FILE",
    "VFIO_PCI",
    "ModelDevice",
    "ModelDriver",
    "ModelSriov",
    "PciSysfsModel",
    "device_attribute",
    "device_driver",
    "device_iommu_group",
    "device_present",
    "driver_on_model",
    "model_options",
    "shared_model",
    "write_device_attribute",
]

VFIO_PCI = "vfio-pci"
_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_BRIDGE_CLASSES = (0x0604, 0x0609)  # PCI-to-PCI and semi-transparent bridges: type 1 headers
_ROOT_BUS = "pci0000:00"


@dataclass
class ModelDriver:
    """A kernel driver of the model: its name and the IDs it matches."""

    name: str
    ids: set[tuple[int, int]] = field(default_factory=set)
    dynamic_ids: set[tuple[int, int]] = field(default_factory=set)

    def matches_ids(self, dev: ModelDevice) -> bool:
        """True when the device's vendor/device pair is in the static or dynamic ID table."""
        pair = (dev.vendor, dev.device)
        return pair in self.ids or pair in self.dynamic_ids


@dataclass
class ModelDevice:
    """A PCI function of the model."""

    address: str
    vendor: int
    device: int
    class_: int
    numa_node: int = -1
    iommu_group: int | None = None
    driver: str | None = None
    driver_override: str | None = None
    busy: bool = False
    sriov: ModelSriov | None = None
    physfn: str | None = None
    vf_index: int | None = None

    netdev_name: str | None = None
    rdma: int | None = None

    @property
    def netdev(self) -> str | None:
        """The network interface the device shows while a (non-vfio) driver holds it, if any."""
        return self.netdev_name if self.driver not in (None, VFIO_PCI) else None

    @property
    def is_bridge(self) -> bool:
        """True for bridges, which have a type 1 header and which vfio-pci refuses."""
        return (self.class_ >> 8) in _BRIDGE_CLASSES


@dataclass
class ModelSriov:
    """The SR-IOV capability of a physical function."""

    total_vfs: int
    vf_device: int
    offset: int = 1
    stride: int = 1
    vf_driver: str | None = None
    netdev: str | None = None
    rdma: bool = False
    autoprobe: bool = True
    vfs: list[str] = field(default_factory=list)
    #: The PF's driver disables SR-IOV when the PF is removed (igb does, nvme does not).
    disabled_on_remove: bool = False


def _device_from_json(data: dict[str, Any]) -> ModelDevice:
    """A device as ``state_file`` keeps it (``asdict``), its SR-IOV capability included."""
    sriov = data.get("sriov")
    return ModelDevice(**{**data, "sriov": ModelSriov(**sriov) if isinstance(sriov, dict) else None})


class PciSysfsModel(SysfsFiles):
    """The kernel's PCI sysfs, as files in a folder, changed by writes as the kernel would.

    ``root`` gets ``sys/`` and ``dev/``; without one a temporary folder is
    made (removed by :meth:`close`). ``iommu`` says whether the machine has an
    IOMMU (groups exist); ``vfio`` whether vfio and vfio-pci are loaded.
    ``state_file``: where the machine's state is kept (see the module's
    docstring); when it exists, ``iommu`` and ``vfio`` are read from it.
    """

    def __init__(
        self, root: Path | None = None, *, iommu: bool = True, vfio: bool = True, state_file: Path | None = None
    ) -> None:
        self._own_root = root is None
        super().__init__(Path(tempfile.mkdtemp(prefix="pcisysfs-")) if root is None else Path(root))
        self._lock = threading.RLock()  # the tree is redrawn in place after every write
        self.iommu = iommu
        self.vfio_loaded = vfio
        self.devices: dict[str, ModelDevice] = {}
        self._removed: dict[str, ModelDevice] = {}
        self.drivers: dict[str, ModelDriver] = {}
        #: Every write made through the model, as (path relative to the sysfs root, data).
        self.writes: list[tuple[str, str]] = []
        self.state_file = state_file
        if state_file is not None and state_file.exists():
            self._load(state_file)
        elif vfio:
            self.drivers[VFIO_PCI] = ModelDriver(VFIO_PCI)
        self._render()

    # --- SysfsAccess -------------------------------------------------------------

    def writable(self, path: Path) -> bool:
        """True for the attributes the model accepts writes to (mode 0644, as sysfs shows them)."""
        with self._lock:
            try:
                return bool(os.stat(path).st_mode & 0o222)
            except OSError:
                return False

    def write_text(self, path: Path, data: str) -> None:
        """Apply a write as the kernel would, then redraw the tree."""
        with self._lock:
            real = Path(os.path.realpath(path))
            if not real.exists():
                raise FileNotFoundError(errno.ENOENT, "open to write: No such file or directory", str(path))
            try:
                rel = real.relative_to(os.path.realpath(self._sys))
            except ValueError:
                raise PermissionError(errno.EACCES, "write outside the model's sysfs", str(path)) from None
            self.writes.append((str(rel), data))
            try:
                self._apply(rel.parts, data, path)
            finally:
                self._render()

    # --- building the machine ----------------------------------------------------

    def add_device(
        self,
        address: str,
        vendor: int,
        device: int,
        class_: int,
        numa_node: int = -1,
        iommu_group: int | None = None,
        driver: str | None = None,
    ) -> ModelDevice:
        """Plug a device in (at set-up, or hot-plug later).

        ``driver`` names the kernel driver whose ID table matches the device
        (loaded if it is not yet); as in the kernel, a device added while a
        matching driver is loaded is probed and bound at once.
        """
        if not _ADDRESS.match(address):
            raise ValueError(f"{address!r} is not a PCI address like 0000:3b:00.0")
        with self._lock:
            if address in self.devices:
                raise ValueError(f"device {address} already exists")
            dev = ModelDevice(address, vendor, device, class_, numa_node, iommu_group)
            self.devices[address] = dev
            if driver is not None:
                self.load_driver(driver, ids=[(vendor, device)])
            self._attach(dev)
            self._render()
            return dev

    def remove_device(self, address: str) -> None:
        """Hot-unplug: the device and every link to it disappear (its driver is released first)."""
        with self._lock:
            self._remove(self._device(address))
            self._render()

    def load_driver(self, name: str, ids: Iterable[tuple[int, int]] = ()) -> ModelDriver:
        """Load a driver (or add IDs to a loaded one); it then binds the unbound devices it matches."""
        with self._lock:
            drv = self.drivers.setdefault(name, ModelDriver(name))
            drv.ids.update(ids)
            for dev in self.devices.values():
                if dev.driver is None and self._matches(drv, dev):
                    self._probe(drv, dev)
            self._render()
            return drv

    def unload_driver(self, name: str) -> None:
        """Unload a driver (``rmmod``): its devices are unbound, its folder disappears."""
        with self._lock:
            if name not in self.drivers:
                raise ValueError(f"driver {name} is not loaded")
            for dev in self.devices.values():
                if dev.driver == name:
                    dev.driver = None
            del self.drivers[name]
            self._render()

    def enable_sriov(
        self,
        address: str,
        total_vfs: int,
        vf_device: int,
        *,
        offset: int = 1,
        stride: int = 1,
        vf_driver: str | None = None,
        netdev: str | None = None,
        rdma: bool = False,
        disabled_on_remove: bool = False,
    ) -> None:
        """Give the physical function at ``address`` the SR-IOV capability (no VF enabled yet).

        ``vf_driver`` names the kernel driver matching the VF ID (loaded if it
        is not); ``netdev`` makes the PF a NIC with that interface name, its
        VFs named ``<netdev>v<N>``; ``rdma`` gives those VFs verbs devices;
        ``disabled_on_remove``: the PF's driver removes its VFs when the PF is removed.
        """
        with self._lock:
            dev = self._device(address)
            dev.sriov = ModelSriov(
                total_vfs, vf_device, offset, stride, vf_driver, netdev, rdma, disabled_on_remove=disabled_on_remove
            )
            dev.netdev_name = netdev
            if vf_driver is not None:
                self.load_driver(vf_driver, ids=[(dev.vendor, vf_device)])
            self._render()

    def numvfs_of(self, address: str) -> int:
        """How many VFs the PF has enabled."""
        with self._lock:
            sriov = self._device(address).sriov
            return len(sriov.vfs) if sriov is not None else 0

    def set_busy(self, address: str, busy: bool = True) -> None:
        """Make ``unbind`` of the device fail with ``EBUSY`` (user space holds it)."""
        with self._lock:
            self._device(address).busy = busy
            self._save()

    def set_iommu(self, enabled: bool) -> None:
        """Switch the IOMMU on or off (as a reboot with or without ``intel_iommu=on`` would)."""
        with self._lock:
            self.iommu = enabled
            self._render()

    def grab(self, address: str, driver: str) -> None:
        """Another agent binds ``driver`` to the device (by hand: unbind, bind), whatever the override."""
        with self._lock:
            dev = self._device(address)
            self.drivers.setdefault(driver, ModelDriver(driver))
            dev.driver = driver
            self._render()

    # --- what tests ask ----------------------------------------------------------

    def driver_of(self, address: str) -> str | None:
        """The device's current driver."""
        with self._lock:
            return self._device(address).driver

    def override_of(self, address: str) -> str | None:
        """The device's ``driver_override`` (``None`` when unset)."""
        with self._lock:
            return self._device(address).driver_override

    def close(self) -> None:
        """Remove the tree, if the model made its own folder."""
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    # --- the kernel's side -------------------------------------------------------

    def _device(self, address: str) -> ModelDevice:
        try:
            return self.devices[address]
        except KeyError:
            raise KeyError(f"no device {address} in the model") from None

    def _group(self, dev: ModelDevice) -> int | None:
        return dev.iommu_group if self.iommu else None

    def _matches(self, drv: ModelDriver, dev: ModelDevice) -> bool:
        """``pci_match_device``: the override alone decides when set; else the ID tables."""
        if dev.driver_override is not None:
            return dev.driver_override == drv.name
        return drv.matches_ids(dev)

    def _probe_error(self, drv: ModelDriver, dev: ModelDevice) -> int:
        """0 when the driver's probe accepts the device, else the errno it fails with."""
        if drv.name == VFIO_PCI and (self._group(dev) is None or dev.is_bridge):
            return errno.EINVAL
        return 0

    def _probe(self, drv: ModelDriver, dev: ModelDevice) -> int:
        err = self._probe_error(drv, dev)
        if err == 0:
            dev.driver = drv.name
        return err

    def _attach(self, dev: ModelDevice) -> None:
        """``device_attach``: the first matching driver whose probe succeeds binds; failures are silent."""
        if dev.driver is not None:
            return
        for drv in self.drivers.values():
            if self._matches(drv, dev) and self._probe(drv, dev) == 0:
                return

    def _remove(self, dev: ModelDevice) -> None:
        """Hot-removal; the device is kept aside, as the hardware is still in its slot for a rescan."""
        if dev.sriov is not None and dev.sriov.disabled_on_remove and dev.driver is not None:
            for address in dev.sriov.vfs:  # the PF driver's remove disables SR-IOV
                vf = self.devices.pop(address, None)
                if vf is not None:
                    vf.driver = None
            dev.sriov.vfs = []
        del self.devices[dev.address]
        self._removed[dev.address] = dev

    def _rescan(self) -> None:
        """``bus/pci/rescan``: removed devices come back as new ones (no override, no driver) and are probed;
        a PF with its SR-IOV capability (no VFs, autoprobe 1) and its interface name."""
        for address, old in sorted(self._removed.items()):
            dev = ModelDevice(address, old.vendor, old.device, old.class_, old.numa_node, old.iommu_group)
            if old.sriov is not None:
                dev.sriov = replace(old.sriov, vfs=[], autoprobe=True)
                dev.netdev_name = old.netdev_name
            self.devices[address] = dev
            self._attach(dev)
        self._removed.clear()

    def _apply(self, parts: tuple[str, ...], data: str, path: Path) -> None:
        value = data.strip()
        if parts == ("bus", "pci", "rescan"):
            if value not in ("", "0"):
                self._rescan()
            return
        if parts == ("bus", "pci", "drivers_probe"):
            dev = self.devices.get(value)
            if dev is None:
                raise OSError(errno.ENODEV, f"write {value!r}: No such device", str(path))
            self._attach(dev)
            return
        if len(parts) == 5 and parts[:3] == ("bus", "pci", "drivers"):
            self._driver_file(self.drivers[parts[3]], parts[4], value, path)
            return
        if (
            len(parts) == 4
            and parts[:2] == ("devices", _ROOT_BUS)
            and parts[3] in ("driver_override", "remove", "numa_node", "sriov_numvfs", "sriov_drivers_autoprobe")
        ):
            self._device_file(self.devices[parts[2]], parts[3], data, path)
            return
        raise PermissionError(errno.EACCES, f"write {value!r}: Permission denied (read-only)", str(path))

    def _driver_file(self, drv: ModelDriver, name: str, value: str, path: Path) -> None:
        if name == "unbind":
            dev = self.devices.get(value)
            if dev is None or dev.driver != drv.name:
                raise OSError(errno.ENODEV, f"write {value!r}: No such device", str(path))
            if dev.busy:
                raise OSError(errno.EBUSY, f"write {value!r}: Device or resource busy", str(path))
            dev.driver = None
        elif name == "bind":
            dev = self.devices.get(value)
            if dev is None or not self._matches(drv, dev):
                raise OSError(errno.ENODEV, f"write {value!r}: No such device", str(path))
            if dev.driver is not None:
                raise OSError(errno.EBUSY, f"write {value!r}: Device or resource busy", str(path))
            err = self._probe(drv, dev)
            if err:
                raise OSError(err, f"write {value!r}: {os.strerror(err)}", str(path))
        elif name in ("new_id", "remove_id"):
            fields = value.split()
            try:
                pair = (int(fields[0], 16), int(fields[1], 16))
            except (IndexError, ValueError):
                raise OSError(errno.EINVAL, f"write {value!r}: Invalid argument", str(path)) from None
            if name == "remove_id":
                if pair not in drv.dynamic_ids:
                    raise OSError(errno.ENODEV, f"write {value!r}: No such device", str(path))
                drv.dynamic_ids.discard(pair)
                return
            if pair in drv.dynamic_ids:
                raise OSError(errno.EEXIST, f"write {value!r}: File exists", str(path))
            drv.dynamic_ids.add(pair)
            for dev in self.devices.values():
                if dev.driver is None and self._matches(drv, dev):
                    self._probe(drv, dev)
        else:
            raise PermissionError(errno.EACCES, f"write {value!r}: Permission denied", str(path))

    def _device_file(self, dev: ModelDevice, name: str, data: str, path: Path) -> None:
        if name == "driver_override":
            if len(data) >= 4096:
                raise OSError(errno.E2BIG, "write: Argument list too long", str(path))
            value = data[:-1] if data.endswith("\n") else data
            dev.driver_override = value or None
        elif name == "remove":
            if data.strip() not in ("", "0"):
                self._remove(dev)
        elif name == "sriov_numvfs":
            self._set_numvfs(dev, data.strip(), path)
        elif name == "sriov_drivers_autoprobe":
            assert dev.sriov is not None
            try:
                dev.sriov.autoprobe = _kstrtobool(data.strip())
            except ValueError:
                raise OSError(errno.EINVAL, f"write {data.strip()!r}: Invalid argument", str(path)) from None
        else:  # numa_node: root may override the firmware's value
            try:
                dev.numa_node = int(data.strip())
            except ValueError:
                raise OSError(errno.EINVAL, f"write {data.strip()!r}: Invalid argument", str(path)) from None

    # --- keeping the state ---------------------------------------------------------

    def _load(self, path: Path) -> None:
        data = json.loads(path.read_text())
        self.iommu = bool(data["iommu"])
        self.vfio_loaded = bool(data["vfio_loaded"])
        self.devices = {d["address"]: _device_from_json(d) for d in data["devices"]}
        self._removed = {d["address"]: _device_from_json(d) for d in data["removed"]}
        self.drivers = {
            d["name"]: ModelDriver(d["name"], {(v, i) for v, i in d["ids"]}, {(v, i) for v, i in d["dynamic_ids"]})
            for d in data["drivers"]
        }

    def _save(self) -> None:
        """Write the state to ``state_file`` (atomically), when there is one."""
        if self.state_file is None:
            return
        data = {
            "iommu": self.iommu,
            "vfio_loaded": self.vfio_loaded,
            "devices": [asdict(d) for d in self.devices.values()],
            "removed": [asdict(d) for d in self._removed.values()],
            "drivers": [
                {"name": d.name, "ids": sorted(d.ids), "dynamic_ids": sorted(d.dynamic_ids)}
                for d in self.drivers.values()
            ],
        }
        temp = self.state_file.with_name(self.state_file.name + ".tmp")
        temp.write_text(json.dumps(data))
        os.replace(temp, self.state_file)

    def _set_numvfs(self, pf: ModelDevice, value: str, path: Path) -> None:
        """``sriov_numvfs_store``: same count is a no-op, 0 disables, otherwise only from 0."""
        sriov = pf.sriov
        assert sriov is not None
        try:
            wanted = int(value, 0)
            if wanted < 0:
                raise ValueError(value)
        except ValueError:
            raise OSError(errno.EINVAL, f"write {value!r}: Invalid argument", str(path)) from None
        if wanted == len(sriov.vfs):
            return
        if pf.driver is None:
            raise OSError(errno.ENOENT, f"write {value!r}: No such file or directory (no driver bound)", str(path))
        if wanted == 0:
            for address in sriov.vfs:
                vf = self.devices.pop(address, None)
                if vf is not None:
                    vf.driver = None
            sriov.vfs = []
            return
        if wanted > sriov.total_vfs:
            raise OSError(errno.ERANGE, f"write {value!r}: Numerical result out of range", str(path))
        if sriov.vfs:
            raise OSError(errno.EBUSY, f"write {value!r}: Device or resource busy", str(path))
        domain, bus, rest = pf.address.split(":")
        slot, function = rest.split(".")
        routing = (int(bus, 16) << 8) | (int(slot, 16) << 3) | int(function)
        next_group = max([d.iommu_group or 0 for d in self.devices.values()] + [-1]) + 1
        next_rdma = max([d.rdma for d in self.devices.values() if d.rdma is not None] + [-1]) + 1
        for index in range(wanted):
            rid = routing + sriov.offset + index * sriov.stride
            address = f"{domain}:{rid >> 8:02x}:{(rid >> 3) & 0x1F:02x}.{rid & 0x7}"
            vf = ModelDevice(address, pf.vendor, sriov.vf_device, pf.class_, pf.numa_node, next_group + index)
            vf.physfn, vf.vf_index = pf.address, index
            if sriov.netdev is not None:
                vf.netdev_name = f"{sriov.netdev}v{index}"
                if sriov.rdma:
                    vf.rdma = next_rdma + index
            self.devices[address] = vf
            sriov.vfs.append(address)
            if sriov.autoprobe:
                self._attach(vf)

    # --- drawing the tree --------------------------------------------------------

    def _render(self) -> None:
        """Redraw ``sys/`` and ``dev/vfio`` from the model's state (and save it, with a ``state_file``)."""
        for top in (self._sys, self._dev):
            if top.exists():
                shutil.rmtree(top)
        devices = self._sys / "devices" / _ROOT_BUS
        bus = self._sys / "bus" / "pci"
        groups = self._sys / "kernel" / "iommu_groups"
        for folder in (devices, bus / "devices", bus / "drivers", groups, self._dev):
            folder.mkdir(parents=True)
        _attr(bus / "drivers_probe", "", writable=True)
        _attr(bus / "drivers_autoprobe", "1", writable=True)
        _attr(bus / "rescan", "", writable=True)
        for drv in self.drivers.values():
            folder = bus / "drivers" / drv.name
            folder.mkdir()
            for name in ("bind", "unbind", "new_id", "remove_id", "uevent"):
                _attr(folder / name, "", writable=True)
        vfio_groups: set[int] = set()
        for dev in self.devices.values():
            folder = devices / dev.address
            folder.mkdir()
            _attr(folder / "vendor", f"0x{dev.vendor:04x}")
            _attr(folder / "device", f"0x{dev.device:04x}")
            _attr(folder / "class", f"0x{dev.class_:06x}")
            _attr(folder / "numa_node", str(dev.numa_node), writable=True)
            _attr(folder / "driver_override", dev.driver_override or "(null)", writable=True)
            _attr(folder / "remove", "", writable=True)
            (bus / "devices" / dev.address).symlink_to(f"../../../devices/{_ROOT_BUS}/{dev.address}")
            self._render_sriov(dev, folder)
            group = self._group(dev)
            if group is not None:
                members = groups / str(group) / "devices"
                members.mkdir(parents=True, exist_ok=True)
                (members / dev.address).symlink_to(f"../../../../devices/{_ROOT_BUS}/{dev.address}")
                (folder / "iommu_group").symlink_to(f"../../../kernel/iommu_groups/{group}")
            if dev.driver is not None:
                (folder / "driver").symlink_to(f"../../../bus/pci/drivers/{dev.driver}")
                link = bus / "drivers" / dev.driver / dev.address
                link.symlink_to(f"../../../../devices/{_ROOT_BUS}/{dev.address}")
                if dev.driver == VFIO_PCI and group is not None:
                    vfio_groups.add(group)
        rdma = [d.rdma for d in self.devices.values() if d.rdma is not None and d.netdev is not None]
        if rdma:
            (self._dev / "infiniband").mkdir()
            make_char_device(self._dev / "infiniband" / "rdma_cm")
            for number in rdma:
                make_char_device(self._dev / "infiniband" / f"uverbs{number}")
        if self.vfio_loaded:
            (self._dev / "vfio").mkdir()
            make_char_device(self._dev / "vfio" / "vfio")
            for group in sorted(vfio_groups):
                make_char_device(self._dev / "vfio" / str(group))
        self._save()

    def _render_sriov(self, dev: ModelDevice, folder: Path) -> None:
        """SR-IOV attributes and links, network interfaces and verbs devices of one device."""
        if dev.sriov is not None:
            sriov = dev.sriov
            _attr(folder / "sriov_totalvfs", str(sriov.total_vfs))
            _attr(folder / "sriov_numvfs", str(len(sriov.vfs)), writable=True)
            _attr(folder / "sriov_offset", str(sriov.offset))
            _attr(folder / "sriov_stride", str(sriov.stride))
            _attr(folder / "sriov_vf_device", f"{sriov.vf_device:x}")
            _attr(folder / "sriov_drivers_autoprobe", "1" if sriov.autoprobe else "0", writable=True)
            for index, address in enumerate(sriov.vfs):
                (folder / f"virtfn{index}").symlink_to(f"../{address}")
        if dev.physfn is not None:
            (folder / "physfn").symlink_to(f"../{dev.physfn}")
        if dev.netdev is not None:
            (folder / "net" / dev.netdev).mkdir(parents=True)
            if dev.rdma is not None:
                (folder / "infiniband_verbs" / f"uverbs{dev.rdma}").mkdir(parents=True)


def _kstrtobool(value: str) -> bool:
    """The kernel's ``kstrtobool``: 1/y/Y/on and 0/n/N/off."""
    if value[:1] in ("1", "y", "Y") or value.lower() == "on":
        return True
    if value[:1] in ("0", "n", "N") or value.lower() == "off":
        return False
    raise ValueError(value)


def _attr(path: Path, content: str, writable: bool = False) -> None:
    """One sysfs attribute: its content and its mode (0644 or 0444)."""
    path.write_text(content + "\n" if content else "")
    path.chmod(0o644 if writable else 0o444)


# --- reading a PCI device as a test does: through any SysfsAccess (the model, or the host's sysfs in a VM) ---------


def device_attribute(sysfs: SysfsAccess, address: str, name: str) -> str:
    """``<sysfs>/bus/pci/devices/<address>/<name>`` as read (stripped)."""
    return sysfs.read_text(sysfs.sysfs_root / "bus/pci/devices" / address / name)


def write_device_attribute(sysfs: SysfsAccess, address: str, name: str, value: str) -> None:
    """Write a device attribute, as an admin would by hand."""
    sysfs.write_text(sysfs.sysfs_root / "bus/pci/devices" / address / name, value)


def device_driver(sysfs: SysfsAccess, address: str) -> str | None:
    """The device's driver, from its ``driver`` link (``None``: none)."""
    return sysfs.link_name(sysfs.sysfs_root / "bus/pci/devices" / address / "driver")


def device_present(sysfs: SysfsAccess, address: str) -> bool:
    """True when the device is on the bus."""
    return sysfs.exists(sysfs.sysfs_root / "bus/pci/devices" / address)


def device_iommu_group(sysfs: SysfsAccess, address: str) -> int:
    """The device's IOMMU group number (``AssertionError`` when it has none)."""
    name = sysfs.link_name(sysfs.sysfs_root / "bus/pci/devices" / address / "iommu_group")
    assert name is not None, f"{address} has no IOMMU group"
    return int(name)


def shared_model(root: Path, build: Callable[[PciSysfsModel], object]) -> PciSysfsModel:
    """The model kept in ``root/model.json``: loaded when that file exists, otherwise made in ``root`` and laid out
    by ``build(model)`` (each change saved). For a driver built inside a daemon under test: the daemon, its
    successor after a ``kill -9`` and the test open one machine."""
    state = Path(root) / "model.json"
    fresh = not state.exists()
    model = PciSysfsModel(root, state_file=state)
    if fresh:
        build(model)
    return model


#: The file in a shared model's folder that makes ``unbind`` writes wait (see :func:`driver_on_model`).
SLOW_UNBIND_FILE = "slow-unbind"


def driver_on_model(
    driver_class: type, build: Callable[[PciSysfsModel], object], **collaborators: Callable[[], object]
) -> type:
    """A test double of ``driver_class`` for a daemon under test: the real driver on a :func:`shared_model`.

    The daemon under test is a child process, and the model's effects happen
    only behind its own access layer, so the child builds the driver itself.
    The double's ``Options`` are the driver's plus ``model`` (the model's
    folder, laid out by ``build`` on first use); the driver gets the model as
    its ``access``, through :class:`devplug.testing.sysfsfaults.SlowWrites`
    (while ``<model>/slow-unbind`` exists, ``unbind`` writes of the addresses it
    names wait: a release a test can stretch), and each of ``collaborators``
    (``links=VfLinkModel``) made fresh as a keyword argument. Declare it as a
    test driver: ``vfio_on_model.py`` holds ``VfioOnModel = driver_on_model(VfioDriver, build)``, and the
    suite ``test_drivers = {"vfio-model": "vfio_on_model:VfioOnModel"}``.
    """
    from devplug.testing.sysfsfaults import SlowWrites

    options = dataclasses.make_dataclass(
        f"{driver_class.__name__}ModelOptions",
        [("model", str, dataclasses.field(default=""))],
        bases=(driver_class.Options,),  # type: ignore[attr-defined]
        frozen=True,
    )
    options.__doc__ = f"{driver_class.__name__}'s options, plus ``model``: the folder of the kernel model."

    class OnModel(driver_class):  # type: ignore[misc]
        __doc__ = f"{driver_class.__qualname__} on the shared kernel model in ``options.model``."
        Options = options

        def __init__(self, options: Any) -> None:
            root = Path(options.model)
            self.model = shared_model(root, build)
            made = {k: make() for k, make in collaborators.items()}
            super().__init__(options, access=SlowWrites(self.model, root / SLOW_UNBIND_FILE), **made)

    OnModel.__name__ = OnModel.__qualname__ = driver_class.__name__.removesuffix("Driver") + "OnModel"
    return OnModel


def model_options(machine: Path) -> dict[str, str]:
    """The options a :func:`driver_on_model` double needs for a model in ``machine``: its ``sysfs_root``,
    ``dev_root`` and ``model``."""
    return {"sysfs_root": str(machine / "sys"), "dev_root": str(machine / "dev"), "model": str(machine)}
