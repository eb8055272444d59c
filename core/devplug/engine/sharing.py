"""Shared devices as the lifecycle sees them: which physical devices a request's replica IDs stand for, and who
else holds replicas of them.

The kubelet, the ledger and the device locks' callers speak in advertised IDs
(a shared device's replicas, ``<id>::<k>``); drivers get physical IDs with a
:class:`~devplug.types.Replicas` alongside. Tenancies are the ledger's records:
each record is one allocation, so the tenants of a physical device are the
records holding any of its replicas. Every lookup goes through the ledger's
device index and the table's replica map, never over all records.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from devplug.engine.devicetable import DeviceTable
from devplug.engine.ledger import AllocationRecord, Ledger
from devplug.types import Replicas

__all__ = ["DeviceShare", "SharingView", "shared_env_name"]


@dataclass(frozen=True)
class DeviceShare:
    """One shared physical device now: for ``devplug status`` and metrics."""

    device_id: str
    #: How many replicas it is advertised as.
    replicas: int
    #: How many of them allocations hold.
    in_use: int
    #: How many allocations (tenancies) hold a replica of it.
    tenants: int
    #: The pods PodResources listed holding them (as far as known).
    pods: tuple[str, ...]
    #: How many of those allocations are being released.
    releasing: int


def shared_env_name(resource_name: str) -> str:
    """``DEVPLUG_SHARED_DEVICES_<RESOURCE>``: the env var listing a container's physical devices."""
    suffix = "".join(c if c.isalnum() else "_" for c in resource_name).upper()
    return f"DEVPLUG_SHARED_DEVICES_{suffix}"


class SharingView:
    """Maps advertised IDs to physical devices and counts each device's tenants, from the table and the ledger."""

    def __init__(self, table: DeviceTable, ledger: Ledger) -> None:
        self.table = table
        self.ledger = ledger

    def physical_ids(self, device_ids: Iterable[str]) -> list[str]:
        """The physical devices of ``device_ids``, each once, in order."""
        return list(dict.fromkeys(self.table.physical_of(i) for i in device_ids))

    def is_shared(self, device_ids: Iterable[str]) -> bool:
        """True when some of ``device_ids`` is a replica of a shared device."""
        return self.table.names_replicas(device_ids)  # a replica's ID is never its device's

    def holders(self, physical_id: str, *, excluding: Iterable[str] = ()) -> list[AllocationRecord]:
        """The records holding any replica of ``physical_id``, except the records ``excluding`` names."""
        skip = set(excluding)
        found: dict[str, AllocationRecord] = {}
        for rep in self.table.all_replica_ids(physical_id):
            for record in self.ledger.holders(rep):
                if record.id not in skip:
                    found[record.id] = record
        return list(found.values())

    def still_held(self, physical_id: str, released: set[str]) -> bool:
        """True when a replica of ``physical_id`` outside ``released`` is held by some record."""
        return any(self.ledger.holds(rep) for rep in self.table.all_replica_ids(physical_id) if rep not in released)

    def replicas(self, device_ids: Iterable[str], *, excluding: Iterable[str] = ()) -> tuple[list[str], Replicas]:
        """The physical IDs of ``device_ids`` and the :class:`Replicas` a hook gets with them.

        ``excluding`` are the records of the call's own tenancy: they do not
        count in ``in_use`` and ``tenants``.
        """
        skip = set(excluding)
        by_device: dict[str, list[str]] = {}
        for dev_id in device_ids:
            by_device.setdefault(self.table.physical_of(dev_id), []).append(dev_id)
        in_use: dict[str, int] = {}
        tenants: dict[str, int] = {}
        for phys in by_device:
            others = self.holders(phys, excluding=skip)
            tenants[phys] = len(others)
            reps = set(self.table.all_replica_ids(phys))
            in_use[phys] = sum(1 for r in others for d in r.all_devices() if d in reps)
        replicas = Replicas(by_device={k: tuple(v) for k, v in by_device.items()}, in_use=in_use, tenants=tenants)
        return list(by_device), replicas

    def usage(self) -> list[DeviceShare]:
        """Every shared physical device's replicas in use and tenants (index lookups per replica)."""
        shares = []
        for phys, reps in self.table.shared_devices().items():
            records = self.holders(phys)
            known = set(self.table.all_replica_ids(phys))
            shares.append(
                DeviceShare(
                    device_id=phys,
                    replicas=len(reps),
                    in_use=sum(1 for r in records for d in r.all_devices() if d in known),
                    tenants=len(records),
                    pods=tuple(sorted({r.pod for r in records if r.pod is not None})),
                    releasing=sum(1 for r in records if r.releasing),
                )
            )
        return shares
