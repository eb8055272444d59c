"""The floors: a bare grpcio server on devplug's generated code answering precomputed responses, and a
raw unix-socket round trip. Each server runs as its own process, like the daemon::

    python -m bench.floors grpc --socket S --mode aio|sync --devices N --host-dir D
    python -m bench.floors unix --socket S --reply-size R

The gRPC floor serves ``v1beta1.DevicePlugin``: Allocate answers the mock's
answer for the first four devices (a prebuilt message), GetPreferredAllocation
a prebuilt answer, ListAndWatch the prebuilt bytes of an ``N``-device list at
once and again on every SIGUSR1 (the trigger of the push floor).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from bench.payloads import device_ids, list_and_watch_bytes, mock_allocate_response, preferred_response
from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp

__all__ = ["FloorProcess", "UnixPinger", "grpc_floor", "unix_floor"]

SERVICE = "v1beta1.DevicePlugin"


def _identity(data: bytes) -> bytes:
    return data


class _Answers:
    def __init__(self, devices: int, host_dir: str) -> None:
        self.options = dp.DevicePluginOptions(get_preferred_allocation_available=True)
        self.allocate = mock_allocate_response(device_ids(4), host_dir)
        self.preferred = preferred_response(device_ids(8))
        self.devices = list_and_watch_bytes(devices)
        self.empty_dealloc = dp.DeallocateResponse()


def _handlers(answers: _Answers, law: Any, unary_wrap: Any) -> grpc.GenericRpcHandler[Any, Any]:
    unary = grpc.unary_unary_rpc_method_handler
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "GetDevicePluginOptions": unary(
                unary_wrap(answers.options),
                request_deserializer=dp.Empty.FromString,
                response_serializer=dp.DevicePluginOptions.SerializeToString,
            ),
            "Allocate": unary(
                unary_wrap(answers.allocate),
                request_deserializer=dp.AllocateRequest.FromString,
                response_serializer=dp.AllocateResponse.SerializeToString,
            ),
            "GetPreferredAllocation": unary(
                unary_wrap(answers.preferred),
                request_deserializer=dp.PreferredAllocationRequest.FromString,
                response_serializer=dp.PreferredAllocationResponse.SerializeToString,
            ),
            "Deallocate": unary(
                unary_wrap(answers.empty_dealloc),
                request_deserializer=dp.DeallocateRequest.FromString,
                response_serializer=dp.DeallocateResponse.SerializeToString,
            ),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                law, request_deserializer=dp.Empty.FromString, response_serializer=_identity
            ),
        },
    )


async def _serve_aio(sock: Path, answers: _Answers) -> None:
    loop = asyncio.get_running_loop()
    pushed = asyncio.Event()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, pushed.set)
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    def answer(response: Any) -> Any:
        async def call(request: Any, context: Any) -> Any:
            return response

        return call

    async def law(request: dp.Empty, context: Any) -> AsyncIterator[bytes]:
        yield answers.devices
        while True:
            await pushed.wait()
            pushed.clear()
            yield answers.devices

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((_handlers(answers, law, answer),))
    server.add_insecure_port(f"unix:{sock}")
    await server.start()
    await stop.wait()
    await server.stop(0)


def _serve_sync(sock: Path, answers: _Answers) -> None:
    pushed = threading.Event()
    stop = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: pushed.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def answer(response: Any) -> Any:
        def call(request: Any, context: Any) -> Any:
            return response

        return call

    def law(request: dp.Empty, context: Any) -> Iterator[bytes]:
        yield answers.devices
        while context.is_active():
            if pushed.wait(0.5):
                pushed.clear()
                yield answers.devices

    server = grpc.server(ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((_handlers(answers, law, answer),))
    server.add_insecure_port(f"unix:{sock}")
    server.start()
    while not stop.wait(1.0):
        pass
    server.stop(0)


def _serve_unix(sock: Path, reply_size: int) -> None:
    reply = b"r" * reply_size
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock))
    listener.listen(4)
    listener.settimeout(0.5)
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        with conn:
            while conn.recv(65536):
                conn.sendall(reply)
    listener.close()


class UnixPinger:
    """One connection to the unix floor: send ``request_size`` bytes, read ``reply_size`` back."""

    def __init__(self, sock: Path, request_size: int, reply_size: int) -> None:
        self._request = b"q" * request_size
        self._reply_size = reply_size
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._conn.connect(str(sock))

    def round_trip(self, _: int = 0) -> None:
        self._conn.sendall(self._request)
        got = 0
        while got < self._reply_size:
            chunk = self._conn.recv(65536)
            if not chunk:
                raise ConnectionError("the unix floor closed the connection")
            got += len(chunk)

    def close(self) -> None:
        self._conn.close()


class FloorProcess:
    """A floor server in a child process; ``start`` returns once its socket exists."""

    def __init__(self, args: list[str], sock: Path, log_path: Path) -> None:
        self.args = args
        self.socket = sock
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 20.0) -> FloorProcess:
        with open(self.log_path, "ab") as log:
            env = dict(os.environ, GRPC_VERBOSITY="ERROR")
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bench.floors", *self.args, "--socket", str(self.socket)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
            )
        deadline = time.monotonic() + timeout
        while not self.socket.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"floor {self.args} did not start; see {self.log_path}")
            time.sleep(0.005)
        return self

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> FloorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def grpc_floor(sock: Path, log_path: Path, *, mode: str, devices: int, host_dir: str) -> FloorProcess:
    return FloorProcess(["grpc", "--mode", mode, "--devices", str(devices), "--host-dir", host_dir], sock, log_path)


def unix_floor(sock: Path, log_path: Path, *, reply_size: int) -> FloorProcess:
    return FloorProcess(["unix", "--reply-size", str(reply_size)], sock, log_path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floors")
    sub = parser.add_subparsers(dest="kind", required=True)
    g = sub.add_parser("grpc")
    g.add_argument("--socket", type=Path, required=True)
    g.add_argument("--mode", choices=["aio", "sync"], default="aio")
    g.add_argument("--devices", type=int, default=10)
    g.add_argument("--host-dir", default="/tmp/mock")
    u = sub.add_parser("unix")
    u.add_argument("--socket", type=Path, required=True)
    u.add_argument("--reply-size", type=int, default=512)
    args = parser.parse_args(argv)
    if args.kind == "unix":
        _serve_unix(args.socket, args.reply_size)
        return
    answers = _Answers(args.devices, args.host_dir)
    if args.mode == "aio":
        asyncio.run(_serve_aio(args.socket, answers))
    else:
        _serve_sync(args.socket, answers)


if __name__ == "__main__":
    main()
