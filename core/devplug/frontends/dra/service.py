"""``NodePrepareResources`` and ``NodeUnprepareResources``: DRA claims admitted and released through the core.

The kubelet names each claim by namespace, name and UID
(``k8s.io/kubelet/pkg/apis/dra/v1``, Kubernetes 1.36); :class:`ClaimPreparer`
does the work, protocol-free, and :class:`DraPluginV1` / :class:`DraPluginV1beta1`
are the two wire versions of it (the same messages but ``share_id``, v1 only).

Before anything else, in both calls, each claim's UID, namespace and name must
be of the forms the API server gives them (:meth:`~devplug.frontends.dra.claims.ClaimRef.problem`:
a UUID, a DNS-1123 label, a DNS-1123 subdomain): the UID names the claim's CDI
spec files and its namespace and name the URL it is read from, so a claim
named otherwise (``../ledger``, ``/etc/x``) gets its own error naming the field
and nothing is read, written or removed for it.

**Prepare**, per claim (the claims of one call in parallel, one call at a time
per claim UID):

* already prepared (the ledger has a live record of the claim,
  :meth:`~devplug.engine.lifecycle.DeviceLifecycle.for_claim`): the claim is read
  again and answered with the same devices and CDI IDs (the kubelet repeats
  calls after its restart and when a pod is re-admitted); the pods it is
  reserved for are noted (a shared claim is released only when all are gone);
* else the claim is read (:class:`~devplug.frontends.dra.claims.ClaimReader`):
  unknown, replaced (another UID), not allocated, no device of this driver and
  pool, a device this node does not publish: a per-claim error naming it;
  a device another claim holds: refused the same way; then the core's admission
  with the claim
  (:meth:`~devplug.engine.lifecycle.DeviceLifecycle.allocate` with
  ``claim=DraClaim``): the devices' locks, the ledger record keyed by the claim
  UID, the driver's ``allocate`` with the claim's opaque configuration, rollback
  on failure; an unhealthy device, a busy one, a failing driver: a per-claim
  error, nothing kept;
* a **share** of a device published with consumable capacity (a result with
  ``shareID`` and ``consumedCapacity``, KEP-5075) is admitted as that device's
  replicas (:mod:`devplug.frontends.dra.shares`: as many as the share consumes,
  the lowest no record holds, chosen and admitted under the device's lock, all the
  claim's shares at once; too few free: ``over_consumed``); prepared again, the
  record's replicas are compared with the shares by count. The kubelet's answer
  carries each result's ``share_id`` (v1);
* an **admin-access** result (KEP-5018, :mod:`devplug.frontends.dra.adminaccess`)
  is prepared without the core: only in a namespace labelled
  ``resource.kubernetes.io/admin-access: "true"`` (asked of the API server;
  else ``admin_access_not_permitted``), no ledger record, no driver hook, the
  device's own description in the claim's CDI spec, the claim kept in the
  resource's admin-access file. A claim with both parts gets both, all or
  nothing (a spec or file that cannot be written releases the admitted part);
* the claim's CDI spec is written (:mod:`devplug.frontends.dra.claimcdi`), a CDI
  device per request holding what that request's devices describe and the
  driver's ``allocate`` answer for the claim, and each device answered with its
  request, pool, device name and CDI IDs (its request's CDI device, on the
  request's first device, so a container using the whole claim gets each once;
  and the resource's own CDI device of it with ``[cdi] enabled``); a spec that
  cannot be written releases what was prepared.

**Unprepare**, per claim: the claim's record is released through the core
(:meth:`~devplug.engine.lifecycle.DeviceLifecycle.release`: ``post_stop``, then
``deallocate``, each written to the ledger before and after the hook, so a
daemon killed in between finishes it after its restart, the hooks flagged as
retries), and its CDI spec is deleted meanwhile, in a worker thread (no
container uses it once the kubelet unprepares: its pods' containers are gone).
An admin-access claim's unprepare removes its spec and forgets it, calling no
hook. A claim with no record (never prepared here, or already unprepared) is a
success, as the kubelet expects; its CDI spec is deleted only if its kept copy
says this daemon wrote it (a daemon stopped between the release and the
deletion). A release that fails is that claim's error; the record stays
releasing (its devices withheld) and the kubelet calls again.

**How many claims one call may name.** The kubelet sends one call per pod and
driver, with that pod's claims of the driver (``pkg/kubelet/cm/dra/manager.go``,
``prepareResources``: the claims of ``pod.Spec.ResourceClaims`` batched by driver
name). Each claim this node prepares holds at least one device of the table
exclusively (a device allocated whole, or a share's replicas: a shared device
gives at most as many shares as it has replicas), so a call naming more claims
than the resource has devices can never be prepared whole (an admin-access claim
holds nothing, but a pod of more than :data:`MIN_CLAIMS_BOUND` of them is none
the kubelet sends). A call may name
:meth:`ClaimPreparer.claims_bound` claims: the resource's device count, and never
fewer than :data:`MIN_CLAIMS_BOUND` (a device list shrinking under a pod never
refuses it). A larger call is refused whole with ``INVALID_ARGUMENT`` naming the
bound, before anything is read or held: 20,000 claims in one call were all read
from the API server at once. The reads of all calls together are bounded too
(:data:`~devplug.frontends.dra.claims.READS_AT_ONCE`).

Each claim's outcome is told to the resource's observer (the metrics): its
time, and for a failure its kind (:func:`~devplug.frontends.dra.refusals.prepare_failure_reason`,
one of :data:`~devplug.frontends.dra.refusals.PREPARE_FAILURE_REASONS`; never the message, nor the claim).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from devplug.api.gen.dra.v1 import api_pb2 as v1
from devplug.api.gen.dra.v1 import api_pb2_grpc as v1_grpc
from devplug.api.gen.dra.v1beta1 import api_pb2 as v1beta1
from devplug.api.gen.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from devplug.engine import AllocationRecord, ClaimTenant, DeviceLifecycle, DraClaim, cdi_device_name
from devplug.errors import DevplugError
from devplug.frontends.callgate import CallGate, forward_answered
from devplug.frontends.dra.adminaccess import AdminAccessRefusedError, AdminClaim, AdminClaims, NamespaceCheck
from devplug.frontends.dra.claimcdi import ClaimCdiSpecs
from devplug.frontends.dra.claims import (
    AllocatedDevice,
    ClaimAllocation,
    ClaimError,
    ClaimIdentifierError,
    ClaimReadError,
    ClaimRef,
)
from devplug.frontends.dra.devicestatus import status_entries
from devplug.frontends.dra.refusals import (
    PREPARE_FAILURE_REASONS,
    UNPREPARE_FAILURE_REASONS,
    claim_config,
    prepare_failure_reason,
)
from devplug.frontends.dra.refusals import ClaimRefused as _ClaimRefused
from devplug.frontends.dra.shares import ShareLocks, assign, choose, shares_of
from devplug.frontends.dra.statuswriter import ClaimStatusWriter
from devplug.text.logsafe import id_list
from devplug.types import CDIDevice, Claim, ContainerAllocation, merge_allocations

__all__ = [
    "PREPARE_FAILURE_REASONS",
    "UNPREPARE_FAILURE_REASONS",
    "ClaimPreparer",
    "ClaimReading",
    "DraPluginV1",
    "DraPluginV1beta1",
    "PreparedDevice",
    "prepare_failure_reason",
]

log = logging.getLogger("devplug.frontends.dra")

#: What reads a claim (``ClaimReader.read``).
ClaimReading = Callable[[ClaimRef], Awaitable[ClaimAllocation]]

#: The fewest claims a call may name (see the module docstring).
MIN_CLAIMS_BOUND = 32


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as the kubelet is answered."""

    requests: tuple[str, ...]
    pool: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


