"""Claim reconciliation: the DRA front end's releases that no ``NodeUnprepareResources`` will ask for.

The kubelet owes an unprepare for every claim it prepared, across its own
restarts (``dra_manager_state``). What it does not owe, and what this loop finds:

* **claims gone while the daemon was down** (or while the kubelet forgot them): a
  prepared claim whose ResourceClaim was deleted, replaced by another of that
  name, or deallocated (:meth:`~devplug.frontends.dra.claims.ClaimReader.presence`,
  one get per prepared claim, at start and every ``presence_interval``);
* **leftovers of the device-plugin API** (a node moved from one API to the other
  with devices still allocated): records without a claim;
* **prepares that never completed** (the daemon was killed inside the driver's
  ``allocate``): pending records no admission works on;
* **releases left unfinished** (a failure, a kill -9): releasing records, retried
  with the release queue's backoff;
* **CDI specs of claims released** here (not through an unprepare): deleted;
* **the device status of claims found gone** (:mod:`~devplug.frontends.dra.statuswriter`): removed, and its kept
  copy dropped, at once (a deleted claim took its status with it; the API server drops a deallocated device's);
* **admin-access claims gone** (:mod:`~devplug.frontends.dra.adminaccess`: no
  ledger record, no hook; asked about with the prepared claims): their CDI spec is
  deleted and they are forgotten, at once (nothing is cleaned, so nothing waits
  for their pods' containers: a CDI spec is read when a container is made).

Each goes to the resource's release queue
(:class:`~devplug.engine.releasequeue.ReleaseQueue`), under the same liveness
rules as the device-plugin front end's releases: the devices are cleaned only once
every pod the claim was reserved for has no container left
(:mod:`devplug.engine.tenantexit`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from devplug.engine import AllocationRecord, DeviceLifecycle, ReleaseQueue
from devplug.frontends.dra.adminaccess import AdminClaims
from devplug.frontends.dra.claimcdi import ClaimCdiSpecs
from devplug.frontends.dra.claims import ClaimPresence, ClaimReadError, ClaimRef
from devplug.frontends.dra.statuswriter import ClaimStatusWriter

__all__ = ["ClaimReconciler", "claim_ref"]

log = logging.getLogger("devplug.frontends.dra")

#: Seconds a pending record may be young before it counts as a prepare that never completed.
PENDING_GRACE_S = 10.0

#: What asks the API server whether claims still exist (``ClaimReader.presence``).
PresenceCheck = Callable[[Iterable[ClaimRef]], Any]


def claim_ref(record: AllocationRecord) -> ClaimRef | None:
    """The claim a record was prepared for, as the kubelet names it; None for a record of no claim."""
    if record.claim_uid is None or record.claim is None:
        return None
    namespace, _, name = record.claim.partition("/")
    return ClaimRef(namespace, name, record.claim_uid)


class ClaimReconciler:
    """One DRA resource's reconciliation loop (see the module's docstring)."""

    def __init__(
        self,
        lifecycle: DeviceLifecycle,
        releases: Callable[[], ReleaseQueue | None],
        presence: PresenceCheck,
        cdi: ClaimCdiSpecs,
        *,
        interval: float = 1.0,
        presence_interval: float = 30.0,
        admin: AdminClaims | None = None,
        status: ClaimStatusWriter | None = None,
    ) -> None:
        self.lifecycle = lifecycle
        #: Writes and removes the prepared claims' device status (None: the front end writes none).
        self._status = status
        #: The admin-access claims prepared here (no record of theirs is in the ledger).
        self._admin = admin
        self.name = lifecycle.resource_name
        self._releases = releases
        self._presence = presence
        self._cdi = cdi
        self.interval = interval
        self.presence_interval = presence_interval
        self._wake = asyncio.Event()
        self._check_presence = True
        self._last_presence = 0.0
        #: Why the last presence check failed (None: it worked), for status.
        self.presence_error: str | None = None
        #: Claims found gone, by presence (counted once each).
        self.gone: dict[str, ClaimPresence] = {}
        self._open = asyncio.Event()  # cleared while a handover holds the reconciler (see hold)
        self._open.set()
        self._quiet = asyncio.Event()  # cleared while a pass runs
        self._quiet.set()

    def hold(self) -> None:
        """A newer instance takes the node over: start no pass (the claims' CDI specs and releases become its
        own); a pass under way finishes (:meth:`idle` waits for it)."""
        self._open.clear()

    def release(self) -> None:
        """The handover failed: pass again."""
        self._open.set()
        self.wake()

    async def idle(self) -> None:
        """Return once no pass runs (after :meth:`hold`, none starts)."""
        await self._quiet.wait()

    def wake(self, presence: bool = False) -> None:
        """Look again soon (``presence``: ask the API server too)."""
        self._check_presence |= presence
        self._wake.set()

    async def run(self) -> None:
        """Pass after pass until cancelled; a pass that fails is logged and the next one comes."""
        while True:
            await self._open.wait()
            self._quiet.clear()
            try:
                await self.reconcile()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("[%s] claim reconciliation failed; trying again", self.name)
            finally:
                self._quiet.set()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval)
            self._wake.clear()

    async def reconcile(self) -> None:
        """One pass (see the module's docstring)."""
        queue = self._releases()
        if queue is None:
            return
        now = time.time()
        prepared: list[AllocationRecord] = []
        for record in list(self.lifecycle.records()):
            if queue.running(record.id) or self.lifecycle.in_admission(record.id):
                continue
            if record.releasing:
                queue.retry(record)
            elif record.pending:
                if now - record.created >= PENDING_GRACE_S:
                    queue.start(record, "a prepare that never completed (the daemon stopped inside it)")
            elif record.claim_uid is None:
                queue.release_when_exited(
                    record, "allocated through the device-plugin API before this resource moved to DRA", now
                )
            elif record.claim_uid in self.gone:  # asked again each pass: the liveness grace may be over now
                queue.release_when_exited(record, f"{claim_ref(record)} is {self.gone[record.claim_uid].value}", now)
            else:
                prepared.append(record)
        admin = self._admin_only()
        due = self._check_presence or time.monotonic() - self._last_presence >= self.presence_interval
        if (prepared or admin) and due:
            await self._released_gone(queue, prepared, admin)
        queue.forget_gone()
        for uid in [u for u in self.gone if self.lifecycle.for_claim(u) is None]:
            del self.gone[uid]
        for uid in await self._cdi.kept():
            # its kept copy says the spec was written here: it goes with the claim's record and admin-access part
            if self.lifecycle.for_claim(uid) is None and (self._admin is None or uid not in self._admin):
                await self._cdi.remove(uid, recorded=False)

    def _admin_only(self) -> dict[ClaimRef, str]:
        """The admin-access claims with no record in the ledger (a claim with both parts is asked about through its
        record, and its admin-access part once the record is gone), by ref -> UID."""
        if self._admin is None:
            return {}
        found = {}
        for uid in self._admin:
            kept = self._admin.get(uid)
            if kept is not None and self.lifecycle.for_claim(uid) is None:
                ref = kept.ref(uid)
                if ref.problem() is None:  # written from a checked claim; one edited by hand names no URL
                    found[ref] = uid
        return found

    async def _forget_admin(self, ref: ClaimRef, answer: ClaimPresence) -> None:
        """An admin-access claim found gone: its CDI spec deleted, the claim forgotten (no hook: nothing to clean)."""
        if self._admin is None or self.lifecycle.for_claim(ref.uid) is not None or ref.uid not in self._admin:
            return
        log.warning(
            "[%s] %s was prepared here with admin access but is %s in the API server: its CDI spec is removed",
            self.name,
            ref,
            answer.value,
        )
        self.lifecycle.observer.claim_gone(answer.value)
        await self._cdi.remove(ref.uid, recorded=True, claim=str(ref))
        try:
            await self._admin.forget(ref.uid)
        except OSError as exc:
            log.error("[%s] cannot forget the admin-access claim %s: %s", self.name, ref, exc)

    async def _released_gone(
        self, queue: ReleaseQueue, prepared: list[AllocationRecord], admin: dict[ClaimRef, str]
    ) -> None:
        # a record's claim was checked when prepared; one that fails now (a ledger edited by hand) names no URL
        refs = {ref: record for record in prepared if (ref := claim_ref(record)) is not None and ref.problem() is None}
        try:
            presence: dict[ClaimRef, ClaimPresence] = await self._presence([*refs, *admin])
        except ClaimReadError as exc:
            if self.presence_error != str(exc):
                log.warning("[%s] cannot tell whether prepared claims still exist: %s", self.name, exc)
            self.presence_error = str(exc)
            return
        self.presence_error = None
        self._check_presence = False
        self._last_presence = time.monotonic()
        now = time.time()
        for ref, answer in presence.items():
            if not answer.gone:
                continue
            if ref not in refs:
                await self._forget_admin(ref, answer)
                continue
            record = self.lifecycle.record(refs[ref].id)
            if record is None or record.releasing or queue.running(record.id):
                continue
            if ref.uid not in self.gone:
                if self._status is not None:  # the status goes now; the devices once the pods' containers are gone
                    await self._status.unprepared(ref)
                self.lifecycle.observer.claim_gone(answer.value)
                log.warning(
                    "[%s] %s was prepared here but is %s in the API server: its devices are released once its "
                    "pods' containers are gone",
                    self.name,
                    ref,
                    answer.value,
                )
            self.gone[ref.uid] = answer
            queue.release_when_exited(record, f"{ref} is {answer.value} and was never unprepared", now)
