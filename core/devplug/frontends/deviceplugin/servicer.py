"""The ``v1beta1.DevicePlugin`` gRPC service of one resource, on grpc.aio.

This module is the only place where the engine's errors become gRPC status
codes: a request naming unknown, unhealthy or duplicate devices gets
INVALID_ARGUMENT, one for devices still in use or busy (the previous tenant's
containers still run, a hook on them has not returned) FAILED_PRECONDITION, a
driver that fails gets INTERNAL (DEADLINE_EXCEEDED for a hook timeout), each
with the message. Device IDs no kubelet could send (not a
valid :class:`~devplug.types.Device` ID: control characters, whitespace, too
long) are refused before anything else looks at the request. Messages and log
lines repeat request data escaped and bounded (:mod:`devplug.text.logsafe`).
ListAndWatch sends pre-encoded bytes from the device table, and Allocate
its answer encoded by :func:`~devplug.api.convert.encode_allocate_response`
(identity serializers), so neither builds protobuf objects per device.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Container, Iterable
from typing import Any, Protocol, TypeVar

import grpc
import grpc.aio

from devplug.api.convert import encode_allocate_response
from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.engine import DeviceLifecycle, DeviceTable
from devplug.errors import (
    DeviceBusyError,
    DevplugError,
    DriverError,
    HookTimeoutError,
    RequestError,
    StateWriteError,
)
from devplug.frontends.callgate import CallGate, forward_answered
from devplug.text.logsafe import bounded, id_list
from devplug.types import MAX_DEVICE_ID_BYTES, device_id_problem

__all__ = ["SERVICE_NAME", "DevicePluginService", "StreamObserver"]

SERVICE_NAME = "v1beta1.DevicePlugin"
log = logging.getLogger("devplug.engine")
Req = TypeVar("Req")
Resp = TypeVar("Resp")


class StreamObserver(Protocol):
    """The resource's view of its ListAndWatch streams."""

    @property
    def stopping(self) -> bool: ...

    def stream_opened(self, stream: int) -> None:
        """ListAndWatch stream number ``stream`` (unique in the process) opened."""

    def stream_closed(self, stream: int, by_peer: bool) -> None:
        """Stream ``stream`` ended: by its client (``by_peer``), or because devplug ended it."""


def _identity(data: bytes) -> bytes:
    return data


_stream_numbers = itertools.count(1)

#: The wire name of each gated RPC, by the method serving it.
_RPC_NAMES = {
    "get_preferred_allocation": "GetPreferredAllocation",
    "allocate": "Allocate",
    "pre_start_container": "PreStartContainer",
    "post_stop_container": "PostStopContainer",
    "deallocate": "Deallocate",
}


#: The calls the kubelet makes inside its sync loop with no deadline (``pkg/kubelet/cm/devicemanager/endpoint.go``
#: passes ``context.Background()``), so that every other pod of the node waits while devplug holds one: each one's
#: duration is observed (:meth:`~devplug.engine.observer.ResourceObserver.kubelet_call_held`).
KUBELET_WAITS = frozenset({"Allocate", "GetPreferredAllocation"})


def check_request_ids(resource_name: str, *groups: Iterable[str], known: Container[str] = ()) -> None:
    """Refuse (:class:`RequestError`) IDs the kubelet could never send: it only sends IDs a plugin advertised.

    IDs in ``known`` (the device table: IDs checked when they were advertised) are not checked again.
    """
    bad = [i for ids in groups for i in ids if i not in known and device_id_problem(i) is not None]
    if bad:
        reason = device_id_problem(bad[0])
        raise RequestError(
            f"{resource_name}: malformed device IDs (no kubelet sends them: a device ID is printable, without "
            f"whitespace, at most {MAX_DEVICE_ID_BYTES} bytes): {id_list(bad)} (the first: {reason}); nothing was done"
        )


