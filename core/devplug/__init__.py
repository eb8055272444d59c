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

These two and :mod:`devplug.demo` are :data:`TEST_KIT_MODULES`, for a driver's tests only: they come with the
``devplug-testing`` distribution (a test dependency of drivers), which the runtime (this distribution's code, a
driver's package, the image) never imports (tests/test_arch_testkit.py). Its source tree (``testkit/src`` in
devplug's repository) has a ``devplug/`` folder of its own, joined to this package's ``__path__`` below.

Everything else (the engine, the generated protobuf code, the CLI) is internal. The names in
:data:`DEPRECATED_MODULES` still import, with a ``DeprecationWarning``, until devplug 1.0.
"""

from __future__ import annotations

from pkgutil import extend_path

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
    DeviceCondition,
    DeviceSpec,
    DeviceStatus,
    Health,
    HealthReport,
    Mount,
    NetworkData,
    Partition,
    Replicas,
    ResourceSettings,
    ShareCapacity,
    Topology,
)

# devplug-testing's modules live in a devplug/ folder of another source tree: in an editable install (or a source
# tree on PYTHONPATH) that folder is on another sys.path entry, which this joins; installed from wheels, both
# distributions' files are in one site-packages/devplug/ and this changes nothing.
__path__ = extend_path(__path__, __name__)

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

#: The test kit's modules (the ``devplug-testing`` distribution): a driver's tests may import them, the runtime
#: never does, a driver's package included (tests/test_arch_testkit.py).
TEST_KIT_MODULES: tuple[str, ...] = ("devplug.testing", "devplug.devkubelet", "devplug.demo")

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
    "TEST_KIT_MODULES",
    "AllocationConflictError",
    "CDIDevice",
    "Claim",
    "ClaimConfig",
    "ConfigError",
    "ContainerAllocation",
    "Device",
    "DeviceCondition",
    "DeviceSpec",
    "DeviceStatus",
    "DevplugError",
    "DriverContext",
    "DriverError",
    "Health",
    "HealthReport",
    "HookTimeoutError",
    "Mount",
    "NetworkData",
    "Partition",
    "Replicas",
    "RequestError",
    "ResourceSettings",
    "ShareCapacity",
    "Topology",
    "hookimpl",
]
