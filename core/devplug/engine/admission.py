"""Admitting devices to a container: settle earlier tenancies, allocate through the driver, record, undo on failure.

Every request is checked against the device table and the ledger before a
driver hook sees it (:mod:`devplug.engine.requestcheck`), every change of the
ledger is written to disk before the front end answers, and the devices'
locks are held throughout (:mod:`devplug.engine.guard`). An admission is all or
nothing: a failed hook undoes what the others prepared and puts the ledger back.

Tenancies. A front end may ask for devices the ledger still holds. The earlier
allocation is then either reused by a later container of the same tenant (the
kubelet hands an init container's devices to the pod's next containers with
nothing released in between) or it is a new tenancy, and the previous one is
released (post-stop, deallocate) before the driver prepares the devices again.
Which one it is, the front end's :class:`TenancyJudge` decides from its own
evidence (the device-plugin front end: PodResources and the kubelet's
checkpoint). Before a new tenancy's devices are cleaned, the previous tenant's
containers must be gone (:class:`~devplug.engine.tenantexit.ExitEvidence`): the
kubelet hands a device on as soon as it forgets a pod, which a static pod's
removal or a forced deletion does while its containers still run.

The kubelet waits for an Allocate without a deadline, inside the one loop that
admits and removes every pod of the node (``syncLoopIteration`` in
``pkg/kubelet/kubelet.go``, ``Allocate(context.Background())`` in
``pkg/kubelet/cm/devicemanager/endpoint.go``). So an admission waits for a
previous tenant only on evidence that the wait ends without that loop: the
kubelet forgot the pod during its current run, so its pod worker is killing it
(:attr:`TenantEnd.UNDER_WAY`), and its pod's cgroup is populated (or, unreadable,
the ``[liveness] unknown_grace`` it gets is over within the wait), and at most
``previous_tenant_wait`` seconds. An allocation the kubelet never
checkpointed although it wrote its checkpoint after it belongs to a pod rejected
at admission (:attr:`TenantEnd.NEVER_STARTED`): no container had the devices,
so they are released at once. Any other tenant that may still run (its
liveness unknown, or an orphan only the kubelet's housekeeping would stop, in
the very loop the Allocate holds) is not waited for: the devices are withheld
(advertised unhealthy, :meth:`DeviceGuard.withhold_busy`) and the Allocate is
refused at once.

Shared devices: each allocation of replicas is a tenancy of its own; an
admission of a replica first finishes any release still owed by a record
holding another replica of the same device.

Partitions (contract 1.1, KEP-4815): an admission whose parts, with the parts
held now (allocated, being released, busy), would consume more than a counter
of their parent is refused before any hook of its own runs, naming the parts,
the parent, the counter and the amounts
(:meth:`~devplug.engine.partguard.PartitionGuard.check`); the parts that no
longer fit are then withheld (:meth:`DeviceGuard.sync_withheld`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from devplug.engine.asynctools import BackgroundTasks
from devplug.engine.cdi import AllocationAnswers
from devplug.engine.devicelocks import LockTimeout
from devplug.engine.devicetable import DeviceTable
from devplug.engine.driver import AsyncDriver
from devplug.engine.guard import DeviceGuard
from devplug.engine.ledger import AllocationRecord, ClaimTenant, Ledger
from devplug.engine.liveness import PodState
from devplug.engine.observer import NULL_OBSERVER, ResourceObserver
from devplug.engine.release import Releaser
from devplug.engine.requestcheck import RequestChecks
from devplug.engine.sharing import shared_env_name
from devplug.engine.tenantexit import ExitEvidence, ExitVerdict
from devplug.errors import DeviceBusyError, DriverError, HookTimeoutError, RequestError, StateWriteError
from devplug.text.logsafe import id_list
from devplug.types import Claim, ContainerAllocation

__all__ = ["Admission", "DraClaim", "TenancyJudge", "TenantEnd"]

log = logging.getLogger("devplug.engine")


@dataclass(frozen=True)
class DraClaim:
    """A DRA claim being admitted: what the driver's ``allocate`` gets, and what its ledger record keeps."""

    claim: Claim
    tenant: ClaimTenant


