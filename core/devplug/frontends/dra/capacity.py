"""A shared device as one ResourceSlice device with consumable capacity (KEP-5075, ``DRAConsumableCapacity``).

A device the table advertises as N replicas (``<id>::0`` .. ``<id>::<N-1>``) is published, where the API server keeps
the fields (:mod:`~devplug.frontends.dra.apiversions` finds out by a dry run), as ONE device named after its physical
ID, with ``allowMultipleAllocations: true`` and one capacity, ``Device.share_capacity`` (default ``shares`` of 1 per
replica), of ``N * per_replica``, requested in steps of ``per_replica``:

.. code-block:: json

    {"name": "mock0", "allowMultipleAllocations": true,
     "attributes": {"deviceID": {"string": "mock0"}},
     "capacity": {"shares": {"value": "4", "requestPolicy": {"default": "1",
                  "validRange": {"min": "1", "max": "4", "step": "1"}}}}}

The request policy follows the rules of ``validateRequestPolicyRange`` (``pkg/apis/resource/validation/
validation.go``): ``default`` is required with ``validRange``, ``min`` is required and at most the capacity's value,
``default`` between ``min`` and ``max``, ``max`` at most the value, ``min + step`` at most the value, and ``default``
and ``max`` a whole number of steps above ``min``. With N >= 2 replicas, ``min = step = default = per_replica`` and
``max = value = N * per_replica`` meet every one (``min + step = 2 * per_replica <= N * per_replica``), which is why
only devices of two replicas or more take this form. The allocator rounds a request up to ``min`` plus a whole number
of steps (``roundUpRange``; no amount asked: the ``default``) and refuses one above ``max`` or above what the device
has left (``staging/src/k8s.io/dynamic-resource-allocation/structured/internal/incubating/consumable_capacity.go``
and its ``experimental`` twin: ``calculateConsumedCapacity``, ``fillEmptyRequest``, ``violatesPolicy``), so a claim's
``consumedCapacity`` is always whole replicas, keyed by the device's capacity name as published.

:class:`SharedCapacity` is what prepare needs of such a device: the capacity's name, the replica IDs and how many
replicas an amount takes (:meth:`SharedCapacity.replicas_for`). :func:`shared_capacity` gives it for a physical ID.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from devplug.engine import DeviceTable
from devplug.types import ShareCapacity

__all__ = ["DEFAULT_SHARE_CAPACITY", "SharedCapacity", "capacity_entry", "quantity_text", "shared_capacity"]

_DECIMAL_SUFFIXES = ("", "k", "M", "G", "T", "P", "E")


def quantity_text(amount: int) -> str:
    """A whole number >= 0 as the API server writes it back: the canonical decimal form of
    ``k8s.io/apimachinery/pkg/api/resource/quantity.go`` (``CanonicalizeBytes`` of a ``DecimalSI`` quantity: the
    exponent a multiple of 3, as large as the number allows): ``4``, ``1500``, ``2k``, ``20k``, ``4294967296``,
    ``12G``. So what the publisher wrote and what it reads back compare equal (a restarted daemon adopts its
    slices without a write)."""
    if amount == 0:
        return "0"
    index = 0
    while amount % 1000 == 0 and index < len(_DECIMAL_SUFFIXES) - 1:
        amount //= 1000
        index += 1
    return f"{amount}{_DECIMAL_SUFFIXES[index]}"


#: The capacity of a shared device that names none: ``shares``, one per replica.
DEFAULT_SHARE_CAPACITY = ShareCapacity()


@dataclass(frozen=True)
class SharedCapacity:
    """A shared device as published with consumable capacity: its physical ID, its capacity's name (bare: in the
    driver's domain), the amount one replica is worth and the replica IDs, in index order."""

    device_id: str
    name: str
    per_replica: int
    replica_ids: tuple[str, ...]

    @property
    def replicas(self) -> int:
        return len(self.replica_ids)

    @property
    def total(self) -> int:
        """The capacity published: replicas times ``per_replica``."""
        return self.replicas * self.per_replica

    def replicas_for(self, amount: int) -> int:
        """How many replicas a share of ``amount`` (of this capacity) takes: ``ceil(amount / per_replica)``.

        Raises ``ValueError`` naming the device when ``amount`` is below 1 or above the device's capacity."""
        if isinstance(amount, bool) or not isinstance(amount, int) or not 1 <= amount <= self.total:
            raise ValueError(
                f"device {self.device_id!r}: a share of {amount!r} {self.name} is outside 1..{self.total} "
                f"({self.replicas} replicas of {self.per_replica})"
            )
        return -(-amount // self.per_replica)

    def capacity_entry(self) -> dict[str, Any]:
        """The device's ``capacity`` map in a ResourceSlice (see the module's docstring)."""
        return capacity_entry(self)


def capacity_entry(shared: SharedCapacity) -> dict[str, Any]:
    """``{name: {value, requestPolicy: {default, validRange: {min, max, step}}}}`` of ``shared``."""
    step, total = quantity_text(shared.per_replica), quantity_text(shared.total)
    policy = {"default": step, "validRange": {"min": step, "max": total, "step": step}}
    return {shared.name: {"value": total, "requestPolicy": policy}}


def shared_capacity(table: DeviceTable, device_id: str) -> SharedCapacity | None:
    """The consumable capacity of the physical device ``device_id``, or ``None`` when the table does not advertise
    it as two replicas or more (a replica ID, an unknown ID, a device of one replica)."""
    dev = table.physical(device_id)
    if dev is None:
        return None
    replica_ids = table.replica_ids(device_id)
    if len(replica_ids) < 2 or replica_ids == (device_id,):
        return None
    share = dev.share_capacity or DEFAULT_SHARE_CAPACITY
    return SharedCapacity(device_id, share.name, share.per_replica, replica_ids)
