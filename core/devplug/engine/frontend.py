"""What the core asks of a front end: the protocol a wire front end implements for each resource it serves.

A :class:`~devplug.engine.resource.Resource` starts its driver, loads its
ledger and builds its lifecycle (:class:`~devplug.engine.lifecycle.DeviceLifecycle`,
the core's interface to front ends); then it hands that to its front end
(:meth:`HandoverFrontEnd.started`), runs it (:meth:`HandoverFrontEnd.serve`) and stops it
(:meth:`HandoverFrontEnd.stop`). The front end also judges tenancies for the core's
admission (:class:`~devplug.engine.admission.TenancyJudge`).

A front end may also take part in a handover (:class:`HandoverFrontEnd`) between two daemon instances on
one node (:mod:`devplug.daemon.handover`), through five calls on the old
instance's front end: :meth:`HandoverFrontEnd.hold_calls` when the new instance asks,
:meth:`HandoverFrontEnd.calls_idle` before the old one flushes its ledger,
:meth:`HandoverFrontEnd.handover_facts` for the record, then either
:meth:`HandoverFrontEnd.release_calls` (the handover failed: serve on) or
:meth:`HandoverFrontEnd.hand_over` with the new instance's :attr:`FrontEnd.endpoint`
for the same resource (it serves now: answer through it, stop, never register
again). The new instance's front end starts as after a restart, on an
endpoint of its own, and says when it is :attr:`HandoverFrontEnd.serving`.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from devplug.engine.admission import TenancyJudge
from devplug.engine.lifecycle import DeviceLifecycle

__all__ = ["FrontEnd", "HandoverFrontEnd"]


class FrontEnd(TenancyJudge, Protocol):
    """One resource's wire front end (the device-plugin API, DRA)."""

    @property
    def endpoint(self) -> str:
        """Where the front end serves (a socket path), for ``devplug status``."""
        ...

    async def started(self, lifecycle: DeviceLifecycle, ledger_lost: bool) -> None:
        """Called once the driver started and the ledger is loaded, before :meth:`serve`: build the server.
        ``ledger_lost``: there was no ledger to load, so take in what the kubelet says pods hold
        (:meth:`DeviceLifecycle.adopt`). Raises to fail the resource's start (retried with backoff)."""
        ...

    async def serve(self) -> None:
        """Serve until :meth:`stop`; called once, after :meth:`started`."""
        ...

    async def stop(self, grace: float) -> None:
        """Stop taking calls, give calls in flight ``grace`` seconds, and remove the endpoint."""
        ...

    def describe(self) -> dict[str, Any] | None:
        """What the front end adds to the resource's entry in ``devplug status`` (None: nothing); small and cheap,
        it is built again whenever the status may have changed."""


@runtime_checkable
class HandoverFrontEnd(FrontEnd, Protocol):
    """A front end that can take part in a handover between two instances (the device-plugin one and DRA's)."""

    @property
    def serving(self) -> bool:
        """The new instance's side: registered with the kubelet and the kubelet connected (for the device-plugin
        API its ListAndWatch stream open; for DRA the kubelet's registration accepted). The new instance tells the
        old one its endpoints only once every front end serves, so the old one never stops before the kubelet
        reaches the new one."""
        ...

    # --- handover (the old instance's side)

    def hold_calls(self) -> None:
        """A newer instance asked to take over: calls that would start new work (an allocation, a prepare, a
        container start) wait from now on, never refused; calls already running go on."""
        ...

    async def calls_idle(self) -> None:
        """Return once no call runs in this instance (the held ones wait)."""
        ...

    def release_calls(self) -> None:
        """The handover failed or timed out: run the held calls here, and go on serving as before."""
        ...

    def handover_facts(self) -> dict[str, object]:
        """What is handed over, for the handover's record (``devplug status``, logs): the endpoint, the
        registrations made, how many calls were held and the longest wait. JSON values only."""
        ...

    async def hand_over(self, successor: str, grace: float) -> None:
        """The newer instance serves this resource at ``successor`` (its :attr:`endpoint`): answer the held
        and any later calls through it, mark this instance superseded so it never registers again (whatever
        happens to its stream or socket), then stop serving within ``grace`` seconds without touching what
        the successor registered or published."""
        ...
