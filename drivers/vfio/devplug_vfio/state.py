"""What the driver must remember across crashes: each device it moved, and where it came from.

One JSON file, ``vfio-state.json`` in the resource's state folder, replaced
atomically (:func:`devplug.atomic.write_json_atomic`) *before* sysfs is
changed, so that after a crash the driver knows what it may have half done:

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

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from devplug import DriverError
from devplug.atomic import read_json, write_json_atomic

__all__ = ["STATE_FILE", "DeviceRecord", "Phase", "StateStore"]

STATE_FILE = "vfio-state.json"
_VERSION = 1

Phase = Literal["binding", "bound", "restoring"]
_PHASES = ("binding", "bound", "restoring")


@dataclass
class DeviceRecord:
    """One device devplug moved: where it came from, how far the move got, whether a pod holds it."""

    original_driver: str | None
    group: int
    phase: Phase
    allocated: bool = False


class StateStore:
    """The state file of one resource."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / STATE_FILE

    def load(self) -> dict[str, DeviceRecord]:
        """The records by address (none when the file does not exist yet)."""
        if not self.path.exists():
            return {}
        try:
            data = read_json(self.path)
            if data.get("version") != _VERSION:
                raise ValueError(f"unknown version {data.get('version')!r}")
            records = {}
            for address, raw in data["devices"].items():
                if raw["phase"] not in _PHASES:
                    raise ValueError(f"{address}: unknown phase {raw['phase']!r}")
                records[address] = DeviceRecord(
                    original_driver=raw["original_driver"],
                    group=int(raw["group"]),
                    phase=raw["phase"],
                    allocated=bool(raw["allocated"]),
                )
            return records
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DriverError(
                f"{self.path}: cannot read the vfio driver's state ({exc}); it records which driver each "
                "device had before vfio-pci: fix or remove it after restoring the devices by hand"
            ) from exc

    def save(self, records: dict[str, DeviceRecord]) -> None:
        """Replace the file with ``records``."""
        data = {"version": _VERSION, "devices": {a: asdict(r) for a, r in sorted(records.items())}}
        try:
            write_json_atomic(self.path, data)
        except OSError as exc:
            raise DriverError(f"{self.path}: cannot write the vfio driver's state: {exc}") from exc
