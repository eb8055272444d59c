"""Choosing devices for a container: the driver's ``preferred_allocation`` (or the core's default), bounded by what
was offered.

Shared devices: the driver (or the core's spread) chooses physical devices, each
named once per replica wanted, and gets each device's free replicas picked for
it.

Partitions: the choice keeps only parts that fit their parents' counters together
with the held parts, and fills up from the offered devices that fit
(:meth:`~devplug.engine.partguard.PartitionGuard.fitting`): the kubelet would
otherwise take two free parts an Allocate then refuses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Container, Sequence
from typing import Any

from devplug.engine.devicetable import DeviceTable
from devplug.engine.driver import AsyncDriver
from devplug.engine.requestcheck import RequestChecks
from devplug.engine.sharing import SharingView
from devplug.errors import DeviceBusyError, HookTimeoutError, RequestError
from devplug.text.logsafe import id_list
from devplug.types import Device, Replicas

__all__ = ["DeviceChoice"]


class DeviceChoice:
    """The preferred devices of one resource for a container."""

    def __init__(
        self,
        resource_name: str,
        table: DeviceTable,
        driver: AsyncDriver,
        sharing: SharingView,
        checks: RequestChecks,
        fitting: Callable[[Sequence[str], Sequence[str], Sequence[str], int], list[str]] | None = None,
    ) -> None:
        self.resource_name = resource_name
        self.table = table
        self.driver = driver
        self.sharing = sharing
        self.checks = checks
        self._running: asyncio.Future[Any] | None = None
        #: Keeps a choice's parts within their parents' counters (``PartitionGuard.fitting``), when given.
        self._fitting = fitting

    async def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        """:meth:`_preferred`, its parts kept within their parents' counters when the table has partitions."""
        chosen = await self._preferred(available, must_include, size)
        if self.table.partitions is None or self._fitting is None:
            return chosen
        return self._fitting(chosen, available, must_include, size)

    async def _preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        """The preferred devices for one container: ``must_include`` first, then the driver's choice;
        at most ``size`` IDs, all within ``available``.

        The kubelet (``devicesToAllocate`` in its device manager) puts ``must_include``
        (devices already chosen) into ``available``, asks only while it has fewer than
        ``size``, and takes from the answer, in no set order, the free devices it
        offered until it has ``size``: an ID outside ``available`` is ignored and IDs
        past ``size`` are dropped at random. So a request no kubelet sends (a
        must-include outside ``available``, more must-includes than ``size``) is
        refused, and the answer never holds more than ``size`` IDs.
        """
        self.checks.not_retired("nothing was chosen")
        if size < 0:
            raise RequestError(f"{self.resource_name}: allocation_size {size} is negative")
        offered_ids = set(available) if must_include else ()  # no 1,000-ID set when nothing must be included
        outside = [i for i in dict.fromkeys(must_include) if i not in offered_ids]
        if outside:
            raise RequestError(
                f"{self.resource_name}: must_include device IDs not in available: {id_list(outside)} "
                "(the kubelet always offers the devices it must include)"
            )
        if len(set(must_include)) > size:
            raise RequestError(
                f"{self.resource_name}: {len(set(must_include))} must_include device IDs for allocation_size {size} "
                "(the kubelet asks only while fewer than allocation_size devices are chosen)"
            )
        offer = self.table.offer(available, must_include)
        if offer.unknown:
            raise RequestError(f"{self.resource_name}: unknown device IDs: {id_list(sorted(set(offer.unknown)))}")
        offered = offer.devices
        if self.table.shared and self.sharing.is_shared(d.id for d in offered):
            return await self._replicas(offered, must_include, size)
        held = self._held(offered, must_include)
        if held and len(offered) - len(held) > len(set(must_include)):  # some free device to prefer
            return await self._free_first(offered, held, must_include, size, offer.ids)
        chosen = await self._call(offered, must_include, size)
        result = [i for i in dict.fromkeys([*must_include, *chosen]) if i in offer.ids]
        return result[:size]

    def _held(self, offered: list[Device], must_include: Sequence[str]) -> set[str]:
        """The offered devices an earlier tenancy still holds (not ``must_include``: the same pod's reuse).

        The kubelet offers a device as soon as it forgot the pod that had it; devplug may not know that tenancy is
        over yet, and its containers may still run: an Allocate of such a device first releases it, or is refused
        while its tenant runs. A device no tenancy holds is free now.
        """
        ledger = self.sharing.ledger
        if not len(ledger):
            return set()
        musts = set(must_include)
        return {d.id for d in offered if d.id not in musts and ledger.holds(d.id)}

    async def _free_first(
        self, offered: list[Device], held: set[str], must_include: Sequence[str], size: int, ids: Container[str]
    ) -> list[str]:
        """:meth:`preferred` when some offered devices are still held: the driver chooses among the free ones, and
        held ones only fill what the free ones cannot (the kubelet would fill a shortfall at random)."""
        free = [d for d in offered if d.id not in held]
        chosen = await self._call(free, must_include, size)
        result = [i for i in dict.fromkeys([*must_include, *chosen]) if i in ids and i not in held]
        for dev in offered:
            if len(result) >= size:
                break
            if dev.id in held:
                result.append(dev.id)
        return result[:size]

    async def _replicas(self, offered: list[Device], must_include: Sequence[str], size: int) -> list[str]:
        """:meth:`preferred` on shared devices: the driver (or the core's spread) chooses physical devices,
        each named once per replica, and gets each device's free replicas picked for it."""
        musts = list(dict.fromkeys(must_include))
        physical_ids, replicas = self.sharing.replicas([d.id for d in offered])
        physical = [p for i in physical_ids if (p := self._physical_device(i)) is not None]
        chosen = await self._call(physical, [self.table.physical_of(i) for i in musts], size, replicas)
        free = {phys: [i for i in ids if i not in musts] for phys, ids in replicas.by_device.items()}
        result = list(musts)
        for choice in chosen:
            if len(result) >= size:
                break
            if choice in replicas.by_device and free.get(choice):
                result.append(free[choice].pop(0))  # a physical device: its next free replica
                continue
            phys = self.table.physical_of(choice)
            if choice != phys and choice in free.get(phys, ()):  # a replica ID of an offered device
                free[phys].remove(choice)
                result.append(choice)
        return result[:size]

    async def _call(
        self, offered: list[Device], must_include: Sequence[str], size: int, replicas: Replicas | None = None
    ) -> list[str]:
        """The driver's ``preferred_allocation``; refused at once while an earlier call that outlived
        ``hook_timeout`` still runs (each would take a thread of its own)."""
        running = self._running
        if running is not None and not running.done():
            raise DeviceBusyError(
                f"{self.resource_name}: the driver's preferred_allocation has not returned since it outlived "
                "hook_timeout; nothing was chosen"
            )
        try:
            return await self.driver.preferred_allocation(offered, must_include, size, replicas)
        except HookTimeoutError as exc:
            self._running = exc.still_running
            raise

    def _physical_device(self, physical_id: str) -> Device | None:
        """The driver's device, as the kubelet sees it (unhealthy while the resource is degraded)."""
        dev = self.table.physical(physical_id)
        return None if dev is None else self.table.advertised_physical(dev)
