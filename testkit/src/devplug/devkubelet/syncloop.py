"""The kubelet's sync loop, as a model: one pod event at a time, and how long each waited behind the others.

Follows Kubernetes v1.32.10. ``syncLoop``/``syncLoopIteration``
(``pkg/kubelet/kubelet.go``) is one goroutine that takes one event at a time
from a ``select`` over the config updates (``ADD``: ``HandlePodAdditions``;
``UPDATE``, a graceful deletion among them: ``HandlePodUpdates``; ``REMOVE``,
a static pod's manifest removed or a pod force-deleted: ``HandlePodRemoves``),
the PLEG's container events (a container that exited or crashed:
``HandlePodSyncs``), the sync ticks and the housekeeping ticks
(``HOUSEKEEPING``: ``HandlePodCleanups``, every ``housekeepingPeriod``, 2 s,
once the sources are ready; it kills pods left running from before a restart
that no pod object names: see
:meth:`~devplug.devkubelet.lifecycle.PodLifecycle.housekeeping`), and handles
it before it takes the next:

* a pod ``ADD`` runs ``HandlePodAdditions`` -> ``canAdmitPod`` -> the
  device manager's ``Allocate`` -> ``endpointImpl.allocate``
  (``pkg/kubelet/cm/devicemanager/endpoint.go``), which calls the plugin's
  Allocate with ``context.Background()``: synchronously and with **no
  deadline**, as it calls GetPreferredAllocation
  (``getPreferredAllocation``). While a plugin holds one of them, the loop
  handles nothing else: another pod's admission, a pod's removal, a crashed
  container's restart and housekeeping all wait until it answers (measured
  on a whole v1.32.10 kubelet: a pod with no device written 2 s into a 12 s
  hold started 10.3 s later; ``/healthz/syncloop`` stays 200);
* what the loop hands to a pod worker (``podWorkers.UpdatePod`` in
  ``pkg/kubelet/pod_workers.go``: one goroutine per pod) runs outside it:
  the pod's sandbox and container starts (PreStartContainer with its own
  30 s deadline), the kill of its containers and its clean-up. A kill or a
  start under way is not held up by a held Allocate; a pod worker handles
  its own pod's work one piece at a time
  (:meth:`~devplug.devkubelet.lifecycle.PodLifecycle.pod_worker`).

Every turn of the loop is kept as a :class:`SyncLoopOp`: when the event
arrived, how long it waited behind the loop (``waited``) and how long its
handling held the loop (``held``), so tests and the bench can see what a
held Allocate cost the node.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

__all__ = ["SYNC_LOOP_KINDS", "SyncLoop", "SyncLoopOp"]

#: What a turn of the loop handles: config updates (``ADD``, ``UPDATE``, ``REMOVE``), a PLEG event (``PLEG``),
#: a pod sync (``SYNC``: the resync tick), the first pod list after a restart (``ADD`` too) and a housekeeping
#: tick (``HOUSEKEEPING``: ``HandlePodCleanups``, or its skip while the sources are not ready).
SYNC_LOOP_KINDS = frozenset({"ADD", "UPDATE", "REMOVE", "PLEG", "SYNC", "HOUSEKEEPING"})


@dataclass(frozen=True)
class SyncLoopOp:
    """One event the sync loop handled.

    ``kind`` is one of :data:`SYNC_LOOP_KINDS`, ``pod`` the pod's
    ``namespace/name`` (empty for an event about no one pod), ``queued_at``
    the wall-clock time the event arrived (``time.time()``, as
    :class:`~devplug.devkubelet.model.KubeletEvent` times), ``waited`` the
    seconds it waited for the loop, ``held`` the seconds its handling held the
    loop, and ``behind`` the turn that had the loop when it arrived (``""``:
    the loop was free).
    """

    kind: str
    pod: str
    queued_at: float
    waited: float
    held: float
    behind: str = ""

    @property
    def label(self) -> str:
        """``KIND namespace/name``."""
        return f"{self.kind} {self.pod}".rstrip()


class SyncLoop:
    """One turn at a time, first come first served; every turn is kept in :attr:`ops`.

    ``on_waited(op)`` is called for each turn that had to wait behind another
    (the kubelet records it as an event); ``on_change()``, if given, whenever
    :attr:`busy` or :attr:`waiting` changes (so waiters on them wake up).
    """

    def __init__(self, on_waited: Callable[[SyncLoopOp], None], on_change: Callable[[], None] | None = None) -> None:
        self._on_waited = on_waited
        self._on_change = on_change if on_change is not None else lambda: None
        self._lock: asyncio.Lock | None = None  # made on the running loop at first use
        self._current = ""
        self._waiting: list[str] = []
        #: Every turn taken, in the order the turns ended.
        self.ops: list[SyncLoopOp] = []

    @property
    def busy(self) -> str:
        """The turn that has the loop now (``KIND namespace/name``), or ``""``."""
        return self._current

    @property
    def waiting(self) -> tuple[str, ...]:
        """The turns waiting for the loop now, first in line first (``KIND namespace/name`` each)."""
        return tuple(self._waiting)

    @asynccontextmanager
    async def turn(self, kind: str, pod: str = "") -> AsyncIterator[None]:
        """Wait for the loop, handle the event in the ``with`` body, then free the loop for the next."""
        if kind not in SYNC_LOOP_KINDS:
            raise ValueError(f"sync loop turn kind must be one of {sorted(SYNC_LOOP_KINDS)}, not {kind!r}")
        if self._lock is None:
            self._lock = asyncio.Lock()
        queued_at, queued = time.time(), time.monotonic()
        label = f"{kind} {pod}".rstrip()
        behind = self._current or (self._waiting[0] if self._waiting else "")
        self._waiting.append(label)
        self._on_change()
        try:
            await self._lock.acquire()
        finally:
            self._waiting.remove(label)
        started = time.monotonic()
        self._current = label
        self._on_change()
        try:
            yield
        finally:
            self._current = ""
            op = SyncLoopOp(kind, pod, queued_at, started - queued, time.monotonic() - started, behind)
            self.ops.append(op)
            self._lock.release()
            if behind:
                self._on_waited(op)
            self._on_change()

    async def dispatch(self, kind: str, pod: str = "") -> None:
        """A turn whose handling only hands the event to a pod worker: wait for the loop, then go on."""
        async with self.turn(kind, pod):
            pass
