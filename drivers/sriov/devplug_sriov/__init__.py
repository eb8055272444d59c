"""devplug-sriov: SR-IOV virtual functions created from config, pooled, handed to pods, reset on release.

::

    [resources."intel.com/sriov-net"]
    driver = "sriov"
    options = { pfs = ["ens1f0"], num_vfs = 8, vfs = ["ens1f0#0-3"], vf_driver = "kernel" }

See :mod:`devplug_sriov.options` for the options, :mod:`devplug_sriov.setup`
for what the set-up writes to sysfs (and ``python -m devplug_sriov.setup
--config FILE --dry-run``), and :mod:`devplug_sriov.driver` for the lifecycle.
"""

from __future__ import annotations

from devplug_sriov.driver import SriovDriver, env_name
from devplug_sriov.options import SriovOptions
from devplug_sriov.state import STATE_FILE

__all__ = ["STATE_FILE", "SriovDriver", "SriovOptions", "env_name"]
