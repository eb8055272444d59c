"""A small but real DRA kubelet plugin for the dev kubelet's DRA tests.

It serves ``pluginregistration.Registration`` on a registration socket in the
kubelet's ``plugins_registry/`` and, on its own service socket,
``v1.DRAPlugin`` and/or ``v1beta1.DRAPlugin`` and ``v1alpha1.DRAResourceHealth``
(each a real grpc.aio server on a real unix socket), as the Go helper
(``k8s.io/dynamic-resource-allocation/kubeletplugin``) lays them out. It
records every call and registration status it gets, answers prepare and
unprepare as its :class:`Answers` say (devices, per-claim errors, claims left
out, a call error), and streams the health messages a test queues.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from devplug.api.gen.dra.v1 import api_pb2 as v1
from devplug.api.gen.dra.v1 import api_pb2_grpc as v1_grpc
from devplug.api.gen.dra.v1beta1 import api_pb2 as v1beta1
from devplug.api.gen.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from devplug.api.gen.drahealth.v1alpha1 import api_pb2 as health_pb
from devplug.api.gen.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from devplug.api.gen.pluginregistration.v1 import api_pb2 as reg_pb
from devplug.api.gen.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from devplug.devkubelet import ContainerSpec, DevKubelet, DRAConfig, PodClaim, PodSpec, ResourceClaimRef

DRIVER = "gpu.example.com"

#: Timings for tests: the kubelet's behaviour, at a pace a test can wait for.
FAST = DRAConfig(
    reconcile_period=0.05,
    dial_timeout=2.0,
    get_info_timeout=2.0,
    notify_timeout=2.0,
    call_timeout=5.0,
    wiping_delay=30.0,
    manager_reconcile_period=None,
    pod_resync_period=None,
    pod_sync_backoff=None,
    health_stream_period=0.1,
)


@dataclass
class Answers:
    """What the plugin answers; change it between calls.

    ``devices`` maps a claim UID to the devices prepared for it (default: one
    device ``pool-0/dev-<uid>`` with CDI ID ``example.com/gpu=<uid>``);
    ``prepare_errors``/``unprepare_errors`` a claim UID to its error string;
    ``skip`` holds claim UIDs left out of the answer; ``extra`` a claim UID
    answered though not asked for; ``call_error`` fails the whole call with
    this gRPC status code; ``delay`` makes every prepare/unprepare answer that late.
    """

    devices: dict[str, list[Any]] = field(default_factory=dict)
    prepare_errors: dict[str, str] = field(default_factory=dict)
    unprepare_errors: dict[str, str] = field(default_factory=dict)
    skip: set[str] = field(default_factory=set)
    extra: str | None = None
    call_error: grpc.StatusCode | None = None
    delay: float = 0.0


def device(pool: str, name: str, *cdi: str, requests: Sequence[str] = (), share_id: str | None = None) -> Any:
    """A v1 Device for :attr:`Answers.devices`."""
    msg = v1.Device(request_names=list(requests), pool_name=pool, device_name=name, cdi_device_ids=list(cdi))
    if share_id is not None:
        msg.share_id = share_id
    return msg


def health_report(*devices: tuple[str, str, int], timeout: int = 0, message: str = "") -> Any:
    """A NodeWatchResourcesResponse: ``(pool, device, health_pb.HEALTHY|UNHEALTHY|UNKNOWN)`` each."""
    return health_pb.NodeWatchResourcesResponse(
        devices=[
            health_pb.DeviceHealth(
                device=health_pb.DeviceIdentifier(pool_name=pool, device_name=dev),
                health=status,  # type: ignore[arg-type]
                last_updated_time=1,
                health_check_timeout_seconds=timeout,
                message=message,
            )
            for pool, dev, status in devices
        ]
    )


_END = object()


class DRAPlugin:
    """One instance of a DRA driver's kubelet plugin (see the module docstring).

    ``services`` is what it lists in ``supported_versions`` and serves (any of
    ``v1.DRAPlugin``, ``v1beta1.DRAPlugin``, ``v1alpha1.DRAResourceHealth``);
    ``serve`` can serve other services than it lists. ``instance`` names its
    sockets as the Go helper's rolling updates do (``<driver>-<uid>-reg.sock``,
    ``dra-<uid>.sock``).
    """

    def __init__(
        self,
        root: Path,
        driver: str = DRIVER,
        *,
        services: Sequence[str] = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"),
        serve: Sequence[str] | None = None,
        instance: str = "",
        plugin_type: str = "DRAPlugin",
        registration_name: str | None = None,
    ) -> None:
        self.root = root
        self.driver = driver
        self.services = list(services)
        self.serve = list(serve) if serve is not None else list(services)
        self.plugin_type = plugin_type
        suffix = f"-{instance}" if instance else ""
        self.registration_socket = root / "plugins_registry" / (registration_name or f"{driver}{suffix}-reg.sock")
        self.service_socket = root / "plugins" / driver / f"dra{suffix}.sock"
        self.answers = Answers()
        #: (method, claim UIDs) of every prepare/unprepare call, oldest first.
        self.calls: list[tuple[str, list[str]]] = []
        #: The full requests (v1 or v1beta1 messages), oldest first.
        self.requests: list[tuple[str, Any]] = []
        #: Every NotifyRegistrationStatus received: (plugin_registered, error).
        self.statuses: list[tuple[bool, str]] = []
        self.get_info_calls = 0
        #: When each GetInfo came (the event loop's clock).
        self.get_info_times: list[float] = []
        self.health_streams = 0
        self._health_queues: list[asyncio.Queue[object]] = []
        self._registration: grpc.aio.Server | None = None
        self._service: grpc.aio.Server | None = None
        self._changed = asyncio.Condition()

    # -- serving -----------------------------------------------------------------------------------

    async def start(self) -> DRAPlugin:
        """Serve the DRA services, then the registration socket (so the kubelet can call at once)."""
        await self.start_service()
        await self.start_registration()
        return self

    async def start_service(self) -> None:
        self.service_socket.parent.mkdir(parents=True, exist_ok=True)
        self.service_socket.unlink(missing_ok=True)
        server = grpc.aio.server()
        if "v1.DRAPlugin" in self.serve:
            v1_grpc.add_DRAPluginServicer_to_server(_V1(self), server)
        if "v1beta1.DRAPlugin" in self.serve:
            v1beta1_grpc.add_DRAPluginServicer_to_server(_V1beta1(self), server)
        if "v1alpha1.DRAResourceHealth" in self.serve:
            health_grpc.add_DRAResourceHealthServicer_to_server(_Health(self), server)
        server.add_insecure_port(f"unix:{self.service_socket}")
        await server.start()
        self._service = server

    async def start_registration(self) -> None:
        self.registration_socket.parent.mkdir(parents=True, exist_ok=True)
        self.registration_socket.unlink(missing_ok=True)
        server = grpc.aio.server()
        reg_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix:{self.registration_socket}")
        await server.start()
        self._registration = server

    async def stop_service(self) -> None:
        """Stop serving the DRA services (the process died): the socket file stays."""
        if self._service is not None:
            await self._service.stop(None)
            self._service = None

    async def stop_registration(self, *, remove_socket: bool = True) -> None:
        """Stop serving registration; ``remove_socket`` as a plugin cleaning up (else it stays, as after kill -9)."""
        if self._registration is not None:
            await self._registration.stop(None)
            self._registration = None
        if remove_socket:
            self.registration_socket.unlink(missing_ok=True)

    async def stop(self) -> None:
        """A clean shutdown: the registration socket removed, then the service stopped."""
        await self.stop_registration()
        await self.stop_service()
        for queue in self._health_queues:
            queue.put_nowait(_END)

    # -- what happened -----------------------------------------------------------------------------

    async def note(self, method: str, request: Any) -> None:
        async with self._changed:
            self.calls.append((method, [c.uid for c in request.claims]))
            self.requests.append((method, request))
            self._changed.notify_all()
        if self.answers.delay:
            await asyncio.sleep(self.answers.delay)  # a slow driver

    async def poke(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[DRAPlugin], bool], timeout: float = 5.0, what: str = "") -> None:
        """Until ``predicate(self)`` holds, re-checked at every call the plugin gets; TimeoutError naming ``what``."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: predicate(self)), timeout)
            except asyncio.TimeoutError:
                raise TimeoutError(
                    f"DRA plugin {self.driver}: timed out after {timeout:g}s waiting for {what or predicate}; "
                    f"calls={self.calls} statuses={self.statuses}"
                ) from None

    def calls_of(self, method: str) -> list[list[str]]:
        """The claim UIDs of every call to ``method`` (``prepare`` or ``unprepare``), oldest first."""
        return [uids for name, uids in self.calls if name == method]

    # -- health ----------------------------------------------------------------------------------

    def send_health(self, report: Any) -> None:
        """Send ``report`` on every open health stream."""
        for queue in self._health_queues:
            queue.put_nowait(report)

    def end_health_streams(self) -> None:
        """End every open health stream (the plugin returns from NodeWatchResources)."""
        for queue in self._health_queues:
            queue.put_nowait(_END)

    async def _stream(self) -> AsyncIterator[Any]:
        queue: asyncio.Queue[object] = asyncio.Queue()
        self._health_queues.append(queue)
        self.health_streams += 1
        await self.poke()
        try:
            while True:
                item = await queue.get()
                if item is _END:
                    return
                yield item
        finally:
            self._health_queues.remove(queue)

    @property
    def open_health_streams(self) -> int:
        return len(self._health_queues)


