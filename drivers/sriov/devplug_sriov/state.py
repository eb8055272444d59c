"""What the driver must remember across crashes: each VF a pod holds, and how far its move or reset got.

One JSON file, ``sriov-state.json`` in the resource's state folder, replaced
atomically before sysfs or netlink is touched:

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

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from devplug import DriverError
from devplug.atomic import read_json, write_json_atomic

__all__ = ["STATE_FILE", "Phase", "StateStore", "VfRecord"]

STATE_FILE = "sriov-state.json"
_VERSION = 1

Phase = Literal["allocated", "binding", "bound", "restoring", "resetting"]
_PHASES = ("allocated", "binding", "bound", "restoring", "resetting")


@dataclass
class VfRecord:
    """One VF devplug acted on: its PF and index, its own driver, and the phase it is in."""

    pf: str
    index: int
    original_driver: str | None
    phase: Phase
    reason: str = ""


class StateStore:
    """The state file of one resource."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / STATE_FILE

    def load(self) -> dict[str, VfRecord]:
        """The records by VF address (none when the file does not exist yet)."""
        if not self.path.exists():
            return {}
        try:
            data = read_json(self.path)
            if data.get("version") != _VERSION:
                raise ValueError(f"unknown version {data.get('version')!r}")
            records = {}
            for address, raw in data["vfs"].items():
                if raw["phase"] not in _PHASES:
                    raise ValueError(f"{address}: unknown phase {raw['phase']!r}")
                records[address] = VfRecord(
                    str(raw["pf"]), int(raw["index"]), raw["original_driver"], raw["phase"], str(raw.get("reason", ""))
                )
            return records
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DriverError(
                f"{self.path}: cannot read the sriov driver's state ({exc}); it records which VFs pods hold and "
                "their own drivers: fix or remove it after releasing the VFs by hand"
            ) from exc

    def save(self, records: dict[str, VfRecord]) -> None:
        """Replace the file with ``records``."""
        data = {"version": _VERSION, "vfs": {a: asdict(r) for a, r in sorted(records.items())}}
        try:
            write_json_atomic(self.path, data)
        except OSError as exc:
            raise DriverError(f"{self.path}: cannot write the sriov driver's state: {exc}") from exc
