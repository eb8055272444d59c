"""The metrics port under a flood of slow clients, and what it costs the kubelet's gRPC calls (issue 24, item 3).

Before the bounded server, 1,313 half-sent requests held 1,327 threads and 85 MB of the daemon, and closing
them printed 178 tracebacks. Here :attr:`Settings.flood_connections` connections are opened to the daemon's
metrics port, each sending a request line and one header but never the blank line that ends the request, in two
ways, on one daemon in the same run:

* **held** (the issue's load): the connections are opened once and kept; the server keeps at most its limit
  open and closes the rest;
* **reopening** (a harder attacker): every connection the server closes is opened again at once, so the
  server's accept-and-close work never stops and shares the daemon's interpreter with gRPC.

For each: Allocate round trips (4 devices per call, the kubelet's socket) without and with the flood, p50 and
p99, and their ratio (the flood's cost to gRPC); the daemon's threads and resident memory; a probe's answer time
(``GET /healthz`` on a fresh connection, as the kubelet's probe); how many slow connections the server closed;
and the tracebacks in the daemon's log once every connection is closed (want none).
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from bench.client import PluginClient
from bench.payloads import device_ids
from bench.procstat import rss_parts_mb
from bench.scenarios.allocate import devplug_series
from bench.settings import Settings
from bench.stats import ms, percentile

__all__ = ["SlowClientProcess", "SlowClients", "free_port", "measure", "probe_ms"]

#: What each slow client sends: a request line and a header, never the blank line that would end the request.
HALF_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: devplug\r\n"


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now (the daemon binds it a moment later)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _raise_open_files(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))


class SlowClients:
    """``count`` connections to ``port`` that each send :data:`HALF_REQUEST` and then nothing, kept open: one the
    server closes is counted (``closed``) and, when ``reopen``, opened again at once. :meth:`run` loops for ever,
    printing ``sent closed`` every 0.1 s; it runs in a process of its own (:class:`SlowClientProcess`) so that
    the flood never holds the measuring process's interpreter between a probe's connect and its send, or in the
    middle of an Allocate's round trip."""

    def __init__(self, port: int, count: int, *, reopen: bool) -> None:
        self.port = port
        self.count = count
        self.reopen = reopen
        self.sent = 0
        self.closed = 0
        self._selector = selectors.DefaultSelector()

    def _open(self) -> None:
        conn = socket.socket()
        conn.setblocking(False)
        code = conn.connect_ex(("127.0.0.1", self.port))
        if code not in (0, errno.EINPROGRESS):
            raise OSError(code, f"connecting to 127.0.0.1:{self.port}: {os.strerror(code)}")
        self._selector.register(conn, selectors.EVENT_WRITE)

    def _step(self, conn: socket.socket, events: int) -> None:
        try:
            if events & selectors.EVENT_WRITE:  # connected (or failed): send the half request once
                conn.send(HALF_REQUEST)
                self.sent += 1
                self._selector.modify(conn, selectors.EVENT_READ)
                return
            if conn.recv(4096):
                return  # an answer (a 408 or 431): wait for the close
        except OSError:
            pass
        self._selector.unregister(conn)  # closed by the server (or never connected)
        conn.close()
        self.closed += 1
        if self.reopen:
            self._open()

    def run(self) -> None:
        _raise_open_files(self.count + 64)
        for _ in range(self.count):
            self._open()
        said = 0.0
        while True:
            for key, events in self._selector.select(timeout=0.05):
                assert isinstance(key.fileobj, socket.socket)
                self._step(key.fileobj, events)
            if time.monotonic() - said >= 0.1:
                print(self.sent, self.closed, flush=True)
                said = time.monotonic()


