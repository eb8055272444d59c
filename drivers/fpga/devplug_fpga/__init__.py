"""devplug-fpga: FPGA cards and partial-reconfiguration regions, deprogrammed and verified on release.

::

    [resources."example.com/fpga-region"]
    driver = "fpga"
    options = { backend = "dfl", mode = "regions", blank_image = "/opt/fpga/blank.gbs",
                blank_afu_id = "d8424dc4a4a3c413f89e433683f9040b" }

See :mod:`devplug_fpga.options` for the options, :mod:`devplug_fpga.driver` for
the lifecycle, ``drivers/fpga/demo/fpga_demo.py`` (beside the package: it runs on the test kit) for the demo.
"""

from __future__ import annotations

from devplug_fpga.driver import FpgaDriver, env_suffix
from devplug_fpga.options import FpgaOptions
from devplug_fpga.state import QUARANTINE_DIR, STATE_FILE

__all__ = ["QUARANTINE_DIR", "STATE_FILE", "FpgaDriver", "FpgaOptions", "env_suffix"]
