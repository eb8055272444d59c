"""Releasing a tenancy: post-stop, then deallocate, each written to the ledger before and after, retried until done.

A front end (or an admission finding an earlier tenancy of its devices) decides
that a tenancy is over; :meth:`Releaser.release` then runs the driver's
``post_stop`` for the devices not post-stopped yet and ``deallocate`` for all
of them, and removes the record. The devices are withheld from the first step
until the driver's deallocate returned, so no device the driver still holds is
offered. Each hook's intent is written before the hook is called and its
completion after: a daemon killed in between calls it again after its restart
with ``retry=True`` (the hooks' contract is at-least-once, the retry flagged).

Shared devices (:mod:`devplug.engine.sharing`): releasing a tenancy runs
``post_stop`` for it; ``deallocate`` of a physical device runs only when no
other record holds a replica of it, so a device is never reset under another
tenant.

A hook that outlives ``hook_timeout`` is waited for, its devices' locks held and
the devices withheld: its outcome decides the release, and no second call starts
on its devices meanwhile. A failing hook leaves the record releasing with its
failure kept (:attr:`Releaser.failures`); the caller retries later.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field

from devplug.engine.devicetable import DeviceTable
from devplug.engine.driver import AsyncDriver
from devplug.engine.guard import DeviceGuard
from devplug.engine.ledger import AllocationRecord, Ledger
from devplug.engine.observer import NULL_OBSERVER, ResourceObserver
from devplug.errors import DriverError, HookTimeoutError
from devplug.text.logsafe import id_list
from devplug.types import Replicas

__all__ = ["Release", "ReleaseFailure", "Releaser"]

log = logging.getLogger("devplug.engine")


@dataclass
class ReleaseFailure:
    """A release that failed, until it succeeds: the hook, the driver's own words, attempts, since when."""

    hook: str
    message: str
    attempts: int = 1
    since: float = field(default_factory=time.time)

    def describe(self) -> str:
        """One line for the status: ``deallocate: <the driver's message> (3 attempts since 12:00:01)``."""
        plural = "s" if self.attempts != 1 else ""
        since = time.strftime("%H:%M:%S", time.localtime(self.since))
        return f"{self.hook}: {self.message} ({self.attempts} attempt{plural} since {since})"


@dataclass(frozen=True)
class Release:
    """One finished release, for the status report and the benchmarks."""

    record_id: str
    device_ids: tuple[str, ...]
    reason: str
    pod: str | None
    finished_at: float
    duration_s: float
    retry: bool = False
    #: What showed the pod's containers were gone (its cgroup, or the grace when that cannot be read).
    evidence: str | None = None


