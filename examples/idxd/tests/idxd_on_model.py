"""The idxd-like driver on the /sys/bus/dsa model, for a daemon under test: it opens the model the test laid out
in the folder above ``sysfs_root`` (a SysBusModel keeps its state in its files, so both work on one machine)."""

from __future__ import annotations

from devplug.testing.bussysfs import SysBusModel
from idxd_example import IdxdDriver


class IdxdOnModel(IdxdDriver):
    """IdxdDriver with the model as its SysfsAccess."""

    def __init__(self, options: IdxdDriver.Options) -> None:
        super().__init__(options, access=SysBusModel(options.sysfs_root.parent, options.bus))


def lay_out(model: SysBusModel, queues: int) -> None:
    """A DSA device with ``queues`` user work queues, unbound, and the kernel's drivers loaded (once)."""
    if model.devices():
        return
    model.set_autoprobe(False)
    model.add_device("dsa0", {"state": "enabled"})
    for index in range(queues):
        model.add_device(f"wq0.{index}", {"type": "user", "mode": "dedicated"}, parent="pci0000:00/0000:6a:01.0/dsa0")
    model.load_driver("idxd", ["dsa*"])
    model.load_driver("user", ["wq*"], node="dsa/{name}")