class SlowClientProcess:
    """:class:`SlowClients` in a child process; ``sent`` and ``closed`` as it last reported them."""

    def __init__(self, port: int, count: int, *, reopen: bool) -> None:
        command = [sys.executable, "-m", "bench.scenarios.metricsflood", str(port), str(count)]
        self._child = subprocess.Popen([*command, "reopen" if reopen else "hold"], stdout=subprocess.PIPE, text=True)
        self.sent = 0
        self.closed = 0
        self._reader = threading.Thread(target=self._read, name="slow-clients", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._child.stdout is not None
        for line in self._child.stdout:
            self.sent, self.closed = (int(word) for word in line.split())

    def check(self) -> None:
        code = self._child.poll()
        if code is not None:
            raise RuntimeError(f"bench: the slow clients' process exited ({code}) before the measurement ended")

    def __enter__(self) -> SlowClientProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self._child.kill()
        self._child.wait()
        self._reader.join(10)


def probe_ms(port: int, timeout: float = 30.0) -> float:
    """One ``GET /healthz`` on a fresh connection until its whole answer arrived, in milliseconds."""
    start = time.perf_counter_ns()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    took = ms(time.perf_counter_ns() - start)
    if not answer.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"bench: the probe got {answer[:80]!r}")
    return took


def _threads(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


@contextlib.contextmanager
def _flood(port: int, count: int, reopen: bool) -> Iterator[SlowClientProcess]:
    with SlowClientProcess(port, count, reopen=reopen) as clients:
        deadline = time.monotonic() + 60
        while clients.sent + clients.closed < count:
            clients.check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"bench: {count} slow clients did not get going within 60 s")
            time.sleep(0.05)
        yield clients
        clients.check()


def _figures(settings: Settings, client: PluginClient, pid: int, port: int, suffix: str) -> dict[str, float]:
    """One Allocate series with a probe after each tenth of it, then the daemon's threads and RSS."""
    series = devplug_series("flood", client, settings, lambda: None, pool=device_ids(settings.flood_devices))
    series.warm_up(settings.warmup)
    probes: list[float] = []
    for _ in range(settings.flood_probes):
        series.run(settings.flood_calls // settings.flood_probes)
        probes.append(probe_ms(port))
    return {
        f"flood_allocate_p50_ms{suffix}": ms(percentile(series.samples, 50)),
        f"flood_allocate_p99_ms{suffix}": ms(percentile(series.samples, 99)),
        f"flood_threads{suffix}": float(_threads(pid)),
        f"flood_rss_mb{suffix}": rss_parts_mb(pid)["VmRSS"],
        f"flood_probe_ms{suffix}": max(probes),
    }


def _flooded(settings: Settings, client: PluginClient, pid: int, port: int, reopen: bool) -> dict[str, float]:
    suffix = "_reopening" if reopen else ""
    with _flood(port, settings.flood_connections, reopen) as clients:
        started = time.monotonic()
        out = _figures(settings, client, pid, port, suffix)
        out[f"flood_closed_per_s{suffix}"] = clients.closed / (time.monotonic() - started)
    return out


def measure(settings: Settings, client: PluginClient, pid: int, port: int, log_path: Path) -> dict[str, float]:
    """The figures above, for a daemon (``pid``) serving Allocate on ``client`` and its metrics on ``port``."""
    out = {"flood_connections": float(settings.flood_connections)}
    out.update(_figures(settings, client, pid, port, "_quiet"))
    out.update(_flooded(settings, client, pid, port, reopen=False))
    out.update(_flooded(settings, client, pid, port, reopen=True))
    out["flood_tracebacks"] = float(log_path.read_text(errors="replace").count("Traceback"))
    for suffix in ("", "_reopening"):
        out[f"flood_allocate_ratio_p99{suffix}"] = (
            out[f"flood_allocate_p99_ms{suffix}"] / out["flood_allocate_p99_ms_quiet"]
        )
        out[f"flood_rss_growth_mb{suffix}"] = out[f"flood_rss_mb{suffix}"] - out["flood_rss_mb_quiet"]
    return out


if __name__ == "__main__":  # python -m bench.scenarios.metricsflood PORT COUNT hold|reopen: the flooder
    SlowClients(int(sys.argv[1]), int(sys.argv[2]), reopen=sys.argv[3] == "reopen").run()
