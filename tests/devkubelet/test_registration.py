"""Register: the kubelet's checks and texts, dialing inside the call, ListAndWatch into capacity."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import grpc.aio
import pytest

from devplug.devkubelet import ContainerSpec, DeviceInfo, DevKubelet, KubeletError, PluginOptions, PodSpec
from devplug.devkubelet.endpoints import EndpointKeying, OlderStreamEnd, older_stream_end
from tests.devkubelet.fakeplugin import Behaviour, Dev, FakePlugin, devs, gpu, plugin_on, running_kubelet


def test_register_refuses_an_unsupported_version(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = FakePlugin(plugin_dir, "example.com/gpu", devs("a"))
            await plugin.start()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await plugin.register(kubelet.kubelet_socket, version="v1alpha")
            await plugin.stop()
            assert info.value.code() == grpc.StatusCode.UNKNOWN
            assert info.value.details() == (
                'requested API version "v1alpha" is not supported by kubelet. Supported versions are ["v1beta1"]'
            )
            assert kubelet.registrations("example.com/gpu") == 0
            assert kubelet.resource("example.com/gpu") is None
            assert [e.kind for e in kubelet.events] == ["register-refused"]

    asyncio.run(body())


@pytest.mark.parametrize(
    "name",
    ["gpu", "kubernetes.io/gpu", "requests.example.com/gpu", "Example.com/gpu", "example.com/-gpu", "a.com/b/c"],
)
def test_register_refuses_an_invalid_resource_name(plugin_dir: Path, name: str) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = FakePlugin(plugin_dir, name, devs("a"))
            await plugin.start()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await plugin.register(kubelet.kubelet_socket)
            await plugin.stop()
            assert info.value.code() == grpc.StatusCode.UNKNOWN
            assert info.value.details() == f'the ResourceName "{name}" is invalid'
            assert plugin.calls == []  # refused before dialing

    asyncio.run(body())


def test_register_fails_when_the_endpoint_does_not_answer(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir, register_dial_timeout=0.3) as kubelet:
            plugin = FakePlugin(plugin_dir, "example.com/gpu", devs("a"), endpoint="nobody.sock")
            with pytest.raises(grpc.aio.AioRpcError) as info:  # registers without serving
                await plugin.register(kubelet.kubelet_socket)
            assert info.value.code() == grpc.StatusCode.UNKNOWN
            assert str(info.value.details()).startswith("failed to dial device plugin: context deadline exceeded")
            assert kubelet.registrations("example.com/gpu") == 0
            assert kubelet.events[-1].kind == "register-refused"

    asyncio.run(body())


def test_register_fails_when_get_device_plugin_options_fails(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            server = grpc.aio.server()  # serves nothing: every method is UNIMPLEMENTED
            server.add_insecure_port(f"unix:{plugin_dir / 'empty.sock'}")
            await server.start()
            plugin = FakePlugin(plugin_dir, "example.com/gpu", devs("a"), endpoint="empty.sock")
            try:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await plugin.register(kubelet.kubelet_socket)
            finally:
                await server.stop(None)
            assert info.value.code() == grpc.StatusCode.UNKNOWN
            assert str(info.value.details()).startswith("failed to get device plugin options:")
            assert kubelet.resource("example.com/gpu") is None

    asyncio.run(body())


def test_register_reads_options_and_opens_list_and_watch_once(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            behaviour = Behaviour(pre_start_required=True, deallocate_available=True)
            plugin = await plugin_on(kubelet, devs("a", "b"), behaviour=behaviour)
            view = kubelet.resource("example.com/gpu")
            assert view is not None
            assert view.endpoint == "fake.sock"
            assert view.registered
            assert view.options == PluginOptions(pre_start_required=True, deallocate_available=True)
            assert [name for name, _ in plugin.calls] == ["GetDevicePluginOptions", "ListAndWatch"]
            assert [e.kind for e in kubelet.events] == ["register", "list-and-watch"]
            assert kubelet.registrations("example.com/gpu") == 1
            await plugin.stop()

    asyncio.run(body())


def test_capacity_and_allocatable_follow_list_and_watch(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, [Dev("a", numa=(0,)), Dev("b", numa=(1,)), Dev("c")])
            view = kubelet.resource("example.com/gpu")
            assert view is not None
            assert (view.capacity, view.allocatable) == (3, 3)
            assert view.device("b") is not None
            assert view.device("b") == DeviceInfo("b", "Healthy", (1,))

            plugin.update([Dev("a"), Dev("b", "Unhealthy"), Dev("c")])
            await kubelet.wait_for(lambda k: gpu(k).allocatable == 2)
            view = kubelet.resource("example.com/gpu")
            assert view is not None
            assert view.capacity == 3
            assert view.healthy_ids == ("a", "c")

            # anything but exactly "Healthy" is unhealthy
            plugin.update([Dev("a", "healthy"), Dev("b", "Sick"), Dev("c")])
            await kubelet.wait_for(lambda k: gpu(k).allocatable == 1)
            assert gpu(kubelet).capacity == 3

            # each message replaces the whole list; an empty one means capacity 0, still registered
            plugin.update([])
            await kubelet.wait_for(lambda k: gpu(k).capacity == 0)
            view = kubelet.resource("example.com/gpu")
            assert view is not None
            assert view.registered
            assert view.stream_open
            assert kubelet.events[-1].kind == "list-and-watch"
            await plugin.stop()

    asyncio.run(body())


def test_a_newer_instance_takes_the_resource_and_the_older_one_keeps_streaming(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            old = await plugin_on(kubelet, devs("a", "b"), endpoint="old.sock")
            new = await plugin_on(kubelet, devs("x", "y", "z"), endpoint="new.sock")
            view = kubelet.resource("example.com/gpu")
            assert view is not None
            assert view.endpoint == "new.sock"
            assert view.capacity == 3
            assert kubelet.registrations("example.com/gpu") == 2
            assert old.requests("ListAndWatch-ended") == []  # registerClient keeps the older client
            admitted = await kubelet.admit_pod(_one("p", 1))
            assert admitted.containers[0].devices["example.com/gpu"] == ("x",)
            assert old.requests("Allocate") == []  # the endpoint is the newest registration's
            assert len(new.requests("Allocate")) == 1
            old.update(devs("a"))  # an older stream still feeds the resource, by name
            await kubelet.wait_for(lambda k: gpu(k).capacity == 1)
            new.update(devs("x", "y", "z"))
            await kubelet.wait_for(lambda k: gpu(k).capacity == 3)
            await old.stop()
            await new.stop()

    asyncio.run(body())


def test_keyed_by_socket_path_the_older_instance_ending_leaves_the_newer_one_alone(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir, endpoints_by="socket-path") as kubelet:
            old = await plugin_on(kubelet, devs("a", "b"), endpoint="old.sock")
            new = await plugin_on(kubelet, devs("x", "y", "z"), endpoint="new.sock")
            old.end_streams()  # the old instance exits
            await kubelet.wait_for(lambda k: bool(k.events_of("instance-disconnected")))
            view = gpu(kubelet)
            assert (view.capacity, view.allocatable, view.registered) == (3, 3, True)
            assert kubelet.events_of("stream-ended") == []
            assert new.requests("ListAndWatch-ended") == []
            admitted = await kubelet.admit_pod(_one("p", 2))
            assert admitted.containers[0].devices["example.com/gpu"] == ("x", "y")
            await old.stop()
            await new.stop()

    asyncio.run(body())


@pytest.mark.parametrize(
    ("keying", "older", "current", "effect"),
    [
        ("socket-path", "old.sock", "new.sock", OlderStreamEnd.ONLY_ITSELF),
        ("socket-path", "same.sock", "same.sock", OlderStreamEnd.CURRENT_BY_SOCKET),  # the PR fixes unique names only
        ("resource-name", "old.sock", "new.sock", OlderStreamEnd.CURRENT_BY_NAME),
        ("resource-name", "same.sock", "same.sock", OlderStreamEnd.CURRENT_BY_NAME),
        ("resource-name", "old.sock", None, OlderStreamEnd.ONLY_ITSELF),  # nothing current to disconnect
    ],
)
def test_what_an_older_stream_end_disconnects(
    keying: EndpointKeying, older: str, current: str | None, effect: OlderStreamEnd
) -> None:
    # (Two live servers on one socket path cannot be staged here: gRPC's shared subchannels would dial the first.)
    assert older_stream_end(keying, older, current) is effect


def test_an_unknown_endpoint_keying_is_refused(plugin_dir: Path) -> None:
    with pytest.raises(KubeletError, match="endpoints_by must be one of socket-path, resource-name, not 'by-magic'"):
        DevKubelet(plugin_dir, endpoints_by="by-magic")  # type: ignore[arg-type]


def test_stream_end_marks_every_device_unhealthy_and_never_reconnects(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b"))
            plugin.end_streams()
            await kubelet.wait_for(lambda k: bool(k.events_of("stream-ended")))
            view = kubelet.resource("example.com/gpu")
            assert view is not None
            assert (view.capacity, view.allocatable) == (2, 0)
            assert not view.stream_open
            assert not view.registered
            assert len(plugin.requests("ListAndWatch")) == 1
            # only a new registration opens a new stream
            await plugin.register(kubelet.kubelet_socket)
            await kubelet.wait_for(lambda k: gpu(k).allocatable == 2)
            assert len(plugin.requests("ListAndWatch")) == 2
            await plugin.stop()

    asyncio.run(body())


def test_plugin_exit_marks_devices_unhealthy_and_drop_after_drops_the_resource(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir, drop_after=0.05) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b"))
            await plugin.stop()
            await kubelet.wait_for(lambda k: bool(k.events_of("stream-ended")))
            await kubelet.wait_for(lambda k: k.resource("example.com/gpu") is None)
            assert kubelet.events[-1].kind == "resource-dropped"

    asyncio.run(body())


def _one(name: str, count: int) -> PodSpec:
    return PodSpec(name, [ContainerSpec("main", {"example.com/gpu": count})])


def test_keyed_by_resource_name_the_old_stream_end_zeroes_the_new_registration(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir, endpoints_by="resource-name") as kubelet:
            old = await plugin_on(kubelet, devs("a", "b"), endpoint="old.sock")
            new = await plugin_on(kubelet, devs("x", "y", "z"), endpoint="new.sock")
            assert old.requests("ListAndWatch-ended") == []  # the old registration keeps streaming
            old.update(devs("a"))  # and still feeds the resource, by name
            await kubelet.wait_for(lambda k: gpu(k).capacity == 1)
            old.end_streams()  # the old instance exits...
            await kubelet.wait_for(lambda k: bool(k.events_of("stream-ended")))
            view = gpu(kubelet)
            assert (view.capacity, view.allocatable) == (1, 0)  # ...and the new one's resource drains
            assert not view.registered
            assert "current one was disconnected" in kubelet.events[-1].detail
            await new.wait_calls("ListAndWatch-ended")
            await old.stop()
            await new.stop()

    asyncio.run(body())
