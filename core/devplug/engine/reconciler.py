"""Release detection on kubelets that never call Deallocate.

The reconciler compares each resource's ledger with what the kubelet
attributes to live containers, every ``[release] interval`` seconds while
anything is allocated (it does not poll at all while nothing is). An
allocation is released through the driver (post-stop, then deallocate) once
the kubelet no longer attributes its devices to any container; whether its pod
object still exists does not matter (Kubernetes v1.32 lists a finished pod in
PodResources ``List``, without devices). It is careful not to release by
mistake:

* devices PodResources lists under a container are held; devices it does not
  list are released only once the kubelet's own checkpoint, rewritten on
  request (:mod:`devplug.engine.checkpointview`), attributes them to no pod
  either: that covers init containers (never listed) and the window right
  after a kubelet restart, when ``List`` answers successfully with no pods
  while pods run;
* without that evidence (no checkpoint, no stream to the kubelet), an answer
  of PodResources right after it (re)appeared (daemon start, an outage, a
  kubelet restart: its socket changed) releases nothing until ``grace_period``
  has passed since;
* a fresh allocation not yet visible (admission in progress) is left alone for
  ``grace_period`` seconds; an Allocate still in flight is never touched;
* when PodResources cannot be read (an outage, RESOURCE_EXHAUSTED), nothing
  is released, and the reconciler backs off;
* allocations released through the KEP's Deallocate, or by a new tenancy's
  Allocate, are gone from the ledger, so they are not released twice;
* a tenancy the kubelet no longer attributes is released only once its pod's
  containers are gone (:mod:`devplug.engine.tenantexit`): the kubelet forgets
  a removed static pod or a force-deleted one while its containers still run
  out their grace period. The pod's cgroup says when its last process exited
  (on cgroup v2 that wakes the release at once); where the cgroups cannot be
  read, the tenancy waits ``[liveness] unknown_grace`` seconds from the moment
  its pod vanished. Each tenancy's pod UID, which names its cgroup, is learnt
  from the kubelet's checkpoint while the pod runs, and kept in the ledger;
* a release that fails is retried with capped exponential backoff and jitter
  (from ``[release] interval`` up to ``max_retry_interval``), logged when it
  starts failing, when it is still failing after 10, 100, 1000... attempts, and
  when it recovers.

Its loop is supervised: an unexpected error is logged, shown in ``devplug
status`` and the loop is restarted; a failure in one resource's pass never
stops another resource's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from devplug.api.checkpoint import KubeletCheckpoint
from devplug.config import ReleaseConfig
from devplug.engine.asynctools import BackgroundTasks, Backoff, sliced, wait_any
from devplug.engine.checkpointview import CheckpointView, pods_holding
from devplug.engine.ledger import AllocationRecord
from devplug.engine.liveness import PodLiveness, PodState
from devplug.engine.podresources_client import DeviceUse, PodResourcesClient
from devplug.engine.resource import Resource
from devplug.engine.supervise import supervise
from devplug.engine.tenantexit import ExitEvidence
from devplug.errors import DriverError

#: A pass over a resource's records lets other work run (an Allocate) after this many: with 1,000 allocations
#: held, a pass in one go kept the event loop for 2-3 ms every second.
RECORDS_PER_SLICE = 100

__all__ = ["Reconciler"]

log = logging.getLogger("devplug.engine")

#: A failing release is logged again (without the driver's message, said once) after this many attempts, then
#: after ten times as many, and so on.
STILL_FAILING_FIRST = 10


@dataclass
class _Awaiting:
    """A tenancy the kubelet no longer attributes whose pod's containers may still run."""

    resource: str
    devices: tuple[str, ...]
    pod: str | None
    pod_uid: str | None
    since: float
    why: str
    cancel: Callable[[], None] | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "devices": list(self.devices),
            "pod": self.pod,
            "pod_uid": self.pod_uid,
            "since": self.since,
            "why": self.why,
        }


@dataclass
class _Retry:
    """When a failing release is tried again, and what was last said about it in the log."""

    backoff: Backoff
    due: float  # time.monotonic()
    message: str
    next_report: int = STILL_FAILING_FIRST


