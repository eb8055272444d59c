"""What the core asks of a front end: the protocol a wire front end implements for each resource it serves.

A :class:`~devplug.engine.resource.Resource` starts its driver, loads its
ledger and builds its lifecycle (:class:`~devplug.engine.lifecycle.DeviceLifecycle`,
the core's interface to front ends); then it hands that to its front end
(:meth:`FrontEnd.started`), runs it (:meth:`FrontEnd.serve`) and stops it
(:meth:`FrontEnd.stop`). The front end also judges tenancies for the core's
admission (:class:`~devplug.engine.admission.TenancyJudge`).
"""

from __future__ import annotations

from typing import Any, Protocol

from devplug.engine.admission import TenancyJudge
from devplug.engine.lifecycle import DeviceLifecycle

__all__ = ["FrontEnd"]


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
        ...
