"""Which devices a hook may touch now: the device locks, hooks running past their timeout, and what is withheld.

Every operation on a resource's devices (an admission, a release, the
kubelet's KEP calls) holds the locks of every device it touches, and of every
other device of the records holding them, for its whole run
(:meth:`DeviceGuard.hold`), so two operations never run hooks on one device at
once. Shared devices are locked per physical device, so tenancies of one device
take turns.

A hook that outlives ``hook_timeout`` may still be working on its devices:
their locks stay held until it returns (:meth:`DeviceGuard.keep_busy`), or the
release that called it waits for it (:meth:`DeviceGuard.await_overdue`).
Meanwhile the devices are withheld (advertised unhealthy), as are the devices
of records being released, those a quarantined ledger entry names, and the free
replicas of a device whose replica count was lowered below its tenants
(:meth:`DeviceGuard.sync_withheld`).

Partitions (contract 1.1, KEP-4815). The parts of a parent that cannot be
allocated now, because what the held parts consume of a parent's counter
leaves too little for them, are withheld too (:mod:`devplug.engine.partitions`, fed by
:mod:`devplug.engine.partguard`: every device an allocation holds, being
released included, and every busy one counts as held). So the kubelet never picks a part an Allocate would refuse,
and a DRA slice taints it. The set is synced whenever what is held changes (an
allocation, a release done, busy or quarantined devices) and when the parts do
(the table's ``on_partitions``, through the resource); a table without
partitions skips it. A parent whose parts disagree about its counters is logged
as a driver error when the parts change.

Busy tenancies. A tenancy the kubelet no longer attributes whose pod's
containers still run, or may (its cgroup cannot be read), keeps its devices
busy: they are withheld too (:meth:`DeviceGuard.withhold_busy`) until the
tenancy is released or turns out to be attributed after all
(:meth:`DeviceGuard.end_busy`). The kubelet offers only healthy devices
(``devicesToAllocate`` in ``pkg/kubelet/cm/devicemanager/manager.go``), so it
gives the next pod a free device, or none, instead of an Allocate that would have
to wait for the previous tenant (the kubelet admits pods one at a time and waits
for that call without a deadline).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from devplug.engine.devicelocks import DeviceLocks, HeldLocks
from devplug.engine.devicetable import DeviceTable
from devplug.engine.hookrunner import HookRunner
from devplug.engine.ledger import AllocationRecord, Ledger
from devplug.engine.partguard import PartitionGuard
from devplug.engine.sharing import SharingView
from devplug.errors import DriverError, HookTimeoutError
from devplug.text.logsafe import id_list

__all__ = ["DeviceGuard"]

log = logging.getLogger("devplug.engine")


class DeviceGuard:
    """The device locks of one resource and every rule about devices no hook may touch now."""

    def __init__(
        self,
        resource_name: str,
        table: DeviceTable,
        ledger: Ledger,
        runner: HookRunner,
        *,
        on_change: Callable[[], None],
        on_freed: Callable[[], None],
    ) -> None:
        self.resource_name = resource_name
        self.table = table
        self.ledger = ledger
        self.sharing = SharingView(table, ledger)
        self._runner = runner
        #: Called when what the status shows changes outside the ledger (busy devices, release failures).
        self._on_change = on_change
        #: Called when a hook kept past its timeout returned (a release of its devices may be due).
        self._on_freed = on_freed
        self.locks = DeviceLocks(self._kept_released)
        #: Physical device ID -> what a release hook still running past ``hook_timeout`` is doing (the release
        #: waits for it to return; the device stays out of service meanwhile).
        self.overdue: dict[str, str] = {}
        #: IDs of the records an admission in flight is filling; reconciliation leaves them alone.
        self.allocating: set[str] = set()
        #: Record ID -> why its devices are busy: the kubelet no longer attributes them, but the tenancy's
        #: containers still run or may (withheld until it is released or attributed again).
        self.busy: dict[str, str] = {}
        #: Partitions: what is held of each parent, what cannot be allocated now, checks (contract 1.1).
        self.parts = PartitionGuard(resource_name, table, ledger, self._busy_physical)

    # --- locks

    def closure(self, device_ids: Iterable[str]) -> set[str]:
        """``device_ids`` and every other device of the records holding them; for shared devices also of the
        records releasing another replica of them (an admission finishes those first)."""
        ids = set(device_ids)
        if not self.table.shared and not self.ledger.holds_any(ids):
            return ids
        out = ids | {d for i in ids for r in self.ledger.holders(i) for d in r.all_devices()}
        if self.table.shared:
            for phys in self.sharing.physical_ids(list(out)):
                out.update(d for r in self.sharing.holders(phys) if r.releasing for d in r.all_devices())
        return out

    def lock_keys(self, device_ids: Iterable[str]) -> set[str]:
        """The locks of advertised IDs: one per physical device, so tenancies of a shared device take turns."""
        return self.table.physical_id_set(device_ids)

    def hold(self, device_ids: Iterable[str], what: str, timeout: float | None = None) -> HeldDevices:
        """``async with``: hold the locks of ``device_ids`` and of every device of the records holding them
        (``as`` gives True when that had to wait: other work ran meanwhile)."""
        return HeldDevices(self, device_ids, what, timeout)

    def set_activity(self, device_ids: Iterable[str], what: str) -> None:
        """Say what holds the locks of ``device_ids`` now (named in refusals of other operations)."""
        self.locks.set_activity(self.lock_keys(device_ids), what)

    # --- hooks running past their timeout

    def keep_if_hung(self, exc: DriverError, device_ids: Sequence[str]) -> None:
        """After a hook on ``device_ids`` failed: if it outlived ``hook_timeout`` and still runs, keep the devices
        busy until it returns (:meth:`keep_busy`)."""
        if isinstance(exc, HookTimeoutError) and exc.still_running is not None:
            self.keep_busy(exc.still_running, device_ids, exc.hook or "a hook")

    def keep_busy(self, running: asyncio.Future[Any], device_ids: Sequence[str], hook: str) -> None:
        """A hook on ``device_ids`` outlived ``hook_timeout`` and still runs: their locks stay held (no other hook
        touches them) and they are advertised unhealthy until it returns; the resource's other devices go on."""
        if running.done():
            return
        keys = self.lock_keys(device_ids)
        self.locks.keep_until(
            keys, running, f"{hook} running past hook_timeout ({self._runner.timeout:g} s) since {time.ctime()}"
        )
        self.sync_withheld()
        self._on_change()
        log.warning(
            "[%s] %s of %s did not return within hook_timeout (%g s): the devices stay out of service until it "
            "returns; the other devices go on",
            self.resource_name,
            hook,
            id_list(list(device_ids)),
            self._runner.timeout,
            extra={"device": id_list(list(device_ids))},
        )

    def _kept_released(self, keys: list[str]) -> None:
        """A hook abandoned at its timeout returned: its devices are back (unless released meanwhile)."""
        log.info(
            "[%s] the hook abandoned on %s returned: the devices are in service again",
            self.resource_name,
            id_list(keys),
        )
        self.sync_withheld()
        self._on_change()
        self._on_freed()

    async def await_overdue(self, hook: str, running: asyncio.Future[Any], device_ids: Sequence[str]) -> None:
        """Wait for a release hook running past ``hook_timeout`` (its devices' locks held, the devices withheld);
        its failure is raised as the hook's."""
        keys = self.lock_keys(device_ids)
        started = time.time()
        what = f"{hook} running past hook_timeout ({self._runner.timeout:g} s) since {time.ctime(started)}"
        self.overdue.update(dict.fromkeys(keys, what))
        self.locks.set_activity(keys, f"release: {what}")
        shown = id_list(list(device_ids))
        log.warning(
            "[%s] %s of %s did not return within hook_timeout (%g s): waiting for it; the devices stay out of "
            "service and no other hook runs on them until it returns",
            self.resource_name,
            hook,
            shown,
            self._runner.timeout,
            extra={"device": shown},
        )
        self.sync_withheld()
        self._on_change()
        try:
            await self._runner.outcome(hook, running)
        finally:
            for key in keys:
                self.overdue.pop(key, None)
            self.sync_withheld()
            self._on_change()
        log.info(
            "[%s] %s of %s returned after %.1f s",
            self.resource_name,
            hook,
            shown,
            time.time() - started,
            extra={"device": shown},
        )

    # --- what no hook may touch, and what is withheld

    def busy_devices(self, device_ids: Iterable[str] | None = None) -> dict[str, str]:
        """Devices (of ``device_ids``, or all) that no hook may touch now, and why: a hook abandoned at its
        ``hook_timeout`` still runs on them, a release hook runs past its timeout, an earlier allocate of them
        timed out and has not returned, or a quarantined ledger record names them."""
        kept = self.locks.kept()
        quarantined = self.ledger.quarantined_devices()
        if not kept and not self.overdue and not quarantined and not self.allocating:
            return {}  # the common case, without a walk over the IDs
        ids = list(dict.fromkeys(device_ids)) if device_ids is not None else None
        busy: dict[str, str] = {}
        for phys, what in (*kept.items(), *self.overdue.items()):
            for dev in self.table.all_replica_ids(phys):
                if ids is None or dev in ids:
                    busy.setdefault(dev, what)
        for dev, where in quarantined.items():
            if ids is None or dev in ids:
                busy.setdefault(
                    dev, f"named by {where}: withheld until released through the driver or cleared by the operator"
                )
        if self.allocating:
            for dev in ids if ids is not None else self.ledger.held_devices():
                if any(r.releasing and r.id in self.allocating for r in self.ledger.holders(dev)):
                    busy.setdefault(dev, "an earlier allocate of it timed out and has not returned yet")
        return busy

    def withhold_busy(self, record: AllocationRecord, liveness: str) -> None:
        """``record``'s tenancy is over for the kubelet but its containers still run, or may (``liveness``: what its
        cgroup says): advertise its devices unhealthy until :meth:`end_busy` or its release; the status shows why."""
        who = record.pod or record.pod_uid or "its previous pod"
        why = f"the kubelet no longer attributes them but pod {who} may still run ({liveness})"
        if self.busy.get(record.id) == why:
            return
        first = record.id not in self.busy
        self.busy[record.id] = why
        if first:
            shown = id_list(record.all_devices())
            log.info(
                "[%s] %s withheld (advertised unhealthy) while %s",
                self.resource_name,
                shown,
                why,
                extra={"device": shown},
            )
            self.sync_withheld()
        self._on_change()

    def end_busy(self, record_id: str) -> None:
        """The record's tenancy is released, being released, or attributed again: its devices are not busy."""
        if self.busy.pop(record_id, None) is not None:
            self.sync_withheld()
            self._on_change()

    def busy_tenancies(self) -> list[tuple[AllocationRecord, str]]:
        """The busy tenancies still in the ledger and not being released, with why they are busy."""
        found = []
        for record_id, why in self.busy.items():
            record = self.ledger.get(record_id)
            if record is not None and not record.releasing:
                found.append((record, why))
        return found

    def _busy_physical(self) -> list[str]:
        """The physical devices a hook still running keeps busy (kept past its timeout, or an overdue release)."""
        return [*self.locks.kept(), *self.overdue]

    def sync_withheld(self) -> None:
        """Advertise unhealthy the devices being released, those a hook still running keeps busy, those a
        quarantined ledger record names, those of busy tenancies (:meth:`withhold_busy`), the free replicas of
        a device that already has as many tenants as its (lowered) replica count allows, and the parts whose
        parent's counters the held parts leave too little of (:mod:`devplug.engine.partitions`)."""
        withheld = self.ledger.releasing_devices()
        if self.busy:
            for gone in [i for i in self.busy if self.ledger.get(i) is None]:
                del self.busy[gone]  # released: its devices are free (or withheld above while releasing)
            for record_id in self.busy:
                record = self.ledger.get(record_id)
                if record is not None:
                    withheld.update(record.all_devices())
        for phys in [*self.locks.kept(), *self.overdue]:
            withheld.update(self.table.all_replica_ids(phys))
        withheld.update(self.ledger.quarantined_devices())
        if self.table.shrunk:  # a lowered replica count: no more tenants than replicas while the excess drains
            withheld.update(self.table.excess_replicas(self.ledger.holds))
        parts = self.table.partitions
        if parts is None:
            self.table.set_withheld(withheld)
            return
        blocked = self.parts.blocked(parts)
        only = blocked.difference(withheld) if withheld else blocked
        self.table.set_withheld(withheld.union(blocked), only)


