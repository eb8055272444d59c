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
  request (:mod:`devplug.frontends.deviceplugin.checkpointview`), attributes them to no pod
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
* a tenancy the kubelet no longer attributes is handed to the resource's
  release queue (:mod:`devplug.engine.releasequeue`), which releases it only
  once its pod's containers are gone and retries a failing release with
  backoff. Each tenancy's pod UID, which names its cgroup, is learnt from the
  kubelet's checkpoint while the pod runs, and kept in the ledger.

Its loop is supervised: an unexpected error is logged, shown in ``devplug
status`` and the loop is restarted; a failure in one resource's pass never
stops another resource's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from devplug.api.checkpoint import KubeletCheckpoint
from devplug.backoff import CappedBackoff
from devplug.config import ReleaseConfig
from devplug.engine import (
    AllocationRecord,
    BackgroundTasks,
    DeviceLifecycle,
    ExitEvidence,
    ReleaseQueue,
    Resource,
    RunningResource,
    sliced,
    supervise,
    wait_any,
)
from devplug.frontends.deviceplugin.checkpointview import CheckpointView, pods_holding
from devplug.frontends.deviceplugin.podresources_client import DeviceUse, PodResourcesClient
from devplug.frontends.deviceplugin.sightings import KubeletSightings

#: A pass over a resource's records lets other work run (an Allocate) after this many: with 1,000 allocations
#: held, a pass in one go kept the event loop for 2-3 ms every second.
RECORDS_PER_SLICE = 100

__all__ = ["Reconciler"]

