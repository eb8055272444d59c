"""What one resource reports about itself: its entry in the status file and its figures for the metrics.

:class:`~devplug.engine.resource.Resource` hands its parts over as
:class:`ReportSources` (read here, never changed) and answers
``report_version()``, ``report()`` and ``figures()`` with the functions below;
nothing else reads its parts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from devplug.config import ResourceConfig
from devplug.drivers import DriverHooks
from devplug.engine.asynctools import sliced
from devplug.engine.devicetable import DeviceTable
from devplug.engine.driverhost import PublishedStatus
from devplug.engine.ledger import Ledger
from devplug.engine.lifecycle import DeviceLifecycle
from devplug.engine.resourcestatus import ResourceState, ResourceStatus
from devplug.types import Device, Health

__all__ = [
    "ITEMS_PER_SLICE",
    "LIST_ALL_DEVICES_UP_TO",
    "DeviceEntries",
    "ReportSources",
    "ResourceFigures",
    "build_report",
    "figures",
    "report_version",
]

#: Resources with more devices list only the interesting ones (allocated, releasing, unhealthy).
LIST_ALL_DEVICES_UP_TO = 256
#: A status build lets other work run after this many records or device entries: with 1,000 allocations held a
#: build costs about 3 ms, which an Allocate arriving then waited for.
ITEMS_PER_SLICE = 100


#: A device's status entry, and what it was built from (the device object itself, its pod or None when not
#: allocated, releasing, advertised unhealthy): reused while those stay the same.
_CachedEntry = tuple[Device, tuple[bool, str | None, bool, bool], dict[str, Any]]
#: The device entries of a resource's last report, by device ID (kept by the caller between builds).
DeviceEntries = dict[str, _CachedEntry]


@dataclass(frozen=True)
class ReportSources:
    """A resource's parts as one report reads them (the lifecycle and hooks are None until its driver started)."""

    name: str
    config: ResourceConfig
    state: ResourceState
    endpoint: str
    status: ResourceStatus
    table: DeviceTable
    ledger: Ledger
    published: PublishedStatus
    lifecycle: DeviceLifecycle | None
    hooks: DriverHooks | None
    #: What the front end adds (:meth:`~devplug.engine.frontend.FrontEnd.describe`), or None.
    frontend: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ResourceFigures:
    """What the engine keeps about one resource, read on the event loop at scrape time."""

    resource: str
    healthy: int  # advertised healthy to the kubelet
    unhealthy: int  # advertised unhealthy (the driver says so, a release runs, or the resource is degraded)
    registered: bool
    registrations: int
    kubelet_restarts: int
    #: Each shared physical device: (device ID, replicas advertised, replicas in use, tenants).
    shared: Sequence[tuple[str, int, int, int]] = ()
    #: Devices allocations hold (advertised IDs: replicas count one each).
    allocated: int = 0
    #: Devices no hook may touch now (a hook past its timeout still runs, a quarantined record names them).
    busy: int = 0
    #: Devices withheld while their tenancy's containers may still run (the kubelet no longer attributes them).
    withheld_busy: int = 0
    #: Releases failing (retried with backoff).
    failing_releases: int = 0
    #: Each device the driver reports unhealthy, with the reason it gives (empty when it gives none).
    unhealthy_reasons: Sequence[tuple[str, str]] = ()
    #: What the front end says of itself (:meth:`~devplug.engine.frontend.FrontEnd.describe`: a DRA front end's
    #: registration, slices and claims), or None.
    frontend: Mapping[str, Any] | None = None


def figures(src: ReportSources) -> ResourceFigures:
    """The resource's figures for the metrics, as they are now."""
    table, lifecycle = src.table, src.lifecycle
    healthy = table.healthy_count()
    shares = lifecycle.shared_usage() if lifecycle is not None else []
    return ResourceFigures(
        resource=src.name,
        healthy=healthy,
        unhealthy=len(table) - healthy,
        registered=src.state is ResourceState.REGISTERED,
        registrations=src.status.registrations,
        kubelet_restarts=src.status.kubelet_restarts,
        shared=[(d.device_id, d.replicas, d.in_use, d.tenants) for d in shares],
        allocated=len(src.ledger.held_devices()),
        busy=len(lifecycle.busy_devices()) if lifecycle is not None else 0,
        withheld_busy=sum(len(r.all_devices()) for r, _ in lifecycle.busy_tenancies()) if lifecycle is not None else 0,
        failing_releases=len(lifecycle.release_failures) if lifecycle is not None else 0,
        unhealthy_reasons=[
            (dev_id, device.reason or "")
            for dev_id in sorted(table.unhealthy_ids())
            if (device := table.reported(dev_id)) is not None
        ],
        frontend=src.frontend,
    )


