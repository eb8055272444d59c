"""Drivers: finding them, building them for a resource, calling them; one job a module.

* :mod:`devplug.drivers.discovery` -- the installed drivers (entry points in the group ``devplug.drivers``,
  their distributions' metadata), loading a driver class by name, and the hooks a class implements;
* :mod:`devplug.drivers.construction` -- a driver instance for a resource, and a driver class's check of all of
  its resources together;
* :mod:`devplug.drivers.facade` -- the one layer between devplug and pluggy: a plugin manager per resource and a
  checked call per hook (the engine awaits them through :class:`devplug.engine.driver.AsyncDriver`;
  :class:`DriverHooks` calls them directly).

Loading order: the core's defaults (``trylast``), then the chosen driver,
then ``check_pending()`` so that a misspelt hook fails loudly. Set
``DEVPLUG_DISABLE_DRIVERS=a,b`` to hide installed drivers, and
``DEVPLUG_TRACE_HOOKS=1`` to log every hook call at debug level.

Every name here stays importable from ``devplug.drivers`` itself (drivers'
tests import :class:`DriverHooks`, :func:`check_device_list` and the rest from it).
"""

from __future__ import annotations

from devplug.drivers.construction import check_driver_resources, construct_driver
from devplug.drivers.discovery import (
    DISABLE_ENV,
    ENTRY_POINT_GROUP,
    DriverInfo,
    EntryPoint,
    driver_hook_names,
    driver_names,
    entry_point_group,
    entry_points,
    installed_drivers,
    load_driver_class,
)
from devplug.drivers.facade import TRACE_ENV, DriverCapabilities, DriverFacade, DriverHooks, check_device_list
from devplug.hookspecs import HOOK_NAMES

__all__ = [
    "DISABLE_ENV",
    "ENTRY_POINT_GROUP",
    "HOOK_NAMES",
    "TRACE_ENV",
    "DriverCapabilities",
    "DriverFacade",
    "DriverHooks",
    "DriverInfo",
    "EntryPoint",
    "check_device_list",
    "check_driver_resources",
    "construct_driver",
    "driver_hook_names",
    "driver_names",
    "entry_point_group",
    "entry_points",
    "installed_drivers",
    "load_driver_class",
]
