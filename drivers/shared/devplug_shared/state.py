"""The driver's own files in its state folder: the slots this node holds, and a status file.

``held.json`` lists the slots this node claimed for its pods. A slot is added
*before* it is claimed in the store and removed after its claim is deleted,
so after a crash the file names every claim this node may have (and perhaps a
few it never got): at the next start the driver claims them again (the pods
still run) and deletes its other claims in the store.

``shared-status.json`` is what ``python -m devplug_shared.status`` shows: each
slot's holder and lease age, the store's reachability, and conflicts.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from devplug.atomic import write_atomic

__all__ = ["HELD_FILE", "STATUS_FILE", "HeldSlots", "write_status"]

HELD_FILE = "held.json"
STATUS_FILE = "shared-status.json"


class HeldSlots:
    """The set of slots this node holds, persisted in ``held.json`` on every change; thread-safe."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / HELD_FILE
        self._lock = threading.Lock()
        self._slots: set[str] = set()
        try:
            data = json.loads(self.path.read_text())
            self._slots = {str(s) for s in data.get("slots", [])}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, AttributeError) as exc:
            raise OSError(f"{self.path}: unreadable ({exc}); move it away to start afresh") from exc

    def snapshot(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._slots)

    def add(self, slots: Iterable[str]) -> list[str]:
        """Add ``slots``; return those that were new. Written before returning."""
        with self._lock:
            new = [s for s in slots if s not in self._slots]
            if new:
                self._slots.update(new)
                self._write()
            return new

    def discard(self, slots: Iterable[str]) -> None:
        with self._lock:
            gone = self._slots & set(slots)
            if gone:
                self._slots -= gone
                self._write()

    def _write(self) -> None:
        write_atomic(self.path, json.dumps({"slots": sorted(self._slots)}).encode())


def write_status(folder: Path, data: dict[str, Any]) -> None:
    """Write the status file atomically (readable by the operator: mode 0644)."""
    write_atomic(folder / STATUS_FILE, json.dumps(data, indent=1, sort_keys=True).encode(), mode=0o644)