def report_version(src: ReportSources) -> tuple[object, ...]:
    """Everything a resource's status entry is built from, as cheap counters and scalars."""
    lifecycle, ledger = src.lifecycle, src.ledger
    return (
        src.table.version,
        ledger.version,
        src.state,
        src.status.last_error,
        src.status.registrations,
        ledger.write_error,
        len(ledger.quarantined),
        None
        if lifecycle is None
        else (
            len(lifecycle.recent_releases),
            lifecycle.failures_version,
            tuple(lifecycle.busy_devices()),
            tuple(r.id for r, _ in lifecycle.busy_tenancies()),
        ),
        src.hooks is not None,
        src.published.version,
        None if src.frontend is None else repr(src.frontend),
    )


async def _device_entries(
    table: DeviceTable,
    listed: Sequence[Device],
    pods: dict[str, str | None],
    releasing: set[str],
    cache: DeviceEntries,
) -> list[dict[str, Any]]:
    """The listed devices' entries; an entry whose inputs did not change since the last build is reused
    (read-only), so a status rebuilt while 1,000 devices are held costs lookups, not 1,000 new entries.

    What a device shows is taken from the sets as they were when the build started (the table's withheld set is
    replaced, never changed in place), so a change while the build lets other work run is shown by the next one.
    """
    withheld, degraded = table.withheld, table.degraded is not None  # as table.overrides_health
    entries = []
    fresh: DeviceEntries = {}
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


def _sharing_status(src: ReportSources) -> dict[str, Any] | None:
    """Replicas per device and, per shared physical device, replicas in use and tenants (``None``: no sharing)."""
    config = src.config
    shares = src.lifecycle.shared_usage() if src.lifecycle is not None else []
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


def _partitions_status(lifecycle: DeviceLifecycle | None) -> list[dict[str, Any]] | None:
    """Per parent of partitioned devices (contract 1.1): its counters, what the held parts consume of them, the held
    parts, the parts that cannot be allocated now (withheld) and, for a driver whose parts disagree about the
    parent's counters, why all are withheld; ``None``: no device declares a partition."""
    usage = lifecycle.partition_usage() if lifecycle is not None else []
    if not usage:
        return None
    return [
        {
            "parent": u.parent,
            "counters": dict(u.counters),
            "in_use": dict(u.in_use),
            "held": list(u.held),
            "blocked": list(u.blocked),
            **({"conflict": u.conflict} if u.conflict is not None else {}),
        }
        for u in usage
    ]


def _releases(lifecycle: DeviceLifecycle) -> list[dict[str, Any]]:
    """The last ten releases, newest last."""
    return [
        {
            "devices": list(r.device_ids),
            "reason": r.reason,
            "pod": r.pod,
            "finished_at": r.finished_at,
            "duration_s": round(r.duration_s, 4),
            "retry": r.retry,
            "evidence": r.evidence,
        }
        for r in list(lifecycle.recent_releases)[-10:]
    ]


async def build_report(src: ReportSources, cache: DeviceEntries) -> dict[str, Any]:
    """One resource's status entry. The counts and sets are taken at once; the per-record and per-device walks let
    other work run every :data:`ITEMS_PER_SLICE` (:func:`_device_entries` says what that means for a device)."""
    table, ledger, lifecycle = src.table, src.ledger, src.lifecycle
    records = list(ledger.records.values())
    releasing = ledger.releasing_devices()
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
    devices = await _device_entries(table, listed, pods, releasing, cache)
    releases: list[dict[str, Any]] = []
    if lifecycle is not None:
        releases = _releases(lifecycle)
        failures = {
            ", ".join(record.all_devices()): lifecycle.release_failures[record.id].describe()
            for record in records
            if record.id in lifecycle.release_failures
        }
        busy = lifecycle.busy_devices()
        withheld_busy = [
            {"devices": record.all_devices(), "pod": record.pod, "pod_uid": record.pod_uid, "why": why}
            for record, why in lifecycle.busy_tenancies()
        ]
    else:
        failures, busy, withheld_busy = {}, {}, []
    return {
        "name": src.name,
        "driver": src.config.driver,
        "state": src.state.value,
        "socket": src.endpoint,
        "registrations": src.status.registrations,
        "registered_at": src.status.registered_at,
        "last_error": src.status.last_error,
        "degraded": table.degraded,
        "hooks": src.hooks.implemented() if src.hooks else [],
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
        "withheld_busy": withheld_busy,
        "state_error": ledger.write_error,
        "driver_status": src.published.data,
        "driver_problem": src.published.problem,
        **({"sharing": sharing} if (sharing := _sharing_status(src)) is not None else {}),
        **({"partitions": parts} if (parts := _partitions_status(lifecycle)) is not None else {}),
        **({"frontend": dict(src.frontend)} if src.frontend is not None else {}),
        "quarantined_records": [
            {"index": q.index, "key": q.key, "reason": q.reason, "devices": q.devices()} for q in ledger.quarantined
        ],
    }
