"""The driver's own files in its state folder: the slots this node holds, and a status file.

``held.json`` (a :class:`devplug.kit.RecordStore`, table ``slots``) lists the
slots this node claimed for its pods. A slot is added *before* it is claimed in
the store and removed after its claim is deleted, so after a crash the file
names every claim this node may have (and perhaps a few it never got): at the
next start the driver claims them again (the pods still run) and deletes its
other claims in the store. A ``held.json`` written before the kit
(``{"slots": [...]}``) is read as it was, and rewritten in the kit's format.

``shared-status.json`` is what ``python -m devplug_shared.status`` shows: each
slot's holder and lease age, the store's reachability, and conflicts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from devplug.atomic import write_atomic
from devplug.kit import RecordStore

__all__ = ["HELD_FILE", "STATUS_FILE", "HeldSlots", "write_status"]

HELD_FILE = "held.json"
STATUS_FILE = "shared-status.json"


def _upgrade(path: Path) -> None:
    """Rewrite a ``held.json`` of before the kit (``{"slots": [...]}``, no version) in the record store's format."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return  # missing, or unreadable: the record store says so
    if isinstance(data, dict) and "version" not in data and isinstance(data.get("slots"), list):
        slots = {str(slot): True for slot in data["slots"]}
        write_atomic(path, (json.dumps({"version": 1, "slots": slots}, indent=1, sort_keys=True) + "\n").encode())


class HeldSlots:
    """The set of slots this node holds, written to ``held.json`` before each change returns; thread-safe.

    :class:`devplug.DriverError` names the file when it cannot be read.
    """

    def __init__(self, folder: Path) -> None:
        path = Path(folder) / HELD_FILE
        _upgrade(path)
        store = RecordStore(path, what="the slots this node holds", recover="move it away to start afresh")
        self._slots = store.table("slots", bool)

    def snapshot(self) -> frozenset[str]:
        return frozenset(self._slots.snapshot())

    def add(self, slots: Iterable[str]) -> list[str]:
        """Add ``slots``; return those that were new. Written before returning."""
        new = [s for s in dict.fromkeys(slots) if s not in self._slots]
        self._slots.update(dict.fromkeys(new, True))
        return new

    def discard(self, slots: Iterable[str]) -> None:
        self._slots.drop(*slots)


def write_status(folder: Path, data: dict[str, Any]) -> None:
    """Write the status file atomically (readable by the operator: mode 0644)."""
    write_atomic(folder / STATUS_FILE, json.dumps(data, indent=1, sort_keys=True).encode(), mode=0o644)
