"""Kubelet start and restart, waiting, the threaded wrapper and the foreground runner."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from pathlib import Path

import grpc.aio
import pytest

from devplug.devkubelet import ContainerSpec, DevKubelet, DevKubeletThread, PodSpec, run_foreground
from devplug.errors import KubeletError
from devplug.testing.plugin import cgroup_layout_for
from tests.devkubelet.fakeplugin import FakePlugin, devs, gpu, node_dev_root, plugin_on, running_kubelet

GPU = "example.com/gpu"


def make_socket(path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()  # the socket file stays


def test_start_deletes_everything_but_directories_and_the_checkpoint(plugin_dir: Path) -> None:
    plugin_dir.mkdir(parents=True)
    make_socket(plugin_dir / "stale-plugin.sock")
    make_socket(plugin_dir / "kubelet.sock")
    (plugin_dir / "kubelet_internal_checkpoint").write_text("{}")
    (plugin_dir / "notes.txt").write_text("a plugin's file")  # CleanupPluginDirectory removes regular files too
    (plugin_dir / "dangling").symlink_to(plugin_dir / "nowhere")
    (plugin_dir / "sub").mkdir()
    make_socket(plugin_dir / "sub" / "nested.sock")  # directories are left alone

    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            names = sorted(p.name for p in plugin_dir.iterdir())
            assert names == ["kubelet.sock", "kubelet_internal_checkpoint", "sub"]
            assert (plugin_dir / "sub" / "nested.sock").exists()
            assert kubelet.pod_resources_socket.exists()
            # "{}" fails its checksum: the kubelet goes on without it
            (read,) = kubelet.events_of("checkpoint-read")
            assert "failed to read the checkpoint" in read.detail
        assert not (plugin_dir / "kubelet.sock").exists()  # stop removes its sockets
        assert (plugin_dir / "kubelet_internal_checkpoint").read_text() == "{}"  # no device list came: not rewritten

    asyncio.run(body())


def test_restart_deletes_plugin_sockets_restores_the_checkpoint_and_keeps_pods(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b"))
            admitted = await kubelet.admit_pod(PodSpec("p", [ContainerSpec("main", {GPU: 1})]))
            assert plugin.socket.exists()

            await kubelet.restart()
            assert not plugin.socket.exists()
            assert kubelet.checkpoint_path.exists()
            assert (plugin_dir / "kubelet.sock").exists()
            view = gpu(kubelet)
            assert not view.registered
            assert (view.capacity, view.allocatable) == (0, 0)  # restored from the checkpoint with no devices
            assert kubelet.pods() == [admitted]
            assert view.in_use == {"a"}
            assert kubelet.attributed(GPU) == {"a": ("default/p", "main")}
            kinds = [e.kind for e in kubelet.events]
            assert "restart" in kinds
            assert "1 entries restored" in kubelet.events_of("checkpoint-read")[-1].detail
            with pytest.raises(KubeletError, match="no healthy devices present; cannot allocate unhealthy devices"):
                await kubelet.admit_pod(PodSpec("q", [ContainerSpec("main", {GPU: 1})]))

            # the plugin must serve a fresh socket and register again
            await plugin.stop()
            again = FakePlugin(plugin_dir, GPU, devs("a", "b"))
            await again.start()
            await again.register(kubelet.kubelet_socket)
            await kubelet.wait_registered(GPU, after=1)
            await kubelet.wait_for(lambda k: gpu(k).allocatable == 2)
            assert kubelet.registrations(GPU) == 2
            # the surviving pod still holds its device; the rejected q is re-created as a new pod object
            admitted_q = await kubelet.admit_pod(PodSpec("q", [ContainerSpec("main", {GPU: 1})]))
            assert admitted_q.containers[0].devices[GPU] == ("b",)
            await again.stop()

    asyncio.run(body())


def test_restart_with_a_corrupt_checkpoint_forgets_what_running_pods_hold(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            plugin = await plugin_on(kubelet, devs("a", "b"))
            await kubelet.admit_pod(PodSpec("p", [ContainerSpec("main", {GPU: 1})]))
            await plugin.stop()
            kubelet.checkpoint_path.write_text("checkpoint")  # not what the kubelet wrote

            await kubelet.restart()
            assert "failed to read the checkpoint" in kubelet.events_of("checkpoint-read")[-1].detail
            assert [p.spec.name for p in kubelet.pods()] == ["p"]  # the container still runs...
            assert kubelet.attributed(GPU) == {}  # ...but the kubelet no longer knows it holds "a"
            assert kubelet.resource(GPU) is None  # nor the resource, until its plugin registers again
            again = await plugin_on(kubelet, devs("a", "b"))
            taken = await kubelet.admit_pod(PodSpec("q", [ContainerSpec("main", {GPU: 2})]))
            assert taken.containers[0].devices[GPU] == ("a", "b")  # "a" handed out under the running pod
            await again.stop()

    asyncio.run(body())


def test_a_registration_to_a_stopped_kubelet_fails(plugin_dir: Path) -> None:
    async def body() -> None:
        kubelet = DevKubelet(plugin_dir)
        await kubelet.start()
        plugin = FakePlugin(plugin_dir, GPU, devs("a"))
        await plugin.start()
        await kubelet.stop()
        with pytest.raises(grpc.aio.AioRpcError):
            await plugin.register(kubelet.kubelet_socket)
        await plugin.stop()

    asyncio.run(body())


def test_wait_for_timeout_names_what_was_awaited(plugin_dir: Path) -> None:
    async def body() -> None:
        async with running_kubelet(plugin_dir) as kubelet:
            with pytest.raises(TimeoutError, match=r"example\.com/gpu to register \(registration count > 0\)"):
                await kubelet.wait_registered(GPU, timeout=0.05)
            with pytest.raises(TimeoutError, match="the moon"):
                await kubelet.wait_for(lambda k: False, timeout=0.05, what="the moon")

    asyncio.run(body())


def test_socket_paths_too_long_for_unix_sockets_are_refused() -> None:
    kubelet = DevKubelet(Path("/tmp") / ("x" * 120))

    async def body() -> None:
        with pytest.raises(KubeletError, match="107"):
            await kubelet.start()

    asyncio.run(body())


def test_threaded_wrapper(plugin_dir: Path) -> None:
    with DevKubeletThread(
        plugin_dir, pod_resources_rate=None, dev_root=node_dev_root(plugin_dir), cgroups=cgroup_layout_for(None)
    ) as kubelet:
        plugin_future = asyncio.run_coroutine_threadsafe(_serve_plugin(plugin_dir, kubelet), kubelet.loop)
        plugin = plugin_future.result(30)
        kubelet.wait_registered(GPU)
        kubelet.wait_for(lambda k: gpu(k).capacity == 2)
        view = kubelet.resource(GPU)
        assert view is not None
        assert view.healthy_ids == ("a", "b")
        assert kubelet.registrations(GPU) == 1

        kubelet.kep_mode = True
        assert kubelet.kep_mode
        kubelet.pod_resources_available = False
        assert not kubelet.pod_resources_available

        admitted = kubelet.admit_pod(PodSpec("p", [ContainerSpec("main", {GPU: 2})]))
        assert admitted.containers[0].devices[GPU] == ("a", "b")
        kubelet.start_container("p", "main")
        assert kubelet.pods() == [admitted]
        kubelet.remove_pod("p")
        assert kubelet.pods() == []
        with pytest.raises(KubeletError):
            kubelet.remove_pod("p")

        kubelet.restart()
        assert not plugin.socket.exists()
        assert kubelet.resource(GPU).allocatable == 0  # type: ignore[union-attr]
        kinds = [e.kind for e in kubelet.events]
        assert kinds[:2] == ["register", "list-and-watch"]
        assert "allocate" in kinds
        assert "restart" in kinds
        with pytest.raises(TimeoutError):
            kubelet.wait_registered(GPU, after=1, timeout=0.05)
        asyncio.run_coroutine_threadsafe(plugin.stop(), kubelet.loop).result(30)
    assert not (plugin_dir / "kubelet.sock").exists()


async def _serve_plugin(plugin_dir: Path, kubelet: DevKubeletThread) -> FakePlugin:
    plugin = FakePlugin(plugin_dir, GPU, devs("a", "b"))
    return await plugin.serve_and_register(kubelet.kubelet_socket)


def test_threaded_wrapper_ends_its_thread_when_the_kubelet_cannot_be_built(plugin_dir: Path) -> None:
    with pytest.raises(TypeError):
        DevKubeletThread(plugin_dir, no_such_option=True)
    assert not [t for t in threading.enumerate() if t.name == "devkubelet-loop"]


def test_run_foreground_serves_and_logs_every_event(plugin_dir: Path) -> None:
    lines: list[str] = []
    serving = asyncio.Event

    class Collect(logging.Handler):
        def __init__(self, ready: asyncio.Event) -> None:
            super().__init__(logging.INFO)
            self.ready = ready

        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())
            if record.getMessage().startswith("dev kubelet serving"):
                self.ready.set()

    async def body() -> None:
        ready = serving()
        handler = Collect(ready)
        log = logging.getLogger("devplug.devkubelet")
        log.addHandler(handler)
        old_level = log.level
        log.setLevel(logging.INFO)
        try:
            task = asyncio.create_task(run_foreground(plugin_dir, kep_mode=True, pod_resources_socket=None))
            await asyncio.wait_for(ready.wait(), 10)
            plugin = FakePlugin(plugin_dir, GPU, devs("a"))
            await plugin.serve_and_register(plugin_dir / "kubelet.sock")
            await plugin.wait_calls("ListAndWatch")
            await plugin.stop()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            log.removeHandler(handler)
            log.setLevel(old_level)

    asyncio.run(body())
    assert any("KEP mode" in line for line in lines)
    assert any(line.startswith("register ") and GPU in line and "fake.sock" in line for line in lines)
    assert lines[-1] == "dev kubelet stopped"
    assert not (plugin_dir / "kubelet.sock").exists()
