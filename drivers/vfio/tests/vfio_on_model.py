"""A test double of devplug-vfio for the daemon under test: the real driver on the kernel model.

The daemon under test is a child process, and the kernel model's effects
happen only behind its own file-access layer, so the child builds the
driver itself: :class:`VfioOnModel` (test entry point ``vfio-model``) is
:class:`devplug_vfio.VfioDriver` on a :class:`~devplug.testing.pcisysfs.PciSysfsModel`
kept in ``<model>/model.json`` (one machine across the daemon's restarts and
``kill -9``), recording its hook calls in ``<model>`` with the kit's
recorder. While ``<model>/slow-unbind`` exists, every ``unbind`` write waits
for it to go: a release that a test can kill in the middle.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from devplug import ContainerAllocation, hookimpl
from devplug.sysfs import SysfsAccess
from devplug.testing.pcisysfs import PciSysfsModel
from devplug.testing.recorder import HookRecorder
from devplug_vfio import VfioDriver, VfioOptions

#: While this file exists in the model's folder, ``unbind`` writes wait.
SLOW_FILE = "slow-unbind"
NICS = ("0000:00:04.0", "0000:00:08.0")  # two e1000e NICs, each alone in its IOMMU group
E1000E = (0x8086, 0x10D3)


@dataclass(frozen=True)
class ModelOptions(VfioOptions):
    """vfio's options, plus ``model``: the folder of the kernel model (built there on first use)."""

    model: str = ""


def open_machine(root: Path) -> PciSysfsModel:
    """The model in ``root``: loaded from ``root/model.json``, or built (a host bridge and two NICs) and saved."""
    state = root / "model.json"
    fresh = not state.exists()
    model = PciSysfsModel(root, state_file=state)
    if fresh:
        model.add_device("0000:00:00.0", 0x8086, 0x29C0, 0x060000, iommu_group=0)
        for group, address in enumerate(NICS, start=4):
            model.add_device(address, *E1000E, 0x020000, iommu_group=group, driver="e1000e")
    return model


class SlowUnbind:
    """A SysfsAccess whose ``unbind`` writes wait while ``flag`` exists (at most ``limit`` seconds): those of the
    devices the flag file names (one address per line), or of every device when it is empty."""

    def __init__(self, inner: SysfsAccess, flag: Path, limit: float = 300.0) -> None:
        self.inner = inner
        self.flag = flag
        self.limit = limit

    @property
    def sysfs_root(self) -> Path:
        return self.inner.sysfs_root

    @property
    def dev_root(self) -> Path:
        return self.inner.dev_root

    def read_text(self, path: Path) -> str:
        return self.inner.read_text(path)

    def write_text(self, path: Path, data: str) -> None:
        if path.name == "unbind" and self._slowed(data):
            deadline = time.monotonic() + self.limit
            while self.flag.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        self.inner.write_text(path, data)

    def _slowed(self, address: str) -> bool:
        try:
            named = self.flag.read_text().split()
        except FileNotFoundError:
            return False
        return not named or address.strip() in named

    def exists(self, path: Path) -> bool:
        return self.inner.exists(path)

    def is_dir(self, path: Path) -> bool:
        return self.inner.is_dir(path)

    def listdir(self, path: Path) -> list[str]:
        return self.inner.listdir(path)

    def link_name(self, path: Path) -> str | None:
        return self.inner.link_name(path)

    def writable(self, path: Path) -> bool:
        return self.inner.writable(path)


class VfioOnModel(VfioDriver):
    """devplug-vfio on the kernel model in ``options.model``, recording its allocate and deallocate calls."""

    Options: ClassVar[type[VfioOptions]] = ModelOptions

    def __init__(self, options: VfioOptions) -> None:
        assert isinstance(options, ModelOptions)
        root = Path(options.model)
        self.model = open_machine(root)
        self.recorder = HookRecorder(root)
        super().__init__(options, access=SlowUnbind(self.model, root / SLOW_FILE))

    @hookimpl
    def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation | None:
        with self.recorder.call("allocate", device_ids):
            return super().allocate(device_ids)

    @hookimpl
    def deallocate(self, device_ids: Sequence[str], retry: bool) -> None:  # type: ignore[override]
        with self.recorder.call("deallocate", device_ids, retry=retry):
            super().deallocate(device_ids)
