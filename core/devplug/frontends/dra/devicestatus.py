"""What a driver's ``allocate`` says of its devices, as the entries of the claim's ``status.devices`` (KEP-4817).

A driver of hook contract 1.1 may answer ``allocate`` with
``ContainerAllocation.device_status``: a :class:`~devplug.types.DeviceStatus` per device ID it was given (the
physical ID of a shared device: the driver never sees replica IDs). Through DRA each becomes one
``AllocatedDeviceStatus`` per allocation result of this driver and pool that maps to that device
(``k8s.io/api/resource/v1/types.go``, ``ResourceClaimStatus.Devices``, a list map keyed by ``driver``,
``device``, ``pool`` and ``shareID``):

* a device of its own: the result naming it;
* a shared device published as N devices: each result naming one of its replicas (``mock0::1`` -> ``mock0``);
* a shared device published as one consumable device (KEP-5075): each result naming it, with the result's
  ``shareID`` (``validateDeviceStatus`` in ``pkg/apis/resource/validation/validation.go`` requires driver, pool,
  device and shareID to be those of an allocation result: "must be an allocated device in the claim").

Each entry carries what the status holds (the wire names of ``AllocatedDeviceStatus``):

* ``conditions``: ``metav1.Condition``s, whose ``lastTransitionTime`` is required
  (``ValidateCondition`` in ``apimachinery/pkg/apis/meta/v1/validation/validation.go``: "must be set"); it is
  the time the entries were built (RFC 3339, seconds), kept with them so that writing them again changes
  nothing. ``observedGeneration`` is optional (``>= 0`` when set) and left out: the claim's generation says
  nothing of the device. ``message`` is sent even when empty (the Go type has no ``omitempty``);
* ``data``: the driver's JSON object (at most 10 KiB: ``AllocatedDeviceStatusDataMaxLength``);
* ``networkData``: ``interfaceName``, ``ips`` and ``hardwareAddress``, each only when set (``omitempty``).

A status the driver gave for an ID that names none of the claim's devices is left out (and named, for the log);
a status with nothing in it makes no entry.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from devplug.frontends.dra.claims import AllocatedDevice
from devplug.types import DeviceStatus

__all__ = ["StatusEntries", "entry_key", "now_rfc3339", "status_entries"]


def now_rfc3339(now: float | None = None) -> str:
    """``metav1.Time`` as the API server writes it: UTC, RFC 3339, whole seconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))


def entry_key(entry: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """The list map key of an ``AllocatedDeviceStatus``: driver, pool, device and shareID (``""`` when unset)."""
    return (
        str(entry.get("driver", "")),
        str(entry.get("pool", "")),
        str(entry.get("device", "")),
        str(entry.get("shareID") or ""),
    )


@dataclass(frozen=True)
class StatusEntries:
    """The entries of one claim, and the device IDs whose status matched none of its devices."""

    entries: tuple[Mapping[str, Any], ...]
    #: Device IDs the driver gave a status for that name none of the claim's devices of this driver and pool.
    unmatched: tuple[str, ...] = ()
    #: The device ID (as allocate was given it) each entry is for, in the entries' order: for the log.
    device_ids: tuple[str, ...] = ()


def _conditions(status: DeviceStatus, when: str) -> list[dict[str, Any]]:
    return [
        {
            "type": c.type,
            "status": c.status,
            "reason": c.reason,
            "message": c.message,
            "lastTransitionTime": when,
        }
        for c in status.conditions
    ]


def _entry(driver: str, pool: str, dev: AllocatedDevice, status: DeviceStatus, when: str) -> dict[str, Any] | None:
    entry: dict[str, Any] = {"driver": driver, "pool": pool, "device": dev.device_name}
    if dev.share_id:
        entry["shareID"] = dev.share_id
    if status.conditions:
        entry["conditions"] = _conditions(status, when)
    if status.data is not None:
        entry["data"] = dict(status.data)
    network = status.network_data
    if network is not None:
        wire: dict[str, Any] = {}
        if network.interface_name:
            wire["interfaceName"] = network.interface_name
        if network.ips:
            wire["ips"] = list(network.ips)
        if network.hardware_address:
            wire["hardwareAddress"] = network.hardware_address
        if wire:
            entry["networkData"] = wire
    return entry if len(entry) > (4 if dev.share_id else 3) else None


def status_entries(
    driver: str,
    pool: str,
    devices: Sequence[AllocatedDevice],
    statuses: Mapping[str, DeviceStatus],
    physical_of: Callable[[str], str],
    *,
    now: float | None = None,
) -> StatusEntries:
    """The ``status.devices`` entries of a claim's ``devices`` (this driver's, in this pool) from the driver's
    ``statuses`` (by the device IDs ``allocate`` was given); ``physical_of`` maps a replica ID to its device's.
    Called once per prepare, when the driver's answer comes; returns the entries in the allocation's order."""
    if not statuses:
        return StatusEntries(())
    when = now_rfc3339(now)
    entries: list[Mapping[str, Any]] = []
    ids: list[str] = []
    used: set[str] = set()
    for dev in devices:
        key = dev.device_id if dev.device_id in statuses else physical_of(dev.device_id)
        status = statuses.get(key)
        if status is None:
            continue
        used.add(key)
        entry = _entry(driver, pool, dev, status, when)
        if entry is not None:
            entries.append(entry)
            ids.append(key)
    unmatched = tuple(sorted(k for k in statuses if k not in used))
    return StatusEntries(tuple(entries), unmatched, tuple(ids))