class DevicePluginService:
    """Serves one resource's DevicePlugin RPCs from its lifecycle and device table."""

    def __init__(
        self,
        lifecycle: DeviceLifecycle,
        table: DeviceTable,
        options: dp.DevicePluginOptions,
        observer: StreamObserver,
        gate: CallGate | None = None,
    ) -> None:
        self.lifecycle = lifecycle
        #: Whether calls run here, wait, or go to a successor instance (a handover); open when not given.
        self.gate = gate or CallGate()
        self.table = table
        self.options = options
        self.observer = observer
        self._closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def close(self) -> None:
        """End this service's ListAndWatch streams (the resource moved to a fresh server or is stopping)."""
        if not self._closed.done():
            self._closed.set_result(None)

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        """The generic handler to add to a ``grpc.aio`` server."""
        unary = grpc.unary_unary_rpc_method_handler
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "GetDevicePluginOptions": unary(
                    self._guard(self.get_options),
                    request_deserializer=dp.Empty.FromString,
                    response_serializer=dp.DevicePluginOptions.SerializeToString,
                ),
                "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                    self.list_and_watch,
                    request_deserializer=dp.Empty.FromString,
                    response_serializer=_identity,
                ),
                "GetPreferredAllocation": unary(
                    self._guard(self.get_preferred_allocation, dp.PreferredAllocationResponse.FromString),
                    request_deserializer=dp.PreferredAllocationRequest.FromString,
                    response_serializer=dp.PreferredAllocationResponse.SerializeToString,
                ),
                "Allocate": unary(
                    self._guard(self.allocate, _identity),
                    request_deserializer=dp.AllocateRequest.FromString,
                    response_serializer=_identity,  # encoded by encode_allocate_response
                ),
                "PreStartContainer": unary(
                    self._guard(self.pre_start_container, dp.PreStartContainerResponse.FromString),
                    request_deserializer=dp.PreStartContainerRequest.FromString,
                    response_serializer=dp.PreStartContainerResponse.SerializeToString,
                ),
                "PostStopContainer": unary(
                    self._guard(self.post_stop_container, dp.PostStopContainerResponse.FromString),
                    request_deserializer=dp.PostStopContainerRequest.FromString,
                    response_serializer=dp.PostStopContainerResponse.SerializeToString,
                ),
                "Deallocate": unary(
                    self._guard(self.deallocate, dp.DeallocateResponse.FromString),
                    request_deserializer=dp.DeallocateRequest.FromString,
                    response_serializer=dp.DeallocateResponse.SerializeToString,
                ),
            },
        )

    def _guard(
        self, method: Callable[[Req], Awaitable[Resp]], decode: Callable[[bytes], Any] | None = None
    ) -> Callable[[Req, grpc.aio.ServicerContext[Any, Any]], Awaitable[Resp]]:
        """``method`` with the engine's errors as gRPC codes; with ``decode`` (its reply's parser) the call also
        passes the gate: it may wait, or go to the successor instance (:mod:`devplug.frontends.callgate`)."""
        name = method.__name__
        if decode is not None:
            return self._gated(self._guard(method), _RPC_NAMES[name], decode)

        async def call(request: Req, context: grpc.aio.ServicerContext[Any, Any]) -> Resp:
            try:
                return await method(request)
            except DeviceBusyError as exc:
                log.warning("[%s] %s refused: %s", self.lifecycle.resource_name, name, bounded(str(exc)))
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, bounded(str(exc)))
            except RequestError as exc:
                log.warning("[%s] %s refused: %s", self.lifecycle.resource_name, name, bounded(str(exc)))
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, bounded(str(exc)))
            except HookTimeoutError as exc:
                log.error("[%s] %s failed: %s", self.lifecycle.resource_name, name, bounded(str(exc)))
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, bounded(str(exc)))
            except DriverError as exc:
                log.error("[%s] %s failed: %s", self.lifecycle.resource_name, name, bounded(str(exc)))
                await context.abort(grpc.StatusCode.INTERNAL, bounded(str(exc)))
            except StateWriteError as exc:
                log.error("[%s] %s refused: %s", self.lifecycle.resource_name, name, exc)
                code = grpc.StatusCode.RESOURCE_EXHAUSTED if exc.no_space else grpc.StatusCode.UNAVAILABLE
                await context.abort(code, bounded(str(exc)))
            except DevplugError as exc:
                log.error("[%s] %s failed: %s", self.lifecycle.resource_name, name, bounded(str(exc)))
                await context.abort(grpc.StatusCode.INTERNAL, bounded(str(exc)))
            raise AssertionError("unreachable: context.abort raises")

        call.__name__ = name
        return call

    def _gated(
        self,
        guarded: Callable[[Req, grpc.aio.ServicerContext[Any, Any]], Awaitable[Resp]],
        rpc: str,
        decode: Callable[[bytes], Any],
    ) -> Callable[[Req, grpc.aio.ServicerContext[Any, Any]], Awaitable[Resp]]:
        method = f"/{SERVICE_NAME}/{rpc}"

        async def call(request: Req, context: grpc.aio.ServicerContext[Any, Any]) -> Resp:
            # The gate is passed here, not handed this call to run: it never calls back into this module.
            gate = self.gate
            successor = await gate.enter()
            try:
                if successor is None:
                    return await guarded(request, context)
                answer: Resp = await forward_answered(
                    successor, self.lifecycle.resource_name, method, request, context, decode
                )
                return answer
            finally:
                gate.leave()

        if rpc not in KUBELET_WAITS:
            call.__name__ = guarded.__name__
            return call
        observer = self.lifecycle.observer

        async def held(request: Req, context: grpc.aio.ServicerContext[Any, Any]) -> Resp:
            start = time.monotonic()
            try:
                return await call(request, context)
            finally:
                observer.kubelet_call_held(rpc, time.monotonic() - start)

        held.__name__ = guarded.__name__
        return held

    # --- RPCs

    async def get_options(self, request: dp.Empty) -> dp.DevicePluginOptions:
        return self.options

    async def list_and_watch(
        self, request: dp.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        """The whole list at once, then again on every change, until the peer or the daemon ends it."""
        stream = next(_stream_numbers)
        self.observer.stream_opened(stream)
        closed = self._closed
        self.table.watchers += 1
        try:
            version = self.table.version
            yield self.table.encoded()
            while True:
                changed = self.table.next_change(version)  # shared by every stream: no task per wait
                if not changed.done():
                    await asyncio.wait((changed, closed), return_when=asyncio.FIRST_COMPLETED)
                if closed.done() or self.observer.stopping:
                    return
                version = self.table.version
                yield self.table.encoded()
        finally:
            self.table.watchers -= 1
            by_peer = not (closed.done() or self.observer.stopping)
            self.observer.stream_closed(stream, by_peer)

    async def get_preferred_allocation(self, request: dp.PreferredAllocationRequest) -> dp.PreferredAllocationResponse:
        # Each repeated field read once: every read of a protobuf string list decodes its strings again.
        requests = [
            (list(c.available_deviceIDs), list(c.must_include_deviceIDs), int(c.allocation_size))
            for c in request.container_requests
        ]
        for available, must_include, _ in requests:
            check_request_ids(self.lifecycle.resource_name, available, must_include, known=self.table.ids)
        responses = []
        for available, must_include, size in requests:
            chosen = await self.lifecycle.preferred(available, must_include, size)
            responses.append(dp.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return dp.PreferredAllocationResponse(container_responses=responses)

    async def allocate(self, request: dp.AllocateRequest) -> bytes:
        """The serialized ``AllocateResponse``."""
        containers = [list(c.devices_ids) for c in request.container_requests]
        check_request_ids(self.lifecycle.resource_name, *containers, known=self.table.ids)
        if not containers:
            raise RequestError(f"{self.lifecycle.resource_name}: Allocate without container requests")
        allocations = await self.lifecycle.allocate(containers)
        return encode_allocate_response(allocations)

    async def pre_start_container(self, request: dp.PreStartContainerRequest) -> dp.PreStartContainerResponse:
        check_request_ids(self.lifecycle.resource_name, request.devices_ids)
        await self.lifecycle.pre_start(list(request.devices_ids))
        return dp.PreStartContainerResponse()

    async def post_stop_container(self, request: dp.PostStopContainerRequest) -> dp.PostStopContainerResponse:
        check_request_ids(self.lifecycle.resource_name, request.devices_ids)
        await self.lifecycle.post_stop_devices(list(request.devices_ids))
        return dp.PostStopContainerResponse()

    async def deallocate(self, request: dp.DeallocateRequest) -> dp.DeallocateResponse:
        check_request_ids(self.lifecycle.resource_name, request.devices_ids)
        await self.lifecycle.deallocate_devices(list(request.devices_ids))
        return dp.DeallocateResponse()
