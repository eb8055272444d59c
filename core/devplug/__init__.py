"""devplug: a framework for Kubernetes device plugins, with the whole device lifecycle.

For driver authors, the public surface is :data:`PUBLIC_MODULES`: this package's root and

* :mod:`devplug.hookspecs` -- the driver contract (read its docstrings);
* :mod:`devplug.types` -- the value types re-exported here;
* :mod:`devplug.options` -- how a driver's ``Options`` dataclass is checked;
* :mod:`devplug.atomic` -- crash-safe writes for a driver's own state;
* :mod:`devplug.allocation` -- the default NUMA-packing preferred allocation;
* :mod:`devplug.host.watch` -- directory watching (inotify) for hot-plug;
* :mod:`devplug.host.sysfs` -- the one door to sysfs, so tests can put a kernel model behind it;
* :mod:`devplug.kit` -- the driver kit: what drivers share (the external command runner, :mod:`devplug.kit.pci`:
  PCI functions moved to vfio-pci and back, shared by vfio and sriov);
* :mod:`devplug.devkubelet` -- the dev kubelet, for tests and demos;
* :mod:`devplug.testing` -- the pytest plugin, the conformance checks and kernel models.

Everything else (the engine, the generated protobuf code, the CLI) is internal. The names in
:data:`DEPRECATED_MODULES` still import, with a ``DeprecationWarning``, until devplug 1.0.
"""

from __future__ import annotations

import pluggy

from devplug.context import DriverContext
from devplug.contract import HOOK_CONTRACT
from devplug.errors import (
    AllocationConflictError,
    ConfigError,
    DevplugError,
    DriverError,
    HookTimeoutError,
    RequestError,
)
from devplug.hookspecs import PROJECT_NAME
from devplug.types import (
    CDIDevice,
    Claim,
    ClaimConfig,
    ContainerAllocation,
    Device,
    DeviceSpec,
    Health,
    HealthReport,
    Mount,
    Replicas,
    ResourceSettings,
    Topology,
)

__version__ = "0.1.0"

#: The modules drivers may import (and their submodules, for the last two); tests/test_architecture.py and
#: tests/test_docs.py keep the code and the driver guide (docs/driver/kit.md) to this one list.
PUBLIC_MODULES: tuple[str, ...] = (
    "devplug",
    "devplug.hookspecs",
    "devplug.types",
    "devplug.options",
    "devplug.atomic",
    "devplug.allocation",
    "devplug.host.watch",
    "devplug.host.sysfs",
    "devplug.kit",
    "devplug.devkubelet",
    "devplug.testing",
)

#: Old names of public modules, kept until devplug 1.0: importing one warns and gives the module it names.
DEPRECATED_MODULES: dict[str, str] = {
    "devplug.sysfs": "devplug.host.sysfs",
    "devplug.pci": "devplug.kit.pci",
    "devplug.watch": "devplug.host.watch",
}

#: Marks a driver method as the implementation of a hook of the same name.
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

__all__ = [
    "DEPRECATED_MODULES",
    "HOOK_CONTRACT",
    "PUBLIC_MODULES",
    "AllocationConflictError",
    "CDIDevice",
    "Claim",
    "ClaimConfig",
    "ConfigError",
    "ContainerAllocation",
    "Device",
    "DeviceSpec",
    "DevplugError",
    "DriverContext",
    "DriverError",
    "Health",
    "HealthReport",
    "HookTimeoutError",
    "Mount",
    "Replicas",
    "RequestError",
    "ResourceSettings",
    "Topology",
    "hookimpl",
]