class ClaimPreparer:
    """Prepares and unprepares one DRA driver's claims through one resource's lifecycle (see the module)."""

    def __init__(
        self,
        lifecycle: DeviceLifecycle,
        read_claim: ClaimReading,
        cdi: ClaimCdiSpecs,
        *,
        driver: str,
        pool: str,
        resource_cdi_kind: str | None = None,
        status: ClaimStatusWriter | None = None,
        admin_claims: AdminClaims | None = None,
        namespaces: NamespaceCheck | None = None,
    ) -> None:
        self.lifecycle = lifecycle
        #: Writes what the driver's ``allocate`` says of the devices into the claim's status (KEP-4817).
        self.status = status
        self.name = lifecycle.resource_name
        self._read = read_claim
        self.cdi = cdi
        self.driver = driver
        self.pool = pool
        #: The resource's own CDI kind when ``[cdi] enabled`` (its devices' CDI IDs come in the allocation).
        self._resource_kind = resource_cdi_kind
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        #: One lock per device with consumable capacity: a share's replicas are chosen and admitted under it.
        self._share_locks = ShareLocks()
        #: The admin-access claims prepared here (:mod:`~devplug.frontends.dra.adminaccess`), and the check of their
        #: namespace's label; without them an admin-access allocation is refused.
        self.admin_claims = admin_claims
        self._namespaces = namespaces
        self.observer = lifecycle.observer
        #: Counts, for status and metrics.
        self.prepared = 0
        self.unprepared = 0
        self.refused = 0

    async def restore_admin_specs(self) -> None:
        """At start: write back the CDI specs of the admin-access claims kept (a reboot may have emptied the CDI spec
        dir while the kubelet holds them prepared); the claims with a record are restored with the records."""
        if self.admin_claims is None:
            return
        for uid in self.admin_claims:
            if self.lifecycle.for_claim(uid) is None:
                try:
                    await self.cdi.restore(uid)
                except OSError as exc:
                    log.error("[%s] cannot restore the CDI spec of admin-access claim uid %s: %s", self.name, uid, exc)

    def claims_bound(self) -> int:
        """How many claims one call may name: one per device the resource publishes, at least
        :data:`MIN_CLAIMS_BOUND` (see the module docstring)."""
        return max(MIN_CLAIMS_BOUND, len(self.lifecycle.table))

    def _lock(self, claim_uid: str) -> asyncio.Lock:
        lock = self._locks.get(claim_uid)
        if lock is None:
            lock = self._locks[claim_uid] = asyncio.Lock()
        return lock

    # --- prepare

    async def prepare(self, claims: Iterable[ClaimRef]) -> dict[str, list[PreparedDevice] | str]:
        """Each claim's devices, or its error (a string naming the claim)."""
        wanted = list(dict.fromkeys(claims))
        if len(wanted) == 1:  # the usual call (one pod, one claim): no task to run it in
            return {wanted[0].uid: await self._prepare_one(wanted[0])}
        answers = await asyncio.gather(*(self._prepare_one(c) for c in wanted))
        return {c.uid: a for c, a in zip(wanted, answers, strict=True)}

    async def _prepare_one(self, ref: ClaimRef) -> list[PreparedDevice] | str:
        start = time.monotonic()
        async with self._lock(ref.uid):
            try:
                devices = await self._prepare_locked(ref)
            except DevplugError as exc:
                self.refused += 1
                self.observer.claim_prepare_failed(prepare_failure_reason(exc), time.monotonic() - start)
                message = str(exc)
                if not isinstance(exc, ClaimError | _ClaimRefused | ClaimReadError):
                    message = f"{ref}: {message}"
                log.warning("[%s] cannot prepare %s", self.name, message)
                return message
            except Exception as exc:  # a bug: this claim's error, with a traceback in the log; the others go on
                self.refused += 1
                self.observer.claim_prepare_failed("internal_error", time.monotonic() - start)
                log.exception("[%s] preparing %s failed unexpectedly", self.name, ref)
                return f"{ref}: devplug failed unexpectedly: {type(exc).__name__}: {exc} (see the daemon's log)"
            self.observer.claim_prepared(time.monotonic() - start)
            return devices

    async def _prepare_locked(self, ref: ClaimRef) -> list[PreparedDevice]:
        problem = ref.problem()
        if problem is not None:
            raise ClaimIdentifierError(ref, f"{problem}; nothing was prepared")
        allocation = await self._read(ref)
        normal = tuple(d for d in allocation.devices if not d.admin_access)
        admin = tuple(d for d in allocation.devices if d.admin_access)
        record = self.lifecycle.for_claim(ref.uid)
        kept = self.admin_claims.get(ref.uid) if self.admin_claims is not None else None
        live = record is not None and not record.releasing and not record.pending
        if live or (record is None and not normal and kept is not None):
            again = await self._again(ref, allocation, record if live else None, kept)
            if again is not None:
                return again
            record = None  # released: prepared afresh below
        if record is not None and record.releasing:
            raise _ClaimRefused(
                f"{ref}: being unprepared (its release has not finished); try again later", "being_unprepared"
            )
        self._check_free(ref, normal)
        if admin:
            await self._admin_allowed(ref, admin)
        shares = shares_of(ref, normal, self.lifecycle.table, self.driver)
        answer = ContainerAllocation()
        async with self._share_locks.holding(shares.values()):
            if shares:  # the replicas no record holds, under the devices' locks until admitted
                held, withheld = self.lifecycle.ledger.holds, self.lifecycle.table.withheld
                ids = choose(ref, normal, shares, held=held, withheld=withheld)
            else:
                ids = [(d.device_id,) for d in normal]
            if normal:
                claim = Claim(
                    ref.namespace,
                    ref.name,
                    ref.uid,
                    requests=_requests(normal, ids),
                    config=tuple(claim_config(c, ref) for c in allocation.configs),
                )
                tenant = ClaimTenant(ref.uid, f"{ref.namespace}/{ref.name}", allocation.reserved_for)
                flat = [i for group in ids for i in group]
                [answer] = await self.lifecycle.allocate([flat], claim=DraClaim(claim, tenant))
        try:
            if admin and self.admin_claims is not None:
                await self.admin_claims.put(ref.uid, f"{ref.namespace}/{ref.name}", [d.device_id for d in admin])
            cdi_ids = await self.cdi.write(ref.uid, self._by_request(allocation, answer))
        except OSError as exc:
            record = self.lifecycle.for_claim(ref.uid)
            if record is not None:
                await self.lifecycle.release(record.id, f"the CDI spec of {ref} could not be written")
            if admin and self.admin_claims is not None:
                with contextlib.suppress(OSError):
                    await self.admin_claims.forget(ref.uid)
            raise _ClaimRefused(
                f"{ref}: cannot write its CDI spec {self.cdi.path(ref.uid)} or keep its admin-access part "
                f"({self.admin_claims.path if self.admin_claims is not None else 'none'}): {exc.strerror or exc}; "
                "nothing was prepared",
                "cdi_spec_unwritable",
            ) from exc
        self.prepared += 1
        await self._write_status(ref, allocation, answer.device_status)
        log.info(
            "[%s] prepared %s: %s%s",
            self.name,
            ref,
            id_list([i for group in ids for i in group]),
            f"; admin access to {id_list([d.device_id for d in admin])}" if admin else "",
            extra={"device": id_list(allocation.device_ids)},
        )
        return self._devices(allocation, answer, cdi_ids)

    async def _admin_allowed(self, ref: ClaimRef, admin: Sequence[AllocatedDevice]) -> None:
        """Refuse admin access unless the claim's namespace allows it (:class:`NamespaceCheck`)."""
        names = [d.device_name for d in admin]
        if self._namespaces is None or self.admin_claims is None:
            raise AdminAccessRefusedError(
                ref, f"admin access to {', '.join(names)}: this front end cannot check the claim's namespace"
            )
        await self._namespaces.check(ref, names)

    async def _write_status(self, ref: ClaimRef, allocation: ClaimAllocation, statuses: Mapping[str, Any]) -> None:
        """Once a claim is prepared: the device status the driver's ``allocate`` answered, into the claim's
        ``status.devices`` (:mod:`~devplug.frontends.dra.devicestatus`), written in the background: never fails the
        prepare."""
        if self.status is None or not statuses:
            return
        devices = [d for d in allocation.devices if not d.admin_access]  # admin access: no allocate answered them
        found = status_entries(self.driver, self.pool, devices, statuses, self.lifecycle.table.physical_of)
        await self.status.prepared(ref, found)

    def _description(self, device_id: str) -> ContainerAllocation | None:
        """What a device (a replica, a device allocated whole, the physical ID of a shared one) gives a container."""
        table = self.lifecycle.table
        found = table.reported(device_id) or table.physical(table.physical_of(device_id))
        return found.allocation if found is not None else None

    def _by_request(self, allocation: ClaimAllocation, answer: ContainerAllocation) -> dict[str, ContainerAllocation]:
        """What each request gives a container: its devices' own descriptions, and, for a request without admin
        access, the part of the claim's answer that no device describes (the driver's ``allocate`` answer, the
        core's shared-device entries); an admin-access request gets its devices' descriptions alone."""
        described: dict[str, ContainerAllocation] = {}
        for dev in allocation.devices:
            found = self._description(dev.device_id)
            if found is not None:
                described[self.lifecycle.table.physical_of(dev.device_id)] = found
        parts = described.values()
        envs = {k: v for p in parts for k, v in p.envs.items()}
        mounts = {m for p in parts for m in p.mounts}
        nodes = {d for p in parts for d in p.devices}
        claim_wide = ContainerAllocation(
            envs={k: v for k, v in answer.envs.items() if envs.get(k) != v},
            mounts=tuple(m for m in answer.mounts if m not in mounts),
            devices=tuple(d for d in answer.devices if d not in nodes),
        )
        physical = self.lifecycle.table.physical_of
        out: dict[str, ContainerAllocation] = {}
        for request in dict.fromkeys(d.request for d in allocation.devices):
            mine = [d for d in allocation.devices if d.request == request]
            own = [described[p] for p in dict.fromkeys(physical(d.device_id) for d in mine) if p in described]
            given = own if all(d.admin_access for d in mine) else [claim_wide, *own]
            out[request] = merge_allocations(given) if given else ContainerAllocation()
        return out

    async def _again(
        self, ref: ClaimRef, allocation: ClaimAllocation, record: AllocationRecord | None, kept: AdminClaim | None
    ) -> list[PreparedDevice] | None:
        """A claim prepared earlier: the same answer (its devices must be the record's, its shares as many of each
        device's replicas as the record holds, its admin-access devices those kept). None when the earlier prepare
        never finished (a run that ended between the ledger's record and the claim's CDI spec, so the kubelet had
        no answer): what it holds is released, for the claim to be prepared afresh."""
        normal = tuple(d for d in allocation.devices if not d.admin_access)
        admin = [d.device_id for d in allocation.devices if d.admin_access]
        if record is not None:
            shares = shares_of(ref, normal, self.lifecycle.table, self.driver)
            if assign(normal, shares, record.devices, self.lifecycle.table) is None:
                raise _ClaimRefused(
                    f"{ref}: prepared earlier with {id_list(record.devices)}, but its allocation now names "
                    f"{id_list(allocation.device_ids)}"
                    + (f" (shares of {id_list(sorted({s.of.device_id for s in shares.values()}))})" if shares else ""),
                    "allocation_changed",
                )
        if admin and kept is not None and sorted(kept.devices) != sorted(admin):
            raise _ClaimRefused(
                f"{ref}: prepared earlier with admin access to {id_list(kept.devices)}, but its allocation now names "
                f"{id_list(admin)}",
                "allocation_changed",
            )
        if admin and kept is None:  # the ledger's record was written, the admin-access part was not: never answered
            await self._unfinished(ref, record, None, "its prepare ended before its admin-access part was kept")
            return None
        if record is not None:
            pods = tuple(p for p in (record.pod_uid, *record.pod_uids) if p)
            if allocation.reserved_for and set(allocation.reserved_for) != set(pods):
                self.lifecycle.note_claim_pods(record.id, allocation.reserved_for)
                await self.lifecycle.save()
        try:
            cdi_ids = await self.cdi.restore(ref.uid)
        except OSError as exc:
            raise _ClaimRefused(
                f"{ref}: prepared, but its CDI spec {self.cdi.path(ref.uid)} cannot be written back: "
                f"{exc.strerror or exc}",
                "cdi_spec_unwritable",
            ) from exc
        if not cdi_ids and self._described([*(record.devices if record is not None else ()), *admin]):
            # Its devices describe what a container gets, so its first prepare wrote a spec, or ended before it.
            await self._unfinished(ref, record, kept, "its prepare ended before its CDI spec was written")
            return None
        cdi_devices = tuple(CDIDevice(n) for n in (record.prepared.get("cdi_devices", ()) if record else ()))
        if self.status is not None and not await self.status.again(ref) and record is not None:
            # None kept: killed after the ledger's confirmation (which journalled it) and before keeping it.
            await self._write_status(ref, allocation, record.device_status())
        return self._devices(allocation, ContainerAllocation(cdi_devices=cdi_devices), cdi_ids)

    async def _unfinished(
        self, ref: ClaimRef, record: AllocationRecord | None, kept: AdminClaim | None, why: str
    ) -> None:
        """Release what a prepare that never answered the kubelet left (its record, its kept admin-access part)."""
        held = [*(record.devices if record is not None else ()), *(kept.devices if kept is not None else ())]
        log.warning(
            "[%s] %s was recorded as prepared by a run that ended before it answered (the kubelet had no answer; %s): "
            "releasing %s and preparing it afresh",
            self.name,
            ref,
            why,
            id_list(held),
        )
        if record is not None:
            await self.lifecycle.release(record.id, f"{ref}: {why}")
        if kept is not None and self.admin_claims is not None:
            await self.admin_claims.forget(ref.uid)

    def _described(self, device_ids: Iterable[str]) -> bool:
        """Whether one of the devices describes what a container gets (its claim then has a CDI spec)."""
        for device in device_ids:
            found = self._description(device)
            if found is not None and found != ContainerAllocation():
                return True
        return False

    def _check_free(self, ref: ClaimRef, devices: Sequence[AllocatedDevice]) -> None:
        """Refuse devices a live record of another claim holds (admin-access devices are not among ``devices``; a
        share's replicas are chosen among the free ones)."""
        for dev in devices:
            for holder in self.lifecycle.ledger.holders(dev.device_id):
                if holder.claim_uid is not None and holder.claim_uid != ref.uid and not holder.releasing:
                    raise _ClaimRefused(
                        f"{ref}: device {dev.device_name} ({dev.device_id}) is held by claim {holder.claim} "
                        f"(uid {holder.claim_uid}), still prepared on this node",
                        "device_held_by_other_claim",
                    )

    def _devices(
        self, allocation: ClaimAllocation, answer: ContainerAllocation, cdi_ids: Mapping[str, str]
    ) -> list[PreparedDevice]:
        """The answer's devices: each with its request and CDI IDs (its request's, on the request's first device;
        the resource's own CDI device of it when the allocation names one)."""
        named = {c.name for c in answer.cdi_devices}
        given: set[str] = set()
        devices = []
        for dev in allocation.devices:
            ids: list[str] = []
            if dev.request in cdi_ids and dev.request not in given:
                ids.append(cdi_ids[dev.request])
                given.add(dev.request)
            if self._resource_kind is not None:
                own = f"{self._resource_kind}={cdi_device_name(dev.device_id)}"
                if own in named:
                    ids.append(own)
            devices.append(PreparedDevice((dev.request,), self.pool, dev.device_name, tuple(ids), dev.share_id))
        return devices

    # --- unprepare

    async def unprepare(self, claims: Iterable[ClaimRef]) -> dict[str, str]:
        """Each claim's error ("" when unprepared, or never prepared here)."""
        wanted = list(dict.fromkeys(claims))
        if len(wanted) == 1:
            return {wanted[0].uid: await self._unprepare_one(wanted[0])}
        answers = await asyncio.gather(*(self._unprepare_one(c) for c in wanted))
        return {c.uid: a for c, a in zip(wanted, answers, strict=True)}

    async def _unprepare_one(self, ref: ClaimRef) -> str:
        start = time.monotonic()
        problem = ref.problem()
        if problem is not None:  # its UID would name the files removed: none is
            self.observer.claim_unprepare_failed("claim_identifier_invalid", time.monotonic() - start)
            message = f"{ref}: {problem}; nothing was unprepared"
            log.warning("[%s] refused to unprepare %s", self.name, message)
            return message
        async with self._lock(ref.uid):
            record = self.lifecycle.for_claim(ref.uid)
            kept = self.admin_claims.get(ref.uid) if self.admin_claims is not None else None
            # The spec goes in a worker thread while the release runs: no container uses it once the kubelet
            # unprepares the claim (its pods' containers are gone), whatever the release's outcome.
            removal = asyncio.ensure_future(
                self.cdi.remove(ref.uid, recorded=record is not None or kept is not None, claim=str(ref))
            )
            try:
                if record is not None:
                    await self.lifecycle.release(record.id, f"the kubelet unprepared {ref}")
                    self.unprepared += 1
            except DevplugError as exc:  # the driver's hook, or the ledger that cannot be written
                self.observer.claim_unprepare_failed("release_failed", time.monotonic() - start)
                log.error("[%s] unprepare of %s failed: %s", self.name, ref, exc)
                return f"{ref}: releasing its devices failed: {exc}; they stay withheld until it succeeds"
            except Exception as exc:  # a bug: this claim's error, with a traceback in the log
                self.observer.claim_unprepare_failed("internal_error", time.monotonic() - start)
                log.exception("[%s] unprepare of %s failed unexpectedly", self.name, ref)
                return f"{ref}: devplug failed unexpectedly: {type(exc).__name__}: {exc} (see the daemon's log)"
            finally:
                await removal  # logs its own failure; never raises
            if kept is not None and self.admin_claims is not None:  # no hook: its spec was all it had
                try:
                    await self.admin_claims.forget(ref.uid)
                except OSError as exc:
                    self.observer.claim_unprepare_failed("release_failed", time.monotonic() - start)
                    log.error("[%s] unprepare of %s failed: %s", self.name, ref, exc)
                    return f"{ref}: its admin-access part cannot be forgotten ({self.admin_claims.path}): {exc}"
                if record is None:
                    self.unprepared += 1
            if self.status is not None:  # its device status goes, in the background (kept: also after a restart)
                await self.status.unprepared(ref)
            self.observer.claim_unprepared(time.monotonic() - start)
            return ""


