"""devplug-vfio: PCI devices handed to containers through vfio-pci on demand, and given back.

::

    [resources."example.com/nic"]
    driver = "vfio"
    options = { devices = ["8086:10d3"], bind = "on-allocate" }

See :mod:`devplug_vfio.options` for the options and :mod:`devplug_vfio.driver`
for the lifecycle.
"""

from __future__ import annotations

from devplug_vfio.driver import VfioDriver, env_name
from devplug_vfio.options import VfioOptions
from devplug_vfio.state import STATE_FILE

__all__ = ["STATE_FILE", "VfioDriver", "VfioOptions", "env_name"]
