"""The daemon's status file, ``<state dir>/status.json``, read by ``devplug status``."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from devplug.engine.asynctools import sliced
from devplug.engine.lock import StateLock
from devplug.engine.lockholder import prove_holder
from devplug.engine.resource import Resource
from devplug.engine.statusschema import check_status
from devplug.errors import StateError
from devplug.types import Device, Health

__all__ = ["STATUS_FILE", "StatusBuilder", "read_status"]

STATUS_FILE = "status.json"
#: A status file larger than this is not the daemon's (10k listed devices take about 2 MiB).
MAX_STATUS_BYTES = 64 * 1024 * 1024


#: Resources with more devices list only the interesting ones (allocated, releasing, unhealthy).
LIST_ALL_DEVICES_UP_TO = 256
#: A status build lets other work run after this many records or device entries: with 1,000 allocations held a
#: build costs about 3 ms, which an Allocate arriving then waited for.
ITEMS_PER_SLICE = 100


#: A device's status entry, and what it was built from (the device object itself, its pod or None when not
#: allocated, releasing, advertised unhealthy): reused while those stay the same.
_CachedEntry = tuple[Device, tuple[bool, str | None, bool, bool], dict[str, Any]]


async def _device_entries(
    resource: Resource,
    listed: Sequence[Device],
    pods: dict[str, str | None],
    releasing: set[str],
    cache: dict[str, _CachedEntry],
) -> list[dict[str, Any]]:
    """The listed devices' entries; an entry whose inputs did not change since the last build is reused
    (read-only), so a status rebuilt while 1,000 devices are held costs lookups, not 1,000 new entries.

    What a device shows is taken from the sets as they were when the build started (the table's withheld set is
    replaced, never changed in place), so a change while the build lets other work run is shown by the next one.
    """
    table = resource.table
    withheld, degraded = table.withheld, table.degraded is not None  # as table.overrides_health
    entries = []
    fresh: dict[str, _CachedEntry] = {}
    async for dev in sliced(listed, ITEMS_PER_SLICE):
        dev_id = dev.id
        inputs = (dev_id in pods, pods.get(dev_id), dev_id in releasing, degraded or dev_id in withheld)
        cached = cache.get(dev_id)
        if cached is None or cached[0] is not dev or cached[1] != inputs:
            cached = (dev, inputs, _device_entry(dev, inputs))
        fresh[dev_id] = cached
        entries.append(cached[2])
    cache.clear()
    cache.update(fresh)
    return entries


def _device_entry(dev: Device, inputs: tuple[bool, str | None, bool, bool]) -> dict[str, Any]:
    allocated, pod, releasing, overridden = inputs
    return {
        "id": dev.id,
        "health": Health.UNHEALTHY.value if overridden else dev.health.value,
        "driver_health": dev.health.value,
        "numa_nodes": list(dev.topology.numa_nodes),
        "allocated": allocated,
        "pod": pod,
        "releasing": releasing,
        **({"reason": dev.reason} if dev.reason and not dev.healthy else {}),
    }


def _sharing_status(resource: Resource) -> dict[str, Any] | None:
    """Replicas per device and, per shared physical device, replicas in use and tenants (``None``: no sharing)."""
    config = resource.config
    shares = resource.shared_devices()
    if config.replicas == 1 and config.configured_name is None and not shares:
        return None
    return {
        "replicas": config.replicas,
        "configured_as": config.configured_name,
        "fail_requests_greater_than_one": config.fail_requests_greater_than_one,
        "devices": [
            {
                "device": s.device_id,
                "replicas": s.replicas,
                "in_use": s.in_use,
                "tenants": s.tenants,
                "releasing": s.releasing,
                "pods": list(s.pods),
            }
            for s in shares
        ],
    }


async def _resource_status(resource: Resource, cache: dict[str, _CachedEntry]) -> dict[str, Any]:
    """One resource's entry. The counts and sets are taken at once; the per-record and per-device walks let
    other work run every :data:`ITEMS_PER_SLICE` (:func:`_device_entries` says what that means for a device)."""
    table = resource.table
    records = list(resource.ledger.records.values())
    releasing = resource.ledger.releasing_devices()
    total = len(table)
    healthy = table.healthy_count()
    unhealthy, withheld = sorted(table.unhealthy_ids()), sorted(table.withheld)
    pods: dict[str, str | None] = {}
    async for record in sliced(records, ITEMS_PER_SLICE):
        pods.update(dict.fromkeys(record.all_devices(), record.pod))
    every = total <= LIST_ALL_DEVICES_UP_TO
    if every:
        listed = table.reported_devices()
    else:  # only the interesting ones, found through the kept sets (a 10k-device table is not walked)
        interesting = list(dict.fromkeys([*pods, *unhealthy, *withheld]))
        listed = [dev async for i in sliced(interesting, ITEMS_PER_SLICE) if (dev := table.reported(i)) is not None]
    devices = await _device_entries(resource, listed, pods, releasing, cache)
    releases = []
    if resource.lifecycle is not None:
        releases = [
            {
                "devices": list(r.device_ids),
                "reason": r.reason,
                "pod": r.pod,
                "finished_at": r.finished_at,
                "duration_s": round(r.duration_s, 4),
                "retry": r.retry,
                "evidence": r.evidence,
            }
            for r in list(resource.lifecycle.recent_releases)[-10:]
        ]
        failures = {
            ", ".join(record.all_devices()): resource.lifecycle.release_failures[record.id].describe()
            for record in records
            if record.id in resource.lifecycle.release_failures
        }
        busy = resource.lifecycle.busy_devices()
    else:
        failures, busy = {}, {}
    return {
        "name": resource.name,
        "driver": resource.config.driver,
        "state": resource.state.value,
        "socket": resource.frontend.endpoint,
        "registrations": resource.registrations,
        "registered_at": resource.registered_at,
        "last_error": resource.last_error,
        "degraded": table.degraded,
        "hooks": resource.hooks.implemented() if resource.hooks else [],
        "counts": {
            "devices": total,
            "healthy": healthy,
            "unhealthy": total - healthy,
            "allocated": len(pods),
            "releasing": len(releasing),
        },
        "devices_listed": "all" if every else "allocated, releasing or unhealthy",
        "devices": devices,
        "recent_releases": releases,
        "release_failures": failures,
        "busy_devices": busy,
        "state_error": resource.state_error,
        "driver_status": resource.published.data,
        **({"sharing": sharing} if (sharing := _sharing_status(resource)) is not None else {}),
        "quarantined_records": [
            {"index": q.index, "key": q.key, "reason": q.reason, "devices": q.devices()}
            for q in resource.ledger.quarantined
        ],
    }


def _version(resource: Resource) -> tuple[object, ...]:
    """Everything a resource's status entry is built from, as cheap counters and scalars."""
    lifecycle = resource.lifecycle
    return (
        resource.table.version,
        resource.ledger.version,
        resource.state,
        resource.status.last_error,
        resource.status.registrations,
        resource.ledger.write_error,
        len(resource.ledger.quarantined),
        None
        if lifecycle is None
        else (len(lifecycle.recent_releases), lifecycle.failures_version, tuple(lifecycle.busy_devices())),
        resource.hooks is not None,
        resource.published.version,
    )


class StatusBuilder:
    """Builds the status incrementally: a resource's entry is rebuilt only when something it shows changed."""

    def __init__(self, started_at: float, config_path: str | None) -> None:
        self.started_at = started_at
        self.config_path = config_path
        self._cache: dict[str, tuple[tuple[object, ...], dict[str, Any]]] = {}
        self._device_cache: dict[str, dict[str, _CachedEntry]] = {}

    def forget(self, name: str) -> None:
        """Drop ``name``'s cached entry (its resource was replaced by a reload: the new one's counters restart)."""
        self._cache.pop(name, None)
        self._device_cache.pop(name, None)

    async def build(self, resources: Iterable[Resource]) -> dict[str, Any]:
        """The status: each resource's entry rebuilt when its :func:`_version` changed, reused otherwise.

        A rebuild lets other work run now and then (:data:`ITEMS_PER_SLICE`); an entry is kept under the
        version read before it was built, so a change meanwhile makes the next build rebuild it.
        """
        entries = []
        for resource in list(resources):
            version = _version(resource)
            cached = self._cache.get(resource.name)
            if cached is None or cached[0] != version:
                device_cache = self._device_cache.setdefault(resource.name, {})
                cached = (version, await _resource_status(resource, device_cache))
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
