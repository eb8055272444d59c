"""A pod's claims on the kubelet's timeline: prepared before its sandbox, unprepared after its containers.

Follows Kubernetes 1.36, and every release modelled alike (v1.32.10's
``kuberuntime_manager.go`` and ``kubelet.go``, as KubeEdge vendors them, make
the same two calls at the same two places, behind the DynamicResourceAllocation
gate: beta and off by default in 1.32 and 1.33, so a dev kubelet with DRA is
one whose gate is on; GA from 1.34):

* **prepare** (``kuberuntime_manager.go`` ``SyncPod``): ``PrepareDynamicResources``
  runs when the pod's sandbox is to be made, before it; when it fails the
  kubelet records ``FailedPrepareDynamicResources`` and makes no sandbox: the
  pod stays admitted with nothing running. That sync returns no error, so the
  pod is synced again at its next resync (``--sync-frequency``, 1 minute) or
  when asked, and the same claims are sent again;
* **unprepare** (``kubelet.go`` ``SyncTerminatingPod``): after every container
  of the pod stopped and before its final status, ``UnprepareDynamicResources``;
  when it fails the pod worker's sync fails and is tried again after its
  back-off (``backOffPeriod``, 10 s): the pod stays terminating (still active)
  until the claims are unprepared. The DRA manager's reconcile loop also
  unprepares claims of pods no longer active (a pod the kubelet forgot).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from devplug.devkubelet.dra.model import PodClaim
from devplug.errors import KubeletError

if TYPE_CHECKING:
    from devplug.devkubelet.dra.node import DRAKubelet
    from devplug.devkubelet.pods import PodRecord

__all__ = ["ClaimPrepareError", "ClaimUnprepareError", "PodClaims"]

Recorder = Callable[[str, str, str], None]


class ClaimPrepareError(KubeletError):
    """The pod was admitted but its claims could not be prepared: no sandbox, no container runs (yet).

    The dev kubelet tries again at the pod's next sync (``sync_pod``, or after
    the pod worker's back-off).
    """


class ClaimUnprepareError(KubeletError):
    """The pod's containers stopped but its claims could not be unprepared: the pod stays terminating.

    The dev kubelet tries again after the pod worker's back-off, or at ``sync_pod``.
    """


def _label(record: PodRecord) -> str:
    return f"{record.spec.namespace}/{record.spec.name}"


class PodClaims:
    """The pod worker's DRA steps over a :class:`~devplug.devkubelet.dra.node.DRAKubelet` (None: DRA off).

    ``backoff`` is the pod worker's wait before a failed sync runs again
    (None: only when :meth:`nudge` asks).
    """

    def __init__(self, node: DRAKubelet | None, record: Recorder, *, backoff: float | None) -> None:
        self._node = node
        self._record = record
        self._backoff = backoff
        self._nudges: dict[str, asyncio.Event] = {}

    @property
    def enabled(self) -> bool:
        return self._node is not None

    def check(self, claims: tuple[PodClaim, ...], label: str) -> None:
        """A pod using claims on a dev kubelet without DRA is refused before anything happens."""
        if claims and self._node is None:
            raise KubeletError(
                f"pod {label} uses resource claims, but this dev kubelet runs without DRA "
                "(DevKubelet(..., dra=DRAConfig()))"
            )

    async def prepare(self, record: PodRecord) -> None:
        """``PrepareDynamicResources``; :class:`ClaimPrepareError` (after recording it) when it fails."""
        claims = tuple(record.spec.resource_claims)
        if not claims or self._node is None:
            record.claims_prepared = True
            return
        try:
            await self._node.manager.prepare_resources(record.uid, _label(record), claims)
        except KubeletError as exc:
            record.claims_prepared, record.claims_error = False, str(exc)
            self._record("pod-prepare-failed", "", f"{_label(record)} (uid {record.uid}): {exc}")
            raise ClaimPrepareError(f"pod {_label(record)}: FailedPrepareDynamicResources: {exc}") from exc
        record.claims_prepared, record.claims_error = True, None
        names = ", ".join(c.claim.label for c in claims)
        self._record("pod-claims-prepared", "", f"{_label(record)} (uid {record.uid}): {names}")

    async def unprepare_once(self, record: PodRecord) -> str | None:
        """``UnprepareDynamicResources`` once; the error (recorded) or None."""
        claims = tuple(record.spec.resource_claims)
        if not claims or self._node is None:
            return None
        names = [c.claim.name for c in claims]
        try:
            await self._node.manager.unprepare_resources(record.uid, record.spec.namespace, names, _label(record))
        except KubeletError as exc:
            record.claims_error = str(exc)
            self._record("pod-unprepare-failed", "", f"{_label(record)} (uid {record.uid}): {exc}")
            return str(exc)
        record.claims_error = None
        self._record("pod-claims-unprepared", "", f"{_label(record)} (uid {record.uid})")
        return None

    async def unprepare_until_done(self, record: PodRecord) -> None:
        """Unprepare, trying again after each back-off (or :meth:`nudge`) until it succeeds."""
        while await self.unprepare_once(record) is not None:
            await self.wait_for_sync(record.uid)

    async def wait_for_sync(self, uid: str) -> None:
        """Until the pod's next sync: the back-off passed or :meth:`nudge` was called."""
        event = self._nudges.setdefault(uid, asyncio.Event())
        try:
            if self._backoff is None:
                await event.wait()
            else:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(event.wait(), self._backoff)
        finally:
            event.clear()

    def nudge(self, uid: str) -> None:
        """Sync the pod now: a sync waiting for its back-off runs at once (or the next wait ends at once)."""
        self._nudges.setdefault(uid, asyncio.Event()).set()
