"""A test double of devplug-sriov for the daemon under test: the real driver on the kernel model.

The daemon under test is a child process, and the model's effects happen only
behind its own access layer, so the child builds the driver itself:
:class:`SriovOnModel` (test entry point ``sriov-model``) is
:class:`devplug_sriov.SriovDriver` on a :class:`~devplug.testing.pcisysfs.PciSysfsModel`
kept in ``<model>/model.json`` (the VM's SR-IOV NVMe controller: 4 VFs at
most, on nvme), so the daemon, its successor after a ``kill -9`` and the test
see one machine. An NVMe PF has no network interface, so releases reset no
netlink settings (the netlink model stays empty). While ``<model>/slow-unbind``
exists, ``unbind`` writes of the VFs it names wait
(:class:`devplug.testing.sysfsfaults.SlowWrites`): a release a test can stretch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from devplug.testing.pcisysfs import PciSysfsModel, shared_model
from devplug.testing.sysfsfaults import SlowWrites
from devplug_sriov import SriovDriver, SriovOptions
from devplug_sriov.vfmodel import VfLinkModel

#: While this file exists in the model's folder, ``unbind`` writes wait.
SLOW_FILE = "slow-unbind"
PF = "0000:02:00.0"
NVME = (0x1B36, 0x0010)


@dataclass(frozen=True)
class ModelOptions(SriovOptions):
    """sriov's options, plus ``model``: the folder of the kernel model (built there on first use)."""

    model: str = ""


def build_machine(model: PciSysfsModel) -> None:
    """The VM's SR-IOV part: a root port and the NVMe PF on nvme, 4 VFs at most, each in a group of its own."""
    model.add_device("0000:00:07.0", 0x1B36, 0x000C, 0x060400, iommu_group=8, driver="pcieport")
    model.add_device(PF, *NVME, 0x010802, iommu_group=9, driver="nvme")
    model.enable_sriov(PF, 4, NVME[1], vf_driver="nvme")


class SriovOnModel(SriovDriver):
    """devplug-sriov on the kernel model in ``options.model``."""

    Options: ClassVar[type[SriovOptions]] = ModelOptions

    def __init__(self, options: SriovOptions) -> None:
        assert isinstance(options, ModelOptions)
        root = Path(options.model)
        self.model = shared_model(root, build_machine)
        super().__init__(options, access=SlowWrites(self.model, root / SLOW_FILE), links=VfLinkModel())
