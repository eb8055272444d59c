"""One registered instance of a DRA driver's kubelet plugin, as the kubelet talks to it.

Follows ``pkg/kubelet/cm/dra/plugin/dra_plugin.go`` and ``dra_plugin_manager.go``
(Kubernetes 1.34 to 1.36, connection monitoring from PR #132058):

* one gRPC connection per instance to ``unix:<endpoint>``, made at
  registration and asked to connect at once (``conn.Connect()``); its state
  is watched (the gRPC stats handler's ``ConnBegin``/``ConnEnd``): the
  instance is *connected* while the connection is up, and a lost connection
  is asked to reconnect (gRPC's own reconnect back-off applies);
* NodePrepareResources and NodeUnprepareResources go to the service chosen
  at registration: ``v1.DRAPlugin`` as is, ``v1beta1.DRAPlugin`` through the
  conversion of ``k8s.io/kubelet/pkg/apis/dra/v1beta1`` (``V1Beta1ClientWrapper``:
  the same fields, ``share_id`` dropped); each call has 45 s
  (``defaultClientCallTimeout``) and fails at once when the connection is down
  (gRPC's default, fail fast);
* NodeWatchResources (``v1alpha1.DRAResourceHealth``) goes over the same connection.

Every call failure is a :class:`DRACallError` carrying gRPC's status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
import grpc.aio

from devplug.api.gen.dra.v1 import api_pb2 as v1
from devplug.api.gen.dra.v1 import api_pb2_grpc as v1_grpc
from devplug.api.gen.dra.v1beta1 import api_pb2 as v1beta1
from devplug.api.gen.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from devplug.api.gen.drahealth.v1alpha1 import api_pb2 as health_pb
from devplug.api.gen.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from devplug.errors import KubeletError

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "HEALTH_SERVICE",
    "SERVICE_V1",
    "SERVICE_V1BETA1",
    "SERVICES_SUPPORTED_BY_KUBELET",
    "DRACallError",
    "DRAPluginClient",
]

_log = logging.getLogger("devplug.devkubelet")

#: ``drapbv1.DRAPluginService`` and ``drapbv1beta1.DRAPluginService``: names a plugin lists in ``supported_versions``.
SERVICE_V1 = "v1.DRAPlugin"
SERVICE_V1BETA1 = "v1beta1.DRAPlugin"
#: ``servicesSupportedByKubelet`` (``dra_plugin.go``): most recent first.
SERVICES_SUPPORTED_BY_KUBELET = (SERVICE_V1, SERVICE_V1BETA1)
#: The health service's name as plugins list it (the kubelet opens the stream whether or not it is listed).
HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"
#: ``defaultClientCallTimeout``: what a driver has to answer any call.
DEFAULT_CALL_TIMEOUT = 45.0


class DRACallError(KubeletError):
    """A call to a DRA plugin failed; ``code`` is gRPC's status code name, ``details`` its message."""

    def __init__(self, method: str, driver: str, endpoint: str, code: str, details: str) -> None:
        super().__init__(f"rpc error: code = {code} desc = {details}")
        self.method = method
        self.driver = driver
        self.endpoint = endpoint
        self.code = code
        self.details = details


def _v1beta1_request(claims: Sequence[v1.Claim], message: type) -> Any:
    return message(claims=[v1beta1.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims])


def _v1_prepare_response(reply: Any) -> v1.NodePrepareResourcesResponse:
    """``V1Beta1ClientWrapper``: the same answer as a v1 message (no share IDs)."""
    result = v1.NodePrepareResourcesResponse()
    for uid, entry in reply.claims.items():
        out = result.claims[uid]
        out.error = entry.error
        for device in entry.devices:
            out.devices.add(
                request_names=list(device.request_names),
                pool_name=device.pool_name,
                device_name=device.device_name,
                cdi_device_ids=list(device.cdi_device_ids),
            )
    return result


def _v1_unprepare_response(reply: Any) -> v1.NodeUnprepareResourcesResponse:
    result = v1.NodeUnprepareResourcesResponse()
    for uid, entry in reply.claims.items():
        result.claims[uid].error = entry.error
    return result


