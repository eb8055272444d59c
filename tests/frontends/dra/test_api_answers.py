"""API answers that devplug cannot use (issue 36, items 4 and 11), from a real HTTP server on a raw socket, read by
the real lightkube client devplug makes: an answer that trickles ends at the call's overall deadline, and a
redirect, a silent server, a huge body and junk each get a message naming what happened."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devplug.frontends.dra.claims import ClaimReader, ClaimReadError, ClaimRef
from devplug.kube import client as kubeclient
from devplug.kube.client import make_client

from .conftest import run

#: The overall deadline of an API call (``kubeclient.DEFAULT_DEADLINE``, checked below).
DEFAULT_DEADLINE = 30.0
CLAIM = ClaimRef("default", "gpu-claim", "0b6f2d2e-8d44-4e0e-9f35-1c1b1b3e2a11")


class RawServer:
    """An HTTP server on a raw socket: each connection is answered by ``answer(connection)`` in its own thread."""

    def __init__(self, answer: Callable[[socket.socket], None]) -> None:
        self._answer = answer
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(connection,), daemon=True).start()

    def _one(self, connection: socket.socket) -> None:
        with connection:
            connection.recv(65536)  # the request (small: a GET)
            with contextlib.suppress(OSError):  # the client gave up
                self._answer(connection)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[Callable[[socket.socket], None]], Path]]:
    """``serve(answer)``: a raw server answering so, and a kubeconfig naming it."""
    servers: list[RawServer] = []

    def start(answer: Callable[[socket.socket], None]) -> Path:
        import yaml  # type: ignore[import-untyped]

        server = RawServer(answer)
        servers.append(server)
        path = tmp_path / f"kubeconfig-{len(servers)}"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "raw", "cluster": {"server": server.url}}],
                    "contexts": [{"name": "raw", "context": {"cluster": "raw"}}],
                    "current-context": "raw",
                }
            )
        )
        return path

    yield start
    for server in servers:
        server.close()


def read_claim(kubeconfig: Path, **client: float) -> tuple[str, float]:
    """Read CLAIM through a ClaimReader on a client of ``kubeconfig``: the error's message and the seconds taken."""

    async def scenario() -> tuple[str, float]:
        kube = make_client(kubeconfig, field_manager="devplug-test", **client)  # type: ignore[arg-type]
        reader = ClaimReader(kube, driver="gpu.example.com", pool="node-a", device_id=lambda name: name)
        started = time.monotonic()
        try:
            await reader.read(CLAIM)
        except ClaimReadError as exc:
            return str(exc), time.monotonic() - started
        finally:
            await kube.close()
        raise AssertionError("the claim was read")

    return run(scenario, timeout=90.0)


def headers(status: str, length: int, extra: str = "") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n{extra}\r\n".encode()


def test_an_answer_trickling_a_byte_every_second_ends_at_the_calls_deadline(serve: Callable[..., Path]) -> None:
    body = b'{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "gpu-claim"}}' * 2

    def trickle(connection: socket.socket) -> None:
        connection.sendall(headers("200 OK", len(body)))
        for byte in body:  # each read well within the client's 10 s read timeout: only a deadline ends it
            connection.sendall(bytes([byte]))
            time.sleep(1.0)

    message, took = read_claim(serve(trickle))
    print(f"longest claim read (the prepare's API call) under a 1 byte/s trickle: {took:.2f} s")
    assert DEFAULT_DEADLINE - 0.5 <= took <= DEFAULT_DEADLINE + 3.0, took
    assert "GET /apis/resource.k8s.io/v1/namespaces/default/resourceclaims/gpu-claim" in message, message
    assert f"did not come whole within {DEFAULT_DEADLINE:g} s (the deadline of an API call;" in message, message
    assert kubeclient.DEFAULT_DEADLINE == DEFAULT_DEADLINE


def test_a_redirect_says_so_and_where(serve: Callable[..., Path]) -> None:
    def redirect(connection: socket.socket) -> None:
        connection.sendall(
            b"HTTP/1.1 302 Found\r\nLocation: https://elsewhere.example/login\r\nContent-Length: 0\r\n\r\n"
        )

    message, _ = read_claim(serve(redirect))
    assert "KeyError" not in message, message
    assert "answered 302 (a redirect to https://elsewhere.example/login)" in message, message
    assert "GET /apis/resource.k8s.io/v1/namespaces/default/resourceclaims/gpu-claim" in message, message


def test_a_silent_server_is_a_read_timeout_naming_the_request(serve: Callable[..., Path]) -> None:
    def silent(connection: socket.socket) -> None:
        time.sleep(5.0)

    message, _ = read_claim(serve(silent), timeout=1.0)
    assert "ReadTimeout: timed out (GET /apis/resource.k8s.io/v1/namespaces/default/resourceclaims/gpu-claim)" in (
        message
    ), message


def test_a_40_mb_answer_is_refused_not_read_as_a_claim_of_uid_none(serve: Callable[..., Path]) -> None:
    size = 40 * 1024 * 1024

    def huge(connection: socket.socket) -> None:
        connection.sendall(headers("200 OK", size) + b'{"kind": "ResourceClaim", "junk": "')
        block = b"x" * 65536
        for _ in range(size // len(block)):
            connection.sendall(block)

    message, _ = read_claim(serve(huge))
    assert "uid None" not in message, message
    assert "is larger than 16777216 bytes" in message, message


def test_junk_that_is_no_claim_says_so(serve: Callable[..., Path]) -> None:
    body = b'{"kind": "Status", "spec": {}}'

    def junk(connection: socket.socket) -> None:
        connection.sendall(headers("200 OK", len(body)) + body)

    message, _ = read_claim(serve(junk))
    assert "uid None" not in message, message
    assert "the API server's answer is no ResourceClaim (it has no metadata.uid" in message, message
