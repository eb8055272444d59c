"""The daemon's status file, ``<state dir>/status.json``, read by ``devplug status``."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from devplug.daemon.lock import StateLock
from devplug.daemon.lockholder import prove_holder
from devplug.daemon.statusschema import check_status
from devplug.engine.resource import Resource
from devplug.engine.resourcereport import DeviceEntries
from devplug.errors import StateError

__all__ = ["STATUS_FILE", "StatusBuilder", "read_status"]

STATUS_FILE = "status.json"
#: A status file larger than this is not the daemon's (10k listed devices take about 2 MiB).
MAX_STATUS_BYTES = 64 * 1024 * 1024


class StatusBuilder:
    """Builds the status incrementally: a resource's entry is rebuilt only when something it shows changed."""

    def __init__(self, started_at: float, config_path: str | None) -> None:
        self.started_at = started_at
        self.config_path = config_path
        self._cache: dict[str, tuple[tuple[object, ...], dict[str, Any]]] = {}
        self._device_cache: dict[str, DeviceEntries] = {}

    def forget(self, name: str) -> None:
        """Drop ``name``'s cached entry (its resource was replaced by a reload: the new one's counters restart)."""
        self._cache.pop(name, None)
        self._device_cache.pop(name, None)

    async def build(self, resources: Iterable[Resource]) -> dict[str, Any]:
        """The status: each resource's entry rebuilt when its report version changed, reused otherwise.

        A rebuild lets other work run now and then (:mod:`devplug.engine.resourcereport`); an entry is kept under
        the version read before it was built, so a change meanwhile makes the next build rebuild it.
        """
        entries = []
        for resource in list(resources):
            version = resource.report_version()
            cached = self._cache.get(resource.name)
            if cached is None or cached[0] != version:
                device_cache = self._device_cache.setdefault(resource.name, {})
                cached = (version, await resource.report(device_cache))
                self._cache[resource.name] = cached
            entries.append(cached[1])
        return {
            "pid": os.getpid(),
            "started_at": self.started_at,
            "written_at": time.time(),
            "config": self.config_path,
            "resources": entries,
        }


def _holds_lock(state_dir: Path, pid: int) -> bool:
    """Whether process ``pid`` is proven to hold the state dir's lock (a live pid alone may have been reused)."""
    try:
        with prove_holder(state_dir, StateLock(state_dir).path) as holder:
            return holder.pid == pid
    except StateError:
        return False


def _read_regular(path: Path) -> bytes:
    """The file's bytes; refuses (``ValueError``) a FIFO or device, which could block, and a huge file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > MAX_STATUS_BYTES:
            raise ValueError(f"{st.st_size} bytes, more than a status file ever holds")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_status(state_dir: Path) -> dict[str, Any]:
    """The daemon's last status (``running`` added: not stopped, and its pid proven to hold the state dir's lock);
    :class:`StateError` when there is none or it is malformed."""
    path = state_dir / STATUS_FILE
    try:
        raw = _read_regular(path)
    except FileNotFoundError:
        raise StateError(f"no devplug daemon status at {path}: is the daemon running with this state dir?") from None
    except OSError as exc:
        raise StateError(f"{path}: unreadable status file: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise StateError(f"{path}: not a devplug status file: {exc}") from None
    try:
        data = check_status(json.loads(raw))
    except RecursionError:
        raise StateError(f"{path}: not a devplug status file: JSON nested too deeply") from None
    except ValueError as exc:  # JSON syntax, bad UTF-8, or the wrong shape
        raise StateError(f"{path}: not a devplug status file: {exc}") from None
    data["running"] = not data.get("stopped") and _holds_lock(state_dir, data["pid"])
    return data
