"""What the driver must remember across crashes, and the operator's quarantine markers.

``fpga-state.json`` in the resource's driver folder, replaced atomically
*before* each change to a card, records every device the driver holds:

* ``programming`` -- loading the default image for an allocation has begun;
  whatever happened, the device is dirty until deprogrammed;
* ``allocated`` -- handed to a container (dirty: the tenant may have programmed it);
* ``deprogramming`` -- a deprogram has begun (a tool's PID is kept while it runs);
* ``clean`` -- deprogrammed and verified, waiting for ``deallocate`` to free it.

A device without a record is free and clean. After a crash, the engine calls
``post_stop``/``deallocate`` again: a ``clean`` record makes the retry skip the
work (done exactly once), any other phase makes it redo the deprogram. The file
also keeps each card's power threshold from before power save.

A device that failed to deprogram or verify gets a marker file,
``quarantine/<device id>``, beside it: its first line says why, the rest is
what the tool or the hardware said. While it exists the device is never
handed out; the operator deletes it once the card is fixed.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from devplug.atomic import read_json, write_atomic, write_json_atomic
from devplug_fpga.command import FpgaError

__all__ = ["STATE_FILE", "QUARANTINE_DIR", "Phase", "Record", "StateStore"]

STATE_FILE = "fpga-state.json"
QUARANTINE_DIR = "quarantine"
_VERSION = 1

Phase = Literal["programming", "allocated", "deprogramming", "clean"]
_PHASES = ("programming", "allocated", "deprogramming", "clean")


@dataclass(frozen=True)
class Record:
    """One held device: its phase, and the PID of a tool running for it."""

    phase: Phase
    pid: int | None = None
    program: str | None = None


class StateStore:
    """The state file and the quarantine markers of one resource."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / STATE_FILE
        self.quarantine_dir = self.folder / QUARANTINE_DIR
        self.records: dict[str, Record] = {}
        self.power: dict[str, str] = {}

    def load(self) -> None:
        """Read the file (none yet: nothing held)."""
        self.quarantine_dir.mkdir(mode=0o700, exist_ok=True)
        if not self.path.exists():
            return
        try:
            data = read_json(self.path)
            if data.get("version") != _VERSION:
                raise ValueError(f"unknown version {data.get('version')!r}")
            records = {}
            for device, raw in data["devices"].items():
                if raw["phase"] not in _PHASES:
                    raise ValueError(f"{device}: unknown phase {raw['phase']!r}")
                records[device] = Record(raw["phase"], raw.get("pid"), raw.get("program"))
            self.records = records
            self.power = {str(k): str(v) for k, v in data.get("power", {}).items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise FpgaError(
                f"{self.path}: cannot read the fpga driver's state ({exc}); it records which devices may hold a "
                "tenant's bitstream: deprogram the cards by hand, then remove it"
            ) from exc

    def save(self) -> None:
        """Replace the file with the current records."""
        data = {
            "version": _VERSION,
            "devices": {
                d: {"phase": r.phase, "pid": r.pid, "program": r.program} for d, r in sorted(self.records.items())
            },
            "power": dict(sorted(self.power.items())),
        }
        try:
            write_json_atomic(self.path, data)
        except OSError as exc:
            raise FpgaError(f"{self.path}: cannot write the fpga driver's state: {exc}") from exc

    def set(self, devices: list[str], phase: Phase) -> None:
        """Move ``devices`` to ``phase`` and save."""
        for device in devices:
            self.records[device] = Record(phase)
        self.save()

    def drop(self, devices: list[str]) -> None:
        """Forget ``devices`` (free) and save."""
        for device in devices:
            self.records.pop(device, None)
        self.save()

    def phase(self, device: str) -> Phase | None:
        """The device's phase, ``None`` when free."""
        record = self.records.get(device)
        return None if record is None else record.phase

    # --- quarantine ------------------------------------------------------------------

    def marker(self, device: str) -> Path:
        """The quarantine marker of ``device``."""
        return self.quarantine_dir / device

    def quarantine(self, device: str, reason: str, output: str) -> Path:
        """Keep ``device`` out of service: write its marker."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        text = f"{reason}\n# quarantined {stamp}; delete this file to put the device back in service\n{output}"
        path = self.marker(device)
        write_atomic(path, text.encode(errors="replace"))
        return path

    def quarantined(self) -> dict[str, str]:
        """The devices out of service, with the reason (each marker's first line); re-read every time."""
        try:
            names = os.listdir(self.quarantine_dir)
        except FileNotFoundError:
            return {}
        out = {}
        for name in names:
            if name.startswith("."):
                continue  # a write in progress
            try:
                with open(self.quarantine_dir / name, encoding="utf-8", errors="replace") as handle:
                    out[name] = handle.readline().strip() or "quarantined"
            except OSError:
                continue
        return out
