"""Whether an Allocate of held devices reuses their tenancy, judged from what the kubelet shows.

The kubelet hands a finished or rejected pod's devices to the next pod at once,
and its Allocate names no pod. So when an Allocate asks for a device the ledger
still holds, the earlier allocation is either reused by a later container of
the same pod (the kubelet gives an init container's devices to the pod's next
containers, with nothing released in between; Kubernetes v1.32
``pkg/kubelet/cm/devicemanager/manager.go`` Allocate and devicesToAllocate) or
it is a new tenancy. The evidence:

* an allocation whose devices PodResources ever listed is never reused: the
  kubelet reuses only the devices of non-restartable init containers, and
  PodResources lists only app and sidecar containers;
* otherwise the kubelet is asked: a ListAndWatch message makes it rewrite its
  checkpoint with the devices it attributes now (:mod:`.checkpointview`).
  Before this Allocate the kubelet already dropped inactive pods
  (``UpdateAllocatedDevices``), so if it still attributes the devices to the
  allocation's pod, that pod is the one being admitted: a reuse. If it does
  not, the pod finished, was rejected or deleted;
* with no evidence at all (no checkpoint, no stream), it is treated as a new
  tenancy: the devices are cleaned first. That never cleans a device under a
  running container (the kubelet allocates only devices no active pod holds,
  or, for reuse, before any container of the pod started); its cost is one
  extra release between an init container and its pod's app container.

Before any of that, an allocation whose pod's UID is not known yet learns it
from the checkpoint as the file stands (the kubelet prunes ended pods in
memory before the Allocate, but the file names them until its next write),
and from every rewrite of it as it happens (:mod:`.sightings`).

A new tenancy whose previous tenant may still run is judged by
:meth:`CheckpointTenancy.tenant_end` (see :class:`~devplug.engine.admission.TenantEnd`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from devplug.api.checkpoint import KubeletCheckpoint
from devplug.engine import AllocationRecord, BackgroundTasks, DeviceLifecycle, TenantEnd
from devplug.frontends.deviceplugin.checkpointview import CheckpointView, pods_holding
from devplug.frontends.deviceplugin.sightings import KubeletSightings

__all__ = ["COARSE_CLOCK_S", "CheckpointTenancy"]

#: A file's mtime comes from the kernel's coarse clock, up to a tick (4 ms at HZ=250, 10 ms at HZ=100) behind the
#: clock the ledger's times come from: checkpoint versions are compared with an allocation's times with this
#: margin, so that neither a version written before it counts as after it nor the other way round.
COARSE_CLOCK_S = 0.05


class CheckpointTenancy:
    """The device-plugin front end's :class:`~devplug.engine.admission.TenancyJudge`."""

    def __init__(
        self,
        resource_name: str,
        checkpoint: CheckpointView,
        resend: Callable[[], bool],
        lifecycle: DeviceLifecycle,
        sightings: KubeletSightings,
    ) -> None:
        self.resource_name = resource_name
        self.checkpoint = checkpoint
        #: Sends a ListAndWatch message (the kubelet rewrites its checkpoint); False when no stream is open.
        self._resend = resend
        self.lifecycle = lifecycle
        self.sightings = sightings
        #: Records some version of the checkpoint written after their allocation attributed to a pod (in memory;
        #: only ever used with :attr:`KubeletSightings.continuous_since`, which a restart resets).
        self._named: set[str] = set()
        #: Device ID -> the UID of the pod of its last tenancy found over: a version of the checkpoint written
        #: just before the next allocation may still name that pod, which must not be taken for the new one's.
        self._previous: dict[str, str] = {}
        self._tasks = BackgroundTasks()
        checkpoint.listeners.append(self._written)

    def close(self) -> None:
        """The front end stops: hear no more rewrites."""
        if self._written in self.checkpoint.listeners:
            self.checkpoint.listeners.remove(self._written)

    # --- learning from the checkpoint

    def _written(self, checkpoint: KubeletCheckpoint | None, mtime: float) -> None:
        """A version of the checkpoint was read: the records it names learn their pod's UID.

        Only records not named yet are looked at (in steady state, the few allocated since the last rewrite),
        through one device -> pods index of the version: the kubelet rewrites the file at every ListAndWatch
        message of any plugin, with every held device in it.
        """
        if checkpoint is None:
            return
        records = list(self.lifecycle.records())
        pending = [
            r
            for r in records
            if r.id not in self._named and r.claim_uid is None and mtime >= r.created - COARSE_CLOCK_S
        ]
        if len(self._named) > len(records):
            self._named.intersection_update(r.id for r in records)  # released records are forgotten
        if not pending:
            return
        holders: dict[str, set[str]] = {}
        for entry in checkpoint.entries_for(self.resource_name):
            for device in entry.device_ids:
                holders.setdefault(device, set()).add(entry.pod_uid)
        learnt = False
        for record in pending:
            devices = record.all_devices()
            uids = {uid for d in devices for uid in holders.get(d, ())}
            uids.difference_update(self._previous.get(d) for d in devices)
            if not uids:
                continue
            self._named.add(record.id)
            if record.pod_uid is None and len(uids) == 1:
                self.lifecycle.note_pod_uid(record.id, next(iter(uids)))
                learnt = True
        if learnt:
            self._tasks.spawn(self.lifecycle.save())

    # --- the judge

    async def reuses(self, record: AllocationRecord) -> tuple[bool, str]:
        """Is an Allocate of ``record``'s devices a reuse by its own pod? Returns (reuse, why)."""
        reuse, why = await self._reuses(record)
        if not reuse:
            current = self.lifecycle.record(record.id) or record
            if current.pod_uid is not None:
                self._previous.update(dict.fromkeys(current.all_devices(), current.pod_uid))
        return reuse, why

    async def _reuses(self, record: AllocationRecord) -> tuple[bool, str]:
        if record.pod_uid is None:
            self.checkpoint.current()  # the file as it stands: it still names an ended pod until the next write
            record = self.lifecycle.record(record.id) or record
        if record.seen_at is not None:
            return False, (
                f"pod {record.pod} ran with them (PodResources listed them) and the kubelet allocates them again: "
                "a new tenancy, so the previous one is released first"
            )
        checkpoint = await self.checkpoint.fresh(self._resend)
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
        record = self.lifecycle.record(record.id) or record
        if record.pod_uid is not None and record.pod_uid not in uids:
            return False, (
                f"the kubelet attributes them to pod {', '.join(sorted(uids))}, not to pod {record.pod_uid} "
                "that got them: the previous allocation is released first"
            )
        if record.pod_uid is None and len(uids) == 1:
            self.lifecycle.note_pod_uid(record.id, next(iter(uids)))
        return (
            True,
            f"reused by a later container of pod {', '.join(sorted(uids))} (the kubelet's init-container reuse)",
        )

    async def tenant_end(self, record: AllocationRecord) -> tuple[TenantEnd, str]:
        """How the previous tenancy of devices an Allocate asks for is ending (the kubelet no longer attributes
        them, and their pod's containers are not known gone)."""
        never = await self._never_started(record)
        if never is not None:
            return TenantEnd.NEVER_STARTED, never
        record = self.lifecycle.record(record.id) or record
        who = record.pod or record.pod_uid or "that had them"
        if record.pod_uid is None:
            return TenantEnd.UNKNOWN, f"the UID of pod {who} was never learnt, so its cgroup cannot be watched"
        if self.sightings.in_pod_manager_this_run(record.id, record.created):
            return TenantEnd.UNDER_WAY, (
                f"the kubelet held pod {who} during its current run and forgot it: its pod worker is stopping it"
            )
        return TenantEnd.UNKNOWN, (
            f"the kubelet has not held pod {who} since it restarted: an orphan its housekeeping stops, in the loop "
            "that waits for this Allocate"
        )

    async def _never_started(self, record: AllocationRecord) -> str | None:
        """Why no container ever had ``record``'s devices, or None when that is not known."""
        if record.adopted is not None or record.allocated_at is None:
            return None  # PodResources listing it is no evidence either way: it lists a pod during its admission
        reached = self.lifecycle.reached_container(record)
        if reached is False:
            return "the kubelet called no PreStartContainer for them, which it does before a container gets them"
        if reached is True or record.pod_uid is not None or record.id in self._named:
            return None
        since = self.sightings.continuous_since
        if since is None or since > record.created:
            return None  # a rewrite may have been missed: no evidence
        after = record.allocated_at + COARSE_CLOCK_S
        if self.sightings.last_write <= after:  # no rewrite read is surely later than the allocation: ask for one
            await asyncio.sleep(min(COARSE_CLOCK_S, max(0.0, after - time.time())))
            await self.checkpoint.fresh(self._resend)
        if not self.sightings.read_after(after) or record.id in self._named:
            return None
        return (
            "the kubelet wrote its checkpoint after allocating them and never named them: it rejected their pod at "
            "admission, before any container"
        )