class Reconciler:
    """Keeps every resource's ledger in step with what the kubelet attributes."""

    def __init__(
        self,
        resources: Sequence[Resource],
        pod_resources_socket: Path,
        release: ReleaseConfig,
        checkpoint: CheckpointView,
        wake: asyncio.Event,
        exits: ExitEvidence,
    ) -> None:
        self.resources = list(resources)
        self.client = PodResourcesClient(pod_resources_socket)
        self.checkpoint = checkpoint
        self.exits = exits
        self.interval = release.interval
        self.grace = release.grace_period
        self.max_retry_interval = release.max_retry_interval
        #: Tenancies whose pod's containers may still run, by record ID.
        self._awaiting: dict[str, _Awaiting] = {}
        #: Failing releases' schedules, by record ID.
        self._retries: dict[str, _Retry] = {}
        self._wake = wake
        self._releasing: set[str] = set()
        self._tasks = BackgroundTasks()
        self.last_error: str | None = None
        self.last_success: float | None = None
        self.polls = 0
        #: PodResources reads that failed, and since when the reads fail without a break (None: they do not).
        self.failures = 0
        self.failing_since: float | None = None
        self._delay = self.interval
        #: Since when PodResources has answered without a break (None: it has not, or it just failed).
        self.trusted_from: float | None = None
        self._socket_id: tuple[int, int] | None = None
        #: Per resource, the last error of its pass (a bug or a bad record), for ``devplug status``.
        self.resource_errors: dict[str, str] = {}

    def wake(self) -> None:
        """Something was allocated: start polling (if idle)."""
        self._wake.set()

    def describe(self) -> dict[str, Any]:
        return {
            "interval": self.interval,
            "grace_period": self.grace,
            "polls": self.polls,
            "failures": self.failures,
            "failing_since": self.failing_since,
            "last_success": self.last_success,
            "last_error": self.last_error,
            "trusted_from": self.trusted_from,
            "checkpoint": str(self.checkpoint.path),
            "checkpoint_problem": self.checkpoint.last_problem,
            "resource_errors": dict(self.resource_errors),
            "max_retry_interval": self.max_retry_interval,
            "liveness": self.exits.liveness.describe(),
            "awaiting_exit": [a.describe() for a in self._awaiting.values()],
        }

    def _busy(self) -> bool:
        if self.last_success is None and not self._starting():
            return True  # one pass at start even with an empty ledger: a lost or rebuilt one adopts what pods hold
        return any(r.lifecycle is not None and any(True for _ in r.ledger) for r in self.resources)

    def _starting(self) -> bool:
        return any(r.lifecycle is None and not r.stopping for r in self.resources)

    async def run(self) -> None:
        """Poll while anything is allocated; sleep on an event while nothing is. Restarted if it fails."""
        try:
            await supervise("the release reconciler", self._loop, report=self._report, stopping=lambda: False)
        finally:
            await self.client.close()

    def _report(self, reason: str | None) -> None:
        self.last_error = reason

    async def _loop(self) -> None:
        while True:
            if not self._busy():
                self._wake.clear()
                if self._starting():
                    await wait_any(self._wake, timeout=self.interval)
                    continue
                await self._wake.wait()
                continue
            await self.reconcile_once()
            await asyncio.sleep(self._delay)

    def _pod_resources_socket_id(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.client.socket)
        except OSError:
            return None
        return (st.st_dev, st.st_ino)

    async def reconcile_once(self) -> bool:
        """One pass over every resource; returns False when PodResources could not be read."""
        self.polls += 1
        try:
            use = await self.client.list_device_use()
        except grpc.aio.AioRpcError as exc:
            self._failed(f"{exc.code().name}: {exc.details()}", exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED)
            return False
        now = time.time()
        socket_id = self._pod_resources_socket_id()
        if self.trusted_from is None or socket_id != self._socket_id:
            if self.trusted_from is not None:
                log.info("PodResources at %s was recreated (kubelet restart)", self.client.socket)
            self.trusted_from = now
        self._socket_id = socket_id
        if self.last_error is not None:
            log.info("PodResources readable again at %s", self.client.socket)
        self.last_error = None
        self.last_success = now
        self.failing_since = None
        self._delay = self.interval
        ready = [r for r in self.resources if r.lifecycle is not None and not r.stopping]
        await asyncio.gather(*(self._reconcile_guarded(r, use, now) for r in ready))
        self.forget_gone()
        return True

    def _failed(self, detail: str, exhausted: bool) -> None:
        self.failures += 1
        if self.failing_since is None:
            self.failing_since = time.time()
        if self.last_error is None:
            log.warning(
                "cannot read PodResources at %s (%s); releasing nothing until it answers",
                self.client.socket,
                detail,
            )
        self.last_error = detail
        self.trusted_from = None
        self._delay = min(self._delay * 2, self.interval * 10) if exhausted else self.interval

    async def _reconcile_guarded(self, resource: Resource, use: DeviceUse, now: float) -> None:
        try:
            await resource.apply_quarantine_request()
            await self._reconcile_resource(resource, use, now)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if self.resource_errors.get(resource.name) != reason:
                log.exception("[%s] release reconciliation failed; other resources go on", resource.name)
            self.resource_errors[resource.name] = reason
        else:
            self.resource_errors.pop(resource.name, None)

    async def _reconcile_resource(self, resource: Resource, use: DeviceUse, now: float) -> None:
        lifecycle = resource.lifecycle
        assert lifecycle is not None
        used = use.get(resource.name, {})
        in_use = used.keys()
        changed = False
        candidates: list[AllocationRecord] = []
        checkpoint: list[KubeletCheckpoint | None] = []  # read once per pass, when a record lacks its pod's UID
        async for record in sliced(resource.ledger, RECORDS_PER_SLICE):  # the ledger iterates over a copy
            if resource.ledger.records.get(record.id) is not record:
                continue  # released or replaced while the pass let other work run
            if record.id in self._releasing or record.id in lifecycle.allocating:
                continue
            if record.kep_at is not None and now - record.kep_at < self.grace:
                continue  # the kubelet is releasing it through the KEP's calls
            if record.releasing:
                self._retry_release(resource, record)
                continue
            if record.pod_uid is None:  # the pod's UID names its cgroup: learnt as soon as the checkpoint has it
                changed |= self._learn_uid(resource, record, checkpoint)
            devices = record.all_devices()
            pods = {p for d in devices for p in used.get(d, ())} if not in_use.isdisjoint(devices) else None
            if pods:
                self._stop_awaiting(record.id)
                if record.pending:  # the kubelet got the answer, though its confirm was lost (a power loss)
                    resource.ledger.settle_pending(record)
                    changed = True
                pod = sorted(pods)[0]
                if record.pod != pod or record.seen_at is None:
                    record.pod = pod
                    changed = True
                record.seen_at = now
                continue
            if record.seen_at is None and now - record.created < self.grace:
                continue  # admission in progress: not listed yet (and a pending record may yet be listed)
            if record.pending:
                self._start_release(resource, record, "an Allocate that never completed")
                continue
            candidates.append(record)
        if candidates:
            changed |= await self._release_unattributed(resource, candidates, now)
        if self._adopt(resource, used, now):
            changed = True
        if changed:
            self._tasks.spawn(resource.ledger.save())

    def _learn_uid(
        self, resource: Resource, record: AllocationRecord, checkpoint: list[KubeletCheckpoint | None]
    ) -> bool:
        """Take the UID of the pod holding ``record``'s devices from the kubelet's checkpoint (as the file is now):
        it names the pod's cgroup, the evidence that its containers are gone. True when learnt."""
        if not checkpoint:
            checkpoint.append(self.checkpoint.current())
        if checkpoint[0] is None:
            return False
        uids = pods_holding(checkpoint[0], resource.name, record.all_devices())
        if len(uids) != 1:
            return False
        record.pod_uid = next(iter(uids))
        return True

    async def _release_unattributed(self, resource: Resource, records: list[AllocationRecord], now: float) -> bool:
        """Release those of ``records`` (not listed by PodResources) the kubelet attributes to no pod either, once
        their pods' containers are gone."""
        evidence = await self.checkpoint.fresh(resource.table.resend)
        changed = False
        for record in records:
            if evidence is not None:
                uids = pods_holding(evidence, resource.name, record.all_devices())
                if uids:
                    self._stop_awaiting(record.id)
                    if record.pod_uid is None and len(uids) == 1:
                        record.pod_uid = next(iter(uids))
                        changed = True
                    continue  # an init container's devices, or the kubelet has not reloaded its pods yet
                why = "the kubelet attributes them to no container any more"
            else:
                assert self.trusted_from is not None
                if now - self.trusted_from < self.grace:
                    continue  # PodResources just (re)appeared: its pod list may not be loaded yet
                why = f"PodResources has not listed them for {self.grace:g} s"
            if record.seen_at is not None:
                reason = f"pod {record.pod} no longer holds them"
            elif record.adopted is not None:
                reason = f"adopted from {record.adopted}, and no pod holds them"
            else:
                reason = f"no pod took them within the {self.grace:g} s grace period"
            log.debug("[%s] %s: %s", resource.name, ", ".join(record.all_devices()), why)
            self._release_when_exited(resource, record, reason, now)
        return changed

    def _release_when_exited(self, resource: Resource, record: AllocationRecord, reason: str, now: float) -> None:
        """Release ``record`` now if its pod's containers are gone; else wait for them (woken by the pod's cgroup
        on v2, looked at every pass otherwise)."""
        verdict = self.exits.verdict(record, now)
        if verdict.exited:
            self._stop_awaiting(record.id)
            self._start_release(resource, record, reason, verdict.why)
            return
        waiting = self._awaiting.get(record.id)
        if waiting is not None:
            waiting.why = verdict.why
            return
        devices = tuple(record.all_devices())
        log.warning(
            "[%s] %s: the kubelet no longer attributes them, but pod %s may still run (%s): released once its "
            "containers are gone",
            resource.name,
            ", ".join(devices),
            record.pod or record.pod_uid or "(unknown)",
            verdict.why,
            extra={"device": ", ".join(devices)},
        )
        waiting = _Awaiting(resource.name, devices, record.pod, record.pod_uid, now, verdict.why)
        self._awaiting[record.id] = waiting
        if verdict.liveness.state is PodState.RUNNING and record.pod_uid is not None:
            waiting.cancel = self.exits.liveness.on_exit(
                record.pod_uid, lambda answer: self._exited(resource, record, reason, answer)
            )

    def _exited(self, resource: Resource, record: AllocationRecord, reason: str, answer: PodLiveness) -> None:
        """The pod's cgroup says its last process is gone: release at once (unless something else did)."""
        waiting = self._awaiting.pop(record.id, None)
        if waiting is None or resource.ledger.records.get(record.id) is not record or record.releasing:
            return
        if record.id in self._releasing or resource.stopping:
            return
        verdict = self.exits.verdict(record)
        if verdict.exited:
            self._start_release(resource, record, reason, verdict.why)
        else:  # unknown after all: the next pass decides, with the grace
            log.debug("[%s] pod %s: %s", resource.name, record.pod_uid, answer.detail)

    def _stop_awaiting(self, record_id: str) -> None:
        waiting = self._awaiting.pop(record_id, None)
        self.exits.forget(record_id)
        if waiting is not None and waiting.cancel is not None:
            waiting.cancel()

    def _retry_release(self, resource: Resource, record: AllocationRecord) -> None:
        """A record left releasing: finish it (interrupted by a restart) or retry it once its backoff is over."""
        assert resource.lifecycle is not None
        failure = resource.lifecycle.release_failures.get(record.id)
        if failure is None:
            self._start_release(resource, record, "finishing an interrupted release")
            return
        retry = self._retries.get(record.id)
        if retry is not None and time.monotonic() < retry.due:
            return
        self._start_release(resource, record, f"retrying a failed release (attempt {failure.attempts + 1})")

    def _adopt(self, resource: Resource, used: dict[str, set[str]], now: float) -> bool:
        """Take into the ledger devices pods hold that it does not know (a lost or rebuilt ledger).

        Without this, such devices would never be released through the driver.
        """
        held = resource.ledger.held_devices()
        orphans: dict[str, list[str]] = {}
        for dev_id, pods in used.items():
            if dev_id not in held:
                orphans.setdefault(sorted(pods)[0], []).append(dev_id)
        for pod, devices in orphans.items():
            record = resource.ledger.adopt(devices, now, "PodResources", pod=pod)
            if record is None:
                continue
            log.warning(
                "[%s] adopted %s held by pod %s but missing from the ledger",
                resource.name,
                ", ".join(record.devices),
                pod,
                extra={"device": ", ".join(record.devices)},
            )
        return bool(orphans)

    def awaiting_exit(self) -> int:
        """How many tenancies wait for their pod's containers to exit."""
        return len(self._awaiting)

    def releasing_in(self, resource: Resource) -> bool:
        """Whether a release of one of ``resource``'s allocations is running (a reload waits for it)."""
        return any(record.id in self._releasing for record in resource.ledger)

    def forget_gone(self) -> None:
        """Drop what is kept about records no longer in any ledger (released, or their resource removed)."""
        alive = {r.id for resource in self.resources for r in resource.ledger}
        for record_id in [i for i in self._awaiting if i not in alive]:
            self._stop_awaiting(record_id)
        for record_id in [i for i in self._retries if i not in alive]:
            del self._retries[record_id]

    def _start_release(
        self, resource: Resource, record: AllocationRecord, reason: str, evidence: str | None = None
    ) -> None:
        if resource.stopping:  # a reload is replacing it: the new instance finds the record in the ledger
            return
        self._releasing.add(record.id)
        self._tasks.spawn(self._release(resource, record, reason, evidence))

    async def _release(
        self, resource: Resource, record: AllocationRecord, reason: str, evidence: str | None = None
    ) -> None:
        lifecycle = resource.lifecycle
        assert lifecycle is not None
        try:
            await lifecycle.release(record, reason, evidence)
        except DriverError as exc:
            self._release_failed(resource, record, exc)
        except Exception:
            log.exception("[%s] release of %s failed unexpectedly, will retry", resource.name, record.id)
        else:
            retry = self._retries.pop(record.id, None)
            if retry is not None:
                log.info("[%s] release of %s recovered", resource.name, ", ".join(record.all_devices()))
        finally:
            self._releasing.discard(record.id)

    def _release_failed(self, resource: Resource, record: AllocationRecord, exc: DriverError) -> None:
        """A release failed: schedule its retry (capped exponential backoff with jitter) and log a change of
        state only: the first failure (with the driver's message), a new message, every tenfold attempts."""
        assert resource.lifecycle is not None
        failure = resource.lifecycle.release_failures.get(record.id)
        attempts = failure.attempts if failure is not None else 1
        message = exc.reason or str(exc)
        devices = ", ".join(record.all_devices())
        retry = self._retries.get(record.id)
        if retry is None:
            retry = self._retries[record.id] = _Retry(
                Backoff(initial=self.interval, cap=max(self.interval, self.max_retry_interval), jitter=0.5), 0.0, ""
            )
        delay = retry.backoff.next()
        retry.due = time.monotonic() + delay
        hook = f"{exc.hook}: " if exc.hook else ""
        if message != retry.message:
            log.error(
                "[%s] release of %s failed (attempt %d): %s%s; retrying with backoff, at most every %g s",
                resource.name,
                devices,
                attempts,
                hook,
                message,
                self.max_retry_interval,
                extra={"device": devices},
            )
            retry.message = message
        elif attempts >= retry.next_report:
            log.warning(
                "[%s] release of %s still failing after %d attempts (next in %.1f s)",
                resource.name,
                devices,
                attempts,
                delay,
                extra={"device": devices},
            )
            retry.next_report *= 10
