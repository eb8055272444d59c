"""Devices on a ``/sys/bus/<bus>`` and the moves between drivers, bind, unbind and rebind, each verified.

Every bus the driver core registers has the same files (``drivers/base/bus.c``),
so one helper serves them all; :class:`devplug.kit.pci.PciBus` is the ``pci`` case of
it. What each file does, as the kernel documents it (the ABI files are under
``Documentation/ABI/``):

* ``/sys/bus/<bus>/devices/<name>``: a link to each device on the bus; the
  device's ``driver`` link names the driver holding it, absent when none does.
* ``/sys/bus/<bus>/drivers/<driver>/bind`` and ``.../unbind``
  (``testing/sysfs-bus-pci``, "/sys/bus/pci/drivers/.../bind" and ".../unbind";
  the same store methods for every bus: ``bind_store`` and ``unbind_store`` in
  ``drivers/base/bus.c``): writing a device's name asks that driver to take it,
  or to let it go. ``bind`` fails with ``ENODEV`` when the driver does not match
  the device (or there is no such device), ``EBUSY`` when the device already has
  a driver (``__driver_probe_device`` in ``drivers/base/dd.c``), or with the
  probe's own error; ``unbind`` fails with ``ENODEV`` when the device is not
  bound to that driver.
* ``/sys/bus/<bus>/devices/<name>/driver_override`` (``testing/sysfs-bus-pci``
  and ``testing/sysfs-bus-platform``, "driver_override"; ``driver_set_override``
  in ``drivers/base/driver.c``): on the buses that have it, only the driver of
  that name may bind the device; it reads ``(null)`` when unset, and writing a
  lone newline clears it. Writing it neither unbinds nor probes.
* ``/sys/bus/<bus>/drivers_probe`` (``testing/sysfs-bus-pci``,
  "/sys/bus/pci/drivers_probe"; ``drivers_probe_store`` in ``drivers/base/bus.c``):
  writing a device's name makes the driver core look for a driver for it, when
  it has none. A probe that fails is not reported: the write succeeds and the
  device is left without a driver.

Hence the helper never trusts a write alone: after each move it reads the
``driver`` link again and raises :class:`devplug.DriverError` when the kernel did
not do what was asked (a refused write is one too, naming the device and the
file). Everything goes through a :class:`devplug.host.sysfs.SysfsAccess`, so a test
gives it :class:`devplug.testing.bussysfs.SysBusModel` where production gives
:class:`devplug.host.sysfs.HostSysfs`::

    bus = SysBus(access, "dsa")
    bus.rebind("wq0.1", "user")            # whoever held it, "user" does now, or DriverError
    bus.unbind("wq0.1")                    # nobody does
"""

from __future__ import annotations

import logging
from pathlib import Path

from devplug.errors import DriverError
from devplug.host.sysfs import SysfsAccess

__all__ = ["SysBus"]

_log = logging.getLogger("devplug.kit.sysbus")


