"""One registered device plugin as the kubelet holds it: its channel, its options, its ListAndWatch stream.

The kubelet dials the plugin's socket inside the Register call (blocking, with a
deadline) and asks for its options; after Register returns it opens
ListAndWatch once and never again. Every call failure becomes a
:class:`PluginCallError` carrying the plugin's own message.

Allocate and GetPreferredAllocation have **no deadline**: the kubelet calls
them with ``context.Background()`` (``endpointImpl.allocate`` and
``getPreferredAllocation`` in ``pkg/kubelet/cm/devicemanager/endpoint.go``),
from its sync loop (see :mod:`~devplug.devkubelet.syncloop`), so a plugin
that does not answer holds the node's pod admissions and removals until it
does. PreStartContainer has 30 s (``KubeletPreStartContainerRPCTimeoutInSecs``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from devplug.api.convert import allocation_from_pb
from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.api.gen.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from devplug.devkubelet.model import DeviceInfo, PluginOptions
from devplug.errors import KubeletError
from devplug.kube.names import MAX_SOCKET_PATH
from devplug.types import ContainerAllocation

__all__ = ["PRE_START_TIMEOUT", "PluginCallError", "PluginClient", "unix_target"]

_log = logging.getLogger("devplug.devkubelet")

#: The kubelet gives PreStartContainer 30 seconds.
PRE_START_TIMEOUT = 30.0
#: PostStopContainer and Deallocate (the KEP's RPCs) get the same.
KEP_CALL_TIMEOUT = 30.0


class PluginCallError(KubeletError):
    """A call to a device plugin failed; ``details`` is the plugin's message (or gRPC's)."""

    def __init__(self, method: str, resource: str, code: str, details: str) -> None:
        super().__init__(f"{method} for {resource} failed: {details} (gRPC {code})")
        self.method = method
        self.resource = resource
        self.code = code
        self.details = details


def unix_target(path: Path) -> str:
    """The gRPC address of a unix socket; refuses paths a unix socket cannot have."""
    absolute = path.absolute()
    if len(str(absolute).encode()) > MAX_SOCKET_PATH:
        raise KubeletError(
            f"unix socket path {str(absolute)!r} is {len(str(absolute).encode())} bytes, "
            f"more than the {MAX_SOCKET_PATH} a unix socket address can hold: use a shorter folder"
        )
    return f"unix:{absolute}"


def _options_from_pb(msg: dp.DevicePluginOptions) -> PluginOptions:
    return PluginOptions(
        pre_start_required=bool(msg.pre_start_required),
        get_preferred_allocation_available=bool(msg.get_preferred_allocation_available),
        post_stop_required=bool(msg.post_stop_required),
        deallocate_available=bool(msg.deallocate_available),
    )


def _device_from_pb(msg: dp.Device) -> DeviceInfo:
    nodes = tuple(int(n.ID) for n in msg.topology.nodes) if msg.HasField("topology") else ()
    return DeviceInfo(id=str(msg.ID), health=str(msg.health), numa_nodes=nodes)


class PluginClient:
    """The kubelet's side of one plugin registration.

    Build it with :meth:`connect` (dial + GetDevicePluginOptions), then
    :meth:`watch` opens ListAndWatch in a task. :meth:`close` cancels the
    stream and closes the channel; a closed client never reports its stream
    ending.
    """

    def __init__(
        self, resource: str, endpoint: str, socket: Path, channel: grpc.aio.Channel, options: PluginOptions
    ) -> None:
        self.resource = resource
        self.endpoint = endpoint
        self.socket = socket
        self.options = options
        self._channel = channel
        self._stub = dp_grpc.DevicePluginStub(channel)
        self._watch_task: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    async def connect(cls, resource: str, endpoint: str, socket: Path, timeout: float) -> PluginClient:
        """Dial the plugin's socket (blocking, up to ``timeout``) and read its options.

        Raises :class:`KubeletError` with the kubelet's wording when either fails.
        """
        try:
            target = unix_target(socket)
        except KubeletError as exc:
            raise KubeletError(f"failed to dial device plugin: {exc}") from None
        channel = grpc.aio.insecure_channel(target)
        try:
            try:
                await asyncio.wait_for(channel.channel_ready(), timeout)
            except asyncio.TimeoutError:
                raise KubeletError(
                    f"failed to dial device plugin: context deadline exceeded "
                    f"(nothing answered on {socket} within {timeout:g}s)"
                ) from None
            stub = dp_grpc.DevicePluginStub(channel)
            try:
                reply = await stub.GetDevicePluginOptions(dp.Empty(), timeout=timeout)
            except grpc.aio.AioRpcError as exc:
                raise KubeletError(f"failed to get device plugin options: {exc.details()}") from None
        except BaseException:
            await channel.close(None)
            raise
        return cls(resource, endpoint, socket, channel, _options_from_pb(reply))

    @property
    def stream_open(self) -> bool:
        """True while the ListAndWatch task runs."""
        return self._watch_task is not None and not self._watch_task.done()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    def watch(
        self,
        on_opened: Callable[[], None],
        on_list: Callable[[tuple[DeviceInfo, ...]], None],
        on_end: Callable[[str], None],
    ) -> None:
        """Open ListAndWatch once, in a task.

        ``on_list`` gets every message's whole device list; ``on_end`` gets a
        reason when the stream ends by itself (not when :meth:`close` ended it).
        """
        if self._watch_task is not None:
            raise RuntimeError("ListAndWatch is opened once per registration")
        self._watch_task = asyncio.get_running_loop().create_task(
            self._consume(on_opened, on_list, on_end), name=f"devkubelet-listandwatch-{self.resource}"
        )

    async def _consume(
        self,
        on_opened: Callable[[], None],
        on_list: Callable[[tuple[DeviceInfo, ...]], None],
        on_end: Callable[[str], None],
    ) -> None:
        reason = "the plugin closed the stream"
        try:
            call = self._stub.ListAndWatch(dp.Empty())
            on_opened()
            async for reply in call:
                on_list(tuple(_device_from_pb(d) for d in reply.devices))
        except asyncio.CancelledError:
            if not self._closed:
                on_end("the stream was cancelled")
            raise
        except grpc.aio.AioRpcError as exc:
            reason = f"{exc.code().name}: {exc.details()}"
        except Exception as exc:  # a bug here must not leave the resource silently healthy
            _log.exception("ListAndWatch consumer for %s failed", self.resource)
            reason = f"the dev kubelet failed reading the stream: {exc!r}"
        if not self._closed:
            on_end(reason)

    async def close(self) -> None:
        """Cancel the stream and close the channel (idempotent)."""
        if self._closed:
            return
        self._closed = True
        task = self._watch_task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._channel.close(None)

    async def _call(self, method: str, call: Awaitable[Any]) -> Any:
        try:
            return await call
        except grpc.aio.AioRpcError as exc:
            raise PluginCallError(method, self.resource, exc.code().name, str(exc.details())) from None
        except asyncio.CancelledError:
            # The call, not this task, was cancelled: the plugin's stream ended (it died) and the
            # channel was closed under the call. The kubelet sees that as a failed call.
            task = asyncio.current_task()
            if task is not None and getattr(task, "cancelling", lambda: 0)():
                raise
            raise PluginCallError(method, self.resource, "CANCELLED", "the connection to the plugin closed") from None

    async def get_preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> tuple[str, ...]:
        """GetPreferredAllocation with one container request; the IDs of ``container_responses[0]``."""
        request = dp.PreferredAllocationRequest(
            container_requests=[
                dp.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        reply = await self._call("GetPreferredAllocation", self._stub.GetPreferredAllocation(request))
        responses = reply.container_responses
        if not responses:
            raise PluginCallError("GetPreferredAllocation", self.resource, "OK", "no container responses in the reply")
        return tuple(str(i) for i in responses[0].deviceIDs)

    async def allocate_response(self, device_ids: Sequence[str]) -> dp.AllocateResponse:
        """Allocate with one container request (``endpointImpl.allocate``); the whole reply, unknown fields dropped."""
        request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=list(device_ids))])
        reply: dp.AllocateResponse = await self._call("Allocate", self._stub.Allocate(request))
        reply.DiscardUnknownFields()  # the kubelet's generated Go types keep none
        return reply

    async def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation:
        """Allocate with one container request; ``container_responses[0]`` as a ContainerAllocation."""
        responses = (await self.allocate_response(device_ids)).container_responses
        if not responses:
            raise PluginCallError("Allocate", self.resource, "OK", "no containers return in allocation response")
        try:
            return allocation_from_pb(responses[0])
        except ValueError as exc:
            raise PluginCallError("Allocate", self.resource, "OK", f"malformed response: {exc}") from None

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        """PreStartContainer with the container's devices (30 s deadline, like the kubelet)."""
        request = dp.PreStartContainerRequest(devices_ids=list(device_ids))
        await self._call("PreStartContainer", self._stub.PreStartContainer(request, timeout=PRE_START_TIMEOUT))

    async def post_stop(self, device_ids: Sequence[str]) -> None:
        """PostStopContainer (the KEP's RPC) with the container's devices."""
        request = dp.PostStopContainerRequest(devices_ids=list(device_ids))
        await self._call("PostStopContainer", self._stub.PostStopContainer(request, timeout=KEP_CALL_TIMEOUT))

    async def deallocate(self, device_ids: Sequence[str]) -> None:
        """Deallocate (the KEP's RPC) with devices no live container holds any more."""
        request = dp.DeallocateRequest(devices_ids=list(device_ids))
        await self._call("Deallocate", self._stub.Deallocate(request, timeout=KEP_CALL_TIMEOUT))
