"""The dev kubelet: a kubelet's device manager over real gRPC on unix sockets, for tests and demos.

:class:`DevKubelet` serves ``kubelet.sock`` (Registration) and the PodResources
socket, holds one :class:`~devplug.devkubelet.plugin_client.PluginClient` per
registered resource, and admits and removes pods through the
:class:`~devplug.devkubelet.devicemanager.DeviceManager`. Every state change
wakes :meth:`DevKubelet.wait_for`, so tests wait on events, never on sleeps.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import time
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

import grpc.aio

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.devkubelet.devicemanager import DeviceManager, PluginCalls
from devplug.devkubelet.model import (
    AdmittedPod,
    DeviceInfo,
    KubeletEvent,
    PluginOptions,
    PodSpec,
    ResourceView,
)
from devplug.devkubelet.plugin_client import PluginClient, unix_target
from devplug.devkubelet.podresources import PodResourcesServicer, add_podresources_servicer
from devplug.devkubelet.registration import RegistrationServicer, add_registration_servicer
from devplug.errors import KubeletError
from devplug.types import Health

__all__ = ["KUBELET_SOCKET", "DevKubelet", "run_foreground"]

_log = logging.getLogger("devplug.devkubelet")

#: The file name the kubelet serves Registration on, inside the device plugin folder.
KUBELET_SOCKET = "kubelet.sock"


class _Resource:
    """What the dev kubelet keeps about one extended resource."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.client: PluginClient | None = None
        self.superseded: list[PluginClient] = []  # older registrations still streaming (rolling_update_pitfall)
        self.endpoint = ""
        self.options = PluginOptions()
        self.devices: tuple[DeviceInfo, ...] = ()
        self.stream_open = False
        self.registrations = 0
        self.drop_timer: asyncio.TimerHandle | None = None

    def mark_unhealthy(self) -> None:
        self.devices = tuple(DeviceInfo(d.id, Health.UNHEALTHY.value, d.numa_nodes) for d in self.devices)
        self.stream_open = False


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.lstat().st_mode)
    except FileNotFoundError:
        return False


def _describe(predicate: Callable[..., bool]) -> str:
    code = getattr(predicate, "__code__", None)
    name = getattr(predicate, "__qualname__", repr(predicate))
    if code is not None:
        return f"{name} ({Path(code.co_filename).name}:{code.co_firstlineno})"
    return name


