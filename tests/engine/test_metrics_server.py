"""The metrics server's probes against a real event loop in a thread and real HTTP on loopback: ``/healthz``
answers from the loop itself, so a loop stuck in a blocking call is reported, not hidden by the HTTP thread."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from devplug.daemon.httpserve import DEFAULT_LIMITS, HttpLimits
from devplug.daemon.metrics import Metrics, MetricsServer
from devplug.engine.resourcereport import ResourceFigures


def _get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


class LoopThread:
    """An asyncio loop running in a thread, as the daemon's is."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def block_until(self, release: threading.Event) -> threading.Event:
        """Make the loop run a blocking call until ``release`` is set; returns an event set once it blocks."""
        blocked = threading.Event()

        def stuck() -> None:
            blocked.set()
            release.wait(30)

        self.loop.call_soon_threadsafe(stuck)
        assert blocked.wait(10)
        return blocked

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.close()


def _serve(loop_thread: LoopThread, unregistered: list[str], limits: HttpLimits = DEFAULT_LIMITS) -> MetricsServer:
    figures = [ResourceFigures("example.com/a", 3, 1, registered=True, registrations=1, kubelet_restarts=0)]
    return Metrics().serve(
        "127.0.0.1",
        0,
        loop_thread.loop,
        lambda: figures,
        lambda: [f"not registered with the kubelet: {', '.join(unregistered)}"] if unregistered else [],
        probe_timeout=0.3,
        limits=limits,
    )


def test_probes_answer_from_the_event_loop(loop_thread: LoopThread) -> None:
    unregistered = ["example.com/b"]
    server = _serve(loop_thread, unregistered)
    try:
        assert _get(server.port, "/healthz") == (200, "ok\n")
        assert _get(server.port, "/readyz") == (503, "not ready: not registered with the kubelet: example.com/b\n")
        unregistered.clear()
        assert _get(server.port, "/readyz") == (200, "ready\n")
        status, body = _get(server.port, "/metrics")
        assert status == 200
        assert 'devplug_devices{health="healthy",resource="example.com/a"} 3.0' in body
        assert 'devplug_devices{health="unhealthy",resource="example.com/a"} 1.0' in body

        release = threading.Event()
        loop_thread.block_until(release)  # the loop is stuck; the HTTP thread is fine
        try:
            status, body = _get(server.port, "/healthz")
            assert (status, body) == (503, "unhealthy: the event loop did not run a call within 0.3 s\n")
            assert _get(server.port, "/readyz")[0] == 503
            assert _get(server.port, "/metrics")[0] == 503
        finally:
            release.set()
        assert _get(server.port, "/healthz") == (200, "ok\n")
    finally:
        server.close()


def test_healthz_fails_once_the_loop_is_gone() -> None:
    lt = LoopThread()
    server = _serve(lt, [])
    try:
        assert _get(server.port, "/healthz")[0] == 200
        lt.close()
        status, body = _get(server.port, "/healthz")
        assert status == 503
        assert body.startswith("unhealthy: the event loop is gone")
    finally:
        server.close()


