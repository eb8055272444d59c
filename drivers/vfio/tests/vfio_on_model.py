"""A test double of devplug-vfio for the daemon under test: the real driver on the kernel model.

The daemon under test is a child process, and the kernel model's effects
happen only behind its own file-access layer, so the child builds the
driver itself: :class:`VfioOnModel` (test entry point ``vfio-model``) is
:class:`devplug_vfio.VfioDriver` on a :class:`~devplug.testing.pcisysfs.PciSysfsModel`
kept in ``<model>/model.json`` (one machine across the daemon's restarts and
``kill -9``). While ``<model>/slow-unbind`` exists, ``unbind`` writes wait for
it to go (:class:`devplug.testing.sysfsfaults.SlowWrites`): a release that a
test can kill in the middle. Its hook calls are recorded by the kit's
recording stand-in, not here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from devplug.testing.pcisysfs import PciSysfsModel, shared_model
from devplug.testing.sysfsfaults import SlowWrites
from devplug_vfio import VfioDriver, VfioOptions

#: While this file exists in the model's folder, ``unbind`` writes wait.
SLOW_FILE = "slow-unbind"
NICS = ("0000:00:04.0", "0000:00:08.0")  # two e1000e NICs, each alone in its IOMMU group
E1000E = (0x8086, 0x10D3)


@dataclass(frozen=True)
class ModelOptions(VfioOptions):
    """vfio's options, plus ``model``: the folder of the kernel model (built there on first use)."""

    model: str = ""


def build_machine(model: PciSysfsModel) -> None:
    """A host bridge and two NICs."""
    model.add_device("0000:00:00.0", 0x8086, 0x29C0, 0x060000, iommu_group=0)
    for group, address in enumerate(NICS, start=4):
        model.add_device(address, *E1000E, 0x020000, iommu_group=group, driver="e1000e")


class VfioOnModel(VfioDriver):
    """devplug-vfio on the kernel model in ``options.model``."""

    Options: ClassVar[type[VfioOptions]] = ModelOptions

    def __init__(self, options: VfioOptions) -> None:
        assert isinstance(options, ModelOptions)
        root = Path(options.model)
        self.model = shared_model(root, build_machine)
        super().__init__(options, access=SlowWrites(self.model, root / SLOW_FILE))
