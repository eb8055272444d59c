"""The mock driver's record of hook calls: ``<directory>/.calls.jsonl``.

Every call of ``preferred_allocation``, ``allocate``, ``pre_start``,
``post_stop`` and ``deallocate`` appends one JSON object on one line::

    {"hook": "allocate", "device_ids": ["mock0"], "time": 1700000000.25}

written after the hook did its work; a hook that failed adds
``"error": "<message>"``. ``preferred_allocation`` also records
``must_include`` and ``size``; its ``device_ids`` are the available devices.
Each line is appended with a single ``write`` on a file opened with
``O_APPEND``, so lines never interleave, even across processes. A call that
cannot be recorded (the folder is gone) is logged as a warning and does not
fail the hook.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["CALLS_FILE", "CallLog", "read_calls"]

#: The call log's file name, inside the mock folder (a dotfile, so never a device).
CALLS_FILE = ".calls.jsonl"

log = logging.getLogger("devplug_mock")


class CallLog:
    """Appends hook calls to ``<directory>/.calls.jsonl``; thread-safe."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / CALLS_FILE
        self._lock = threading.Lock()

    def record(
        self,
        hook: str,
        device_ids: Sequence[str],
        *,
        error: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Append one call: its hook, device IDs, the time now, and ``error`` if it failed."""
        entry: dict[str, Any] = {"hook": hook, "device_ids": list(device_ids), "time": time.time()}
        if extra:
            entry.update(extra)
        if error is not None:
            entry["error"] = error
        line = (json.dumps(entry) + "\n").encode()
        with self._lock:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
                try:
                    os.write(fd, line)
                finally:
                    os.close(fd)
            except OSError as exc:  # the folder was removed under us: the hook itself still counts
                log.warning("cannot record the %s call in %s: %s", hook, self.path, exc)


def read_calls(directory: Path) -> list[dict[str, Any]]:
    """Every call recorded in ``directory``'s call log, oldest first (``[]`` when there is none)."""
    try:
        data = (Path(directory) / CALLS_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    calls: list[dict[str, Any]] = []
    for line in data.splitlines(keepends=True):
        if line.endswith("\n") and line.strip():  # a line still being written has no newline yet
            calls.append(json.loads(line))
    return calls
