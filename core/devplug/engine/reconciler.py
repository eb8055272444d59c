"""Release detection on kubelets that never call Deallocate.

The reconciler compares each resource's ledger with the kubelet's
PodResources List, every ``[release] interval`` seconds while anything is
allocated (it does not poll at all while nothing is). An allocation whose
devices no listed pod uses any more is released through the driver
(post-stop, then deallocate), once. It is careful not to release by mistake:

* a fresh allocation not yet visible in PodResources (admission in progress)
  is left alone for ``grace_period`` seconds;
* an Allocate still in flight is never touched;
* when PodResources cannot be read (an outage, RESOURCE_EXHAUSTED), nothing
  is released, and the reconciler backs off;
* allocations released through the KEP's Deallocate are gone from the ledger,
  so they are not released twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Sequence
from typing import Any

import grpc
import grpc.aio

from devplug.config import ReleaseConfig
from devplug.engine.ledger import AllocationRecord, new_record_id
from devplug.engine.podresources import DeviceUse, PodResourcesClient
from devplug.engine.resource import Resource, wait_any
from devplug.errors import DriverError

__all__ = ["Reconciler"]

log = logging.getLogger("devplug.engine")


class Reconciler:
    """Keeps every resource's ledger in step with PodResources."""

    def __init__(self, resources: Sequence[Resource], pod_resources_socket: Any, release: ReleaseConfig) -> None:
        self.resources = list(resources)
        self.client = PodResourcesClient(pod_resources_socket)
        self.interval = release.interval
        self.grace = release.grace_period
        self._wake = asyncio.Event()
        self._releasing: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.last_error: str | None = None
        self.last_success: float | None = None
        self.polls = 0
        self._delay = self.interval
        for resource in self.resources:
            resource.on_allocated = self.wake
            resource.stale_check = self.stale_records

    def wake(self) -> None:
        """Something was allocated: start polling (if idle)."""
        self._wake.set()

    def describe(self) -> dict[str, Any]:
        return {
            "interval": self.interval,
            "grace_period": self.grace,
            "polls": self.polls,
            "last_success": self.last_success,
            "last_error": self.last_error,
        }

    def _busy(self) -> bool:
        if self.last_success is None and not self._starting():
            return True  # one pass at start even with an empty ledger: a lost or rebuilt one adopts what pods hold
        return any(r.lifecycle is not None and any(True for _ in r.ledger) for r in self.resources)

    def _starting(self) -> bool:
        return any(r.lifecycle is None and not r.stopping for r in self.resources)

    async def run(self) -> None:
        """Poll while anything is allocated; sleep on an event while nothing is."""
        try:
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
        finally:
            await self.client.close()

    async def reconcile_once(self) -> bool:
        """One pass over every resource; returns False when PodResources could not be read."""
        self.polls += 1
        try:
            use = await self.client.list_device_use()
        except grpc.aio.AioRpcError as exc:
            self._failed(f"{exc.code().name}: {exc.details()}", exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED)
            return False
        if self.last_error is not None:
            log.info("PodResources readable again at %s", self.client.socket)
        self.last_error = None
        self.last_success = time.time()
        self._delay = self.interval
        for resource in self.resources:
            if resource.lifecycle is not None and not resource.stopping:
                self._reconcile_resource(resource, use, time.time())
        return True

    def _failed(self, detail: str, exhausted: bool) -> None:
        if self.last_error is None:
            log.warning(
                "cannot read PodResources at %s (%s); releasing nothing until it answers",
                self.client.socket,
                detail,
            )
        self.last_error = detail
        self._delay = min(self._delay * 2, self.interval * 10) if exhausted else self.interval

    def _reconcile_resource(self, resource: Resource, use: DeviceUse, now: float) -> None:
        assert resource.lifecycle is not None
        used = use.get(resource.name, {})
        changed = False
        for record in resource.ledger:
            if record.id in self._releasing or record.id in resource.lifecycle.allocating:
                continue
            if record.kep_at is not None and now - record.kep_at < self.grace:
                continue  # the kubelet is releasing it through the KEP's calls
            if record.releasing:
                self._start_release(resource, record, "finishing an interrupted release")
                continue
            pods = {p for d in record.all_devices() for p in used.get(d, ())}
            if pods:
                pod = sorted(pods)[0]
                if record.pod != pod or record.seen_at is None:
                    record.pod = pod
                    changed = True
                record.seen_at = now
                continue
            if record.seen_at is None and now - record.created < self.grace and not record.pending:
                continue  # admission in progress: not listed yet
            if record.seen_at is not None:
                reason = f"pod {record.pod} no longer holds them"
            elif record.pending:
                reason = "an Allocate that never completed"
            else:
                reason = f"no pod took them within the {self.grace:g} s grace period"
            self._start_release(resource, record, reason)
        if self._adopt(resource, used, now):
            changed = True
        if changed:
            self._spawn(resource.save_ledger())

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
            record = AllocationRecord(id=new_record_id(), devices=sorted(devices), created=now, pod=pod, seen_at=now)
            resource.ledger.records[record.id] = record
            log.warning(
                "[%s] adopted %s held by pod %s but missing from the ledger",
                resource.name,
                ", ".join(record.devices),
                pod,
                extra={"device": ", ".join(record.devices)},
            )
        return bool(orphans)

    def _start_release(self, resource: Resource, record: AllocationRecord, reason: str) -> None:
        self._releasing.add(record.id)
        self._spawn(self._release(resource, record, reason))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _release(self, resource: Resource, record: AllocationRecord, reason: str) -> None:
        assert resource.lifecycle is not None
        try:
            await resource.lifecycle.release(record, reason)
        except DriverError as exc:
            log.error(
                "[%s] release of %s failed, will retry: %s",
                resource.name,
                ", ".join(record.all_devices()),
                exc,
            )
            resource.note_hook_failure(exc)
        finally:
            self._releasing.discard(record.id)

    async def stale_records(self, resource: Resource, records: Sequence[AllocationRecord]) -> list[AllocationRecord]:
        """Of ``records`` (held devices the kubelet asks to allocate again), those whose pod is gone.

        The kubelet may hand a device to a new pod before the reconciler noticed
        the old pod ended; those allocations must be released first. A record
        never seen in PodResources, or a pod still listed, is a reuse by the
        same pod (init containers' devices); an unreadable PodResources counts
        as reuse too.
        """
        stale = []
        for record in records:
            if record.pod is None or record.releasing:
                continue
            try:
                exists = await self.client.pod_exists(record.pod)
            except grpc.aio.AioRpcError as exc:
                log.warning(
                    "[%s] cannot check pod %s (%s); treating as reuse",
                    resource.name,
                    record.pod,
                    exc.code().name,
                )
                continue
            if not exists:
                stale.append(record)
        return stale