def _closed_by_server(client: socket.socket) -> bool:
    """True once the server closed ``client`` (end of stream, or a reset)."""
    try:
        return client.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_slow_clients_take_no_thread_each_are_dropped_and_never_starve_the_probes(
    loop_thread: LoopThread, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 24: half-sent requests held a thread each (1,313 of them, 85 MB) and closing them printed
    tracebacks. Now: a bounded number of connections, the oldest still-arriving request evicted by a new client
    past the limit, slow requests closed after request_timeout, one log line for all of it."""
    caplog.set_level(logging.INFO)
    limits = HttpLimits(connections=16, threads=2, request_timeout=0.5, idle_timeout=2.0)
    server = _serve(loop_thread, [], limits)
    threads = threading.active_count()
    clients: list[socket.socket] = []
    try:
        for _ in range(300):
            client = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            client.sendall(b"GET /metr")  # and nothing more
            clients.append(client)
        assert _get(server.port, "/healthz") == (200, "ok\n")  # a probe after the flood is answered at once
        assert threading.active_count() <= threads, "a thread per connection"
        for client in clients:
            client.settimeout(10)
            assert _closed_by_server(client), "a slow client kept its connection"
        assert _get(server.port, "/readyz") == (200, "ready\n")
    finally:
        for client in clients:
            client.close()
        server.close()
    drops = [r for r in caplog.records if "dropped" in r.getMessage() and "HTTP client" in r.getMessage()]
    assert len(drops) == 1, [r.getMessage() for r in drops]
    assert "past 16 connections" in drops[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


#: A flooder process: ``count`` connections that send half a request and nothing more; each one the server closes
#: is opened again at once (an attacker who reconnects). It prints how many were closed, every 0.1 s. It runs in a
#: process of its own so that it does not hold the test's interpreter between a probe's connect and its send (the
#: kubelet's prober, in Go, sends its request right after connecting).
_REOPENING_FLOOD = """
import selectors, socket, sys, time
port, count = int(sys.argv[1]), int(sys.argv[2])
selector = selectors.DefaultSelector()
closed = 0
def open_one():
    conn = socket.socket()
    conn.setblocking(False)
    conn.connect_ex(("127.0.0.1", port))
    selector.register(conn, selectors.EVENT_WRITE)
for _ in range(count):
    open_one()
said = time.monotonic()
while True:
    for key, events in selector.select(timeout=0.05):
        conn = key.fileobj
        try:
            if events & selectors.EVENT_WRITE:
                conn.send(b"GET /metrics HTTP/1.1\\r\\nHost: x\\r\\n")
                selector.modify(conn, selectors.EVENT_READ)
                continue
            if conn.recv(4096):
                continue
        except OSError:
            pass
        selector.unregister(conn)
        conn.close()
        closed += 1
        open_one()
    if time.monotonic() - said > 0.1:
        print(closed, flush=True)
        said = time.monotonic()
"""


#: The prober: ``count`` GETs of ``path`` one after another, each on a new connection, as the kubelet's prober makes
#: them; one JSON line per probe, ``[status, body]`` or the error's repr. A process of its own, as the kubelet is: in
#: the test's interpreter the server's thread could hold the GIL between a probe's connect and its send, which a
#: busy machine stretches past the moment the flood has evicted the probe as the longest waiting connection.
_PROBER = """
import http.client, json, sys
port, path, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for _ in range(count):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        print(json.dumps([response.status, response.read().decode()]), flush=True)
    except (OSError, http.client.HTTPException) as exc:
        print(json.dumps(repr(exc)), flush=True)
    finally:
        conn.close()
"""


@pytest.mark.alone  # a probe evicted because a test beside it held the CPU past 16 reconnections is no fault here
def test_every_probe_is_answered_while_slow_clients_reconnect_as_fast_as_they_are_dropped(
    loop_thread: LoopThread, caplog: pytest.LogCaptureFixture
) -> None:
    """An attacker who reconnects each slow client the server drops keeps the server closing and accepting: a
    probe must still get its answer, never a closed connection. Before, the loop turn that evicted a connection
    could hand its poll readiness to a new connection given the same file descriptor number: waitress logged an
    EAGAIN with a traceback and closed that new connection, a probe as likely as not."""
    caplog.set_level(logging.INFO)
    server = _serve(loop_thread, [], HttpLimits(connections=16, threads=2, request_timeout=0.5, idle_timeout=2.0))
    flood = subprocess.Popen(
        [sys.executable, "-c", _REOPENING_FLOOD, str(server.port), "200"], stdout=subprocess.PIPE, text=True
    )
    answers: list[object] = []
    try:
        assert flood.stdout is not None
        for line in flood.stdout:  # the flood is under way once the server has closed 200 of its connections
            if int(line) >= 200:
                break
        probes = subprocess.run(
            [sys.executable, "-c", _PROBER, str(server.port), "/healthz", "100"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        answers = [tuple(a) if isinstance(a, list) else a for a in map(json.loads, probes.stdout.splitlines())]
        assert len(answers) == 100, probes.stdout + probes.stderr
        assert flood.poll() is None, "the flooder stopped before the probes were done"
    finally:
        flood.kill()
        flood.wait()
        server.close()
    failed = [a for a in answers if a != (200, "ok\n")]
    assert not failed, f"{len(failed)} of {len(answers)} probes failed during the flood, e.g. {failed[:3]}"
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


def test_headers_are_capped_and_only_get_is_served(loop_thread: LoopThread) -> None:
    server = _serve(loop_thread, [], HttpLimits(max_header_bytes=1024))
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.putrequest("GET", "/healthz")
        conn.putheader("X-Padding", "a" * 4096)
        conn.endheaders()
        assert conn.getresponse().status == 431  # Request Header Fields Too Large
        conn.close()
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("POST", "/healthz", body=b"x")
        assert conn.getresponse().status == 405
        conn.close()
        assert _get(server.port, "/nowhere")[0] == 404
    finally:
        server.close()


def _modules_after_daemon(tmp_path: Path, metrics: bool) -> list[str]:
    config = tmp_path / f"devplug-{metrics}.toml"
    config.write_text(
        f"[metrics]\nenabled = {'true' if metrics else 'false'}\n"
        f'[resources."example.com/mock"]\ndriver = "mock"\noptions = {{ directory = "{tmp_path / "mock"}" }}\n'
    )
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from devplug.config import load_config\n"
        "from devplug.daemon.process import Daemon\n"
        f"Daemon(load_config(Path({str(config)!r})))\n"
        "print(' '.join(m for m in ('prometheus_client', 'waitress') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return result.stdout.split()


def test_the_run_path_imports_prometheus_client_only_when_enabled(tmp_path: Path) -> None:
    assert _modules_after_daemon(tmp_path, metrics=False) == []
    assert _modules_after_daemon(tmp_path, metrics=True) == ["prometheus_client", "waitress"]
