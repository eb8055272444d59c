"""A small but real device plugin server for the dev kubelet's tests.

It serves ``v1beta1.DevicePlugin`` over grpc.aio on a unix socket in the device
plugin folder, advertises a configurable device list and options, records
every call it gets, and can be told to fail a call or end its streams.
Allocate hands out ``/dev/<id>`` for each device, a character device it makes
in ``<folder's parent>/dev``, the node's /dev of :func:`running_kubelet`'s kubelet.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.api.gen.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from devplug.api.gen.podresources.v1 import api_pb2 as pr
from devplug.api.gen.podresources.v1 import api_pb2_grpc as pr_grpc
from devplug.devkubelet import DevKubelet, ResourceView
from devplug.testing.devnodes import make_char_device
from devplug.testing.plugin import cgroup_layout_for


@dataclass(frozen=True)
class Dev:
    """One device the fake plugin advertises."""

    id: str
    health: str = "Healthy"
    numa: tuple[int, ...] = ()

    def to_pb(self) -> Any:
        msg = dp.Device(ID=self.id, health=self.health)
        if self.numa:
            msg.topology.nodes.extend(dp.NUMANode(ID=n) for n in self.numa)
        return msg


def devs(*ids: str, numa: tuple[int, ...] = ()) -> list[Dev]:
    """Healthy devices with these IDs."""
    return [Dev(i, numa=numa) for i in ids]


@dataclass
class Behaviour:
    """What the fake plugin answers; change it between calls."""

    pre_start_required: bool = False
    preferred_available: bool = False
    post_stop_required: bool = False
    deallocate_available: bool = False
    preferred: Sequence[str] | None = None  # None: echo the must-includes, then the first available
    preferred_error: str | None = None
    allocate_errors: dict[int, str] = field(default_factory=dict)  # Allocate call number (1-based) -> message
    allocate_empty: set[int] = field(default_factory=set)  # Allocate call numbers answered with no container response
    pre_start_error: str | None = None
    envs_per_device: bool = True  # Allocate answers DEVICES=<ids> in envs
    allocate_gate: asyncio.Event | None = None  # Allocate waits for it (a plugin stuck in Allocate)
    pre_start_gate: asyncio.Event | None = None  # PreStartContainer waits for it
    regular_files: bool = False  # Allocate hands out regular files, not device nodes (what runtimes refuse)


class _Servicer(dp_grpc.DevicePluginServicer):  # type: ignore[misc]
    def __init__(self, plugin: FakePlugin) -> None:
        self._plugin = plugin

    async def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        b = self._plugin.behaviour
        self._plugin.record("GetDevicePluginOptions", request)
        return dp.DevicePluginOptions(
            pre_start_required=b.pre_start_required,
            get_preferred_allocation_available=b.preferred_available,
            post_stop_required=b.post_stop_required,
            deallocate_available=b.deallocate_available,
        )

    async def ListAndWatch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        plugin = self._plugin
        queue: asyncio.Queue[list[Dev] | None] = asyncio.Queue()
        plugin.streams.append(queue)
        plugin.record("ListAndWatch", request)
        try:
            yield dp.ListAndWatchResponse(devices=[d.to_pb() for d in plugin.devices])
            while True:
                item = await queue.get()
                if item is None:
                    return
                yield dp.ListAndWatchResponse(devices=[d.to_pb() for d in item])
        finally:
            plugin.streams.remove(queue)
            plugin.record("ListAndWatch-ended", request)

    async def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        b = self._plugin.behaviour
        self._plugin.record("GetPreferredAllocation", request)
        if b.preferred_error is not None:
            await context.abort(grpc.StatusCode.INTERNAL, b.preferred_error)
        responses = []
        for creq in request.container_requests:
            if b.preferred is not None:
                ids = list(b.preferred)
            else:
                ids = list(creq.must_include_deviceIDs)
                ids += [i for i in creq.available_deviceIDs if i not in ids][: creq.allocation_size - len(ids)]
            responses.append(dp.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return dp.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(self, request: Any, context: Any) -> Any:
        plugin = self._plugin
        plugin.record("Allocate", request)
        number = len(plugin.requests("Allocate"))
        error = plugin.behaviour.allocate_errors.get(number)
        if plugin.behaviour.allocate_gate is not None:
            await plugin.behaviour.allocate_gate.wait()
        if error is not None:
            await context.abort(grpc.StatusCode.INTERNAL, error)
        if number in plugin.behaviour.allocate_empty:
            return dp.AllocateResponse()
        plugin.dev_root.mkdir(exist_ok=True)
        for creq in request.container_requests:
            for device_id in creq.devices_ids:
                if plugin.behaviour.regular_files:
                    (plugin.dev_root / device_id).unlink(missing_ok=True)
                    (plugin.dev_root / device_id).write_text("")
                else:
                    make_char_device(plugin.dev_root / device_id)
        responses = [
            dp.ContainerAllocateResponse(
                envs={"DEVICES": ",".join(creq.devices_ids)},
                devices=[
                    dp.DeviceSpec(container_path=f"/dev/{i}", host_path=f"/dev/{i}", permissions="rw")
                    for i in creq.devices_ids
                ],
            )
            for creq in request.container_requests
        ]
        return dp.AllocateResponse(container_responses=responses)

    async def PreStartContainer(self, request: Any, context: Any) -> Any:
        self._plugin.record("PreStartContainer", request)
        if self._plugin.behaviour.pre_start_gate is not None:
            await self._plugin.behaviour.pre_start_gate.wait()
        if self._plugin.behaviour.pre_start_error is not None:
            await context.abort(grpc.StatusCode.INTERNAL, self._plugin.behaviour.pre_start_error)
        return dp.PreStartContainerResponse()

    async def PostStopContainer(self, request: Any, context: Any) -> Any:
        self._plugin.record("PostStopContainer", request)
        return dp.PostStopContainerResponse()

    async def Deallocate(self, request: Any, context: Any) -> Any:
        self._plugin.record("Deallocate", request)
        return dp.DeallocateResponse()


class FakePlugin:
    """A device plugin for ``resource`` serving ``directory/endpoint``; records ``(method, request)`` calls.

    Create, start and register it from coroutines on the event loop that runs it.
    """

    def __init__(
        self,
        directory: Path,
        resource: str = "example.com/gpu",
        devices: Sequence[Dev] = (),
        *,
        endpoint: str = "fake.sock",
        behaviour: Behaviour | None = None,
    ) -> None:
        self.directory = directory
        self.resource = resource
        self.devices = list(devices)
        self.endpoint = endpoint
        self.behaviour = behaviour or Behaviour()
        self.calls: list[tuple[str, Any]] = []
        self.streams: list[asyncio.Queue[list[Dev] | None]] = []
        self._server: grpc.aio.Server | None = None
        self._changed = asyncio.Event()

    @property
    def socket(self) -> Path:
        return self.directory / self.endpoint

    @property
    def dev_root(self) -> Path:
        """Where the device nodes it hands out are: the node's /dev (see :func:`running_kubelet`)."""
        return node_dev_root(self.directory)

    def record(self, method: str, request: Any) -> None:
        self.calls.append((method, request))
        self._changed.set()

    def requests(self, method: str) -> list[Any]:
        """The requests of every call to ``method``, oldest first."""
        return [request for name, request in self.calls if name == method]

    async def wait_calls(self, method: str, count: int = 1, timeout: float = 5.0) -> None:
        """Wait until ``method`` was called at least ``count`` times."""

        async def wait() -> None:
            while len(self.requests(method)) < count:
                self._changed.clear()
                await self._changed.wait()

        try:
            await asyncio.wait_for(wait(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(
                f"{method} called {len(self.requests(method))} times, expected {count}; calls: "
                f"{[name for name, _ in self.calls]}"
            ) from None

    async def start(self) -> None:
        server = grpc.aio.server()
        dp_grpc.add_DevicePluginServicer_to_server(_Servicer(self), server)
        server.add_insecure_port(f"unix:{self.socket}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
            self._server = None

    async def register(
        self,
        kubelet_socket: Path,
        *,
        version: str = "v1beta1",
        resource: str | None = None,
        options: Any = None,
    ) -> None:
        """Call Register on the kubelet; raises grpc.aio.AioRpcError when refused.

        ``options`` (a DevicePluginOptions) goes in the request; by default the behaviour's own flags.
        """
        if options is None:
            options = dp.DevicePluginOptions(
                pre_start_required=self.behaviour.pre_start_required,
                get_preferred_allocation_available=self.behaviour.preferred_available,
            )
        async with grpc.aio.insecure_channel(f"unix:{kubelet_socket}") as channel:
            stub = dp_grpc.RegistrationStub(channel)
            await stub.Register(
                dp.RegisterRequest(
                    version=version,
                    endpoint=self.endpoint,
                    resource_name=self.resource if resource is None else resource,
                    options=options,
                ),
                timeout=30,
            )

    async def serve_and_register(self, kubelet_socket: Path) -> FakePlugin:
        await self.start()
        await self.register(kubelet_socket)
        return self

    def update(self, devices: Sequence[Dev]) -> None:
        """Send a new device list on every open stream."""
        self.devices = list(devices)
        for queue in self.streams:
            queue.put_nowait(list(devices))

    def end_streams(self) -> None:
        """End every open ListAndWatch stream (the server keeps serving)."""
        for queue in self.streams:
            queue.put_nowait(None)


def node_dev_root(directory: Path) -> Path:
    """The node's /dev for a kubelet whose device-plugin folder is ``directory``: ``<its parent>/dev``."""
    return directory.parent / "dev"


@contextlib.asynccontextmanager
async def running_kubelet(directory: Path, **kwargs: Any) -> AsyncIterator[DevKubelet]:
    """A started DevKubelet on ``directory``, closed afterwards (every container killed, every cgroup removed).

    Its containers run in cgroups when the host allows (as the ``dev_kubelet``
    fixture's); its /dev is :func:`node_dev_root`, where :class:`FakePlugin` makes its nodes.
    """
    kwargs.setdefault("dev_root", node_dev_root(directory))
    if "cgroups" not in kwargs:
        kwargs["cgroups"] = cgroup_layout_for(None)
    kubelet = DevKubelet(directory, **kwargs)
    await kubelet.start()
    try:
        yield kubelet
    finally:
        await kubelet.close()


async def plugin_on(
    kubelet: DevKubelet,
    devices: Sequence[Dev],
    *,
    resource: str = "example.com/gpu",
    endpoint: str = "fake.sock",
    behaviour: Behaviour | None = None,
) -> FakePlugin:
    """A fake plugin that is serving, registered, and whose first device list the kubelet has seen."""
    plugin = FakePlugin(kubelet.device_plugin_dir, resource, devices, endpoint=endpoint, behaviour=behaviour)
    before = kubelet.registrations(resource)
    await plugin.serve_and_register(kubelet.kubelet_socket)
    await kubelet.wait_registered(resource, after=before)
    await kubelet.wait_for(
        lambda k: (
            (view := k.resource(resource)) is not None
            and view.stream_open
            and [d.id for d in view.devices] == [d.id for d in devices]
        ),
        what=f"{resource}'s first device list",
    )
    return plugin


async def push_list(kubelet: DevKubelet, plugin: FakePlugin, devices: Sequence[Dev] | None = None) -> None:
    """Send a device list (the current one by default) and wait until the kubelet rewrote its checkpoint."""
    before = kubelet.checkpoint_writes
    plugin.update(plugin.devices if devices is None else devices)
    await kubelet.wait_for(lambda k: k.checkpoint_writes > before, what="the checkpoint rewritten after a device list")


async def list_pods(kubelet: DevKubelet) -> dict[str, dict[str, list[str]]]:
    """PodResources List over the socket: ``namespace/name`` -> container -> device IDs, in listed order."""
    async with grpc.aio.insecure_channel(f"unix:{kubelet.pod_resources_socket}") as channel:
        reply = await pr_grpc.PodResourcesListerStub(channel).List(pr.ListPodResourcesRequest(), timeout=10)
    return {
        f"{p.namespace}/{p.name}": {c.name: [i for d in c.devices for i in d.device_ids] for c in p.containers}
        for p in reply.pod_resources
    }


def gpu(kubelet: DevKubelet, resource: str = "example.com/gpu") -> ResourceView:
    """The resource's view; fails the test if the resource is unknown."""
    found = kubelet.resource(resource)
    assert found is not None, f"{resource} is not registered"
    return found