class HeldDevices:
    """The locks :meth:`DeviceGuard.hold` takes, for an ``async with`` block (a class: every Allocate takes one,
    and a generator-based context manager costs several times more)."""

    def __init__(self, guard: DeviceGuard, device_ids: Iterable[str], what: str, timeout: float | None) -> None:
        self._guard = guard
        self._device_ids = device_ids
        self._what = what
        self._timeout = timeout
        self._held: HeldLocks | None = None

    async def __aenter__(self) -> bool:
        """Take the locks; True when that had to wait (other coroutines ran meanwhile)."""
        guard = self._guard
        want = guard.closure(self._device_ids)
        waited = False
        while True:
            held = guard.locks.hold(guard.lock_keys(want), self._what, self._timeout)
            if not await held.__aenter__():
                # Fast path (issue 42): taken without waiting, so nothing ran since ``want`` was found and no record
                # can have grown: the closure is not looked up again (0.5 us per Allocate in a loop: a set and an
                # index lookup; small, but the second look said nothing new on every Allocate that did not wait).
                self._held = held
                return waited
            waited = True
            try:
                now = guard.closure(want)
            except BaseException:
                held.release()
                raise
            if now <= want:
                self._held = held
                return waited
            held.release()
            want = now  # a record grew while we waited: take its new devices too

    async def __aexit__(self, *exc: object) -> None:
        if self._held is not None:
            self._held.release()
            self._held = None
