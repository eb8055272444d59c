"""What the driver must remember across crashes: each device it moved, and where it came from.

One table, ``devices``, in ``vfio-state.json`` in the resource's state folder
(a :class:`devplug.kit.RecordStore`: each change written atomically *before*
sysfs is changed), so that after a crash the driver knows what it may have
half done:

* ``binding`` -- a move to vfio-pci had begun for an allocation. The engine
  undoes an allocation that did not complete through ``deallocate``, which
  restores the device; until then it stays as the crash left it.
* ``bound`` -- on vfio-pci, held for an allocation (``allocated``) or kept
  bound in ``at-start`` mode.
* ``restoring`` -- a release had begun; ``start`` finishes it.

``original_driver`` is the driver the device had before devplug first moved
it (``None``: none); it is kept across re-allocations, so a crash never makes
vfio-pci look like the device's own driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["STATE", "STATE_FILE", "DeviceRecord", "Phase"]

STATE_FILE = "vfio-state.json"
#: How the record store names the file's content in errors, and what an operator should do with one it cannot read.
STATE = {
    "what": "the vfio driver's state",
    "recover": "it records which driver each device had before vfio-pci: fix or remove it after restoring the "
    "devices by hand",
}

Phase = Literal["binding", "bound", "restoring"]


@dataclass(frozen=True)
class DeviceRecord:
    """One device devplug moved: where it came from, how far the move got, whether a pod holds it."""

    original_driver: str | None
    group: int
    phase: Phase
    allocated: bool = False
