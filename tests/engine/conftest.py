"""Fixtures for the engine's end-to-end tests: mock devices, a channel to a plugin socket, polling waits."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.config import Config, parse_config
from devplug.devkubelet import DevKubelet, DevKubeletThread, ResourceView
from devplug.engine.resource import Resource
from devplug.kube.names import socket_file_name
from devplug.testing.configs import dev_config
from devplug.testing.daemon import DaemonThread
from devplug.testing.waiting import poll_until

Wait = Callable[..., None]
#: The resource of :func:`daemon_holding`.
MOCK_RESOURCE = "example.com/mock"
T = TypeVar("T")


@contextmanager
def daemon_holding(
    kubelet: DevKubeletThread, root: Path, mock_dir: Path, count: int
) -> Iterator[tuple[DaemonThread, Resource]]:
    """A daemon with one mock resource of ``count`` devices, each allocated alone and held (no release: the grace
    period and the release interval are an hour)."""
    tables = {MOCK_RESOURCE: {"driver": "mock", "options": {"directory": str(mock_dir), "count": count}}}
    config = parse_config(dev_config(root, tables, release_interval=3600.0, grace_period=3600.0))
    with DaemonThread(config) as daemon:
        kubelet.wait_registered(MOCK_RESOURCE, timeout=15)
        (resource,) = daemon.daemon.resources
        client = PluginClient(Path(resource.endpoint))
        try:
            for i in range(count):
                client.allocate([f"mock{i}"])
        finally:
            client.channel.close()
        assert resource.held_count() == count
        yield daemon, resource


async def ticks_during(work: Callable[[], Awaitable[T]]) -> tuple[int, T]:
    """How many times another coroutine got to run on the event loop while ``work`` ran, and what it returned."""
    ticks = 0
    done = False

    async def ticker() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.ensure_future(ticker())
    await asyncio.sleep(0)  # the ticker's first tick, before the work
    before = ticks
    try:
        result = await work()
    finally:
        done = True
        await task
    return ticks - before, result


def view_of(kubelet: DevKubelet | DevKubeletThread, resource: str) -> ResourceView:
    """The dev kubelet's view of ``resource``; fails when it is not registered."""
    view = kubelet.resource(resource)
    assert view is not None, f"{resource} is not registered"
    return view


def in_process_config(root: Path, drivers: dict[str, type], **resource_options: Any) -> Config:
    """A config under ``root`` whose resources use the given (uninstalled) driver classes."""
    tables = {name: {"driver": "mock", "options": {"directory": str(root / "unused")}} for name in drivers}
    config = parse_config(dev_config(root, tables))
    resources = tuple(
        replace(rc, driver="test", driver_class=drivers[rc.name], options=None, **resource_options)
        for rc in config.resources
    )
    return replace(config, resources=resources)


@pytest.fixture
def wait_until() -> Wait:
    """``wait_until(predicate, what, timeout=10)``: poll until true, else fail naming what was awaited."""

    def wait(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
        __tracebackhide__ = True
        poll_until(predicate, what, timeout, interval=0.01)

    return wait


@pytest.fixture
def mock_dir(devplug_root: Path) -> Path:
    directory = devplug_root / "mock"
    directory.mkdir()
    return directory


class PluginClient:
    """A kubelet-side client of one plugin socket, on devplug's generated messages."""

    def __init__(self, socket: Path) -> None:
        self.channel = grpc.insecure_channel(f"unix:{socket}")

    def call(self, method: str, request: Any, response: Any) -> Any:
        stub = self.channel.unary_unary(
            f"/v1beta1.DevicePlugin/{method}",
            request_serializer=type(request).SerializeToString,
            response_deserializer=response.FromString,
        )
        return stub(request, timeout=30)

    def allocate(self, *containers: list[str]) -> dp.AllocateResponse:
        request = dp.AllocateRequest(
            container_requests=[dp.ContainerAllocateRequest(devices_ids=c) for c in containers]
        )
        response: dp.AllocateResponse = self.call("Allocate", request, dp.AllocateResponse)
        return response

    def options(self) -> dp.DevicePluginOptions:
        options: dp.DevicePluginOptions = self.call("GetDevicePluginOptions", dp.Empty(), dp.DevicePluginOptions)
        return options

    def list_and_watch(self) -> Any:
        stub = self.channel.unary_stream(
            "/v1beta1.DevicePlugin/ListAndWatch",
            request_serializer=dp.Empty.SerializeToString,
            response_deserializer=dp.ListAndWatchResponse.FromString,
        )
        return stub(dp.Empty())


@pytest.fixture
def plugin_client(devplug_root: Path) -> Iterator[Callable[[str], PluginClient]]:
    clients: list[PluginClient] = []

    def make(resource: str) -> PluginClient:
        plugin_dir = devplug_root / "device-plugins"
        client = PluginClient(plugin_dir / socket_file_name(resource, len(str(plugin_dir))))
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.channel.close()
