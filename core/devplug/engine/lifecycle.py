"""A resource's device lifecycle: preferred allocation, allocate, pre-start, post-stop, deallocate, release.

Every kubelet request is checked against the device table and the ledger
before a driver hook sees it, and every change of the ledger is written to
disk before the kubelet gets an answer. Every operation holds the locks of the
devices it touches (:mod:`devplug.engine.devicelocks`), so operations on one
device never overlap.

Tenancies. The kubelet hands a finished or rejected pod's devices to the next
pod at once, and its Allocate names no pod. So when an Allocate asks for a
device the ledger still holds, the earlier allocation is either reused by a
later container of the same pod (the kubelet gives an init container's devices
to the pod's next containers, with nothing released in between; Kubernetes
v1.32 ``pkg/kubelet/cm/devicemanager/manager.go`` Allocate and
devicesToAllocate) or it is a new tenancy, and the previous one must be
released (post-stop, deallocate) before the driver prepares the devices again.
The engine decides on evidence:

* an allocation whose devices PodResources ever listed is never reused: the
  kubelet reuses only the devices of non-restartable init containers, and
  PodResources lists only app and sidecar containers;
* otherwise the kubelet is asked: the engine sends a ListAndWatch message,
  which makes it rewrite its checkpoint with the devices it attributes now
  (:mod:`devplug.engine.checkpointview`). Before this Allocate the kubelet
  already dropped inactive pods (``UpdateAllocatedDevices``), so if it still
  attributes the devices to the allocation's pod, that pod is the one being
  admitted: a reuse. If it does not, the pod finished, was rejected or deleted;
* with no evidence at all (no checkpoint, no stream), it is treated as a new
  tenancy: the devices are cleaned first. That never cleans a device under a
  running container (the kubelet allocates only devices no active pod holds,
  or, for reuse, before any container of the pod started); its cost is one
  extra release between an init container and its pod's app container.

Shared devices (:mod:`devplug.engine.sharing`). A shared device is advertised
as several replicas; each allocation of replicas is a tenancy of its own, a
record like any other, so every rule above holds per tenancy (the kubelet's
PodResources and checkpoint name the replica IDs). The locks are taken per
physical device, so two tenancies of one device never run hooks at once.
Releasing a tenancy runs ``post_stop`` for it; ``deallocate`` of a physical
device runs only when no other record holds a replica of it, so a device is
never reset under another tenant. An Allocate of a replica first finishes any
release still owed by a record holding another replica of the same device.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from devplug.config import ReleaseConfig
from devplug.engine.asynctools import BackgroundTasks
from devplug.engine.cdi import AllocationAnswers
from devplug.engine.checkpointview import CheckpointView, pods_holding
from devplug.engine.devicelocks import DeviceLocks, HeldLocks, LockTimeout
from devplug.engine.devicetable import DeviceTable
from devplug.engine.driver import AsyncDriver
from devplug.engine.ledger import AllocationRecord, Ledger, new_record_id
from devplug.engine.observer import NULL_OBSERVER, ResourceObserver
from devplug.engine.sharing import DeviceShare, SharingView, shared_env_name
from devplug.engine.tenantexit import ExitEvidence
from devplug.errors import DeviceBusyError, DriverError, HookTimeoutError, RequestError, StateWriteError
from devplug.logsafe import id_list
from devplug.types import ContainerAllocation, Device, Replicas

__all__ = ["DeviceLifecycle", "Release", "ReleaseFailure"]

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


def _ids(ids: Iterable[str]) -> str:
    """Device IDs for a message or log line: at most a few, escaped, and a count of the rest."""
    return id_list(list(ids))


def _tenant(record: AllocationRecord) -> str:
    """The pod of a tenancy, for messages: ``pod default/x (uid ...)`` as far as it is known."""
    if record.pod is not None:
        return f"pod {record.pod}" + (f" (uid {record.pod_uid})" if record.pod_uid else "")
    if record.pod_uid is not None:
        return f"pod {record.pod_uid}"
    return "its previous pod"


class DeviceLifecycle:
    """The operations the kubelet (or the reconciler) drives on one resource."""

    def __init__(
        self,
        resource_name: str,
        table: DeviceTable,
        driver: AsyncDriver,
        ledger: Ledger,
        checkpoint: CheckpointView,
        on_allocated: Callable[[], None] = lambda: None,
        answers: AllocationAnswers | None = None,
        observer: ResourceObserver = NULL_OBSERVER,
        *,
        exits: ExitEvidence,
        previous_tenant_wait: float = ReleaseConfig.previous_tenant_wait,
        on_change: Callable[[], None] = lambda: None,
        fail_requests_greater_than_one: bool = False,
    ) -> None:
        self.resource_name = resource_name
        #: Refuse an Allocate giving a container more than one device (replica).
        self.fail_requests_greater_than_one = fail_requests_greater_than_one
        self.sharing = SharingView(table, ledger)
        self.table = table
        self.driver = driver
        self.ledger = ledger
        self.checkpoint = checkpoint
        self._on_allocated = on_allocated
        self.answers = answers or AllocationAnswers(resource_name, table, driver, None)
        self.observer = observer
        #: Whether a previous tenant's containers are gone (its pod's cgroup, or the unknown-liveness grace).
        self.exits = exits
        #: How long an Allocate waits for the previous tenant's containers to exit ([release] previous_tenant_wait).
        self.previous_tenant_wait = previous_tenant_wait
        #: Called when what the status shows changes outside the ledger (busy devices, release failures).
        self._on_change = on_change
        self.locks = DeviceLocks(self._kept_released)
        #: Physical device ID -> what a release hook still running past ``hook_timeout`` is doing (the release waits
        #: for it to return; the device stays out of service meanwhile).
        self.overdue: dict[str, str] = {}
        self._preferred_running: asyncio.Future[Any] | None = None
        self.recent_releases: deque[Release] = deque(maxlen=50)
        #: IDs of the records an Allocate in flight is filling; the reconciler leaves them alone.
        self.allocating: set[str] = set()
        #: Each failing release's last failure (by record ID), until it succeeds.
        self.release_failures: dict[str, ReleaseFailure] = {}
        #: Counts changes of :attr:`release_failures` (the status is rebuilt when it moves).
        self.failures_version = 0
        self._tasks = BackgroundTasks()

    @property
    def release_wait(self) -> float:
        """How long an Allocate waits for a release of its devices still running: its two hooks' timeouts."""
        return 2 * self.driver.runner.timeout

    # --- validation

    def _check_ids(self, containers: Sequence[Sequence[str]], call: str) -> None:
        """Unknown (neither advertised nor held), duplicate or no IDs: refuse the whole request."""
        self._refuse_bad_ids(
            containers,
            known=lambda i: i in self.table or self.ledger.holds(i),
            healthy=None,
            prefix=f"{self.resource_name}: {call}: ",
            outcome="nothing was done",
        )

    def _check_servable(self, containers: Sequence[Sequence[str]], flat: Sequence[str]) -> None:
        """Every device must be known and healthy as the driver reports it, and the resource not retired.

        A device withheld (advertised unhealthy) only while a release of it
        runs passes: the Allocate waits for that release. ``flat``: every ID of ``containers``, in order.
        """
        unique = set(flat)
        if len(unique) == len(flat) and unique and self.table.all_reported_healthy(unique):
            return  # the common case, in set operations; otherwise the checks below name what is wrong
        self._refuse_if_retired("nothing was allocated")
        self._refuse_bad_ids(
            containers,
            known=lambda i: self.table.reported(i) is not None,
            healthy=self._reported_healthy,
            prefix=f"{self.resource_name}: ",
            outcome="nothing was allocated",
        )

    def _refuse_if_retired(self, outcome: str) -> None:
        """A resource removed from the config (draining) advertises nothing: no kubelet asks it for devices."""
        if self.table.retired is not None:
            raise RequestError(f"{self.resource_name}: {self.table.retired}; {outcome}")

    def _refuse_bad_ids(
        self,
        containers: Sequence[Sequence[str]],
        *,
        known: Callable[[str], bool],
        healthy: Callable[[str], bool] | None,
        prefix: str,
        outcome: str,
    ) -> None:
        """Raise one :class:`RequestError` naming unknown, unhealthy and duplicate IDs (or none at all)."""
        unknown: list[str] = []
        unhealthy: list[str] = []
        duplicate: list[str] = []
        seen: set[str] = set()
        for ids in containers:
            for dev_id in ids:
                if dev_id in seen:
                    duplicate.append(dev_id)
                seen.add(dev_id)
                if not known(dev_id):
                    unknown.append(dev_id)
                elif healthy is not None and not healthy(dev_id):
                    unhealthy.append(dev_id)
        problems = []
        if unknown:
            problems.append(f"unknown device IDs: {_ids(unknown)}")
        if unhealthy:
            problems.append(f"unhealthy device IDs: {_ids(unhealthy)}")
        if duplicate:
            problems.append(f"duplicate device IDs: {_ids(sorted(set(duplicate)))}")
        if not seen and not problems:
            problems.append("no device IDs requested")
        if problems:
            raise RequestError(prefix + "; ".join(problems) + f"; {outcome}")

    # --- device locks

    def _closure(self, device_ids: Iterable[str]) -> set[str]:
        """``device_ids`` and every other device of the records holding them; for shared devices also of the
        records releasing another replica of them (an Allocate finishes those first)."""
        ids = set(device_ids)
        if not self.table.shared and not self.ledger.holds_any(ids):
            return ids
        out = ids | {d for i in ids for r in self.ledger.holders(i) for d in r.all_devices()}
        if self.table.shared:
            for phys in self.sharing.physical_ids(list(out)):
                out.update(d for r in self.sharing.holders(phys) if r.releasing for d in r.all_devices())
        return out

    def _lock_keys(self, device_ids: Iterable[str]) -> set[str]:
        """The locks of advertised IDs: one per physical device, so tenancies of a shared device take turns."""
        return self.table.physical_id_set(device_ids)

    def _hold(self, device_ids: Iterable[str], what: str, timeout: float | None = None) -> _HeldDevices:
        """``async with``: hold the locks of ``device_ids`` and of every device of the records holding them."""
        return _HeldDevices(self, device_ids, what, timeout)

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
        self._refuse_if_retired("nothing was chosen")
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
            return await self._preferred_replicas(offered, must_include, size)
        chosen = await self._preferred_call(offered, must_include, size)
        result = [i for i in dict.fromkeys([*must_include, *chosen]) if i in offer.ids]
        return result[:size]

    async def _preferred_replicas(self, offered: list[Device], must_include: Sequence[str], size: int) -> list[str]:
        """:meth:`preferred` on shared devices: the driver (or the core's spread) chooses physical devices,
        each named once per replica, and gets each device's free replicas picked for it."""
        musts = list(dict.fromkeys(must_include))
        physical_ids, replicas = self.sharing.replicas([d.id for d in offered])
        physical = [p for i in physical_ids if (p := self._physical_device(i)) is not None]
        chosen = await self._preferred_call(physical, [self.table.physical_of(i) for i in musts], size, replicas)
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

    async def _preferred_call(
        self, offered: list[Device], must_include: Sequence[str], size: int, replicas: Replicas | None = None
    ) -> list[str]:
        """The driver's ``preferred_allocation``; refused at once while an earlier call that outlived
        ``hook_timeout`` still runs (each would take a thread of its own)."""
        running = self._preferred_running
        if running is not None and not running.done():
            raise DeviceBusyError(
                f"{self.resource_name}: the driver's preferred_allocation has not returned since it outlived "
                "hook_timeout; nothing was chosen"
            )
        try:
            return await self.driver.preferred_allocation(offered, must_include, size, replicas)
        except HookTimeoutError as exc:
            self._preferred_running = exc.still_running
            raise

    def _physical_device(self, physical_id: str) -> Device | None:
        """The driver's device, as the kubelet sees it (unhealthy while the resource is degraded)."""
        dev = self.table.physical(physical_id)
        return None if dev is None else self.table.advertised_physical(dev)

    async def allocate(self, containers: Sequence[Sequence[str]]) -> list[ContainerAllocation]:
        """Allocate for every container of one request, all or nothing.

        Devices still held by an earlier allocation are settled first (see the
        module docstring): a reuse joins that allocation, anything else is
        released before the driver sees the devices again. An Allocate whose
        devices are being released waits for that release (at most
        :attr:`release_wait` seconds) and refuses only if it fails.
        """
        requested = [i for ids in containers for i in ids]  # flattened once, for every check and step below
        self._check_servable_or_releasing(containers, requested)
        if self.fail_requests_greater_than_one:
            self._refuse_more_than_one(containers)
        try:
            async with self._hold(requested, "allocate", timeout=self.release_wait) as waited:
                if await self._settle(requested) or waited:  # else nothing ran since the check: no need again
                    self._check_servable(containers, requested)
                if self.table.shrunk:
                    self._refuse_beyond_replicas(requested)
                results = await self._allocate_locked(containers, requested)
                if self.table.shrunk:
                    self._sync_withheld()
        except LockTimeout as exc:
            raise DeviceBusyError(
                f"{self.resource_name}: device(s) {exc} still busy after {self.release_wait:g} s "
                "(twice hook_timeout); nothing was allocated"
            ) from None
        self._on_allocated()
        self.observer.allocated(len(containers))
        if log.isEnabledFor(logging.DEBUG):  # not at info: one line per Allocate would cost more than the call
            for ids in containers:
                log.debug("[%s] allocated %s", self.resource_name, _ids(ids), extra={"device": _ids(ids)})
        return results

    def _refuse_beyond_replicas(self, requested: Sequence[str]) -> None:
        """A device whose replica count was lowered while more allocations held it takes no new tenant until the
        excess ended: the replicas held and requested together may not outnumber its count now."""
        wanted: dict[str, set[str]] = {}
        for dev_id in requested:
            wanted.setdefault(self.table.physical_of(dev_id), set()).add(dev_id)
        for phys, ids in wanted.items():
            held = set(self.table.held_replicas(phys, self.ledger.holds))
            count = self.table.replica_count(phys)
            if len(held | ids) > count:
                raise DeviceBusyError(
                    f"{self.resource_name}: {phys} is advertised as {count} replica(s) now (its count was lowered) "
                    f"and allocations still hold {len(held)} of its replicas ({_ids(sorted(held))}): no new tenant "
                    "until they end; nothing was allocated"
                )

    def _refuse_more_than_one(self, containers: Sequence[Sequence[str]]) -> None:
        """``fail_requests_greater_than_one``: a container asking for several devices (replicas) is refused."""
        for number, ids in enumerate(containers):
            if len(ids) > 1:
                raise RequestError(
                    f"{self.resource_name}: container #{number} of the request asks for {len(ids)} devices "
                    f"({_ids(ids)}) and the resource sets fail_requests_greater_than_one: each container may have "
                    "one replica; nothing was allocated"
                )

    def _check_servable_or_releasing(self, containers: Sequence[Sequence[str]], flat: Sequence[str]) -> None:
        """The up-front check: :meth:`_check_servable` (a device withheld while its release runs may wait for
        it), and no device a hook may not touch now (:meth:`busy_devices`). ``flat``: every ID of ``containers``,
        in order."""
        self._check_servable(containers, flat)
        busy = self.busy_devices(flat)
        if busy:
            raise DeviceBusyError(
                f"{self.resource_name}: busy devices: "
                + "; ".join(f"{dev} ({what})" for dev, what in list(busy.items())[:10])
                + (f"; and {len(busy) - 10} more" if len(busy) > 10 else "")
                + "; nothing was allocated"
            )

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

    async def _settle(self, requested: Sequence[str]) -> bool:
        """Finish every earlier tenancy of ``requested`` that is not reused by this Allocate; False when there was
        none to look at (nothing was awaited)."""
        if not self.table.shared and not self.ledger.holds_any(requested):
            return False
        holders = {r.id: r for i in requested for r in self.ledger.holders(i)}
        if self.table.shared:  # a release owed on another replica of a requested device is finished first
            for phys in self.sharing.physical_ids(requested):
                holders.update((r.id, r) for r in self.sharing.holders(phys) if r.releasing)
        for record in holders.values():
            if self.ledger.records.get(record.id) is not record:
                continue
            if record.releasing:
                reason = "finishing its release before the devices are allocated again"
            else:
                reuse, reason = await self._tenancy(record)
                if reuse:
                    log.info(
                        "[%s] %s: %s",
                        self.resource_name,
                        _ids(record.all_devices()),
                        reason,
                        extra={"device": _ids(record.all_devices())},
                    )
                    continue
                if not record.pending:  # an Allocate that never answered: no container ever had its devices
                    await self._previous_tenant_gone(record)
            try:
                await self._release_locked(record, reason)
            except DriverError as exc:
                failure = type(exc) if isinstance(exc, HookTimeoutError) else DriverError
                raise failure(
                    f"{self.resource_name}: {_ids(record.all_devices())} cannot be allocated again: "
                    f"releasing the previous allocation failed ({exc}); nothing was allocated"
                ) from exc
        return True

    async def _previous_tenant_gone(self, record: AllocationRecord) -> None:
        """Return once the containers of ``record``'s pod are gone; :class:`DeviceBusyError` when they still run
        (or cannot be known gone) after ``previous_tenant_wait`` seconds.

        The kubelet hands a device to the next pod as soon as it forgets the previous one, which a static pod's
        removal or a forced deletion does while that pod's containers still run out their grace period.
        """
        verdict = self.exits.verdict(record)
        if verdict.exited:
            return
        devices = record.all_devices()
        keys = self._lock_keys(devices)
        who = _tenant(record)
        log.warning(
            "[%s] %s: the kubelet gives them to a new pod while %s may still run (%s); waiting up to %g s for it",
            self.resource_name,
            _ids(devices),
            who,
            verdict.why,
            self.previous_tenant_wait,
            extra={"device": _ids(devices)},
        )
        self.locks.set_activity(keys, f"allocate: waiting for {who} to exit")
        verdict = await self.exits.wait(record, self.previous_tenant_wait)
        self.locks.set_activity(keys, "allocate")
        if not verdict.exited:
            raise DeviceBusyError(
                f"{self.resource_name}: {_ids(devices)} still used by {who}: {verdict.why}; waited "
                f"{self.previous_tenant_wait:g} s ([release] previous_tenant_wait) for its containers to exit; "
                "nothing was allocated"
            )
        log.info("[%s] %s: %s is gone (%s)", self.resource_name, _ids(devices), who, verdict.why)

    async def _tenancy(self, record: AllocationRecord) -> tuple[bool, str]:
        """Is an Allocate of ``record``'s devices a reuse by its own pod? Returns (reuse, why)."""
        if record.pending:
            return False, "an Allocate that never answered the kubelet held them"
        if record.seen_at is not None:
            return False, (
                f"pod {record.pod} ran with them (PodResources listed them) and the kubelet allocates them again: "
                "a new tenancy, so the previous one is released first"
            )
        checkpoint = await self.checkpoint.fresh(self.table.resend)
        if checkpoint is None:
            return False, (
                f"no evidence the kubelet still gives them to the same pod ({self.checkpoint.last_problem}): "
                "released first, as a new tenancy"
            )
        uids = pods_holding(checkpoint, self.resource_name, record.all_devices())
        if not uids:
            return False, (
                "the kubelet no longer attributes them to any pod (the pod that had them finished, was rejected "
                "or deleted): a new tenancy, so the previous one is released first"
            )
        if record.pod_uid is not None and record.pod_uid not in uids:
            return False, (
                f"the kubelet attributes them to pod {', '.join(sorted(uids))}, not to pod {record.pod_uid} "
                "that got them: the previous allocation is released first"
            )
        if record.pod_uid is None and len(uids) == 1:
            record.pod_uid = next(iter(uids))
        return (
            True,
            f"reused by a later container of pod {', '.join(sorted(uids))} (the kubelet's init-container reuse)",
        )

    async def _allocate_locked(
        self, containers: Sequence[Sequence[str]], requested: Sequence[str]
    ) -> list[ContainerAllocation]:
        try:
            self.ledger.check_room()  # a full disk refuses before anything is written or the driver is called
        except OSError as exc:
            raise self._write_failed(exc) from exc
        snapshot = self.ledger.snapshot(requested)
        held_before = self.ledger.held_among(requested)
        now = time.time()
        records: list[AllocationRecord] = [self.ledger.begin(ids, now) for ids in containers]
        inflight = {r.id for r in records}
        self.allocating |= inflight
        try:
            try:
                await self.ledger.save(sync=self.driver.durable_allocate)  # the intent, before the driver acts
            except OSError as exc:  # nothing was written, no hook ran: put the ledger back as it was
                self.ledger.restore(snapshot, inflight)
                raise self._write_failed(exc) from exc
            results: list[ContainerAllocation] = []
            try:
                for ids, record in zip(containers, records, strict=True):
                    allocation = await self._allocation(ids, record)
                    self.ledger.confirm(record, allocation, time.time())
                    results.append(allocation)
            except DriverError as exc:
                hung = exc.still_running if isinstance(exc, HookTimeoutError) else None
                if hung is not None:
                    self._keep_busy(hung, containers[len(results)], "allocate")
                done = len(results) if hung is not None else len(results) + 1
                await self._undo(containers[:done], held_before)
                self.ledger.restore(snapshot, inflight)
                if hung is not None:
                    self._undo_when_returned(hung, containers[len(results)], held_before, now)
                await self.ledger.save()
                failure = HookTimeoutError if hung is not None else DriverError  # hangs degrade the resource
                raise failure(f"{exc}; the allocation was rolled back") from exc
            try:
                await self.ledger.save()
            except OSError as exc:  # the kubelet must not get an answer the ledger does not hold: undo
                await self._undo(containers, held_before)
                self.ledger.restore(snapshot, inflight)
                with contextlib.suppress(OSError):  # the begin records on disk are released after a crash
                    await self.ledger.save()
                raise self._write_failed(exc) from exc
        finally:
            self.allocating -= inflight
        return results

    def _write_failed(self, exc: OSError) -> StateWriteError:
        no_space = exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
        return StateWriteError(
            f"{self.resource_name}: cannot write the allocation ledger {self.ledger.path}: "
            f"{exc.strerror or exc}; nothing was allocated",
            no_space,
        )

    async def _allocation(self, device_ids: Sequence[str], record: AllocationRecord) -> ContainerAllocation:
        """The driver's ``allocate`` answer merged with what its devices declare (and their CDI names).

        Shared devices: the driver gets the physical devices with the
        :class:`Replicas`, and the answer gets ``DEVPLUG_SHARED_DEVICES_<RESOURCE>``
        (env and annotation) listing them.
        """
        if not self.sharing.is_shared(device_ids):
            return await self.answers.build(device_ids)
        physical, replicas = self.sharing.replicas(device_ids, excluding=(record.id,))
        listed = ",".join(physical)
        shared = ContainerAllocation(
            envs={shared_env_name(self.resource_name): listed},
            annotations={f"{self.resource_name}.shared-devices": listed},
        )
        return await self.answers.build(device_ids, shared=(physical, replicas, shared))

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
        record = AllocationRecord.new(new_record_id(), now, pending=fresh, releasing=True)
        self.ledger.add(record)
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
                self.allocating.discard(record.id)
                await self.release(record, "undoing an allocate that returned after its timeout")
            except DriverError as exc:
                log.error("[%s] undoing the late allocate of %s failed: %s", self.resource_name, _ids(fresh), exc)
            finally:
                self.allocating.discard(record.id)

        self._tasks.spawn(undo())

    async def _undo(self, containers: Sequence[Sequence[str]], held_before: set[str]) -> None:
        undone = {i for ids in containers for i in ids if i not in held_before}
        for ids in reversed(containers):
            fresh = [i for i in ids if i not in held_before]
            if not fresh:
                continue
            try:
                if self.sharing.is_shared(fresh):
                    await self._undo_shared(fresh, undone)
                else:
                    await self.driver.deallocate(fresh, False)
            except DriverError as exc:
                self._keep_if_hung(exc, fresh)
                log.error("[%s] undoing allocate of %s failed: %s", self.resource_name, _ids(fresh), exc)

    async def _undo_shared(self, fresh: list[str], undone: set[str]) -> None:
        """Undo a shared allocation like a tenancy's release: ``post_stop``, then ``deallocate`` of the devices
        no other tenant holds a replica of (the ledger still holds this request's records, ``undone`` names
        their fresh replicas)."""
        mine = {r.id for i in fresh for r in self.ledger.holders(i)}  # only this request's records hold them
        if self.driver.capabilities.post_stop:
            await self._post_stop(fresh, False, mine)
        last, _ = self._split_last_tenants(fresh, undone)
        await self._deallocate_physical(last, fresh, False)

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        """PreStartContainer: only for devices allocated to a live allocation, healthy, each named once."""
        self._check_ids([device_ids], "PreStartContainer")
        async with self._hold(device_ids, "pre_start"):
            problems = []
            live = {i for i in device_ids for r in self.ledger.holders(i) if not r.releasing and i in r.devices}
            not_allocated = [i for i in device_ids if i not in live]
            releasing = [i for i in not_allocated if i in self.ledger.releasing_devices()]
            never = [i for i in not_allocated if i not in releasing]
            if never:
                problems.append(f"device IDs not allocated: {_ids(never)}")
            if releasing:
                problems.append(f"device IDs being released: {_ids(releasing)}")
            unhealthy = [i for i in device_ids if i in live and not self._reported_healthy(i)]
            if unhealthy:
                problems.append(f"unhealthy device IDs: {_ids(unhealthy)}")
            if problems:
                raise RequestError(
                    f"{self.resource_name}: PreStartContainer: " + "; ".join(problems) + "; nothing was done"
                )
            if self.driver.capabilities.pre_start:
                try:
                    if self.sharing.is_shared(device_ids):
                        holding = [r.id for i in device_ids for r in self.ledger.holders(i)]
                        await self.driver.pre_start(*self.sharing.replicas(device_ids, excluding=holding))
                    else:
                        await self.driver.pre_start(device_ids)
                except DriverError as exc:
                    self._keep_if_hung(exc, device_ids)
                    raise

    def _reported_healthy(self, device_id: str) -> bool:
        dev = self.table.reported(device_id)
        return dev is not None and dev.healthy and self.table.degraded is None

    async def post_stop(self, device_ids: Sequence[str]) -> None:
        """The KEP's PostStopContainer: clean up after one container.

        Devices already post-stopped in their allocation, or already released
        (the reconciler got there first), are skipped and logged.
        """
        self._check_ids([device_ids], "PostStopContainer")
        async with self._hold(device_ids, "post_stop"):
            records = self._holders_of(device_ids)
            owed = [i for i in device_ids if any(i in r.devices and i not in r.post_stopped for r in records)]
            now = time.time()
            for record in records:
                record.kep_at = now
            if owed and self.driver.capabilities.post_stop:
                retry = any(i in r.post_stop_begun or r.adopted is not None for r in records for i in owed)
                for record in records:
                    record.mark_post_stop_begun(i for i in owed if i in record.devices)
                await self.ledger.save(sync=True)
                try:
                    await self._post_stop(owed, retry, [r.id for r in records])
                except DriverError as exc:
                    self._keep_if_hung(exc, owed)
                    raise
            for record in records:
                record.mark_post_stopped([i for i in owed if i in record.devices])
            if records:
                await self.ledger.save()
            skipped = [i for i in device_ids if i not in owed]
            if skipped:
                log.info("[%s] PostStopContainer: %s already cleaned up or released", self.resource_name, _ids(skipped))

    async def deallocate(self, device_ids: Sequence[str]) -> None:
        """The KEP's Deallocate: the devices are free once the driver is done (those already released skipped)."""
        self._check_ids([device_ids], "Deallocate")
        async with self._hold(device_ids, "deallocate"):
            start = time.monotonic()
            records = self._holders_of(device_ids)
            holding = {d for r in records for d in r.all_devices()}
            held = [i for i in device_ids if i in holding]
            skipped = [i for i in device_ids if i not in holding]
            if skipped:
                log.info("[%s] Deallocate: %s already released", self.resource_name, _ids(skipped))
            if not held:
                return
            retry = any(r.deallocate_begun or r.adopted is not None for r in records)
            for record in records:
                record.releasing = True
                record.deallocate_begun = True
                record.kep_at = time.time()
            self._sync_withheld()
            await self.ledger.save()
            try:
                if self.driver.capabilities.deallocate:
                    await self._deallocate(held, retry)
            except DriverError as exc:
                self._keep_if_hung(exc, held)
                for record in records:
                    record.releasing = False
                self._sync_withheld()
                await self.ledger.save()
                raise
            emptied = self.ledger.drop_devices(held)
            for record in records:
                if record.id in self.ledger.records:
                    record.releasing = False
                    record.deallocate_begun = False
            self._sync_withheld()
            await self.ledger.save()
            for record in emptied:
                self._released(record, tuple(held), "KEP Deallocate", start, retry)

    def _holders_of(self, device_ids: Sequence[str]) -> list[AllocationRecord]:
        return list({r.id: r for i in device_ids for r in self.ledger.holders(i)}.values())

    # --- releases found by the engine (reconciler, start-up, a new tenancy)

    async def release(self, record: AllocationRecord, reason: str, evidence: str | None = None) -> None:
        """Release one allocation: post-stop (the devices not yet post-stopped), then deallocate.

        The devices are advertised unhealthy from the first step until the
        driver's deallocate returned, so the kubelet never offers a device the
        driver still holds. An allocation released meanwhile (KEP Deallocate, a
        new tenancy's Allocate) is not released again. A failing hook leaves
        the record releasing; the caller retries later.
        """
        async with self._hold(record.all_devices(), "release"):
            await self._release_locked(record, reason, evidence)

    async def _release_locked(self, record: AllocationRecord, reason: str, evidence: str | None = None) -> None:
        """:meth:`release`, with the devices' locks held.

        Each hook's intent is written to the ledger before the hook is called
        and its completion after: a daemon killed in between calls it again on
        restart with ``retry=True``.
        """
        if self.ledger.records.get(record.id) is not record:
            return  # released meanwhile
        start = time.monotonic()
        owed = tuple(record.all_devices())
        if not record.releasing:
            record.releasing = True
            self._sync_withheld()
            await self.ledger.save()
        log.info("[%s] releasing %s (%s)", self.resource_name, _ids(owed), reason, extra={"device": _ids(owed)})
        retried = False
        try:
            to_stop = tuple(d for d in record.devices if d not in record.post_stopped)
            if to_stop:
                if self.driver.capabilities.post_stop:
                    retry = record.adopted is not None or any(d in record.post_stop_begun for d in to_stop)
                    retried |= retry
                    record.mark_post_stop_begun(to_stop)
                    await self.ledger.save(sync=True)
                    self.locks.set_activity(self._lock_keys(owed), "release: post_stop")
                    await self._call_release_hook(
                        record, "post_stop", lambda ids, again: self._post_stop(ids, again, [record.id]), to_stop, retry
                    )
                record.mark_post_stopped(to_stop)
            if owed and self.driver.capabilities.deallocate:
                retry = record.adopted is not None or record.deallocate_begun
                retried |= retry
                record.deallocate_begun = True
                await self.ledger.save(sync=True)
                self.locks.set_activity(self._lock_keys(owed), "release: deallocate")
                await self._call_release_hook(record, "deallocate", self._deallocate, owed, retry)
        finally:
            self.locks.set_activity(self._lock_keys(owed), "release")
        self.ledger.remove(record)
        if self.release_failures.pop(record.id, None) is not None:
            self.failures_version += 1
        self._sync_withheld()
        await self.ledger.save(sync=True)  # the release path can afford power-loss durability
        self._released(record, owed, reason, start, retried, evidence)

    async def _post_stop(self, device_ids: Sequence[str], retry: bool, tenancy: Iterable[str]) -> None:
        """The driver's ``post_stop`` for one tenancy (the records ``tenancy`` names): on shared devices, the
        physical devices with their :class:`Replicas` (the other tenants counted)."""
        if self.sharing.is_shared(device_ids):
            physical, replicas = self.sharing.replicas(device_ids, excluding=tenancy)
            await self.driver.post_stop(physical, retry, replicas)
        else:
            await self.driver.post_stop(device_ids, retry)

    async def _deallocate(self, device_ids: Sequence[str], retry: bool) -> None:
        """The driver's ``deallocate`` of released devices: on shared devices only of the physical devices whose
        replicas no record holds apart from ``device_ids`` (the last tenant left), and not at all if none."""
        if not self.sharing.is_shared(device_ids):
            await self.driver.deallocate(device_ids, retry)
            return
        last, kept = self._split_last_tenants(device_ids, set(device_ids))
        if kept:
            log.info(
                "[%s] %s still shared by other pods: not deallocated",
                self.resource_name,
                _ids(kept),
                extra={"device": _ids(kept)},
            )
        await self._deallocate_physical(last, device_ids, retry)

    def _split_last_tenants(self, device_ids: Sequence[str], released: set[str]) -> tuple[list[str], list[str]]:
        """The physical devices of shared ``device_ids``: those of which no replica outside ``released`` is held
        (their last tenant left), and those another tenant still holds."""
        physical = self.sharing.physical_ids(device_ids)
        last = [p for p in physical if not self.sharing.still_held(p, released)]
        return last, [p for p in physical if p not in last]

    async def _deallocate_physical(self, last: list[str], device_ids: Sequence[str], retry: bool) -> None:
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

    def shared_usage(self) -> list[DeviceShare]:
        """Every shared physical device: replicas, replicas in use, tenants, pods (for status and metrics)."""
        return self.sharing.usage()

    async def _call_release_hook(
        self,
        record: AllocationRecord,
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
                await self._await_overdue(hook, exc.still_running, device_ids)
        except DriverError as exc:
            self._note_release_failure(record, hook, exc)
            await self.ledger.save()  # keep what was done (post-stopped devices) before the failure
            raise

    def _note_release_failure(self, record: AllocationRecord, hook: str, exc: DriverError) -> None:
        message = exc.reason or str(exc)
        failure = self.release_failures.get(record.id)
        if failure is None:
            self.release_failures[record.id] = ReleaseFailure(hook, message)
        else:
            failure.attempts += 1
            failure.hook, failure.message = hook, message
        self.failures_version += 1
        self._on_change()

    async def _await_overdue(self, hook: str, running: asyncio.Future[Any], device_ids: Sequence[str]) -> None:
        """Wait for a release hook running past ``hook_timeout``; its failure is raised as the hook's."""
        keys = self._lock_keys(device_ids)
        started = time.time()
        what = f"{hook} running past hook_timeout ({self.driver.runner.timeout:g} s) since {time.ctime(started)}"
        self.overdue.update(dict.fromkeys(keys, what))
        self.locks.set_activity(keys, f"release: {what}")
        log.warning(
            "[%s] %s of %s did not return within hook_timeout (%g s): waiting for it; the devices stay out of "
            "service and no other hook runs on them until it returns",
            self.resource_name,
            hook,
            _ids(device_ids),
            self.driver.runner.timeout,
            extra={"device": _ids(device_ids)},
        )
        self._sync_withheld()
        self._on_change()
        try:
            await self.driver.runner.outcome(hook, running)
        finally:
            for key in keys:
                self.overdue.pop(key, None)
            self._sync_withheld()
            self._on_change()
        log.info(
            "[%s] %s of %s returned after %.1f s",
            self.resource_name,
            hook,
            _ids(device_ids),
            time.time() - started,
            extra={"device": _ids(device_ids)},
        )

    def _keep_if_hung(self, exc: DriverError, device_ids: Sequence[str]) -> None:
        """After a hook on ``device_ids`` failed: if it outlived ``hook_timeout`` and still runs, keep the devices
        busy until it returns (:meth:`_keep_busy`)."""
        if isinstance(exc, HookTimeoutError) and exc.still_running is not None:
            self._keep_busy(exc.still_running, device_ids, exc.hook or "a hook")

    def _keep_busy(self, running: asyncio.Future[Any], device_ids: Sequence[str], hook: str) -> None:
        """A hook on ``device_ids`` outlived ``hook_timeout`` and still runs: their locks stay held (no other hook
        touches them) and they are advertised unhealthy until it returns; the resource's other devices go on."""
        if running.done():
            return
        keys = self._lock_keys(device_ids)
        self.locks.keep_until(
            keys, running, f"{hook} running past hook_timeout ({self.driver.runner.timeout:g} s) since {time.ctime()}"
        )
        self._sync_withheld()
        self._on_change()
        log.warning(
            "[%s] %s of %s did not return within hook_timeout (%g s): the devices stay out of service until it "
            "returns; the other devices go on",
            self.resource_name,
            hook,
            _ids(device_ids),
            self.driver.runner.timeout,
            extra={"device": _ids(device_ids)},
        )

    def _kept_released(self, keys: list[str]) -> None:
        """A hook abandoned at its timeout returned: its devices are back (unless released meanwhile)."""
        log.info(
            "[%s] the hook abandoned on %s returned: the devices are in service again", self.resource_name, _ids(keys)
        )
        self._sync_withheld()
        self._on_change()
        self._on_allocated()  # wakes the reconciler: a release of them may be due

    def _released(
        self,
        record: AllocationRecord,
        devices: tuple[str, ...],
        reason: str,
        start: float,
        retry: bool,
        evidence: str | None = None,
    ) -> None:
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
        self.recent_releases.append(release)
        self.observer.released(release.duration_s)
        log.info(
            "[%s] released %s (%s)%s%s",
            self.resource_name,
            _ids(devices),
            reason,
            f"; {evidence}" if evidence else "",
            "; hooks called with retry=True (an earlier call may have done part of the work)" if retry else "",
            extra={"device": _ids(devices)},
        )

    def withheld_changed(self) -> None:
        """What is withheld changed outside the lifecycle (quarantined records cleared): advertise it."""
        self._sync_withheld()

    def _sync_withheld(self) -> None:
        """Advertise unhealthy the devices being released, those a hook still running keeps busy, those a
        quarantined ledger record names, and the free replicas of a device that already has as many tenants as its
        (lowered) replica count allows."""
        withheld = self.ledger.releasing_devices()
        busy = [*self.locks.kept(), *self.overdue]
        for phys in busy:
            withheld.update(self.table.all_replica_ids(phys))
        withheld.update(self.ledger.quarantined_devices())
        if self.table.shrunk:  # a lowered replica count: no more tenants than replicas while the excess drains
            withheld.update(self.table.excess_replicas(self.ledger.holds))
        self.table.set_withheld(withheld)


class _HeldDevices:
    """The locks :meth:`DeviceLifecycle._hold` takes, for an ``async with`` block (a class: every Allocate takes
    one, and a generator-based context manager costs several times more)."""

    def __init__(self, lifecycle: DeviceLifecycle, device_ids: Iterable[str], what: str, timeout: float | None) -> None:
        self._lifecycle = lifecycle
        self._device_ids = device_ids
        self._what = what
        self._timeout = timeout
        self._held: HeldLocks | None = None

    async def __aenter__(self) -> bool:
        """Take the locks; True when that had to wait (other coroutines ran meanwhile)."""
        lifecycle = self._lifecycle
        want = lifecycle._closure(self._device_ids)
        waited = False
        while True:
            held = lifecycle.locks.hold(lifecycle._lock_keys(want), self._what, self._timeout)
            waited = await held.__aenter__() or waited
            try:
                now = lifecycle._closure(want)
            except BaseException:
                held.release()
                raise
            if now <= want:
                self._held = held
                return waited
            held.release()
            waited = True
            want = now  # a record grew while we waited: take its new devices too

    async def __aexit__(self, *exc: object) -> None:
        if self._held is not None:
            self._held.release()
            self._held = None
