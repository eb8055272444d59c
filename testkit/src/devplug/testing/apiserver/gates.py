"""The strategies' ``dropDisabledFields``: what a write loses when a feature gate is off.

Each function is called by the storage on every create and update (main resource, ``status`` subresource, patch,
apply) of its kind, after pruning and defaulting and before validation, with the new object (changed in place),
the stored one (None on create) and the gates that are off. A field is dropped only when the gate is off *and* the
stored object does not use the feature already (the ``...FeatureInUse`` checks), as the real strategies do.

Sources (Kubernetes 1.36):

* ``pkg/registry/resource/resourceslice/strategy.go``: ``dropDisabledDRADeviceTaintsFields``,
  ``dropDisabledDRAPartitionableDevicesFields`` (``sharedCounters``, ``perDeviceNodeSelection``, the devices'
  ``consumesCounters``, ``nodeName``, ``nodeSelector``, ``allNodes``; in use: any of them set),
  ``dropDisabledDRAConsumableCapacityFields`` (``allowMultipleAllocations``, each capacity's ``requestPolicy``);
* ``pkg/registry/resource/resourceclaimspec`` (``DropDisabledFields``, shared by claims and claim templates):
  ``dropDisabledDRAAdminAccessFields`` (``exactly.adminAccess``), ``dropDisabledDRAResourceClaimConsumableCapacity
  Fields`` (``constraints[].distinctAttribute``, ``exactly.capacity``, ``firstAvailable[].capacity``);
* ``pkg/registry/resource/resourceclaim/strategy.go``: ``dropDisabledDRAResourceClaimDeviceStatusFields``
  (``status.devices``), ``dropDisabledDRAAdminAccessStatusFields`` (the results' ``adminAccess``),
  ``dropDisabledDRAResourceClaimConsumableCapacityStatusFields`` (the results' ``shareID`` and
  ``consumedCapacity``, ``status.devices[].shareID``), and ``dropDeallocatedStatusDevices`` (a status update
  that removes allocated devices also removes their ``status.devices`` entries, keyed by driver, pool, device
  and share ID).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["claim_drop_disabled", "slice_drop_disabled"]


def _dicts(value: Any) -> Iterator[dict[str, Any]]:
    for item in value if isinstance(value, list) else ():
        if isinstance(item, dict):
            yield item


def _devices(obj: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return list(_dicts(((obj or {}).get("spec") or {}).get("devices")))


# --- ResourceSlice


def _taints_in_use(old: Mapping[str, Any] | None) -> bool:
    """``draDeviceTaintsFeatureInUse``."""
    return any(d.get("taints") for d in _devices(old))


_PER_DEVICE_NODE = ("nodeName", "nodeSelector", "allNodes")


def _partitionable_in_use(old: Mapping[str, Any] | None) -> bool:
    """``draPartitionableDevicesFeatureInUse``."""
    spec = (old or {}).get("spec") or {}
    if spec.get("sharedCounters") or spec.get("perDeviceNodeSelection") is not None:
        return True
    return any(d.get("consumesCounters") or any(d.get(k) is not None for k in _PER_DEVICE_NODE) for d in _devices(old))


def _consumable_slice_in_use(old: Mapping[str, Any] | None) -> bool:
    """``draConsumableCapacityFeatureInUse`` (the slice's)."""
    for device in _devices(old):
        if device.get("allowMultipleAllocations") is not None:
            return True
        capacity = device.get("capacity")
        if isinstance(capacity, Mapping) and any(
            isinstance(c, Mapping) and c.get("requestPolicy") is not None for c in capacity.values()
        ):
            return True
    return False


def slice_drop_disabled(obj: dict[str, Any], old: Mapping[str, Any] | None, disabled: frozenset[str]) -> None:
    """``resourceslice`` ``dropDisabledFields`` for the modelled gates (DRADeviceTaints, DRAPartitionableDevices,
    DRAConsumableCapacity)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    devices = _devices(obj)
    if "DRADeviceTaints" in disabled and not _taints_in_use(old):
        for device in devices:
            device.pop("taints", None)
    if "DRAPartitionableDevices" in disabled and not _partitionable_in_use(old):
        spec.pop("sharedCounters", None)
        spec.pop("perDeviceNodeSelection", None)
        for device in devices:
            for key in ("consumesCounters", *_PER_DEVICE_NODE):
                device.pop(key, None)
    if "DRAConsumableCapacity" in disabled and not _consumable_slice_in_use(old):
        for device in devices:
            device.pop("allowMultipleAllocations", None)
            capacity = device.get("capacity")
            if isinstance(capacity, Mapping):
                for value in capacity.values():
                    if isinstance(value, dict):
                        value.pop("requestPolicy", None)


# --- ResourceClaim


def _requests(obj: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return list(_dicts((((obj or {}).get("spec") or {}).get("devices") or {}).get("requests")))


def _exactly(request: Mapping[str, Any]) -> dict[str, Any] | None:
    exactly = request.get("exactly")
    return exactly if isinstance(exactly, dict) else None


def _results(obj: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    allocation = ((obj or {}).get("status") or {}).get("allocation") or {}
    return list(_dicts((allocation.get("devices") or {}).get("results") if isinstance(allocation, Mapping) else None))


def _statuses(obj: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return list(_dicts(((obj or {}).get("status") or {}).get("devices")))


def _admin_in_use(old: Mapping[str, Any] | None) -> bool:
    """``draAdminAccessFeatureInUse``: a request's or a result's ``adminAccess`` set (true or false)."""
    if any((_exactly(r) or {}).get("adminAccess") is not None for r in _requests(old)):
        return True
    return any(r.get("adminAccess") is not None for r in _results(old))


def _consumable_claim_in_use(old: Mapping[str, Any] | None) -> bool:
    """``draConsumableCapacityFeatureInUse`` (the claim's: spec, results and device statuses)."""
    constraints = list(_dicts((((old or {}).get("spec") or {}).get("devices") or {}).get("constraints")))
    if any(c.get("distinctAttribute") is not None for c in constraints):
        return True
    for request in _requests(old):
        if (_exactly(request) or {}).get("capacity") is not None:
            return True
        if any(s.get("capacity") is not None for s in _dicts(request.get("firstAvailable"))):
            return True
    if any(r.get("shareID") is not None or r.get("consumedCapacity") is not None for r in _results(old)):
        return True
    return any(s.get("shareID") is not None for s in _statuses(old))


def _device_key(entry: Mapping[str, Any]) -> tuple[Any, Any, Any, Any]:
    """``structured.MakeSharedDeviceID``: driver, pool, device and share ID (None without one)."""
    return (entry.get("driver"), entry.get("pool"), entry.get("device"), entry.get("shareID"))


def _drop_deallocated(obj: dict[str, Any], old: Mapping[str, Any] | None) -> None:
    """``dropDeallocatedStatusDevices``: the ``status.devices`` entries of devices the update took out of the
    allocation go with them."""
    if old is None:
        return
    gone = {_device_key(r) for r in _results(old)} - {_device_key(r) for r in _results(obj)}
    status = obj.get("status")
    if not gone or not isinstance(status, dict) or not isinstance(status.get("devices"), list):
        return
    kept = [s for s in status["devices"] if not (isinstance(s, Mapping) and _device_key(s) in gone)]
    if kept:
        status["devices"] = kept
    else:
        del status["devices"]


def claim_drop_disabled(obj: dict[str, Any], old: Mapping[str, Any] | None, disabled: frozenset[str]) -> None:
    """``resourceclaim`` ``dropDisabledSpecFields`` and ``dropDisabledStatusFields`` for the modelled gates
    (DRAAdminAccess, DRAConsumableCapacity, DRAResourceClaimDeviceStatus), then ``dropDeallocatedStatusDevices``
    (the status strategy's; a main-resource update keeps the old status, so it is a no-op there)."""
    device_status_on = "DRAResourceClaimDeviceStatus" not in disabled or bool(_statuses(old))
    if device_status_on:
        _drop_deallocated(obj, old)
    status = obj.get("status")
    if not device_status_on and isinstance(status, dict):
        status.pop("devices", None)
    if "DRAAdminAccess" in disabled and not _admin_in_use(old):
        for request in _requests(obj):
            (_exactly(request) or {}).pop("adminAccess", None)
        for result in _results(obj):
            result.pop("adminAccess", None)
    if "DRAConsumableCapacity" in disabled and not _consumable_claim_in_use(old):
        devices = (obj.get("spec") or {}).get("devices") or {}
        for constraint in _dicts(devices.get("constraints") if isinstance(devices, Mapping) else None):
            constraint.pop("distinctAttribute", None)
        for request in _requests(obj):
            (_exactly(request) or {}).pop("capacity", None)
            for sub in _dicts(request.get("firstAvailable")):
                sub.pop("capacity", None)
        for result in _results(obj):
            result.pop("shareID", None)
            result.pop("consumedCapacity", None)
        for entry in _statuses(obj):
            entry.pop("shareID", None)
