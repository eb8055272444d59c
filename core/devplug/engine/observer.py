"""What the engine tells an observer (the metrics, when ``[metrics] enabled``) about one resource.

The engine calls these methods at a handful of event points: a driver hook
called, failed or timed out (:mod:`devplug.engine.hookrunner`), containers
allocated and allocations released (:mod:`devplug.engine.lifecycle`), a ledger
write done (:mod:`devplug.engine.ledger`), and for a resource served through DRA
a claim prepared, unprepared or refused and a prepared claim found gone
(:mod:`devplug.frontends.dra`). Each call does O(1) work. The base
class does nothing, and :data:`NULL_OBSERVER` is what every part gets while
metrics are off: one method call that returns at once, and no import of
``prometheus_client`` (see :mod:`devplug.daemon.metrics` for the one that counts).
"""

from __future__ import annotations

__all__ = ["NULL_OBSERVER", "ResourceObserver"]


class ResourceObserver:
    """One resource's events; this base ignores them all. Called from the event loop thread only."""

    def hook_called(self, hook: str) -> None:
        """A driver hook (``allocate``, ``post_stop``, ...) is about to be called."""

    def hook_failed(self, hook: str) -> None:
        """A driver hook raised."""

    def hook_timed_out(self, hook: str) -> None:
        """A driver hook did not return within ``hook_timeout`` (it was abandoned)."""

    def kubelet_call_held(self, call: str, seconds: float) -> None:
        """The kubelet waited ``seconds`` for devplug's answer to ``call`` (``Allocate``, ``GetPreferredAllocation``),
        a call it makes inside the loop that admits and removes every pod of the node, gate and refusals included."""

    def allocated(self, containers: int) -> None:
        """An Allocate succeeded for ``containers`` containers (one allocation each)."""

    def released(self, seconds: float) -> None:
        """An allocation was released: ``seconds`` from the release's start (the reconciler's or a KEP call's
        decision) until it was done (the driver's last release hook returned and the ledger recorded it)."""

    def ledger_written(self, kind: str, seconds: float) -> None:
        """The ledger was written: ``kind`` is ``"journal"`` (an append, fdatasync'ed when asked) or
        ``"snapshot"`` (a compaction)."""

    def claim_prepared(self, seconds: float) -> None:
        """A DRA claim was prepared (or a prepared one answered again) in ``seconds``."""

    def claim_prepare_failed(self, reason: str, seconds: float) -> None:
        """A DRA claim could not be prepared, for ``reason`` (one of a fixed set of kinds, never the message)."""

    def claim_unprepared(self, seconds: float) -> None:
        """A DRA claim was unprepared (or had nothing to unprepare here) in ``seconds``."""

    def claim_unprepare_failed(self, reason: str, seconds: float) -> None:
        """A DRA claim's unprepare failed, for ``reason`` (one of a fixed set of kinds)."""

    def claim_gone(self, cause: str) -> None:
        """A prepared DRA claim was found ``cause`` (deleted, replaced, deallocated) in the API server, with no
        unprepare coming: reconciliation releases it (once per claim)."""


#: The observer of every resource while metrics are off.
NULL_OBSERVER = ResourceObserver()