class _Registration(reg_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, plugin: DRAPlugin) -> None:
        self._plugin = plugin

    async def GetInfo(self, request: Any, context: Any) -> Any:
        plugin = self._plugin
        plugin.get_info_calls += 1
        plugin.get_info_times.append(asyncio.get_running_loop().time())
        await plugin.poke()
        return reg_pb.PluginInfo(
            type=plugin.plugin_type,
            name=plugin.driver,
            endpoint=str(plugin.service_socket),
            supported_versions=plugin.services,
        )

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        plugin = self._plugin
        async with plugin._changed:
            plugin.statuses.append((bool(request.plugin_registered), str(request.error)))
            plugin._changed.notify_all()
        return reg_pb.RegistrationStatusResponse()


def _prepare(plugin: DRAPlugin, request: Any, response: Any, with_share_id: bool) -> Any:
    answers = plugin.answers
    for claim in request.claims:
        if claim.uid in answers.skip:
            continue
        entry = response.claims[claim.uid]
        if claim.uid in answers.prepare_errors:
            entry.error = answers.prepare_errors[claim.uid]
            continue
        devices = answers.devices.get(claim.uid)
        if devices is None:
            devices = [device("pool-0", f"dev-{claim.uid}", f"example.com/gpu={claim.uid}")]
        for dev in devices:
            out = entry.devices.add(
                request_names=list(dev.request_names),
                pool_name=dev.pool_name,
                device_name=dev.device_name,
                cdi_device_ids=list(dev.cdi_device_ids),
            )
            if with_share_id and dev.HasField("share_id"):
                out.share_id = dev.share_id
    if answers.extra is not None:
        response.claims[answers.extra].error = ""
    return response


