"""The driver kit: what drivers share instead of writing it again each.

* :mod:`devplug.kit.advertised` -- what the engine was last told about the
  devices, and pushes that carry only what changed.
* :mod:`devplug.kit.command` -- running an external command (a vendor tool): no
  shell, its own session, a deadline that kills its whole process group, output
  read with a cap, a bounded excerpt for errors and logs.
* :mod:`devplug.kit.owners` -- one resource per device: the check that no two
  resources take the same device, said the same way by every driver.
* :mod:`devplug.kit.records` -- a driver's own records (what it is doing to
  which device), typed, in one JSON file of its state folder replaced
  atomically on every change: what it must know after a crash.
* :mod:`devplug.kit.devicelocks` -- devices held by a driver's own work, so
  that no two pieces of it run on one device at once and a slow one holds up
  no other device.
* :mod:`devplug.kit.runtime` -- what a driver instance holds while it runs,
  in one object (its context, what the engine was told, its rescan loop):
  the shape every shipped driver has.
* :mod:`devplug.kit.rescan` -- a rescan loop: the machine looked at again every
  period and soon after an event, one scan at a time, failures backed off.
* :mod:`devplug.kit.sysbus` -- the devices of a ``/sys/bus/<bus>`` and the
  moves between kernel drivers (bind, unbind, rebind, the ``driver_override``
  way and back), each verified on the ``driver`` link afterwards;
  :class:`devplug.kit.pci.PciBus` is its ``pci`` case.
* :mod:`devplug.kit.retries` -- capped backoff, and a schedule per device for
  failed work a driver retries itself, so that a device that keeps failing is
  tried less and less often and costs the others nothing.

Public for third-party drivers like the rest of :data:`devplug.PUBLIC_MODULES`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from devplug.kit.advertised import AdvertisedDevices
    from devplug.kit.command import (
        CommandError,
        CommandResult,
        StartRecorder,
        kill_left_behind,
        process_stamp,
        run_command,
    )
    from devplug.kit.devicelocks import DeviceLocks
    from devplug.kit.owners import DeviceOwners
    from devplug.kit.records import RecordStore, RecordTable
    from devplug.kit.rescan import RescanLoop
    from devplug.kit.retries import CappedBackoff, DeviceRetries
    from devplug.kit.runtime import DriverRuntime
    from devplug.kit.sysbus import SysBus

#: Where each name of :data:`__all__` is defined. Imported on first use (PEP 562): the engine takes the one device
#: lock type from :mod:`devplug.kit.devicelocks`, and importing this package for it must not load the command
#: runner, the sysfs helpers and their imports into the daemon (measured: 18 ms of every start-up).
_DEFINED_IN = {
    "AdvertisedDevices": "advertised",
    "CommandError": "command",
    "CommandResult": "command",
    "StartRecorder": "command",
    "kill_left_behind": "command",
    "process_stamp": "command",
    "run_command": "command",
    "DeviceLocks": "devicelocks",
    "DeviceOwners": "owners",
    "RecordStore": "records",
    "RecordTable": "records",
    "RescanLoop": "rescan",
    "CappedBackoff": "retries",
    "DeviceRetries": "retries",
    "DriverRuntime": "runtime",
    "SysBus": "sysbus",
}


def __getattr__(name: str) -> Any:
    module = _DEFINED_IN.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_DEFINED_IN])


__all__ = [
    "AdvertisedDevices",
    "CappedBackoff",
    "CommandError",
    "CommandResult",
    "DeviceLocks",
    "DeviceOwners",
    "DeviceRetries",
    "DriverRuntime",
    "RecordStore",
    "RecordTable",
    "RescanLoop",
    "StartRecorder",
    "SysBus",
    "kill_left_behind",
    "process_stamp",
    "run_command",
]
