"""A resource's device lifecycle: preferred allocation, allocate, pre-start, post-stop, deallocate, release.

Every kubelet request is checked against the device table before a driver
hook sees it, and every change of the ledger is written to disk before the
kubelet gets an answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from devplug.drivers import DriverHooks
from devplug.engine.devicetable import DeviceTable
from devplug.engine.hookrunner import HookRunner
from devplug.engine.ledger import AllocationRecord, Ledger, new_record_id
from devplug.errors import DriverError, HookTimeoutError, RequestError
from devplug.logsafe import id_list
from devplug.types import ContainerAllocation, Device

__all__ = ["DeviceLifecycle", "Release", "StaleCheck"]

StaleCheck = Callable[[Sequence[AllocationRecord]], Awaitable[list[AllocationRecord]]]

log = logging.getLogger("devplug.engine")


@dataclass(frozen=True)
class Release:
    """One finished release, for the status report and the benchmarks."""

    record_id: str
    device_ids: tuple[str, ...]
    reason: str
    pod: str | None
    finished_at: float
    duration_s: float


def _ids(ids: Sequence[str]) -> str:
    return ", ".join(ids)


class DeviceLifecycle:
    """The operations the kubelet (or the reconciler) drives on one resource."""

    def __init__(
        self,
        resource_name: str,
        table: DeviceTable,
        hooks: DriverHooks,
        runner: HookRunner,
        ledger: Ledger,
        save: Callable[[], Awaitable[None]],
    ) -> None:
        self.resource_name = resource_name
        self.table = table
        self.hooks = hooks
        self.runner = runner
        self.ledger = ledger
        self._save = save
        self.recent_releases: deque[Release] = deque(maxlen=50)
        #: IDs of the records an Allocate in flight is filling; the reconciler leaves them alone.
        self.allocating: set[str] = set()
        #: Called after every successful Allocate (wakes the reconciler).
        self.on_allocated: Callable[[], None] = lambda: None
        #: Given the live records holding devices asked for again, returns those whose pod is gone.
        self.stale_check: StaleCheck | None = None
        self._release_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    # --- validation

    def _check_servable(self, containers: Sequence[Sequence[str]]) -> None:
        unknown: list[str] = []
        unhealthy: list[str] = []
        duplicate: list[str] = []
        seen: set[str] = set()
        for ids in containers:
            for dev_id in ids:
                if dev_id in seen:
                    duplicate.append(dev_id)
                seen.add(dev_id)
                dev = self.table.advertised(dev_id)
                if dev is None:
                    unknown.append(dev_id)
                elif not dev.healthy:
                    unhealthy.append(dev_id)
        problems = []
        if unknown:
            problems.append(f"unknown device IDs: {id_list(unknown)}")
        if unhealthy:
            problems.append(f"unhealthy device IDs: {id_list(unhealthy)}")
        if duplicate:
            problems.append(f"duplicate device IDs: {id_list(sorted(set(duplicate)))}")
        if not seen and not problems:
            problems.append("no device IDs requested")
        if problems:
            raise RequestError(f"{self.resource_name}: " + "; ".join(problems) + "; nothing was allocated")

    # --- kubelet operations

    async def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
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
        if size < 0:
            raise RequestError(f"{self.resource_name}: allocation_size {size} is negative")
        offered_ids = set(available)
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
        unknown = [i for i in (*available, *must_include) if i not in self.table]
        if unknown:
            raise RequestError(f"{self.resource_name}: unknown device IDs: {id_list(sorted(set(unknown)))}")
        offered: list[Device] = []
        for dev_id in dict.fromkeys((*must_include, *available)):
            dev = self.table.advertised(dev_id)
            if dev is not None and (dev.healthy or dev_id in must_include):
                offered.append(dev)
        chosen = await self.runner.call(
            "preferred_allocation", self.hooks.preferred_allocation, offered, tuple(must_include), size
        )
        allowed = {d.id for d in offered}
        result = [i for i in dict.fromkeys([*must_include, *chosen]) if i in allowed]
        return result[:size]

    async def allocate(self, containers: Sequence[Sequence[str]]) -> list[ContainerAllocation]:
        """Allocate for every container of one request, all or nothing."""
        self._check_servable(containers)
        if await self._release_stale_holders(containers):
            self._check_servable(containers)  # a release withholds devices until it is done
        snapshot = self.ledger.snapshot(i for ids in containers for i in ids)
        held_before = self.ledger.held_devices()
        now = time.time()
        records: list[AllocationRecord] = []
        for ids in containers:
            records.append(self.ledger.begin(ids, now))
        inflight = {r.id for r in records}
        self.allocating |= inflight
        try:
            await self._save()
            results: list[ContainerAllocation] = []
            try:
                for ids, record in zip(containers, records, strict=True):
                    allocation = await self.runner.call("allocate", self.hooks.allocate, tuple(ids))
                    self.ledger.confirm(record, allocation)
                    results.append(allocation)
            except DriverError as exc:
                hung = exc.still_running if isinstance(exc, HookTimeoutError) else None
                done = len(results) if hung is not None else len(results) + 1
                await self._undo(containers[:done], held_before)
                self.ledger.restore(snapshot, inflight)
                if hung is not None:
                    self._undo_when_returned(hung, containers[len(results)], held_before, now)
                await self._save()
                failure = HookTimeoutError if hung is not None else DriverError  # hangs degrade the resource
                raise failure(f"{exc}; the allocation was rolled back") from exc
            await self._save()
        finally:
            self.allocating -= inflight
        self.on_allocated()
        for ids in containers:
            log.info("[%s] allocated %s", self.resource_name, _ids(ids), extra={"device": _ids(ids)})
        return results

    async def _release_stale_holders(self, containers: Sequence[Sequence[str]]) -> bool:
        """Release allocations whose pod is gone but whose devices the kubelet hands out again.

        Returns whether anything was released.
        """
        if self.stale_check is None:
            return False
        holders = {r.id: r for ids in containers for i in ids for r in self.ledger.holders(i) if not r.releasing}
        if not holders:
            return False
        stale = await self.stale_check(list(holders.values()))
        for record in stale:
            if record.id in self.ledger.records:
                await self.release(record, f"pod {record.pod} is gone and the kubelet allocates its devices again")
        return bool(stale)

    def _undo_when_returned(
        self, hung: asyncio.Future[Any], ids: Sequence[str], held_before: set[str], now: float
    ) -> None:
        """An allocate that timed out may still prepare its devices: undo it once it returns.

        Until then its devices stay in the ledger as a release in progress, so
        they are advertised unhealthy (the driver may be holding them) and a
        restart after a crash releases them.
        """
        fresh = [i for i in ids if i not in held_before]
        if not fresh:
            return
        record = AllocationRecord(id=new_record_id(), pending=fresh, created=now, releasing=True)
        self.ledger.records[record.id] = record
        self.allocating.add(record.id)  # the reconciler leaves it alone while the hook still runs
        self._sync_withheld()

        async def undo() -> None:
            try:
                await asyncio.wait((hung,))
                log.warning(
                    "[%s] allocate of %s returned after its timeout; undoing it",
                    self.resource_name,
                    _ids(fresh),
                    extra={"device": _ids(fresh)},
                )
                await self.release(record, "undoing an allocate that returned after its timeout")
            except DriverError as exc:
                log.error("[%s] undoing the late allocate of %s failed: %s", self.resource_name, _ids(fresh), exc)
            finally:
                self.allocating.discard(record.id)

        task = asyncio.ensure_future(undo())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _undo(self, containers: Sequence[Sequence[str]], held_before: set[str]) -> None:
        for ids in reversed(containers):
            fresh = [i for i in ids if i not in held_before]
            if not fresh:
                continue
            try:
                await self.runner.call("deallocate", self.hooks.deallocate, tuple(fresh))
            except DriverError as exc:
                log.error("[%s] undoing allocate of %s failed: %s", self.resource_name, _ids(fresh), exc)

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        self._check_known(device_ids)
        await self.runner.call("pre_start", self.hooks.pre_start, tuple(device_ids))

    async def post_stop(self, device_ids: Sequence[str]) -> None:
        """The KEP's PostStopContainer: clean up after one container.

        Devices already post-stopped in their allocation, or already released
        (the reconciler got there first), are not post-stopped again.
        """
        self._check_known(device_ids)
        async with self._release_lock:
            records = self._holders_of(device_ids)
            owed = [i for i in device_ids if any(i in r.all_devices() and i not in r.post_stopped for r in records)]
            now = time.time()
            for record in records:
                record.kep_at = now
            if owed and self.hooks.implements("post_stop"):
                await self.runner.call("post_stop", self.hooks.post_stop, tuple(owed))
            for record in records:
                record.mark_post_stopped(owed)
            if records:
                await self._save()
            skipped = [i for i in device_ids if i not in owed]
            if skipped:
                log.info("[%s] PostStopContainer: %s already cleaned up", self.resource_name, _ids(skipped))

    async def deallocate(self, device_ids: Sequence[str]) -> None:
        """The KEP's Deallocate: the devices are free once the driver is done (skipped if already released)."""
        self._check_known(device_ids)
        async with self._release_lock:
            start = time.monotonic()
            records = self._holders_of(device_ids)
            if not records:
                log.info("[%s] Deallocate: %s already released", self.resource_name, _ids(device_ids))
                return
            for record in records:
                record.releasing = True
                record.kep_at = time.time()
            self._sync_withheld()
            await self._save()
            try:
                if self.hooks.implements("deallocate"):
                    await self.runner.call("deallocate", self.hooks.deallocate, tuple(device_ids))
            except DriverError:
                for record in records:
                    record.releasing = False
                self._sync_withheld()
                await self._save()
                raise
            emptied = self.ledger.drop_devices(device_ids)
            for record in records:
                if record.id in self.ledger.records:
                    record.releasing = False
            self._sync_withheld()
            await self._save()
            for record in emptied:
                self._released(record, tuple(device_ids), "KEP Deallocate", start)

    def _holders_of(self, device_ids: Sequence[str]) -> list[AllocationRecord]:
        return list({r.id: r for i in device_ids for r in self.ledger.holders(i)}.values())

    def _check_known(self, device_ids: Sequence[str]) -> None:
        unknown = [i for i in device_ids if i not in self.table and not self.ledger.holders(i)]
        if unknown:
            raise RequestError(f"{self.resource_name}: unknown device IDs: {id_list(unknown)}")

    # --- releases found by the engine (reconciler, start-up)

    async def release(self, record: AllocationRecord, reason: str) -> None:
        """Release one allocation: post-stop (the devices not yet post-stopped), then deallocate; once.

        The devices are advertised unhealthy from the first step until the
        driver's deallocate returned, so the kubelet never offers a device the
        driver still holds. Releases, and the KEP's PostStopContainer and
        Deallocate, run one at a time, so an allocation the kubelet released
        meanwhile is not released again. A failing hook leaves the record
        releasing; the caller retries later.
        """
        async with self._release_lock:
            if self.ledger.records.get(record.id) is not record:
                return  # released meanwhile (KEP Deallocate)
            start = time.monotonic()
            owed = tuple(record.all_devices())
            if not record.releasing:
                record.releasing = True
                self._sync_withheld()
                await self._save()
            log.info("[%s] releasing %s (%s)", self.resource_name, _ids(owed), reason, extra={"device": _ids(owed)})
            to_stop = tuple(d for d in record.devices if d not in record.post_stopped)
            if to_stop:
                if self.hooks.implements("post_stop"):
                    await self.runner.call("post_stop", self.hooks.post_stop, to_stop)
                record.mark_post_stopped(to_stop)
                await self._save()
            if owed and self.hooks.implements("deallocate"):
                await self.runner.call("deallocate", self.hooks.deallocate, owed)
            self.ledger.remove(record)
            self._sync_withheld()
            await self._save()
            self._released(record, owed, reason, start)

    def _released(self, record: AllocationRecord, devices: tuple[str, ...], reason: str, start: float) -> None:
        release = Release(
            record_id=record.id,
            device_ids=devices,
            reason=reason,
            pod=record.pod,
            finished_at=time.time(),
            duration_s=time.monotonic() - start,
        )
        self.recent_releases.append(release)
        log.info(
            "[%s] released %s (%s)",
            self.resource_name,
            _ids(devices),
            reason,
            extra={"device": _ids(devices)},
        )

    def _sync_withheld(self) -> None:
        self.table.set_withheld(self.ledger.releasing_devices())