log = logging.getLogger("devplug.engine")


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
        sightings: KubeletSightings,
    ) -> None:
        self._resources = list(resources)
        #: Told which allocations PodResources lists (their pods are in the kubelet's pod manager this run).
        self.sightings = sightings
        self.client = PodResourcesClient(pod_resources_socket)
        self.checkpoint = checkpoint
        self.exits = exits
        self._interval = release.interval
        self._grace = release.grace_period
        self._max_retry_interval = release.max_retry_interval
        self._wake = wake
        self._tasks = BackgroundTasks()
        self.last_error: str | None = None
        self.last_success: float | None = None
        self.polls = 0
        #: PodResources reads that failed, and since when the reads fail without a break (None: they do not).
        self.failures = 0
        self.failing_since: float | None = None
        self._delay = self._interval
        #: PodResources reads refused as exhausted in a row (each one doubles the wait: :meth:`_failed`).
        self._exhausted_in_a_row = 0
        #: Since when PodResources has answered without a break (None: it has not, or it just failed).
        self.trusted_from: float | None = None
        self._socket_id: tuple[int, int] | None = None
        #: Per resource, the last error of its pass (a bug or a bad record), for ``devplug status``.
        self.resource_errors: dict[str, str] = {}

    # --- settings and resources (a reload changes them)

    def configure(self, release: ReleaseConfig) -> None:
        """``[release]`` changed: the poll interval and grace period apply from the next pass."""
        self._interval = release.interval
        self._grace = release.grace_period
        self._max_retry_interval = release.max_retry_interval

    def add(self, resource: Resource) -> None:
        """Reconcile ``resource`` too (added, or replacing one, by a reload)."""
        self._resources.append(resource)

    def remove(self, resource: Resource) -> None:
        """Stop reconciling ``resource`` (removed or replaced by a reload)."""
        if resource in self._resources:
            self._resources.remove(resource)
        self.resource_errors.pop(resource.name, None)

    def wake(self) -> None:
        """Something was allocated: start polling (if idle)."""
        self._wake.set()

    def describe(self) -> dict[str, Any]:
        return {
            "interval": self._interval,
            "grace_period": self._grace,
            "polls": self.polls,
            "failures": self.failures,
            "failing_since": self.failing_since,
            "last_success": self.last_success,
            "last_error": self.last_error,
            "trusted_from": self.trusted_from,
            "checkpoint": str(self.checkpoint.path),
            "checkpoint_problem": self.checkpoint.last_problem,
            "resource_errors": dict(self.resource_errors),
            "max_retry_interval": self._max_retry_interval,
            "liveness": self.exits.liveness.describe(),
            "awaiting_exit": [a.describe() for q in self._queues() for a in q.awaiting()],
        }

    def _running(self) -> list[tuple[Resource, RunningResource]]:
        """The resources whose driver started, with what runs them."""
        return [(r, running) for r in self._resources if (running := r.running) is not None]

    def _queues(self) -> list[ReleaseQueue]:
        return [running.releases for _, running in self._running()]

    def awaiting_exit(self) -> int:
        """How many tenancies wait for their pod's containers to exit."""
        return sum(len(q.awaiting()) for q in self._queues())

    def _busy(self) -> bool:
        if not self._resources:
            return False  # every resource is served through DRA (or none is left): PodResources has nothing for us
        if self.last_success is None and not self._starting():
            return True  # one pass at start even with an empty ledger: a lost or rebuilt one adopts what pods hold
        return any(r.holds_any() for r, _ in self._running())

    def _starting(self) -> bool:
        return any(r.running is None and not r.stopping for r in self._resources)

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
                    await wait_any(self._wake, timeout=self._interval)
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
        self._delay = self._interval
        self._exhausted_in_a_row = 0
        ready = [(r, running) for r, running in self._running() if not r.stopping]
        await asyncio.gather(*(self._reconcile_guarded(r, use, now) for r, _ in ready))
        for queue in self._queues():
            queue.forget_gone()
        self.sightings.forget({r.id for _, running in ready for r in running.lifecycle.records()})
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
        # A kubelet refusing for load (RESOURCE_EXHAUSTED) is asked less and less often: 2, 4, 8, then 10 intervals
        # apart, on devplug's one backoff; any other failure is retried at the interval.
        self._exhausted_in_a_row = self._exhausted_in_a_row + 1 if exhausted else 0
        self._delay = (
            CappedBackoff(2 * self._interval, 10 * self._interval).delay(self._exhausted_in_a_row)
            if exhausted
            else self._interval
        )

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
        running = resource.running
        if running is None:
            return
        core, queue = running.lifecycle, running.releases
        used = use.get(resource.name, {})
        in_use = used.keys()
        changed = False
        candidates: list[AllocationRecord] = []
        listed_ids: list[str] = []
        checkpoint: list[KubeletCheckpoint | None] = []  # read once per pass, when a record lacks its pod's UID
        async for listed in sliced(list(core.records()), RECORDS_PER_SLICE):
            record = core.record(listed.id)
            if record is None:
                continue  # released or joined while the pass let other work run
            if queue.running(record.id) or core.in_admission(record.id):
                continue
            if record.kep_at is not None and now - record.kep_at < self._grace:
                continue  # the kubelet is releasing it through the KEP's calls
            if record.releasing:
                queue.retry(record)
                continue
            if record.pod_uid is None:  # the pod's UID names its cgroup: learnt as soon as the checkpoint has it
                changed |= self._learn_uid(core, record, checkpoint)
            devices = record.all_devices()
            pods = {p for d in devices for p in used.get(d, ())} if not in_use.isdisjoint(devices) else None
            if pods:
                listed_ids.append(record.id)
                queue.stop_awaiting(record.id)
                seen = core.note_seen(record.id, sorted(pods)[0], now)
                changed |= seen is not record
                continue
            if record.seen_at is None and record.pod_uid is None and now - record.created < self._grace:
                continue  # admission in progress: not listed yet (and a pending record may yet be listed); a UID
                # learnt means the kubelet checkpointed the allocation, which it does once the admission is done
            if record.pending:
                queue.start(record, "an Allocate that never completed")
                continue
            candidates.append(record)
        self.sightings.listed(listed_ids)
        if candidates:
            changed |= await self._release_unattributed(resource, core, queue, candidates, now)
        if self._adopt(resource, core, used, now):
            changed = True
        if changed:
            self._tasks.spawn(core.save())

    def _learn_uid(
        self, core: DeviceLifecycle, record: AllocationRecord, checkpoint: list[KubeletCheckpoint | None]
    ) -> bool:
        """Read the kubelet's checkpoint as the file is now (once a pass): a version not read yet teaches the records
        it names their pod's UID, through the front ends' listeners (:class:`~.tenancy.CheckpointTenancy`, which
        never learns from a version older than the record). True when ``record`` learnt its UID."""
        if not checkpoint:
            checkpoint.append(self.checkpoint.current())
        learnt = core.record(record.id)
        return learnt is not None and learnt.pod_uid is not None

    async def _release_unattributed(
        self,
        resource: Resource,
        core: DeviceLifecycle,
        queue: ReleaseQueue,
        records: list[AllocationRecord],
        now: float,
    ) -> bool:
        """Release those of ``records`` (not listed by PodResources) the kubelet attributes to no pod either, once
        their pods' containers are gone."""
        evidence = await self.checkpoint.fresh(resource.resend)
        changed = False
        for listed in records:
            record = core.record(listed.id)
            if record is None or record.releasing or queue.running(record.id):
                continue  # released, or being released, while the checkpoint was read
            if evidence is not None:
                uids = pods_holding(evidence, resource.name, record.all_devices())
                if uids:
                    queue.stop_awaiting(record.id)
                    if record.pod_uid is None and len(uids) == 1:
                        core.note_pod_uid(record.id, next(iter(uids)))
                        changed = True
                    continue  # an init container's devices, or the kubelet has not reloaded its pods yet
                why = "the kubelet attributes them to no container any more"
            else:
                if self.trusted_from is None or now - self.trusted_from < self._grace:
                    continue  # PodResources just (re)appeared: its pod list may not be loaded yet
                why = f"PodResources has not listed them for {self._grace:g} s"
            if record.seen_at is not None:
                reason = f"pod {record.pod} no longer holds them"
            elif record.adopted is not None:
                reason = f"adopted from {record.adopted}, and no pod holds them"
            else:
                reason = f"no pod took them within the {self._grace:g} s grace period"
            log.debug("[%s] %s: %s", resource.name, ", ".join(record.all_devices()), why)
            queue.release_when_exited(record, reason, now)
        return changed

    def _adopt(self, resource: Resource, core: DeviceLifecycle, used: dict[str, set[str]], now: float) -> bool:
        """Take into the ledger devices pods hold that it does not know (a lost or rebuilt ledger).

        Without this, such devices would never be released through the driver.
        """
        held = core.held_devices()
        orphans: dict[str, list[str]] = {}
        for dev_id, pods in used.items():
            if dev_id not in held:
                orphans.setdefault(sorted(pods)[0], []).append(dev_id)
        for pod, devices in orphans.items():
            record = core.adopt(devices, now, "PodResources", pod=pod)
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
