"""The DRA registration socket on a real unix socket: GetInfo as the kubelet's plugin watcher reads it, the
registration status, the socket made again when it vanishes, and sockets of dead instances cleared."""

from __future__ import annotations

import asyncio
import shutil
import socket
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from devplug.api.gen.pluginregistration.v1 import api_pb2 as reg_pb
from devplug.api.gen.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from devplug.engine.resourcestatus import ResourceState, ResourceStatus
from devplug.frontends.dra.registration import (
    HEALTH_SERVICE,
    SERVICES,
    RegistrationServer,
    registration_socket,
    remove_dead_sockets,
    service_socket,
)
from tests.frontends.dra.conftest import run
from tests.frontends.dra.dranode import eventually, short_root

DRIVER = "fpga.example.com"


async def _info(path: Path) -> Any:
    async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
        return await reg_grpc.RegistrationStub(channel).GetInfo(reg_pb.InfoRequest(), timeout=5)


async def _notify(path: Path, registered: bool, error: str = "") -> None:
    async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
        await reg_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
            reg_pb.RegistrationStatus(plugin_registered=registered, error=error), timeout=5
        )


def _summary(status: ResourceStatus) -> tuple[ResourceState, int, str | None]:
    return status.state, status.registrations, status.last_error


def test_the_paths_are_unique_per_instance() -> None:
    root = Path("/var/lib/kubelet")
    assert registration_socket(root / "plugins_registry", DRIVER, "uid-1") == Path(
        "/var/lib/kubelet/plugins_registry/fpga.example.com-uid-1-reg.sock"
    )
    assert service_socket(root / "plugins", DRIVER, "uid-1") == Path(
        "/var/lib/kubelet/plugins/fpga.example.com/dra-uid-1.sock"
    )
    assert SERVICES == ("v1.DRAPlugin", "v1beta1.DRAPlugin") and HEALTH_SERVICE == "v1alpha1.DRAResourceHealth"


def test_get_info_the_status_and_a_socket_made_again_when_it_vanishes() -> None:
    async def scenario() -> None:
        with short_root() as root:
            status = ResourceStatus()
            registered: list[int] = []
            endpoint = service_socket(root / "plugins", DRIVER, "i1")
            server = RegistrationServer(
                driver=DRIVER,
                registry_dir=root / "plugins_registry",
                endpoint=endpoint,
                instance="i1",
                services=(*SERVICES, HEALTH_SERVICE),
                status=status,
                on_registered=lambda: registered.append(1),
            )
            await server.start()
            loop = asyncio.ensure_future(server.run())
            try:
                path = server.socket_path
                assert path == root / "plugins_registry" / f"{DRIVER}-i1-reg.sock"
                info = await _info(path)
                assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRIVER, str(endpoint))
                assert list(info.supported_versions) == [
                    "v1.DRAPlugin",
                    "v1beta1.DRAPlugin",
                    "v1alpha1.DRAResourceHealth",
                ]
                assert status.state is ResourceState.REGISTERING

                await _notify(path, False, "no handler for DRAPlugin")
                assert status.state is ResourceState.REGISTERING
                assert status.last_error is not None and "no handler for DRAPlugin" in status.last_error
                await _notify(path, True)
                assert _summary(status) == (ResourceState.REGISTERED, 1, None)
                assert registered == [1]

                path.unlink()  # someone removed it: the kubelet's watcher saw it go
                await eventually(path.exists, "the socket made again")
                assert (await _info(path)).name == DRIVER
                assert server.state.recreated == 1 and status.state is ResourceState.REGISTERING

                shutil.rmtree(root / "plugins_registry")  # the whole folder wiped
                await eventually(path.exists, "the socket made again in a new folder")
                assert (await _info(path)).endpoint == str(endpoint)
                assert server.state.recreated == 2
            finally:
                loop.cancel()
                await asyncio.gather(loop, return_exceptions=True)
                await server.stop()
            assert not path.exists()

    run(scenario, 60)


def test_only_sockets_nobody_serves_are_removed() -> None:
    async def scenario() -> None:
        with short_root() as root:
            live = RegistrationServer(
                driver=DRIVER,
                registry_dir=root,
                endpoint=root / "x.sock",
                instance="live",
                services=SERVICES,
                status=ResourceStatus(),
            )
            await live.start()
            try:
                dead = root / f"{DRIVER}-dead-reg.sock"
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.bind(str(dead))
                sock.close()  # the file stays, nobody listens: a kill -9's leftover
                plain = root / f"{DRIVER}-file-reg.sock"
                plain.write_text("not a socket")
                other = root / "other.example.com-dead-reg.sock"
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.bind(str(other))
                sock.close()
                removed = await asyncio.to_thread(remove_dead_sockets, root, f"{DRIVER}-", "-reg.sock")
                assert removed == [dead]
                assert live.socket_path.exists() and plain.exists() and other.exists()
            finally:
                await live.stop()

    run(scenario, 30)


def test_a_socket_the_kubelet_never_asks_about_is_said_in_the_status() -> None:
    """Issue 37: an instance the kubelet never registers (its socket in a folder the kubelet does not watch) says so,
    naming the socket, rather than staying "registering" without a word."""

    async def scenario() -> None:
        with short_root() as root:
            status = ResourceStatus()
            server = RegistrationServer(
                driver=DRIVER,
                registry_dir=root / "plugins_registry",
                endpoint=service_socket(root / "plugins", DRIVER, "i1"),
                instance="i1",
                services=SERVICES,
                status=status,
                no_word_after=0.3,
            )
            await server.start()
            loop = asyncio.ensure_future(server.run())
            try:
                said = await eventually(lambda: status.last_error, "the status saying the kubelet never asked")
                assert f"has not called GetInfo on {server.socket_path}" in said
                assert status.state is ResourceState.REGISTERING
                await _info(server.socket_path)  # the kubelet finds it after all, and registers it
                await _notify(server.socket_path, True)
                assert _summary(status) == (ResourceState.REGISTERED, 1, None)
            finally:
                loop.cancel()
                await server.stop()

    run(scenario)
