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
"""

from __future__ import annotations

from collections.abc import Callable

from devplug.engine.ledger import AllocationRecord
from devplug.frontends.deviceplugin.checkpointview import CheckpointView, pods_holding

__all__ = ["CheckpointTenancy"]


class CheckpointTenancy:
    """The device-plugin front end's :class:`~devplug.engine.admission.TenancyJudge`."""

    def __init__(
        self,
        resource_name: str,
        checkpoint: CheckpointView,
        resend: Callable[[], bool],
        note_pod_uid: Callable[[str, str], object],
    ) -> None:
        self.resource_name = resource_name
        self.checkpoint = checkpoint
        #: Sends a ListAndWatch message (the kubelet rewrites its checkpoint); False when no stream is open.
        self._resend = resend
        self._note_pod_uid = note_pod_uid

    async def reuses(self, record: AllocationRecord) -> tuple[bool, str]:
        """Is an Allocate of ``record``'s devices a reuse by its own pod? Returns (reuse, why)."""
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
        if record.pod_uid is not None and record.pod_uid not in uids:
            return False, (
                f"the kubelet attributes them to pod {', '.join(sorted(uids))}, not to pod {record.pod_uid} "
                "that got them: the previous allocation is released first"
            )
        if record.pod_uid is None and len(uids) == 1:
            self._note_pod_uid(record.id, next(iter(uids)))
        return (
            True,
            f"reused by a later container of pod {', '.join(sorted(uids))} (the kubelet's init-container reuse)",
        )
