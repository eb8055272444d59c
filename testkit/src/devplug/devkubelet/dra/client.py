"""One registered instance of a DRA driver's kubelet plugin, as the kubelet talks to it.

Per release (:mod:`~devplug.devkubelet.dra.releases`):

* **the connection, 1.34 to 1.36** (``pkg/kubelet/cm/dra/plugin/dra_plugin.go``
  and ``dra_plugin_manager.go``, connection monitoring from PR #132058): one
  gRPC connection per instance to ``unix:<endpoint>``, made at registration
  and asked to connect at once (``conn.Connect()``); its state is watched
  (the gRPC stats handler's ``ConnBegin``/``ConnEnd``): the instance is
  *connected* while the connection is up, and a lost connection is asked to
  reconnect (gRPC's own reconnect back-off applies);
* **the connection, 1.32 and 1.33** (``plugin.go`` ``getOrCreateGRPCConn``, 1.32.10
  as KubeEdge vendors it; 1.33's ``registration.go`` makes the plugin with
  ``conn: nil`` the same way): nothing is dialled at registration; the first
  call dials and waits at most 1 s for the connection to leave Connecting
  ("timed out waiting for gRPC connection to be ready"), then keeps it for
  good; nobody watches it (:attr:`DRAPluginClient.connected` still shows its
  state, for tests);
* **the services**: NodePrepareResources and NodeUnprepareResources go to the
  service chosen at registration: ``v1.DRAPlugin`` as is (1.34+),
  ``v1beta1.DRAPlugin`` through the conversion of
  ``k8s.io/kubelet/pkg/apis/dra/v1beta1`` (``V1Beta1ClientWrapper``: the same
  fields, ``share_id`` dropped), and on 1.32 and 1.33 the v1alpha4 service
  (listed as ``v1alpha3.NodeService``, called as ``/v1alpha3.Node/...``: the
  package name is ``v1alpha3``; the messages are v1beta1's, field for field,
  ``V1Alpha4ClientWrapper``). Each call has 45 s (``defaultClientCallTimeout``)
  and fails at once when the connection is down (gRPC's default, fail fast);
* ``share_id`` of a prepared device is read from 1.35 on (``dra/v1`` has no
  field 5 before: the kubelet never sees it);
* NodeWatchResources (``v1alpha1.DRAResourceHealth``) goes over the same
  connection (1.34+; the manager never asks before).

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
from devplug.devkubelet.dra.releases import (
    DEFAULT_RELEASE,
    SERVICE_V1,
    SERVICE_V1ALPHA4,
    SERVICE_V1BETA1,
    ReleaseRules,
    release_rules,
)
from devplug.errors import KubeletError

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "HEALTH_SERVICE",
    "FIRST_CONNECT_TIMEOUT",
    "SERVICE_V1",
    "SERVICE_V1ALPHA4",
    "SERVICE_V1BETA1",
    "SERVICES_SUPPORTED_BY_KUBELET",
    "DRACallError",
    "DRAPluginClient",
]

_log = logging.getLogger("devplug.devkubelet")

#: ``servicesSupportedByKubelet`` (``dra_plugin.go``, 1.34+): most recent first. A release's own list is
#: :attr:`ReleaseRules.services <devplug.devkubelet.dra.releases.ReleaseRules.services>`.
SERVICES_SUPPORTED_BY_KUBELET = (SERVICE_V1, SERVICE_V1BETA1)
#: The health service's name as plugins list it (the kubelet opens the stream whether or not it is listed).
HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"
#: ``defaultClientCallTimeout``: what a driver has to answer any call.
DEFAULT_CALL_TIMEOUT = 45.0
#: 1.32 and 1.33 (``getOrCreateGRPCConn``): how long the first call waits for its connection to leave Connecting.
FIRST_CONNECT_TIMEOUT = 1.0

#: The v1alpha4 service's methods: gRPC package ``v1alpha3``, service ``Node`` (``dra/v1alpha4/api.proto``).
_V1ALPHA4_PREPARE = "/v1alpha3.Node/NodePrepareResources"
_V1ALPHA4_UNPREPARE = "/v1alpha3.Node/NodeUnprepareResources"


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
    """The answer as a v1 message without share IDs (``V1Beta1ClientWrapper``; and a v1 answer to a kubelet
    before 1.35, whose ``dra/v1`` has no ``share_id``)."""
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

    ``rules`` is the release followed (see the module docstring); ``on_connection``
    is called with the instance whenever :attr:`connected` changes. Build it
    with :meth:`open`; :meth:`close` ends the connection and its monitoring.
    """

    def __init__(
        self,
        driver: str,
        endpoint: str,
        service: str,
        *,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        on_connection: Callable[[DRAPluginClient], None] = lambda _client: None,
        rules: ReleaseRules | None = None,
    ) -> None:
        self.rules = rules if rules is not None else release_rules(DEFAULT_RELEASE)
        if service not in self.rules.services:
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
        self._v1alpha4_prepare = self._channel.unary_unary(
            _V1ALPHA4_PREPARE,
            request_serializer=v1beta1.NodePrepareResourcesRequest.SerializeToString,
            response_deserializer=v1beta1.NodePrepareResourcesResponse.FromString,
        )
        self._v1alpha4_unprepare = self._channel.unary_unary(
            _V1ALPHA4_UNPREPARE,
            request_serializer=v1beta1.NodeUnprepareResourcesRequest.SerializeToString,
            response_deserializer=v1beta1.NodeUnprepareResourcesResponse.FromString,
        )
        self._health = health_grpc.DRAResourceHealthStub(self._channel)
        self._monitor: asyncio.Task[None] | None = None
        self._dialled = self.rules.connection_monitoring  # 1.32/1.33: dialled at the first call
        self._closed = False

    def open(self) -> None:
        """Watch the connection's state; from 1.34 on, ask it to connect now (``conn.Connect()``)."""
        self._monitor = asyncio.get_running_loop().create_task(self._watch_connection())

    async def _watch_connection(self) -> None:
        monitored = self.rules.connection_monitoring
        state = self._channel.get_state(try_to_connect=monitored)
        while not self._closed:
            connected = state is grpc.ChannelConnectivity.READY
            if connected != self.connected:
                self.connected = connected
                try:
                    self._on_connection(self)
                except Exception:
                    _log.exception("dev kubelet: DRA connection callback failed")
            await self._channel.wait_for_state_change(state)
            # a lost connection is asked to come back (HandleConn's ConnEnd: conn.Connect()); before 1.34 nobody asks
            state = self._channel.get_state(try_to_connect=monitored)

    async def _connection(self) -> None:
        """1.32/1.33 ``getOrCreateGRPCConn``: the first call dials and waits at most 1 s for it to leave Connecting."""
        if self._dialled:
            return
        state = self._channel.get_state(try_to_connect=True)
        try:
            async with asyncio.timeout(FIRST_CONNECT_TIMEOUT):
                while state in (grpc.ChannelConnectivity.IDLE, grpc.ChannelConnectivity.CONNECTING):
                    await self._channel.wait_for_state_change(state)
                    state = self._channel.get_state(try_to_connect=False)
        except TimeoutError:
            raise KubeletError("timed out waiting for gRPC connection to be ready") from None
        self._dialled = True

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
        await self._connection()
        try:
            if self.service == SERVICE_V1:
                reply: v1.NodePrepareResourcesResponse = await self._v1.NodePrepareResources(
                    v1.NodePrepareResourcesRequest(claims=list(claims)), timeout=self.call_timeout
                )
                return reply if self.rules.share_ids else _v1_prepare_response(reply)
            request = _v1beta1_request(claims, v1beta1.NodePrepareResourcesRequest)
            call = self._v1beta1.NodePrepareResources if self.service == SERVICE_V1BETA1 else self._v1alpha4_prepare
            return _v1_prepare_response(await call(request, timeout=self.call_timeout))
        except grpc.aio.AioRpcError as exc:
            raise self._error("NodePrepareResources", exc) from None

    async def node_unprepare_resources(self, claims: Sequence[v1.Claim]) -> v1.NodeUnprepareResourcesResponse:
        """NodeUnprepareResources with the chosen service, 45 s to answer; :class:`DRACallError` on failure."""
        await self._connection()
        try:
            if self.service == SERVICE_V1:
                answer: v1.NodeUnprepareResourcesResponse = await self._v1.NodeUnprepareResources(
                    v1.NodeUnprepareResourcesRequest(claims=list(claims)), timeout=self.call_timeout
                )
                return answer
            request = _v1beta1_request(claims, v1beta1.NodeUnprepareResourcesRequest)
            call = self._v1beta1.NodeUnprepareResources if self.service == SERVICE_V1BETA1 else self._v1alpha4_unprepare
            return _v1_unprepare_response(await call(request, timeout=self.call_timeout))
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