class SysBus:
    """The devices of ``/sys/bus/<bus>`` and their drivers, read and moved through ``access``.

    ``log`` is where :meth:`give_back` warns of a device another driver took meanwhile.
    """

    def __init__(self, access: SysfsAccess, bus: str, *, log: logging.Logger | None = None) -> None:
        if not bus or "/" in bus or bus in (".", ".."):
            raise ValueError(f"{bus!r} is not a bus name (a folder of /sys/bus)")
        self.access = access
        self.bus = bus
        self.sys = access.sysfs_root
        self.bus_dir = self.sys / "bus" / bus
        self.devices_dir = self.bus_dir / "devices"
        self.drivers_dir = self.bus_dir / "drivers"
        self.probe_file = self.bus_dir / "drivers_probe"
        self._log = log if log is not None else _log

    # --- reading

    def devices(self) -> list[str]:
        """The names of the devices on the bus, sorted (none when the bus is absent)."""
        if not self.access.is_dir(self.devices_dir):
            return []
        return self.access.listdir(self.devices_dir)

    def drivers(self) -> list[str]:
        """The drivers registered on the bus, sorted."""
        if not self.access.is_dir(self.drivers_dir):
            return []
        return self.access.listdir(self.drivers_dir)

    def device_dir(self, name: str) -> Path:
        """``/sys/bus/<bus>/devices/<name>``, the device's folder (through its link)."""
        return self.devices_dir / name

    def attribute(self, name: str, attribute: str) -> str:
        """One attribute of the device, stripped; ``OSError`` (``FileNotFoundError`` when absent) as read."""
        return self.access.read_text(self.devices_dir / name / attribute)

    def exists(self, name: str) -> bool:
        """True while the device is on the bus."""
        return self.access.exists(self.devices_dir / name)

    def driver(self, name: str) -> str | None:
        """The driver holding the device (``None``: none, or the device is gone)."""
        return self.access.link_name(self.devices_dir / name / "driver")

    def override(self, name: str) -> str | None:
        """The device's ``driver_override`` (``None`` when unset, or on a bus without one)."""
        path = self.devices_dir / name / "driver_override"
        try:
            value = self.access.read_text(path)
        except FileNotFoundError:
            if self.exists(name):
                return None
            raise
        return None if value in ("", "(null)") else value

    # --- moving, each move verified

    def _write(self, name: str, path: Path, data: str, action: str) -> None:
        try:
            self.access.write_text(path, data)
        except OSError as exc:
            raise DriverError(f"{name}: cannot {action}: {exc}") from exc

    def _unbind_from(self, name: str, driver: str) -> None:
        self._write(name, self.drivers_dir / driver / "unbind", name, f"unbind it from {driver}")

    def _probe(self, name: str) -> None:
        self._write(name, self.probe_file, name, f"probe it (bus/{self.bus}/drivers_probe)")

    def bind(self, name: str, driver: str) -> None:
        """``driver`` takes the unbound device (``drivers/<driver>/bind``); nothing to do when it holds it already.

        :class:`DriverError` when another driver holds it (see :meth:`rebind`), when the kernel refuses the write,
        or when the ``driver`` link does not name ``driver`` afterwards.
        """
        current = self.driver(name)
        if current == driver:
            return
        if current is not None:
            raise DriverError(f"{name}: {current} holds it, not {driver}; unbind it first (or rebind it)")
        self._write(name, self.drivers_dir / driver / "bind", name, f"bind it to {driver}")
        self._verify(name, driver, "")

    def unbind(self, name: str) -> str | None:
        """The device's driver lets it go (``drivers/<driver>/unbind``); returns that driver (``None``: it had
        none, nothing done). :class:`DriverError` when the write is refused or the device still has a driver."""
        current = self.driver(name)
        if current is None:
            return None
        self._unbind_from(name, current)
        now = self.driver(name)
        if now is not None:
            raise DriverError(f"{name}: still held by {now} after unbinding it from {current}")
        return current

    def rebind(self, name: str, driver: str) -> str | None:
        """``driver`` takes the device from whichever driver holds it; returns the one that held it (``None``:
        none). Nothing to do when ``driver`` holds it already.

        When ``driver`` refuses it, the driver that held it is given it back (best effort) and the
        :class:`DriverError` says whether that worked.
        """
        previous = self.driver(name)
        if previous == driver:
            return previous
        self.unbind(name)
        try:
            self.bind(name, driver)
        except DriverError as exc:
            if previous is None:
                raise
            try:
                self.bind(name, previous)
            except DriverError:
                raise DriverError(f"{exc}; it is left without a driver ({previous} did not take it back)") from exc
            raise DriverError(f"{exc}; {previous} holds it again") from exc
        return previous

    def bind_by_override(self, name: str, driver: str, *, hint: str = "") -> None:
        """Move the device to ``driver`` the ``driver_override`` way: set the override, unbind the current driver,
        write the name to ``drivers_probe``, then check the ``driver`` link (a failed probe reports success).

        For buses with ``driver_override`` and a driver that matches by it alone (vfio-pci). ``hint`` ends the
        :class:`DriverError` when the kernel did not bind it (default: look at the kernel log).
        """
        if self.override(name) != driver:
            self._write(name, self.devices_dir / name / "driver_override", driver, f"set driver_override to {driver}")
        current = self.driver(name)
        if current == driver:
            return
        if current is not None:
            self._unbind_from(name, current)
        self._probe(name)
        self._verify(name, driver, hint)

    def give_back(self, name: str, original: str | None, *, taken_by: str) -> None:
        """Undo :meth:`bind_by_override`: ``taken_by`` lets the device go, the override is cleared, and the bus
        probes it for ``original`` (``None``: leave it without a driver), which must take it.

        Idempotent: safe to call again after a crash part-way. A device taken meanwhile by a driver other than
        ``taken_by`` is left with it (a WARNING says so).
        """
        current = self.driver(name)
        if current == taken_by and original != taken_by:
            self._unbind_from(name, taken_by)
            current = None
        if self.override(name) is not None:
            self._write(name, self.devices_dir / name / "driver_override", "\n", "clear driver_override")
        if current is not None:
            if current != original:
                self._log.warning("%s: now held by %s, not %s; leaving it there", name, current, original)
            return
        if original is None:
            return
        self._probe(name)
        now = self.driver(name)
        if now != original:
            raise DriverError(
                f"{name}: {original} did not take the device back (driver now: {now or 'none'}); "
                f"is the {original} module loaded? see the kernel log (dmesg)"
            )

    def _verify(self, name: str, driver: str, hint: str) -> None:
        now = self.driver(name)
        if now != driver:
            raise DriverError(
                f"{name}: the kernel did not bind it to {driver} (driver now: {now or 'none'}); "
                f"{hint or 'see the kernel log (dmesg)'}"
            )