class DRAPluginClient:
    """The kubelet's side of one plugin instance: its connection, its chosen service, its calls.

    ``on_connection`` is called with the instance whenever :attr:`connected` changes.
    Build it with :meth:`open`; :meth:`close` ends the connection and its monitoring.
    """

    def __init__(
        self,
        driver: str,
        endpoint: str,
        service: str,
        *,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        on_connection: Callable[[DRAPluginClient], None] = lambda _client: None,
    ) -> None:
        if service not in SERVICES_SUPPORTED_BY_KUBELET:
            raise KubeletError(f'internal error: unsupported chosen service: "{service}"')
        self.driver = driver
        self.endpoint = endpoint
        self.service = service
        self.call_timeout = call_timeout
        #: Whether the gRPC connection to :attr:`endpoint` is up now.
        self.connected = False
        self._on_connection = on_connection
        self._channel = grpc.aio.insecure_channel(f"unix:{endpoint}")
        self._v1 = v1_grpc.DRAPluginStub(self._channel)
        self._v1beta1 = v1beta1_grpc.DRAPluginStub(self._channel)
        self._health = health_grpc.DRAResourceHealthStub(self._channel)
        self._monitor: asyncio.Task[None] | None = None
        self._closed = False

    def open(self) -> None:
        """Ask the connection to connect now and watch its state (``conn.Connect()`` and the stats handler)."""
        self._monitor = asyncio.get_running_loop().create_task(self._watch_connection())

    async def _watch_connection(self) -> None:
        state = self._channel.get_state(try_to_connect=True)
        while not self._closed:
            connected = state is grpc.ChannelConnectivity.READY
            if connected != self.connected:
                self.connected = connected
                try:
                    self._on_connection(self)
                except Exception:
                    _log.exception("dev kubelet: DRA connection callback failed")
            await self._channel.wait_for_state_change(state)
            # a lost connection is asked to come back (HandleConn's ConnEnd: conn.Connect())
            state = self._channel.get_state(try_to_connect=True)

    async def close(self) -> None:
        """Close the connection (no reconnects) and stop watching it."""
        if self._closed:
            return
        self._closed = True
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
        await self._channel.close(None)

    def _error(self, method: str, exc: grpc.aio.AioRpcError) -> DRACallError:
        return DRACallError(method, self.driver, self.endpoint, exc.code().name, str(exc.details() or ""))

    async def node_prepare_resources(self, claims: Sequence[v1.Claim]) -> v1.NodePrepareResourcesResponse:
        """NodePrepareResources with the chosen service, 45 s to answer; :class:`DRACallError` on failure."""
        try:
            if self.service == SERVICE_V1:
                reply: v1.NodePrepareResourcesResponse = await self._v1.NodePrepareResources(
                    v1.NodePrepareResourcesRequest(claims=list(claims)), timeout=self.call_timeout
                )
                return reply
            reply = await self._v1beta1.NodePrepareResources(
                _v1beta1_request(claims, v1beta1.NodePrepareResourcesRequest), timeout=self.call_timeout
            )
            return _v1_prepare_response(reply)
        except grpc.aio.AioRpcError as exc:
            raise self._error("NodePrepareResources", exc) from None

    async def node_unprepare_resources(self, claims: Sequence[v1.Claim]) -> v1.NodeUnprepareResourcesResponse:
        """NodeUnprepareResources with the chosen service, 45 s to answer; :class:`DRACallError` on failure."""
        try:
            if self.service == SERVICE_V1:
                answer: v1.NodeUnprepareResourcesResponse = await self._v1.NodeUnprepareResources(
                    v1.NodeUnprepareResourcesRequest(claims=list(claims)), timeout=self.call_timeout
                )
                return answer
            reply = await self._v1beta1.NodeUnprepareResources(
                _v1beta1_request(claims, v1beta1.NodeUnprepareResourcesRequest), timeout=self.call_timeout
            )
            return _v1_unprepare_response(reply)
        except grpc.aio.AioRpcError as exc:
            raise self._error("NodeUnprepareResources", exc) from None

    async def node_watch_resources(self) -> AsyncIterator[Any]:
        """The NodeWatchResources stream's messages, until it ends; :class:`DRACallError` when it fails."""
        call = self._health.NodeWatchResources(health_pb.NodeWatchResourcesRequest())
        try:
            async for message in call:
                yield message
        except grpc.aio.AioRpcError as exc:
            raise self._error("NodeWatchResources", exc) from None
        finally:
            call.cancel()