class DevKubelet:
    """A stand-in for the kubelet's device manager, served on real unix sockets (asyncio, grpc.aio).

    ``device_plugin_dir`` plays ``/var/lib/kubelet/device-plugins``;
    ``pod_resources_socket`` defaults to ``<parent>/pod-resources/kubelet.sock``.
    ``kep_mode`` makes pod removal call PostStopContainer and Deallocate (the
    unmerged KEP); stock kubelets never do. ``pod_resources_rate`` is the
    PodResources token bucket (calls per second, burst), None for no limit.
    ``drop_after`` drops a resource whose stream ended and that did not
    register again within that many seconds (the kubelet waits 5 minutes);
    None (the default) never drops. ``rolling_update_pitfall`` reproduces the
    kubelet's handling of a duplicate registration exactly: the old
    registration is not closed, its stream keeps feeding the resource, and
    when it ends the kubelet disconnects the resource's *current* registration
    (the new plugin's devices go unhealthy). By default the old client is
    closed at once and its end is ignored (newest wins cleanly).
    """

    def __init__(
        self,
        device_plugin_dir: Path,
        *,
        pod_resources_socket: Path | None = None,
        kep_mode: bool = False,
        register_dial_timeout: float = 10.0,
        pod_resources_rate: tuple[float, int] | None = (100.0, 10),
        drop_after: float | None = None,
        rolling_update_pitfall: bool = False,
    ) -> None:
        self.device_plugin_dir = Path(device_plugin_dir).absolute()
        self.pod_resources_socket = (
            Path(pod_resources_socket).absolute()
            if pod_resources_socket is not None
            else self.device_plugin_dir.parent / "pod-resources" / KUBELET_SOCKET
        )
        #: When True, pod removal calls PostStopContainer and Deallocate on plugins that advertise them.
        self.kep_mode = kep_mode
        #: When False, every PodResources call fails with UNAVAILABLE (a simulated outage).
        self.pod_resources_available = True
        #: Every call the dev kubelet made or received, oldest first.
        self.events: list[KubeletEvent] = []
        self._dial_timeout = register_dial_timeout
        self._pod_resources_rate = pod_resources_rate
        self._drop_after = drop_after
        self._rolling_update_pitfall = rolling_update_pitfall
        self._resources: dict[str, _Resource] = {}
        self._listeners: list[Callable[[KubeletEvent], None]] = []
        self._waiters: set[asyncio.Future[None]] = set()
        self._background: set[asyncio.Task[Any]] = set()
        self._servers: list[grpc.aio.Server] = []
        self._generation = 0
        self._running = False
        self._pod_lock: asyncio.Lock | None = None
        self._manager = DeviceManager(self._plugin_for, self._devices_for, self._record)

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def kubelet_socket(self) -> Path:
        """Where Registration is served: ``device_plugin_dir / "kubelet.sock"``."""
        return self.device_plugin_dir / KUBELET_SOCKET

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._running

    async def start(self) -> None:
        """Start like a kubelet: delete every unix socket at the top of the folder, then serve.

        Regular files (such as ``kubelet_internal_checkpoint``) are kept.
        Serves Registration on ``kubelet.sock`` and PodResources on its socket.
        """
        if self._running:
            raise KubeletError("the dev kubelet is already running")
        kubelet_target = unix_target(self.kubelet_socket)
        pod_resources_target = unix_target(self.pod_resources_socket)
        self.device_plugin_dir.mkdir(parents=True, exist_ok=True)
        self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
        for entry in sorted(self.device_plugin_dir.iterdir()):
            if _is_socket(entry):
                entry.unlink(missing_ok=True)
        if _is_socket(self.pod_resources_socket):
            self.pod_resources_socket.unlink()
        self._generation += 1
        registration = grpc.aio.server()
        add_registration_servicer(registration, RegistrationServicer(self._register, self._refused))
        pod_resources = grpc.aio.server()
        add_podresources_servicer(
            pod_resources,
            PodResourcesServicer(
                self._manager.records,
                self._allocatable,
                lambda: self.pod_resources_available,
                self._pod_resources_rate,
            ),
        )
        for server, target in ((registration, kubelet_target), (pod_resources, pod_resources_target)):
            try:
                server.add_insecure_port(target)
            except RuntimeError as exc:
                for started in self._servers:
                    await started.stop(None)
                self._servers.clear()
                raise KubeletError(f"cannot serve on {target}: {exc}") from exc
            await server.start()
            self._servers.append(server)
        self._running = True
        self._changed()

    async def stop(self) -> None:
        """Stop serving, close every plugin channel, remove the dev kubelet's sockets.

        Registrations end with it (devices show as unhealthy); pods and their
        devices are kept.
        """
        if not self._running:
            return
        self._running = False
        self._generation += 1
        servers, self._servers = self._servers, []
        for server in servers:
            await server.stop(None)
        for resource in self._resources.values():
            clients = [*resource.superseded, resource.client]
            resource.client, resource.superseded = None, []
            resource.mark_unhealthy()
            for client in clients:
                if client is not None:
                    await client.close()
        for path in (self.kubelet_socket, self.pod_resources_socket):
            if _is_socket(path):
                path.unlink(missing_ok=True)
        for task in list(self._background):
            await task
        self._changed()

    async def restart(self) -> None:
        """A kubelet restart: stop, forget every registration, start again (sockets deleted anew).

        Pods and their device assignments survive, like the kubelet's checkpoint.
        Every resource shows its devices as unhealthy until its plugin registers again.
        """
        self._record("restart", "", f"restarting; {len(self._resources)} resource(s) must register again", ())
        await self.stop()
        await self.start()

    async def __aenter__(self) -> DevKubelet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- observation -----------------------------------------------------------------------------

    def add_listener(self, listener: Callable[[KubeletEvent], None]) -> None:
        """Call ``listener`` with every event as it is recorded (from the event loop)."""
        self._listeners.append(listener)

    def resource(self, name: str) -> ResourceView | None:
        """A snapshot of a resource that registered at least once (None if unknown or dropped)."""
        res = self._resources.get(name)
        if res is None:
            return None
        return ResourceView(
            name=res.name,
            endpoint=res.endpoint,
            options=res.options,
            devices=res.devices,
            stream_open=res.stream_open,
            registered=res.client is not None,
            registrations=res.registrations,
            in_use=frozenset(self._manager.in_use(name)),
        )

    def resources(self) -> list[ResourceView]:
        """Every known resource, by name."""
        return [view for name in sorted(self._resources) if (view := self.resource(name)) is not None]

    def registrations(self, resource: str) -> int:
        """How many times ``resource`` registered successfully (counted across restarts)."""
        res = self._resources.get(resource)
        return res.registrations if res is not None else 0

    def pods(self) -> list[AdmittedPod]:
        """The admitted pods, in admission order."""
        return [record.admitted() for record in self._manager.records()]

    def events_of(self, kind: str, resource: str | None = None) -> list[KubeletEvent]:
        """The recorded events of one kind (and resource, if given)."""
        return [e for e in self.events if e.kind == kind and (resource is None or e.resource == resource)]

    async def wait_for(
        self, predicate: Callable[[DevKubelet], bool], timeout: float = 5.0, *, what: str | None = None
    ) -> None:
        """Return once ``predicate(self)`` is true, re-checked on every state change.

        Raises :class:`TimeoutError` naming what was awaited (``what``, or the
        predicate's name and line) and the resources' state.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate(self):
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(
                    f"dev kubelet: timed out after {timeout:g}s waiting for {what or _describe(predicate)}; "
                    f"{self._summary()}"
                )
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.add(waiter)
            try:
                await asyncio.wait_for(waiter, remaining)
            except asyncio.TimeoutError:
                pass
            finally:
                self._waiters.discard(waiter)

    async def wait_registered(self, resource: str, timeout: float = 5.0, *, after: int = 0) -> None:
        """Wait until ``resource`` has registered more than ``after`` times (``after=n``: a re-registration)."""
        await self.wait_for(
            lambda k: k.registrations(resource) > after,
            timeout,
            what=f"{resource} to register (registration count > {after})",
        )

    def _summary(self) -> str:
        if not self._resources:
            return "no resource has registered"
        parts = []
        for res in self._resources.values():
            healthy = sum(1 for d in res.devices if d.healthy)
            parts.append(
                f"{res.name}: registrations={res.registrations} registered={res.client is not None} "
                f"stream_open={res.stream_open} capacity={len(res.devices)} allocatable={healthy}"
            )
        return "; ".join(parts)

    # -- pods ------------------------------------------------------------------------------------

    def _lock(self) -> asyncio.Lock:
        if self._pod_lock is None:
            self._pod_lock = asyncio.Lock()
        return self._pod_lock

    async def admit_pod(self, pod: PodSpec) -> AdmittedPod:
        """Admit a pod: allocate devices for every container (init containers first), then start them.

        Raises :class:`KubeletError` with the plugin's message when the pod is
        rejected (nothing is kept), or
        :class:`~devplug.devkubelet.devicemanager.ContainerStartError` when it
        was admitted but a container's PreStartContainer failed (the pod is kept).
        """
        async with self._lock():
            try:
                return await self._manager.admit(pod, kep_mode=self.kep_mode)
            finally:
                self._changed()

    async def start_container(self, pod_name: str, container: str, namespace: str = "default") -> None:
        """(Re)start one container: PreStartContainer again when its plugins require it."""
        async with self._lock():
            try:
                await self._manager.start_container((namespace, pod_name), container)
            finally:
                self._changed()

    async def remove_pod(self, pod_name: str, namespace: str = "default") -> None:
        """Remove a pod: its devices become free and it leaves PodResources.

        In KEP mode, PostStopContainer and Deallocate are called first on
        plugins that advertise them; stock kubelets call nothing.
        """
        async with self._lock():
            try:
                await self._manager.remove((namespace, pod_name), kep_mode=self.kep_mode)
            finally:
                self._changed()

    # -- internals -------------------------------------------------------------------------------

    def _changed(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _record(self, kind: str, resource: str, detail: str, device_ids: tuple[str, ...] = ()) -> None:
        event = KubeletEvent(time.time(), kind, resource, detail, tuple(device_ids))
        self.events.append(event)
        _log.debug("%s", event)
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:
                _log.exception("dev kubelet event listener failed")
        self._changed()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _plugin_for(self, resource: str) -> PluginCalls | None:
        res = self._resources.get(resource)
        return res.client if res is not None else None

    def _devices_for(self, resource: str) -> tuple[DeviceInfo, ...] | None:
        res = self._resources.get(resource)
        return res.devices if res is not None else None

    def _allocatable(self) -> Mapping[str, list[tuple[str, tuple[int, ...]]]]:
        return {
            name: [(d.id, d.numa_nodes) for d in res.devices if d.healthy]
            for name, res in sorted(self._resources.items())
            if res.client is not None
        }

    def _refused(self, resource: str, reason: str) -> None:
        self._record("register-refused", resource, reason)

    async def _register(self, request: dp.RegisterRequest) -> None:
        name = str(request.resource_name)
        endpoint = str(request.endpoint)
        generation = self._generation
        socket = Path(os.path.normpath(f"{self.device_plugin_dir}/{endpoint}"))
        client = await PluginClient.connect(name, endpoint, socket, self._dial_timeout)
        if generation != self._generation or not self._running:
            await client.close()
            raise KubeletError("the kubelet restarted while the registration was in progress")
        res = self._resources.get(name)
        if res is None:
            res = self._resources[name] = _Resource(name)
        old, res.client = res.client, client
        res.endpoint = endpoint
        res.options = client.options
        res.registrations += 1
        res.stream_open = False
        if res.drop_timer is not None:
            res.drop_timer.cancel()
            res.drop_timer = None
        opts = client.options
        flags = [
            flag
            for flag, on in (
                ("pre_start_required", opts.pre_start_required),
                ("get_preferred_allocation_available", opts.get_preferred_allocation_available),
                ("post_stop_required", opts.post_stop_required),
                ("deallocate_available", opts.deallocate_available),
            )
            if on
        ]
        detail = f"endpoint {endpoint}, options [{', '.join(flags)}]"
        if old is not None:
            detail += f", replaces endpoint {old.endpoint}"
        self._record("register", name, detail)
        if old is not None:
            if self._rolling_update_pitfall:
                res.superseded.append(old)
            else:
                await old.close()
        client.watch(
            on_opened=lambda: self._stream_opened(res, client),
            on_list=lambda devices: self._stream_list(res, client, devices),
            on_end=lambda reason: self._stream_ended(res, client, reason),
        )

    def _stream_opened(self, res: _Resource, client: PluginClient) -> None:
        if res.client is client:
            res.stream_open = True
            self._changed()

    def _stream_list(self, res: _Resource, client: PluginClient, devices: tuple[DeviceInfo, ...]) -> None:
        if res.client is not client and client not in res.superseded:
            return
        res.devices = devices
        healthy = sum(1 for d in devices if d.healthy)
        unhealthy = tuple(d.id for d in devices if not d.healthy)
        detail = f"{len(devices)} device(s), {healthy} healthy"
        if unhealthy:
            detail += ", unhealthy:"
        self._record("list-and-watch", res.name, detail, unhealthy)

    def _stream_ended(self, res: _Resource, client: PluginClient, reason: str) -> None:
        if client in res.superseded:
            # the kubelet looks its client up by resource name: an old stream's end disconnects the new one
            res.superseded.remove(client)
            self._spawn(client.close())
            current = res.client
            if current is None:
                return
            reason = f"an older registration's stream ended ({reason}), so the current one was disconnected"
            client = current
        elif res.client is not client:
            return
        res.client = None
        res.mark_unhealthy()
        self._record("stream-ended", res.name, f"{reason}; every device marked unhealthy")
        self._spawn(client.close())
        if self._drop_after is not None:
            res.drop_timer = asyncio.get_running_loop().call_later(self._drop_after, self._drop, res)

    def _drop(self, res: _Resource) -> None:
        if self._resources.get(res.name) is res and res.client is None:
            del self._resources[res.name]
            self._record("resource-dropped", res.name, f"no registration within {self._drop_after:g}s")


async def run_foreground(
    device_plugin_dir: Path, *, kep_mode: bool = False, pod_resources_socket: Path | None = None
) -> None:
    """Serve a dev kubelet until cancelled, logging every event as a line (``devplug.devkubelet``, INFO).

    For ``devplug kubelet --dir DIR``.
    """
    kubelet = DevKubelet(device_plugin_dir, kep_mode=kep_mode, pod_resources_socket=pod_resources_socket)
    kubelet.add_listener(lambda event: _log.info("%s", event))
    await kubelet.start()
    _log.info(
        "dev kubelet serving %s and %s%s",
        kubelet.kubelet_socket,
        kubelet.pod_resources_socket,
        " (KEP mode: PostStopContainer and Deallocate are called)" if kep_mode else "",
    )
    try:
        await asyncio.Event().wait()
    finally:
        await kubelet.stop()
        _log.info("dev kubelet stopped")
