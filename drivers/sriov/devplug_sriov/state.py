"""What the driver must remember across crashes: each VF a pod holds, and how far its move or reset got.

One table, ``vfs``, in ``sriov-state.json`` in the resource's state folder
(:class:`devplug.kit.RecordStore`: each change written atomically before sysfs
or netlink is touched):

* ``allocated`` -- a pod holds the VF (kernel mode: nothing was changed);
* ``binding`` -- a move to vfio-pci had begun; the engine undoes an
  allocation that did not complete through ``deallocate``, which restores it;
* ``bound`` -- on vfio-pci for a pod;
* ``restoring`` -- the move back to ``original_driver`` had begun; ``start`` finishes it;
* ``resetting`` -- the netlink reset of the VF's settings on its PF (after the
  restore, in vfio-pci mode) had begun, or failed; ``start`` (and every rescan)
  tries again, and the VF stays out of service, unhealthy with ``reason``,
  until it succeeds.

These records also say which VFs are allocated, so the set-up never removes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from devplug.kit import RecordStore, RecordTable

__all__ = ["STATE_FILE", "Phase", "VfRecord", "open_records"]

STATE_FILE = "sriov-state.json"

Phase = Literal["allocated", "binding", "bound", "restoring", "resetting"]


@dataclass(frozen=True)
class VfRecord:
    """One VF devplug acted on: its PF and index, its own driver, and the phase it is in."""

    pf: str
    index: int
    original_driver: str | None
    phase: Phase
    reason: str = ""


def open_records(state_dir: Path) -> RecordTable[VfRecord]:
    """The records of one resource, by VF address (none before the first allocation)."""
    store = RecordStore(
        Path(state_dir) / STATE_FILE,
        what="the sriov driver's state",
        recover="it records which VFs pods hold and their own drivers: fix or remove it after releasing the VFs "
        "by hand",
    )
    return store.table("vfs", VfRecord)