class Releaser:
    """Runs the release of one resource's tenancies through its driver; keeps the failures and recent releases."""

    def __init__(
        self,
        resource_name: str,
        table: DeviceTable,
        ledger: Ledger,
        driver: AsyncDriver,
        guard: DeviceGuard,
        observer: ResourceObserver = NULL_OBSERVER,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.resource_name = resource_name
        self.table = table
        self.ledger = ledger
        self.driver = driver
        self.guard = guard
        self.sharing = guard.sharing
        self.observer = observer
        self._on_change = on_change
        self.recent: deque[Release] = deque(maxlen=50)
        #: Each failing release's last failure (by record ID), until it succeeds.
        self.failures: dict[str, ReleaseFailure] = {}
        #: Counts changes of :attr:`failures` (the status is rebuilt when it moves).
        self.failures_version = 0

    async def release(self, record_id: str, reason: str, evidence: str | None = None) -> None:
        """Release one allocation: post-stop (the devices not yet post-stopped), then deallocate.

        An allocation released meanwhile (the KEP's Deallocate, a new
        tenancy's admission) is not released again. :class:`DriverError` when a
        hook failed: the record stays releasing and the caller retries later.
        """
        record = self.ledger.get(record_id)
        if record is None:
            return
        async with self.guard.hold(record.all_devices(), "release"):
            await self.release_locked(record_id, reason, evidence)

    async def release_locked(self, record_id: str, reason: str, evidence: str | None = None) -> None:
        """:meth:`release`, the devices' locks held by the caller."""
        record = self.ledger.get(record_id)
        if record is None:
            return  # released meanwhile
        start = time.monotonic()
        owed = tuple(record.all_devices())
        if not record.releasing:
            # On disk with the first hook's intent below (one write, synced), before any hook runs: a crash
            # before that write finds the record as it was, the release not begun, and nothing done.
            record = self.ledger.begin_release(record_id)
            self.guard.sync_withheld()
        log.info("[%s] releasing %s (%s)", self.resource_name, id_list(owed), reason, extra={"device": id_list(owed)})
        retried = False
        try:
            to_stop = tuple(d for d in record.devices if d not in record.post_stopped)
            if to_stop:
                if self.driver.capabilities.post_stop:
                    retry = record.adopted is not None or any(d in record.post_stop_begun for d in to_stop)
                    retried |= retry
                    self.ledger.post_stop_begun(record_id, to_stop)
                    await self.ledger.save(sync=True)
                    self.guard.set_activity(owed, "release: post_stop")
                    await self._call_hook(
                        record_id,
                        "post_stop",
                        lambda ids, again: self.post_stop(ids, again, [record_id]),
                        to_stop,
                        retry,
                    )
                record = self.ledger.post_stopped(record_id, to_stop)
            if owed and self.driver.capabilities.deallocate:
                retry = record.adopted is not None or record.deallocate_begun
                retried |= retry
                record = self.ledger.deallocate_begun(record_id)
                await self.ledger.save(sync=True)
                self.guard.set_activity(owed, "release: deallocate")
                await self._call_hook(record_id, "deallocate", self.deallocate, owed, retry)
        finally:
            self.guard.set_activity(owed, "release")
        self.ledger.remove(record_id)
        if self.failures.pop(record_id, None) is not None:
            self.failures_version += 1
        self.guard.sync_withheld()
        await self.ledger.save(sync=True)  # the release path can afford power-loss durability
        self.finished(record, owed, reason, start, retried, evidence)

    async def _call_hook(
        self,
        record_id: str,
        hook: str,
        call: Callable[[Sequence[str], bool], Awaitable[None]],
        device_ids: tuple[str, ...],
        retry: bool,
    ) -> None:
        """Call a release hook. One that outlives ``hook_timeout`` is waited for (the devices' locks held, the
        devices withheld): its outcome decides the release, and no second call starts on its devices meanwhile."""
        try:
            try:
                await call(device_ids, retry)
            except HookTimeoutError as exc:
                if exc.still_running is None:
                    raise
                await self.guard.await_overdue(hook, exc.still_running, device_ids)
        except DriverError as exc:
            self._note_failure(record_id, hook, exc)
            await self.ledger.save()  # keep what was done (post-stopped devices) before the failure
            raise

    def _note_failure(self, record_id: str, hook: str, exc: DriverError) -> None:
        message = exc.reason or str(exc)
        failure = self.failures.get(record_id)
        if failure is None:
            self.failures[record_id] = ReleaseFailure(hook, message)
        else:
            failure.attempts += 1
            failure.hook, failure.message = hook, message
        self.failures_version += 1
        self._on_change()

    # --- the driver's release hooks, shared devices taken care of

    async def post_stop(self, device_ids: Sequence[str], retry: bool, tenancy: Iterable[str]) -> None:
        """The driver's ``post_stop`` for one tenancy (the records ``tenancy`` names): on shared devices, the
        physical devices with their :class:`Replicas` (the other tenants counted)."""
        if self.sharing.is_shared(device_ids):
            physical, replicas = self.sharing.replicas(device_ids, excluding=tenancy)
            await self.driver.post_stop(physical, retry, replicas)
        else:
            await self.driver.post_stop(device_ids, retry)

    async def deallocate(self, device_ids: Sequence[str], retry: bool) -> None:
        """The driver's ``deallocate`` of released devices: on shared devices only of the physical devices whose
        replicas no record holds apart from ``device_ids`` (the last tenant left), and not at all if none."""
        if not self.sharing.is_shared(device_ids):
            await self.driver.deallocate(device_ids, retry)
            return
        last, kept = self.split_last_tenants(device_ids, set(device_ids))
        if kept:
            log.info(
                "[%s] %s still shared by other pods: not deallocated",
                self.resource_name,
                id_list(kept),
                extra={"device": id_list(kept)},
            )
        await self.deallocate_physical(last, device_ids, retry)

    def split_last_tenants(self, device_ids: Sequence[str], released: set[str]) -> tuple[list[str], list[str]]:
        """The physical devices of shared ``device_ids``: those of which no replica outside ``released`` is held
        (their last tenant left), and those another tenant still holds."""
        physical = self.sharing.physical_ids(device_ids)
        last = [p for p in physical if not self.sharing.still_held(p, released)]
        return last, [p for p in physical if p not in last]

    async def deallocate_physical(self, last: list[str], device_ids: Sequence[str], retry: bool) -> None:
        """The driver's ``deallocate`` of the physical devices ``last``, whose last replicas are among
        ``device_ids`` (nothing when ``last`` is empty); no tenant is left on them."""
        if not last:
            return
        by_device: dict[str, list[str]] = {}
        for i in device_ids:
            if (phys := self.table.physical_of(i)) in last:
                by_device.setdefault(phys, []).append(i)
        replicas = Replicas(
            by_device={p: tuple(by_device.get(p, ())) for p in last},
            in_use=dict.fromkeys(last, 0),
            tenants=dict.fromkeys(last, 0),
        )
        await self.driver.deallocate(last, retry, replicas)

    # --- the record of what was released

    def finished(
        self,
        record: AllocationRecord,
        devices: tuple[str, ...],
        reason: str,
        start: float,
        retry: bool,
        evidence: str | None = None,
    ) -> None:
        """Note a finished release (``start``: its ``time.monotonic()``): the status's recent releases, the
        metrics and a log line."""
        release = Release(
            record_id=record.id,
            device_ids=devices,
            reason=reason,
            pod=record.pod,
            finished_at=time.time(),
            duration_s=time.monotonic() - start,
            retry=retry,
            evidence=evidence,
        )
        self.recent.append(release)
        self.observer.released(release.duration_s)
        log.info(
            "[%s] released %s (%s)%s%s",
            self.resource_name,
            id_list(list(devices)),
            reason,
            f"; {evidence}" if evidence else "",
            "; hooks called with retry=True (an earlier call may have done part of the work)" if retry else "",
            extra={"device": id_list(list(devices))},
        )
