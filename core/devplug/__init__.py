"""devplug: a framework for Kubernetes device plugins, with the whole device lifecycle.

For driver authors, the public surface is this package's root and these modules:

* :mod:`devplug.hookspecs` -- the driver contract (read its docstrings);
* :mod:`devplug.types` -- the value types re-exported here;
* :mod:`devplug.options` -- how a driver's ``Options`` dataclass is checked;
* :mod:`devplug.atomic` -- crash-safe writes for a driver's own state;
* :mod:`devplug.allocation` -- the default NUMA-packing preferred allocation;
* :mod:`devplug.watch` -- directory watching (inotify) for hot-plug;
* :mod:`devplug.sysfs`, :mod:`devplug.pci` -- sysfs access, and PCI bind/unbind through vfio-pci;
* :mod:`devplug.testing` -- the pytest plugin, the dev kubelet fixtures and kernel models.

Everything else (the engine, the generated protobuf code, the CLI) is internal.
"""

from __future__ import annotations

import pluggy

from devplug.context import DriverContext
from devplug.errors import (
    AllocationConflictError,
    ConfigError,
    DevplugError,
    DriverError,
    HookTimeoutError,
    RequestError,
)
from devplug.hookspecs import PROJECT_NAME
from devplug.types import CDIDevice, ContainerAllocation, Device, DeviceSpec, Health, Mount, Topology

__version__ = "0.1.0"

#: Marks a driver method as the implementation of a hook of the same name.
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

__all__ = [
    "AllocationConflictError",
    "CDIDevice",
    "ConfigError",
    "ContainerAllocation",
    "Device",
    "DeviceSpec",
    "DevplugError",
    "DriverContext",
    "DriverError",
    "Health",
    "HookTimeoutError",
    "Mount",
    "RequestError",
    "Topology",
    "hookimpl",
]