class TenantEnd(StrEnum):
    """How a previous tenancy whose containers are not known gone is ending, as the front end sees the kubelet."""

    #: The kubelet forgot the pod during its current run: its pod worker is killing the containers, which ends
    #: without the kubelet's sync loop (``HandlePodRemoves`` hands the kill to the pod worker).
    UNDER_WAY = "under way"
    #: The kubelet never checkpointed the allocation although it wrote its checkpoint after it: the pod was
    #: rejected at admission (the device manager writes only after a container's allocation succeeded), and no
    #: container ever had the devices.
    NEVER_STARTED = "never started"
    #: Nothing says the containers stop without the kubelet's loop (an orphan only its housekeeping kills, or no
    #: evidence at all): an Allocate waiting for them might wait for ever.
    UNKNOWN = "unknown"


class TenancyJudge(Protocol):
    """The front end's answers about a held record's tenancy, from what it sees of the kubelet."""

    async def reuses(self, record: AllocationRecord) -> tuple[bool, str]:
        """Called, the devices' locks held, for a live record (not pending, not releasing) holding devices an
        admission asks for. Returns (reuse, why): a reuse joins the record; otherwise it is released first."""
        ...

    async def tenant_end(self, record: AllocationRecord) -> tuple[TenantEnd, str]:
        """Called, the devices' locks held, for a record an admission found to be a new tenancy while its pod's
        containers are not known gone. Returns how that tenancy is ending, and why the front end thinks so."""
        ...


def _tenant(record: AllocationRecord) -> str:
    """The pod of a tenancy, for messages: ``pod default/x (uid ...)`` as far as it is known."""
    if record.pod is not None:
        return f"pod {record.pod}" + (f" (uid {record.pod_uid})" if record.pod_uid else "")
    if record.pod_uid is not None:
        return f"pod {record.pod_uid}"
    return "its previous pod"


