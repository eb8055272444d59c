"""The metrics server's probes against a real event loop in a thread and real HTTP on loopback: ``/healthz``
answers from the loop itself, so a loop stuck in a blocking call is reported, not hidden by the HTTP thread."""

from __future__ import annotations

import asyncio
import http.client
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from devplug.engine.metrics import Metrics, MetricsServer, ResourceFigures


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


def _serve(loop_thread: LoopThread, unregistered: list[str]) -> MetricsServer:
    figures = [ResourceFigures("example.com/a", 3, 1, registered=True, registrations=1, kubelet_restarts=0)]
    return Metrics().serve(
        "127.0.0.1",
        0,
        loop_thread.loop,
        lambda: figures,
        lambda: [f"not registered with the kubelet: {', '.join(unregistered)}"] if unregistered else [],
        probe_timeout=0.3,
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
        "from devplug.engine.daemon import Daemon\n"
        f"Daemon(load_config(Path({str(config)!r})))\n"
        "print(' '.join(m for m in ('prometheus_client', 'http.server') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return result.stdout.split()


def test_the_run_path_imports_prometheus_client_only_when_enabled(tmp_path: Path) -> None:
    assert _modules_after_daemon(tmp_path, metrics=False) == []
    assert _modules_after_daemon(tmp_path, metrics=True) == ["prometheus_client", "http.server"]
