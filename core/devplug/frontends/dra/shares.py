"""Shares of a device with consumable capacity (KEP-5075): which of its replicas a claim's share is prepared on.

A device the driver shares among N containers (``Device.replicas``) is kept by
the core as N replica IDs (``<id>::0`` .. ``<id>::<N-1>``): the ledger, the
device locks and the release of the last tenant all speak of replicas. Where the
API server keeps ``allowMultipleAllocations`` and a capacity's ``requestPolicy``
(``DRAConsumableCapacity``), such a device is published as ONE device named
after its physical ID, with a capacity (``Device.share_capacity``: ``shares`` by
default) of N times ``per_replica``, requested in steps of ``per_replica``
(:mod:`devplug.frontends.dra.slicecontent`). The scheduler then allocates it to
several claims, each result with a ``shareID`` (a UID) and ``consumedCapacity``
(``k8s.io/api/resource/v1/types.go``, ``DeviceRequestAllocationResult``; both are
set for every result on a device with ``allowMultipleAllocations``, admin access
included: ``allocateDevice`` in
``k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go``,
Kubernetes 1.36). The key of ``consumedCapacity`` is the device's capacity name
as published (``capacityNameForStatus`` in ``consumable_capacity.go``: the bare
name when the device published it bare), or that name qualified with the driver's
domain; both are read.

This module maps each share to replicas (the device's capacity as
:func:`devplug.frontends.dra.capacity.shared_capacity` gives it):

* a share of amount ``q`` holds ``ceil(q / per_replica)`` replicas (the scheduler
  rounds a request up to the policy's step, ``roundUpRange``, so ``q`` is normally
  a whole number of steps already); an amount of 0 or less, above the device's
  capacity, not a quantity, or a result without ``shareID`` or without the
  capacity in ``consumedCapacity``: :class:`ShareError`, naming the claim, device
  and share;
* :func:`choose`: the replicas of a fresh prepare, the lowest indexes that no
  ledger record holds (pending, prepared or being released) and that the device
  table does not withhold (a hook still running on the device, a lowered replica
  count), every share of the claim at once, all or nothing; too few:
  :class:`OverConsumedError` naming the device, the share, how many it needs and
  how many are free (the scheduler's view of the device and the node's differ:
  a replica still being cleaned after its claim was deallocated, say);
* :func:`assign`: the same shares over the replicas a ledger record already holds
  (a claim prepared again: the kubelet repeats calls, after its restart or the
  daemon's), compared by how many replicas of each device the shares need, not
  by replica ID (share IDs are not recorded; an allocation cannot change without
  the claim being unprepared first: ``status.allocation`` may be set or removed, not
  changed: ``+k8s:update=NoModify`` on ``ResourceClaimStatus.Allocation`` in
  ``k8s.io/api/resource/v1/types.go`` v0.36.3, and "status.Allocation is immutable"
  in ``pkg/registry/resource/utils.go``).

A result on a device published in the N-device form (a replica ID) is no share:
it holds its one replica, as before. The device is cleaned once its last replica
is released, by the engine (``engine/release.py``, ``split_last_tenants``): a
share's release calls the driver's ``deallocate`` only when no other record holds
a replica of the device.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from devplug.engine import DeviceTable
from devplug.frontends.dra.capacity import SharedCapacity, shared_capacity
from devplug.frontends.dra.claims import AllocatedDevice, ClaimError, ClaimRef
from devplug.frontends.dra.quantity import QuantityError, ceil_div, parse_quantity

__all__ = ["OverConsumedError", "Share", "ShareError", "ShareLocks", "assign", "choose", "replica_order", "shares_of"]


class ShareError(ClaimError):
    """A share the claim's allocation describes wrongly (no shareID, no or a bad consumed amount)."""


class OverConsumedError(ClaimError):
    """The node has fewer free replicas of a device than the claim's shares need."""


@dataclass(frozen=True)
class Share:
    """One result of the claim on a device with consumable capacity, and how many replicas it holds."""

    #: The result's position in the claim's allocation (``ClaimAllocation.devices``).
    index: int
    device: AllocatedDevice
    of: SharedCapacity
    amount: Fraction
    replicas: int

    def describe(self) -> str:
        return f"share {self.device.share_id} of device {self.device.device_name} ({self.of.device_id})"


def _amount(claim: ClaimRef, dev: AllocatedDevice, of: SharedCapacity, driver: str) -> Fraction:
    name = of.name
    consumed = dict(dev.consumed_capacity)
    where = f"request {dev.request!r}, share {dev.share_id} of device {dev.device_name}"
    text = consumed.get(name, consumed.get(f"{driver}/{name}"))
    if text is None:
        raise ShareError(
            claim,
            f"{where}: its consumedCapacity names no {name!r} (it has {sorted(consumed) or 'none'}); the "
            "scheduler records every capacity of a device it shares (types.go, ConsumedCapacity)",
        )
    try:
        amount = parse_quantity(text)
    except QuantityError as exc:
        raise ShareError(claim, f"{where}: consumedCapacity[{name!r}]: {exc}") from exc
    if amount <= 0 or amount > of.total:
        raise ShareError(
            claim, f"{where}: consumes {text} {name}, outside what the device offers (above 0, at most {of.total})"
        )
    return amount


