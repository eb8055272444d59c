"""Whether a tenancy's containers are gone: the second half of the release evidence.

The kubelet no longer attributing a tenancy's devices (PodResources, its
checkpoint) is not enough to clean them: a static pod removed from its folder,
or a pod deleted with ``--grace-period=0 --force``, leaves the kubelet's pod
manager at once while its containers run out their grace period, and the
kubelet hands the devices to the next pod meanwhile (see
:mod:`devplug.engine.liveness`). So a tenancy is released, and its devices
allocated again, only once its pod has no process left:

* the pod's cgroup says so (:class:`~devplug.engine.liveness.PodProbe`, which the daemon gives):
  ``running`` waits, ``exited`` goes;
* where that cannot be read (no cgroup access, or the tenancy's pod UID was never
  learnt from the kubelet's checkpoint), the tenancy waits ``[liveness]
  unknown_grace`` seconds (the kubelet's default termination grace period) from
  the moment its pod was first seen gone from the kubelet's view.

:class:`ExitEvidence` gives that verdict for the reconciler (which releases)
and for an Allocate whose devices the previous tenant still holds (which waits).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from devplug.config import LivenessConfig
from devplug.engine.ledger import AllocationRecord
from devplug.engine.liveness import PodLiveness, PodProbe, PodState

__all__ = ["ExitEvidence", "ExitVerdict"]

#: While liveness is unknown, a wait looks again this often (the cgroups may become readable meanwhile).
UNKNOWN_RECHECK_S = 1.0


@dataclass(frozen=True)
class ExitVerdict:
    """Whether a tenancy's containers are gone (``exited``), why, and what its pod's cgroup said."""

    exited: bool
    why: str
    liveness: PodLiveness
    #: With liveness unknown: when (``time.time()``) the grace ends.
    grace_ends: float | None = None
    #: The pod the verdict turned on (a pod still running, when one is).
    pod_uid: str | None = None


class ExitEvidence:
    """Exit verdicts for tenancies, node-wide; remembers when each tenancy's pod was first seen gone."""

    def __init__(self, liveness: PodProbe, config: LivenessConfig) -> None:
        self.liveness = liveness
        self.config = config
        #: Record ID -> when (``time.time()``) its pod was first seen gone from the kubelet's view (in memory: a
        #: restarted daemon starts the grace again, which only waits longer).
        self._vanished: dict[str, float] = {}

    def reconfigure(self, config: LivenessConfig) -> None:
        """``[liveness]`` changed (a reload)."""
        self.config = config
        self.liveness.reconfigure(config)

    def vanished_at(self, record: AllocationRecord, now: float) -> float:
        """When ``record``'s pod was first seen gone (``now`` if this is the first time)."""
        return self._vanished.setdefault(record.id, now)

    def forget(self, record_id: str) -> None:
        """The tenancy was released or is attributed again."""
        self._vanished.pop(record_id, None)

    def verdict(self, record: AllocationRecord, now: float | None = None) -> ExitVerdict:
        """Are ``record``'s containers gone? Call it only once the kubelet no longer attributes its devices."""
        now = time.time() if now is None else now
        pods = record.tenant_pods()  # several for a shared DRA claim
        answers = [(uid, self.liveness.pod(uid)) for uid in pods]
        running = next(((uid, a) for uid, a in answers if a.state is PodState.RUNNING), None)
        if running is not None:
            return ExitVerdict(False, running[1].detail, running[1], pod_uid=running[0])
        unknown = next((a for _, a in answers if a.state is not PodState.EXITED), None)
        if unknown is None:
            return ExitVerdict(True, "; ".join(a.detail for _, a in answers), answers[0][1], pod_uid=pods[0])
        answer = unknown
        grace = self.config.unknown_grace
        ends = self.vanished_at(record, now) + grace
        if now >= ends:
            why = f"{answer.detail}; released {grace:g} s after its pod vanished ([liveness] unknown_grace)"
            return ExitVerdict(True, why, answer)
        waiting = f"{answer.detail}; waiting {ends - now:.1f} s more ([liveness] unknown_grace)"
        return ExitVerdict(False, waiting, answer, ends)

    async def wait(self, record: AllocationRecord, timeout: float) -> ExitVerdict:
        """The verdict once ``record``'s containers are gone, or as it stands after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            verdict = self.verdict(record)
            remaining = deadline - loop.time()
            if verdict.exited or remaining <= 0:
                return verdict
            running = verdict.pod_uid if verdict.liveness.state is PodState.RUNNING else None
            if running is not None:
                await self.liveness.wait_exited(running, remaining)
            else:
                until_grace = (verdict.grace_ends - time.time()) if verdict.grace_ends is not None else remaining
                await asyncio.sleep(max(0.0, min(remaining, until_grace, UNKNOWN_RECHECK_S)))