def _requests(devices: Sequence[AllocatedDevice], ids: Sequence[tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Each request's device IDs (a share's replicas), for the driver's ``Claim.requests``."""
    requests: dict[str, list[str]] = {}
    for dev, group in zip(devices, ids, strict=True):
        requests.setdefault(dev.request, []).extend(group)
    return {k: tuple(v) for k, v in requests.items()}


# --- the wire


def _refs(request: Any) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in request.claims]


class DraPluginV1(v1_grpc.DRAPluginServicer):  # type: ignore[misc]
    """``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``.

    Each call passes the resource's :class:`~devplug.frontends.callgate.CallGate`:
    during a handover it waits, then runs here (the handover failed) or goes to
    the successor instance's socket on the same service (it owns the ledger now).
    """

    _pb: Any = v1
    _share_id = True

    def __init__(self, preparer: ClaimPreparer, gate: CallGate | None = None) -> None:
        self.preparer = preparer
        self.gate = gate or CallGate()
        self._service = self._pb.DESCRIPTOR.services_by_name["DRAPlugin"].full_name

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        await self._bounded("NodePrepareResources", request, context)
        return await self._gated("NodePrepareResources", request, context, self._prepare)

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        await self._bounded("NodeUnprepareResources", request, context)
        return await self._gated("NodeUnprepareResources", request, context, self._unprepare)

    async def _gated(self, method: str, request: Any, context: Any, here: Callable[[Any], Awaitable[Any]]) -> Any:
        """``here(request)`` past the gate, or the call at the successor instance's socket (a handover). The gate
        is passed here, not handed the call to run: it never calls back into this module."""
        gate = self.gate
        successor = await gate.enter()
        try:
            if successor is None:
                return await here(request)
            decode = getattr(self._pb, f"{method}Response").FromString
            return await forward_answered(
                successor, self.preparer.name, f"/{self._service}/{method}", request, context, decode
            )
        finally:
            gate.leave()

    async def _bounded(self, method: str, request: Any, context: Any) -> None:
        """Refuse a call naming more claims than :meth:`ClaimPreparer.claims_bound`, whole, before any work."""
        bound = self.preparer.claims_bound()
        count = len(request.claims)
        if count > bound:
            message = (
                f"{method} names {count} claims; driver {self.preparer.driver} prepares at most {bound} per call "
                "(one per device it publishes: the kubelet sends one pod's claims of a driver per call); "
                "nothing was done"
            )
            log.warning("[%s] refused a call: %s", self.preparer.name, message)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)

    async def _prepare(self, request: Any) -> Any:
        answers = await self.preparer.prepare(_refs(request))
        response = self._pb.NodePrepareResourcesResponse()
        for uid, answer in answers.items():
            entry = response.claims[uid]
            if isinstance(answer, str):
                entry.error = answer
                continue
            for dev in answer:
                out = entry.devices.add(
                    request_names=list(dev.requests),
                    pool_name=dev.pool,
                    device_name=dev.device_name,
                    cdi_device_ids=list(dev.cdi_device_ids),
                )
                if self._share_id and dev.share_id is not None:
                    out.share_id = dev.share_id
        return response

    async def _unprepare(self, request: Any) -> Any:
        answers = await self.preparer.unprepare(_refs(request))
        response = self._pb.NodeUnprepareResourcesResponse()
        for uid, error in answers.items():
            response.claims[uid].error = error
        return response


class DraPluginV1beta1(DraPluginV1, v1beta1_grpc.DRAPluginServicer):  # type: ignore[misc]
    """``k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`` (no ``share_id``)."""

    _pb: Any = v1beta1
    _share_id = False
