"""What the driver must remember across crashes, and the operator's quarantine markers.

``fpga-state.json`` in the resource's driver folder (a :class:`devplug.kit.RecordStore`,
each change written atomically *before* the change to a card) records in its
``devices`` table every device the driver holds:

* ``programming`` -- loading the default image for an allocation has begun;
  whatever happened, the device is dirty until deprogrammed;
* ``allocated`` -- handed to a container (dirty: the tenant may have programmed it);
* ``deprogramming`` -- a deprogram has begun (a tool's PID is kept while it runs);
* ``clean`` -- deprogrammed and verified, waiting for ``deallocate`` to free it.

A device without a record is free and clean. After a crash, the engine calls
``post_stop``/``deallocate`` again: a ``clean`` record makes the retry skip the
work (done exactly once), any other phase makes it redo the deprogram. Its
``power`` table keeps each card's power threshold from before power save.

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

from devplug.atomic import write_atomic
from devplug.kit import RecordStore

__all__ = ["STATE_FILE", "QUARANTINE_DIR", "FpgaState", "Phase", "Record"]

STATE_FILE = "fpga-state.json"
QUARANTINE_DIR = "quarantine"

Phase = Literal["programming", "allocated", "deprogramming", "clean"]


@dataclass(frozen=True)
class Record:
    """One held device: its phase, and the PID of a tool running for it, its program and its
    :func:`devplug.kit.process_stamp` (boot id, start time, executable: absent in records written before it was
    kept, whose tool is then never killed at start, only named)."""

    phase: Phase
    pid: int | None = None
    program: str | None = None
    started: str | None = None


class FpgaState:
    """The state file's two tables and the quarantine markers of one resource (read when made)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        store = RecordStore(
            self.folder / STATE_FILE,
            what="the fpga driver's state",
            recover="it records which devices may hold a tenant's bitstream: deprogram the cards by hand, then "
            "remove it",
        )
        #: The devices held, by ID.
        self.devices = store.table("devices", Record)
        #: Each card in power save: its power threshold from before, by card address.
        self.power = store.table("power", str)
        self.quarantine_dir = self.folder / QUARANTINE_DIR
        self.quarantine_dir.mkdir(mode=0o700, exist_ok=True)

    def set(self, devices: list[str], phase: Phase) -> None:
        """Move ``devices`` to ``phase`` (forgetting any tool's PID)."""
        self.devices.update(dict.fromkeys(devices, Record(phase)))

    def phase(self, device: str) -> Phase | None:
        """The device's phase, ``None`` when free."""
        record = self.devices.get(device)
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