class Admission:
    """Admits devices of one resource to containers, all or nothing."""

    def __init__(
        self,
        resource_name: str,
        table: DeviceTable,
        ledger: Ledger,
        driver: AsyncDriver,
        guard: DeviceGuard,
        releaser: Releaser,
        checks: RequestChecks,
        answers: AllocationAnswers,
        judge: TenancyJudge,
        exits: ExitEvidence,
        *,
        previous_tenant_wait: float,
        fail_requests_greater_than_one: bool = False,
        on_allocated: Callable[[], None] = lambda: None,
        observer: ResourceObserver = NULL_OBSERVER,
    ) -> None:
        self.resource_name = resource_name
        self.table = table
        self.ledger = ledger
        self.driver = driver
        self.guard = guard
        self.sharing = guard.sharing
        self.releaser = releaser
        self.checks = checks
        self.answers = answers
        self.judge = judge
        #: Whether a previous tenant's containers are gone (its pod's cgroup, or the unknown-liveness grace).
        self.exits = exits
        #: How long an admission waits for the previous tenant's containers to exit.
        self.previous_tenant_wait = previous_tenant_wait
        #: Refuse an admission giving a container more than one device (replica).
        self.fail_requests_greater_than_one = fail_requests_greater_than_one
        self._on_allocated = on_allocated
        self.observer = observer
        self._tasks = BackgroundTasks()
        #: When this admission began serving (``time.time()``): :attr:`pre_started` covers records created since.
        self.serving_since = time.time()
        #: Records whose devices the kubelet's PreStartContainer named: a container got them.
        self.pre_started: set[str] = set()
        #: Set while a handover is under way: no Allocate waits for a previous tenant (:meth:`cut_waits_short`).
        self._no_waiting = asyncio.Event()

    @property
    def release_wait(self) -> float:
        """How long an admission waits for a release of its devices still running: its two hooks' timeouts."""
        return 2 * self.driver.runner.timeout

    async def allocate(
        self, containers: Sequence[Sequence[str]], claim: DraClaim | None = None
    ) -> list[ContainerAllocation]:
        """Allocate for every container of one request (or for one DRA claim), all or nothing.

        Devices still held by an earlier allocation are settled first (see the
        module docstring): a reuse joins that allocation, anything else is
        released before the driver sees the devices again. An admission whose
        devices are being released waits for that release (at most
        :attr:`release_wait` seconds) and refuses only if it fails.

        ``claim``: the request is a DRA claim's (``containers`` holds one entry,
        its devices): its record names the claim and the pods it is reserved
        for, and the driver's ``allocate`` gets the claim.
        """
        requested = [i for ids in containers for i in ids]  # flattened once, for every check and step below
        self._check_servable_and_free(containers, requested)
        if self.fail_requests_greater_than_one:
            self.checks.one_each(containers)
        try:
            async with self.guard.hold(requested, "allocate", timeout=self.release_wait) as waited:
                if await self._settle(requested) or waited:  # else nothing ran since the check: no need again
                    self.checks.servable(containers, requested)
                if self.table.shrunk:
                    self.checks.within_replicas(requested)
                if self.table.partitions is not None:  # exact, and nothing awaited before the ledger's begin
                    self.guard.parts.check(requested)
                try:
                    results = await self._allocate_locked(containers, requested, claim)
                finally:  # held or rolled back: what fits now (a sync meanwhile counted the records being filled)
                    if self.table.shrunk or self.table.partitions is not None:
                        self.guard.sync_withheld()
        except LockTimeout as exc:
            raise DeviceBusyError(
                f"{self.resource_name}: device(s) {exc} still busy after {self.release_wait:g} s "
                "(twice hook_timeout); nothing was allocated"
            ) from None
        self._on_allocated()
        self.observer.allocated(len(containers))
        if log.isEnabledFor(logging.DEBUG):  # not at info: one line per Allocate would cost more than the call
            for ids in containers:
                log.debug("[%s] allocated %s", self.resource_name, id_list(ids), extra={"device": id_list(ids)})
        return results

    def _check_servable_and_free(self, containers: Sequence[Sequence[str]], flat: Sequence[str]) -> None:
        """The up-front check: servable (a device withheld while its release runs may wait for it), no device
        a hook may not touch now (:meth:`DeviceGuard.busy_devices`), and no parts beyond their parent's counters
        (:meth:`~devplug.engine.partguard.PartitionGuard.check`). ``flat``: every ID of ``containers``."""
        self.checks.servable(containers, flat)
        busy = self.guard.busy_devices(flat)
        if busy:
            raise DeviceBusyError(
                f"{self.resource_name}: busy devices: "
                + "; ".join(f"{dev} ({what})" for dev, what in list(busy.items())[:10])
                + (f"; and {len(busy) - 10} more" if len(busy) > 10 else "")
                + "; nothing was allocated"
            )
        if self.table.partitions is not None:  # parts beyond their parent's counters (the held ones settled)
            self.guard.parts.check(flat, settling=True)

    # --- earlier tenancies

    async def _settle(self, requested: Sequence[str]) -> bool:
        """Finish every earlier tenancy of ``requested`` that is not reused by this admission; False when there
        was none to look at (nothing was awaited)."""
        if not self.table.shared and not self.ledger.holds_any(requested):
            return False
        holders = dict.fromkeys(r.id for i in requested for r in self.ledger.holders(i))
        if self.table.shared:  # a release owed on another replica of a requested device is finished first
            for phys in self.sharing.physical_ids(requested):
                holders.update(dict.fromkeys(r.id for r in self.sharing.holders(phys) if r.releasing))
        for record_id in holders:
            record = self.ledger.get(record_id)
            if record is None:
                continue  # released or joined while an earlier one was settled
            evidence: str | None = None
            if record.releasing:
                reason = "finishing its release before the devices are allocated again"
            elif record.pending:
                reason = "an Allocate that never answered the kubelet held them"
            else:
                reuse, reason = await self.judge.reuses(record)
                if reuse:
                    shown = id_list(record.all_devices())
                    log.info("[%s] %s: %s", self.resource_name, shown, reason, extra={"device": shown})
                    continue
                evidence = await self._previous_tenant_gone(record_id)
            try:
                await self.releaser.release_locked(record_id, reason, evidence)
            except DriverError as exc:
                failure = type(exc) if isinstance(exc, HookTimeoutError) else DriverError
                raise failure(
                    f"{self.resource_name}: {id_list(record.all_devices())} cannot be allocated again: "
                    f"releasing the previous allocation failed ({exc}); nothing was allocated"
                ) from exc
        return True

    async def _previous_tenant_gone(self, record_id: str) -> str | None:
        """Return (the evidence) once the containers of the record's pod are gone, or provably never had the devices;
        :class:`DeviceBusyError` at once when nothing says they end without the kubelet's loop, or after at most
        ``previous_tenant_wait`` seconds when they are being killed but still run (see the module docstring).

        The kubelet hands a device to the next pod as soon as it forgets the previous one, which a static pod's
        removal or a forced deletion does while that pod's containers still run out their grace period.
        """
        record = self.ledger.get(record_id)
        if record is None:
            return None
        verdict = self.exits.verdict(record)
        if verdict.exited:
            return verdict.why
        end, evidence = await self.judge.tenant_end(record)
        devices = record.all_devices()
        shown = id_list(devices)
        who = _tenant(record)
        if end is TenantEnd.NEVER_STARTED:
            log.info(
                "[%s] %s: %s never had them (%s)", self.resource_name, shown, who, evidence, extra={"device": shown}
            )
            return evidence
        self.guard.withhold_busy(record, verdict.why)
        if self._no_waiting.is_set():
            end, evidence = TenantEnd.UNKNOWN, f"{evidence}; a handover to a new instance is under way"
        if end is not TenantEnd.UNDER_WAY or not self._ends_within_wait(verdict):
            raise DeviceBusyError(
                f"{self.resource_name}: {shown} may still be used by {who}: {verdict.why}; not waiting inside the "
                f"kubelet's Allocate ({evidence}); withheld until its containers are gone; nothing was allocated"
            )
        log.warning(
            "[%s] %s: the kubelet gives them to a new pod while %s still runs (%s; %s); waiting up to %g s for it",
            self.resource_name,
            shown,
            who,
            verdict.why,
            evidence,
            self.previous_tenant_wait,
            extra={"device": shown},
        )
        self.guard.set_activity(devices, f"allocate: waiting for {who} to exit")
        try:
            verdict, cut = await self._wait_exit(record)
        finally:
            self.guard.set_activity(devices, "allocate")
        if not verdict.exited:
            why = (
                "a handover to a new instance began, which must not wait for it"
                if cut
                else f"waited {self.previous_tenant_wait:g} s ([release] previous_tenant_wait) for its containers"
            )
            raise DeviceBusyError(
                f"{self.resource_name}: {shown} still used by {who}: {verdict.why}; {why}; withheld until they are "
                "gone; nothing was allocated"
            )
        log.info("[%s] %s: %s is gone (%s)", self.resource_name, shown, who, verdict.why)
        return verdict.why

    def _ends_within_wait(self, verdict: ExitVerdict) -> bool:
        """Whether a tenancy being killed ends within ``previous_tenant_wait`` on evidence: its populated cgroup
        empties when the kill is done (bounded by the wait), or, with its cgroup unreadable, the ``[liveness]
        unknown_grace`` granted to it is over within the wait."""
        if verdict.liveness.state is PodState.RUNNING:
            return True
        return verdict.grace_ends is not None and verdict.grace_ends - time.time() <= self.previous_tenant_wait

    async def _wait_exit(self, record: AllocationRecord) -> tuple[ExitVerdict, bool]:
        """The verdict once the record's containers are gone or ``previous_tenant_wait`` passed, and whether a
        handover cut the wait short (a waiting Allocate must not make it fail)."""
        waiting = asyncio.ensure_future(self.exits.wait(record, self.previous_tenant_wait))
        cut = asyncio.ensure_future(self._no_waiting.wait())
        try:
            await asyncio.wait((waiting, cut), return_when=asyncio.FIRST_COMPLETED)
        finally:
            cut.cancel()
            if not waiting.done():
                waiting.cancel()
        if waiting.cancelled() or not waiting.done():
            return self.exits.verdict(record), True
        return waiting.result(), False

    def cut_waits_short(self, on: bool) -> None:
        """A handover began (``on``): Allocates waiting for a previous tenant are refused now and later ones do not
        wait (the devices stay withheld), so that the handover is not held up; off when it failed."""
        if on:
            self._no_waiting.set()
        else:
            self._no_waiting.clear()

    # --- the driver's allocate, recorded

    async def _allocate_locked(
        self, containers: Sequence[Sequence[str]], requested: Sequence[str], claim: DraClaim | None
    ) -> list[ContainerAllocation]:
        try:
            self.ledger.check_room()  # a full disk refuses before anything is written or the driver is called
        except OSError as exc:
            raise self._write_failed(exc) from exc
        snapshot = self.ledger.snapshot(requested)
        held_before = self.ledger.held_among(requested)
        now = time.time()
        tenant = claim.tenant if claim is not None else None
        record_ids = [self.ledger.begin(ids, now, tenant).id for ids in containers]
        inflight = set(record_ids)
        self.guard.allocating |= inflight
        try:
            try:
                # The intent, before the driver acts. Fast path (issue 42): no look for a vanished ledger file after
                # it: check_room() looked just before, and the confirm's save looks again before the answer (an lstat
                # and an fstat fewer per Allocate: 3.9 us in a loop, more in service, where each syscall runs cold).
                await self.ledger.save(sync=self.driver.durable_allocate, look=False)
            except OSError as exc:  # nothing was written, no hook ran: put the ledger back as it was
                self.ledger.restore(snapshot, inflight)
                raise self._write_failed(exc) from exc
            results: list[ContainerAllocation] = []
            try:
                for ids, record_id in zip(containers, record_ids, strict=True):
                    allocation = await self._allocation(ids, record_id, claim.claim if claim is not None else None)
                    self.ledger.confirm(record_id, allocation, time.time())
                    results.append(allocation)
            except DriverError as exc:
                hung = exc.still_running if isinstance(exc, HookTimeoutError) else None
                if hung is not None:
                    self.guard.keep_busy(hung, containers[len(results)], "allocate")
                done = len(results) if hung is not None else len(results) + 1
                not_undone = await self._undo(containers[:done], held_before)
                self.ledger.restore(snapshot, inflight)
                self._hold_not_undone(not_undone, now)
                if hung is not None:
                    self._undo_when_returned(hung, containers[len(results)], held_before, now)
                await self.ledger.save()
                failure = HookTimeoutError if hung is not None else DriverError  # hangs degrade the resource
                raise failure(f"{exc}; the allocation was rolled back") from exc
            try:
                await self.ledger.save()
            except OSError as exc:  # the front end must not get an answer the ledger does not hold: undo
                not_undone = await self._undo(containers, held_before)
                self.ledger.restore(snapshot, inflight)
                self._hold_not_undone(not_undone, now)
                with contextlib.suppress(OSError):  # the begin records on disk are released after a crash
                    await self.ledger.save()
                raise self._write_failed(exc) from exc
        finally:
            self.guard.allocating -= inflight
        return results

    def _write_failed(self, exc: OSError) -> StateWriteError:
        no_space = exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
        return StateWriteError(
            f"{self.resource_name}: cannot write the allocation ledger {self.ledger.path}: "
            f"{exc.strerror or exc}; nothing was allocated",
            no_space,
        )

    async def _allocation(self, device_ids: Sequence[str], record_id: str, claim: Claim | None) -> ContainerAllocation:
        """The driver's ``allocate`` answer merged with what its devices declare (and their CDI names).

        Shared devices: the driver gets the physical devices with the
        :class:`~devplug.types.Replicas`, and the answer gets
        ``DEVPLUG_SHARED_DEVICES_<RESOURCE>`` (env and annotation) listing them.
        """
        if not self.sharing.is_shared(device_ids):
            return await self.answers.build(device_ids, claim=claim)
        physical, replicas = self.sharing.replicas(device_ids, excluding=(record_id,))
        listed = ",".join(physical)
        shared = ContainerAllocation(
            envs={shared_env_name(self.resource_name): listed},
            annotations={f"{self.resource_name}.shared-devices": listed},
        )
        return await self.answers.build(device_ids, shared=(physical, replicas, shared), claim=claim)

    # --- undo

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
        record_id = self.ledger.hold_for_undo(fresh, now).id
        self.guard.allocating.add(record_id)  # reconciliation leaves it alone while the hook still runs
        self.guard.sync_withheld()

        async def undo() -> None:
            try:
                await asyncio.wait((hung,))
                log.warning(
                    "[%s] allocate of %s returned after its timeout; undoing it",
                    self.resource_name,
                    id_list(fresh),
                    extra={"device": id_list(fresh)},
                )
                self.guard.allocating.discard(record_id)
                await self.releaser.release(record_id, "undoing an allocate that returned after its timeout")
            except DriverError as exc:
                log.error("[%s] undoing the late allocate of %s failed: %s", self.resource_name, id_list(fresh), exc)
            finally:
                self.guard.allocating.discard(record_id)

        self._tasks.spawn(undo())

    async def _undo(self, containers: Sequence[Sequence[str]], held_before: set[str]) -> list[str]:
        """Take back what the driver prepared for ``containers`` (their devices not held before); returns the
        devices whose undo failed (the driver may still hold them)."""
        undone = {i for ids in containers for i in ids if i not in held_before}
        failed: list[str] = []
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
                self.guard.keep_if_hung(exc, fresh)
                failed.extend(fresh)
                log.error(
                    "[%s] undoing allocate of %s failed: %s; they stay out of service until a deallocate succeeds",
                    self.resource_name,
                    id_list(fresh),
                    exc,
                    extra={"device": id_list(fresh)},
                )
        return failed

    def _hold_not_undone(self, device_ids: list[str], now: float) -> None:
        """Devices whose undo failed may still be prepared: keep them in a releasing record (withheld, released
        with ``retry=True`` and backoff like any failed release) rather than offer them uncleaned."""
        if device_ids:
            self.ledger.hold_for_undo(device_ids, now, deallocate_tried=True)
            self.guard.sync_withheld()
            self._on_allocated()  # wakes reconciliation, which retries the release

    async def _undo_shared(self, fresh: list[str], undone: set[str]) -> None:
        """Undo a shared allocation like a tenancy's release: ``post_stop``, then ``deallocate`` of the devices
        no other tenant holds a replica of (the ledger still holds this request's records, ``undone`` names
        their fresh replicas)."""
        mine = {r.id for i in fresh for r in self.ledger.holders(i)}  # only this request's records hold them
        if self.driver.capabilities.post_stop:
            await self.releaser.post_stop(fresh, False, mine)
        last, _ = self.releaser.split_last_tenants(fresh, undone)
        await self.releaser.deallocate_physical(last, fresh, False)

    # --- pre-start

    def _note_pre_start(self, device_ids: Sequence[str]) -> None:
        """The kubelet is about to give ``device_ids`` to a container: their records reached one."""
        if len(self.pre_started) > 2 * len(self.ledger) + 64:
            self.pre_started.intersection_update(self.ledger.records)  # released records are forgotten
        self.pre_started.update(r.id for i in device_ids for r in self.ledger.holders(i) if not r.releasing)

    def reached_container(self, record: AllocationRecord) -> bool | None:
        """Whether a container got ``record``'s devices, as PreStartContainer tells: True once the kubelet called it
        for them; False when it would have (the driver implements ``pre_start``, so the kubelet calls it before a
        container gets the devices) and did not, for a record allocated while this admission served; None when
        that is not known."""
        if record.id in self.pre_started:
            return True
        if self.driver.capabilities.pre_start and record.created >= self.serving_since:
            return False
        return None

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        """PreStartContainer: only for devices allocated to a live allocation, healthy, each named once."""
        self.checks.known([device_ids], "PreStartContainer")
        self._note_pre_start(device_ids)
        async with self.guard.hold(device_ids, "pre_start"):
            problems = []
            live = {i for i in device_ids for r in self.ledger.holders(i) if not r.releasing and i in r.devices}
            not_allocated = [i for i in device_ids if i not in live]
            releasing = [i for i in not_allocated if i in self.ledger.releasing_devices()]
            never = [i for i in not_allocated if i not in releasing]
            if never:
                problems.append(f"device IDs not allocated: {id_list(never)}")
            if releasing:
                problems.append(f"device IDs being released: {id_list(releasing)}")
            unhealthy = [i for i in device_ids if i in live and not self.checks.reported_healthy(i)]
            if unhealthy:
                problems.append(f"unhealthy device IDs: {id_list(unhealthy)}")
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
                    self.guard.keep_if_hung(exc, device_ids)
                    raise