def shares_of(claim: ClaimRef, devices: Sequence[AllocatedDevice], table: DeviceTable, driver: str) -> dict[int, Share]:
    """The shares among ``devices`` (by position), each with the replicas it needs; :class:`ShareError` for a
    share described wrongly. Results on devices allocated whole are not among them."""
    shares: dict[int, Share] = {}
    for index, dev in enumerate(devices):
        of = shared_capacity(table, dev.device_id)
        if of is None:
            continue
        if not dev.share_id:
            raise ShareError(
                claim,
                f"request {dev.request!r} was given device {dev.device_name}, which is published with "
                f"consumable capacity, without a shareID (the scheduler gives one to every allocation of such a "
                "device: allocator_incubating.go, allocateDevice)",
            )
        amount = _amount(claim, dev, of, driver)
        shares[index] = Share(index, dev, of, amount, ceil_div(amount, of.per_replica))
    return shares


def _ids(
    devices: Sequence[AllocatedDevice], shares: dict[int, Share], picked: dict[int, tuple[str, ...]]
) -> list[tuple[str, ...]]:
    return [picked[i] if i in shares else (dev.device_id,) for i, dev in enumerate(devices)]


def choose(
    claim: ClaimRef,
    devices: Sequence[AllocatedDevice],
    shares: dict[int, Share],
    *,
    held: Callable[[str], bool],
    withheld: frozenset[str],
) -> list[tuple[str, ...]]:
    """Each result's device IDs for a fresh prepare: a share's free replicas (lowest indexes first, the claim's
    shares in their order), a whole device's own ID. :class:`OverConsumedError` when a device has too few."""
    free: dict[str, list[str]] = {}
    for share in shares.values():
        if share.of.device_id not in free:
            free[share.of.device_id] = [r for r in share.of.replica_ids if not held(r) and r not in withheld]
    picked: dict[int, tuple[str, ...]] = {}
    for index, share in shares.items():
        left = free[share.of.device_id]
        if len(left) < share.replicas:
            wanted = sum(s.replicas for s in shares.values() if s.of.device_id == share.of.device_id)
            available = len([r for r in share.of.replica_ids if not held(r) and r not in withheld])
            raise OverConsumedError(
                claim,
                f"{share.describe()} needs {share.replicas} replica(s) ({share.amount} "
                f"{share.of.name}); the claim's shares of it need {wanted} and {available} of its "
                f"{len(share.of.replica_ids)} are free on this node (over-consumed: the scheduler's view of the device "
                "and this node's differ); nothing was prepared",
            )
        picked[index], free[share.of.device_id] = tuple(left[: share.replicas]), left[share.replicas :]
    return _ids(devices, shares, picked)


def assign(
    devices: Sequence[AllocatedDevice], shares: dict[int, Share], held: Sequence[str], table: DeviceTable
) -> list[tuple[str, ...]] | None:
    """Each result's device IDs over the IDs a record ``held``: its replicas of each shared device handed to the
    shares in order, lowest index first; None when the record does not hold what the results need (as many
    replicas of each shared device as its shares, and the other devices themselves)."""
    shared = {s.of.device_id for s in shares.values()}
    by_device: dict[str, list[str]] = {}
    whole: list[str] = []
    for device_id in held:
        physical = table.physical_of(device_id)
        if physical in shared and device_id != physical:
            by_device.setdefault(physical, []).append(device_id)
        else:
            whole.append(device_id)
    order = {d: replica_order(d) for d in held}
    picked: dict[int, tuple[str, ...]] = {}
    for index, share in shares.items():
        left = sorted(by_device.get(share.of.device_id, []), key=order.__getitem__)
        if len(left) < share.replicas:
            return None
        picked[index], by_device[share.of.device_id] = tuple(left[: share.replicas]), left[share.replicas :]
    if any(by_device.values()):
        return None
    plain = [dev.device_id for i, dev in enumerate(devices) if i not in shares]
    if sorted(plain) != sorted(whole):
        return None
    return _ids(devices, shares, picked)


def replica_order(replica_id: str) -> tuple[int, str]:
    """A replica ID's place among its device's (``<id>::<k>``: by ``k``; anything else after, by text)."""
    _, sep, index = replica_id.rpartition("::")
    return (int(index), "") if sep and index.isascii() and index.isdigit() else (2**63, replica_id)


class ShareLocks:
    """One lock per device with consumable capacity, for as long as someone holds or waits for it: two claims'
    shares of one device are chosen (:func:`choose`) and admitted one after the other, each admitted before the
    next looks at what is free."""

    def __init__(self) -> None:
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    @contextlib.asynccontextmanager
    async def holding(self, shares: Iterable[Share]) -> AsyncIterator[None]:
        """Hold the locks of the devices ``shares`` are of, taken in a fixed order (no two callers deadlock)."""
        async with contextlib.AsyncExitStack() as stack:
            for device_id in sorted({s.of.device_id for s in shares}):
                lock = self._locks.get(device_id)
                if lock is None:
                    lock = self._locks[device_id] = asyncio.Lock()
                await stack.enter_async_context(lock)
            yield