def _unprepare(plugin: DRAPlugin, request: Any, response: Any) -> Any:
    answers = plugin.answers
    for claim in request.claims:
        if claim.uid in answers.skip:
            continue
        response.claims[claim.uid].error = answers.unprepare_errors.get(claim.uid, "")
    if answers.extra is not None:
        response.claims[answers.extra].error = ""
    return response


class _V1(v1_grpc.DRAPluginServicer):  # type: ignore[misc]
    def __init__(self, plugin: DRAPlugin) -> None:
        self._plugin = plugin

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        await self._plugin.note("prepare", request)
        if self._plugin.answers.call_error is not None:
            await context.abort(self._plugin.answers.call_error, "the plugin failed the call")
        return _prepare(self._plugin, request, v1.NodePrepareResourcesResponse(), True)

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        await self._plugin.note("unprepare", request)
        if self._plugin.answers.call_error is not None:
            await context.abort(self._plugin.answers.call_error, "the plugin failed the call")
        return _unprepare(self._plugin, request, v1.NodeUnprepareResourcesResponse())


class _V1beta1(v1beta1_grpc.DRAPluginServicer):  # type: ignore[misc]
    def __init__(self, plugin: DRAPlugin) -> None:
        self._plugin = plugin

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        await self._plugin.note("prepare-v1beta1", request)
        if self._plugin.answers.call_error is not None:
            await context.abort(self._plugin.answers.call_error, "the plugin failed the call")
        return _prepare(self._plugin, request, v1beta1.NodePrepareResourcesResponse(), False)

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        await self._plugin.note("unprepare-v1beta1", request)
        if self._plugin.answers.call_error is not None:
            await context.abort(self._plugin.answers.call_error, "the plugin failed the call")
        return _unprepare(self._plugin, request, v1beta1.NodeUnprepareResourcesResponse())


class _Health(health_grpc.DRAResourceHealthServicer):  # type: ignore[misc]
    def __init__(self, plugin: DRAPlugin) -> None:
        self._plugin = plugin

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async for report in self._plugin._stream():
            yield report


@contextlib.asynccontextmanager
async def dra_kubelet(plugin_dir: Path, config: DRAConfig = FAST, **options: Any) -> AsyncIterator[DevKubelet]:
    """A started dev kubelet with DRA (its root: ``plugin_dir.parent``), closed afterwards."""
    kubelet = DevKubelet(plugin_dir, dra=config, pod_resources_rate=None, **options)
    await kubelet.start()
    try:
        yield kubelet
    finally:
        await kubelet.close()


def claim_pod(
    name: str, uid: str, *claims: tuple[str, str], namespace: str = "default", driver: str = DRIVER
) -> PodSpec:
    """A pod whose container ``app`` uses one pod claim per ``(claim name, claim UID)``, named like the claim."""
    return PodSpec(
        name,
        [ContainerSpec("app", claims=[c for c, _ in claims])],
        namespace=namespace,
        uid=uid,
        resource_claims=[PodClaim(c, ResourceClaimRef(namespace, c, u, (driver,))) for c, u in claims],
    )


async def registered(kubelet: DevKubelet, plugin: DRAPlugin, count: int = 1, timeout: float = 5.0) -> None:
    """Wait until the kubelet has ``count`` connected instances of the plugin's driver and the plugin heard so."""
    await kubelet.wait_for(
        lambda k: sum(1 for v in k.dra_plugins(plugin.driver) if v.connected) >= count,
        timeout,
        what=f"{count} connected instance(s) of {plugin.driver}",
    )
    await plugin.wait_for(lambda p: (True, "") in p.statuses, timeout, what="NotifyRegistrationStatus(true)")
