"""Where one resource's kubelet calls run during a handover: here, held, or at the successor instance.

Shared by the front ends (each wire API forwards its own calls). While a new
instance takes the node over (:mod:`devplug.daemon.handover`), the old one
holds every call that would start new work (the device-plugin API's Allocate,
GetPreferredAllocation, PreStartContainer and the KEP calls; DRA's
NodePrepareResources and NodeUnprepareResources): they wait, rather than fail,
so the kubelet refuses no pod. If the handover fails the held calls run here
after all (:meth:`CallGate.release`); once the successor serves, they and every
later call go to its socket (:meth:`CallGate.forward_to`, :func:`forward_unary`),
answered by the instance that owns the ledger.

The gate is called, never calling: a service passes it (:meth:`CallGate.enter`),
runs its call itself or hands it to :func:`forward_answered`, then leaves it
(:meth:`CallGate.leave`), so a call goes down from the service to the gate and
back up, never from the gate back into the service (no callback: the kubelet's
call path comes back to no module it left, ``tests/test_arch_call_paths.py``)::

    successor = await gate.enter()
    try:
        if successor is None:
            return await run_here(request, context)
        return await forward_answered(successor, resource, method, request, context, decode)
    finally:
        gate.leave()
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

__all__ = ["FORWARD_TIMEOUT_S", "CallGate", "forward_answered", "forward_unary"]

log = logging.getLogger("devplug.frontends")

#: Seconds a forwarded call may take (the kubelet's own Allocate has no deadline; PreStartContainer has 30 s, DRA's
#: calls 45 s).
FORWARD_TIMEOUT_S = 120.0


class CallGate:
    """Open (calls run here), held (calls wait), or forwarding (calls go to the successor's socket)."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._successor: Path | None = None
        self._running = 0  # calls past the gate (run here or forwarded)
        self._waiting = 0  # calls held at the gate
        self._changed = asyncio.Event()
        #: How many calls waited at the gate, and the longest wait (seconds), since the gate was made.
        self.held_calls = 0
        self.longest_wait = 0.0

    @property
    def successor(self) -> Path | None:
        """The successor's socket once calls are forwarded, else None."""
        return self._successor

    @property
    def in_flight(self) -> int:
        """Calls running (here or forwarded) or held: the kubelet's connection to this instance must outlive them,
        as the kubelet closes it when this instance's stream ends, cancelling whatever still runs on it."""
        return self._running + self._waiting

    def hold(self) -> None:
        """Calls arriving from now on wait (calls already running go on)."""
        self._open.clear()

    def release(self) -> None:
        """Calls run here again (the handover failed); the waiting ones start."""
        self._successor = None
        self._open.set()

    def forward_to(self, socket: Path) -> None:
        """Every waiting and later call goes to ``socket``, the successor instance's."""
        self._successor = socket
        self._open.set()

    async def enter(self) -> Path | None:
        """Wait while held; then the successor's socket to forward to, or None to run here; :meth:`leave` after."""
        if not self._open.is_set():
            loop = asyncio.get_running_loop()
            started = loop.time()
            self.held_calls += 1
            self._waiting += 1
            try:
                await self._open.wait()
            finally:
                self._waiting -= 1
            self.longest_wait = max(self.longest_wait, loop.time() - started)
        self._running += 1
        return self._successor

    def leave(self) -> None:
        """A call that :meth:`enter` let through (run here or forwarded) returned."""
        self._running -= 1
        self._changed.set()

    async def wait_running_done(self) -> None:
        """Return once no call runs past the gate (held ones may still wait)."""
        await self._wait(lambda: self._running == 0)

    async def wait_idle(self) -> None:
        """Return once no call runs or waits (held calls must have been let through and answered)."""
        await self._wait(lambda: self.in_flight == 0)

    async def _wait(self, done: Callable[[], bool]) -> None:
        while not done():
            self._changed.clear()
            await self._changed.wait()


async def forward_unary(
    socket: Path, method: str, request: Any, decode: Callable[[bytes], Any]
) -> tuple[Any, grpc.StatusCode | None, str]:
    """Call the unary ``method`` (its full path, ``/<package>.<Service>/<Method>``) on ``socket`` with ``request``
    (a protobuf message), ``decode`` parsing the reply; (reply, None, "") or (None, code, details)."""
    async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        call = channel.unary_unary(
            method,
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=decode,
        )
        try:
            return await call(request, timeout=FORWARD_TIMEOUT_S), None, ""
        except grpc.aio.AioRpcError as exc:
            return None, exc.code(), exc.details() or ""


async def forward_answered(
    successor: Path,
    resource: str,
    method: str,
    request: Any,
    context: Any,
    decode: Callable[[bytes], Any],
) -> Any:
    """The successor's reply to the unary ``method`` (its full path, ``/<package>.<Service>/<Method>``; ``decode``
    parses the reply) with ``request``, a call :meth:`CallGate.enter` sent to ``successor``; a forwarded call that
    fails aborts ``context`` with the successor's code and details."""
    reply, code, details = await forward_unary(successor, method, request, decode)
    name = method.rpartition("/")[2]
    if code is not None:
        log.warning("[%s] %s forwarded to %s failed: %s", resource, name, successor, details)
        await context.abort(code, details)
    log.info("[%s] %s answered by the successor instance at %s", resource, name, successor)
    return reply
