"""A small HTTP server for the probes and the metrics that no client can wear down: waitress, bounded.

The metrics port is reachable by any pod when the daemon binds ``0.0.0.0`` (as the deploy overlays do, for the
kubelet's probes). A server with a thread per connection and no timeouts let 1,313 half-sent requests hold 1,327
threads and 85 MB. So the serving is `waitress <https://github.com/Pylons/waitress>`_ (the Pylons project's
pure-Python WSGI server, maintained, no dependencies of its own): it reads requests asynchronously in one thread
and hands only complete ones to a fixed pool of workers, and is set up here with

* at most :attr:`HttpLimits.connections` open connections. Waitress would stop accepting at its limit, so a
  flood of slow clients would keep the kubelet's probes waiting in the listen backlog until the daemon is
  restarted for failing them; instead a new connection at the limit evicts the one that has waited longest
  without a complete request (a probe or a scrape sends its request at once, and is answered in
  milliseconds), or is closed itself when every connection is being answered;
* idle connections closed after :attr:`HttpLimits.idle_timeout` seconds, and a request not fully received
  :attr:`HttpLimits.request_timeout` seconds after its first byte closed too (waitress itself times out only
  inactivity, which a client sending one byte a second never shows: :class:`_TimedChannel` adds the rest);
* request headers capped at :attr:`HttpLimits.max_header_bytes`, bodies at :attr:`HttpLimits.max_body_bytes`;
* the drops logged at most once per :data:`LOG_EVERY_S` (a count and the last client), and waitress's own
  warnings just as often.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.server import TcpWSGIServer

__all__ = ["DEFAULT_LIMITS", "HttpLimits", "LimitedHttpServer", "Response"]

log = logging.getLogger("devplug.engine")

#: Log lines about dropped or refused clients come at most this often (seconds).
LOG_EVERY_S = 60.0

#: (status code, body, content type)
Response = tuple[int, bytes, str]
#: The limits a server gets unless told otherwise.
DEFAULT_LIMITS: HttpLimits
_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


@dataclass(frozen=True)
class HttpLimits:
    """What one HTTP client may take of the server."""

    #: Open connections at once; past it, new ones wait in the listen backlog.
    connections: int = 64
    #: Worker threads answering complete requests (each may wait up to the probe timeout for the event loop).
    threads: int = 4
    #: Seconds a connection may sit idle between requests.
    idle_timeout: float = 60.0
    #: Seconds from a request's first byte to its last.
    request_timeout: float = 5.0
    max_header_bytes: int = 16 * 1024
    max_body_bytes: int = 1024


DEFAULT_LIMITS = HttpLimits()


class _TimedChannel(HTTPChannel):  # type: ignore[misc]
    """A waitress channel that knows when the request it is receiving began (``time.time()``, as waitress's own
    ``last_activity``)."""

    request_started = 0.0

    def handle_read(self) -> None:
        """Waitress's read, but a read with nothing to read is no error: the event loop polls every connection and
        then serves the ready ones in turn, so when one is closed (evicted by a new connection) and the new one gets
        its file descriptor number in the same turn, the poll's readiness of the old one reaches the new one.
        Waitress would log an ``EAGAIN`` with its traceback and close the new connection (a probe, as likely as
        not: seen under a flood of slow clients that reconnect as soon as they are dropped)."""
        try:
            self.socket.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return  # not readable after all: wait for the next poll
        except OSError:
            pass  # a real error: waitress's read below meets it and closes the connection
        super().handle_read()

    def received(self, data: bytes) -> bool:
        if self.request is None and data:
            self.request_started = time.time()
        return bool(super().received(data))

    def waiting_since(self) -> float | None:
        """Since when it waits without a complete request (idle, or one arriving); None while being answered."""
        if self.requests:
            return None
        return self.request_started if self.request is not None else self.last_activity


class _RateLimited(logging.Filter):
    """Lets each distinct message of waitress's logger through at most once per :data:`LOG_EVERY_S`; a client's
    socket error (waitress logs ``Socket error`` with a traceback) becomes one line naming the error."""

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        key = str(record.msg)
        if now - self._last.get(key, -LOG_EVERY_S) < LOG_EVERY_S:
            return False
        self._last[key] = now
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, OSError):
            record.msg, record.args = f"{record.getMessage()}: {error!r}", ()
            record.exc_info, record.exc_text = None, None
        return True


_waitress_log = logging.getLogger("waitress")
_waitress_log.addFilter(_RateLimited())


class _BoundedServer(TcpWSGIServer):  # type: ignore[misc]
    channel_class = _TimedChannel

    def __init__(self, *args: Any, limits: HttpLimits, **kwargs: Any) -> None:
        self.limits = limits
        self.dropped = 0
        self.last_dropped: str | None = None
        self._reported = time.monotonic() - LOG_EVERY_S
        super().__init__(*args, **kwargs)

    def readable(self) -> bool:
        """Always accept (a connection past the limit evicts another in :meth:`handle_accept`)."""
        super().readable()  # its maintenance, and its own limit, set far above ours
        return bool(self.accepting)

    def handle_accept(self) -> None:
        if len(self.active_channels) >= self.limits.connections:
            waiting = [(since, ch) for ch in self.active_channels.values() if (since := ch.waiting_since()) is not None]
            if waiting:
                self._drop(min(waiting, key=lambda pair: pair[0])[1], close_now=True)
            else:  # every connection is being answered: this one goes
                try:
                    accepted = self.accept()
                except OSError:
                    return
                if accepted is not None:
                    accepted[0].close()
                    self._count_drop(str(accepted[1]))
                return
        super().handle_accept()

    def maintenance(self, now: float) -> None:
        """Close idle connections (waitress's own rule) and those whose request has been arriving too long."""
        super().maintenance(now)
        cutoff = time.time() - self.limits.request_timeout
        for channel in list(self.active_channels.values()):
            arriving = channel.request is not None and not channel.requests
            if arriving and channel.request_started < cutoff and not channel.will_close:
                self._drop(channel, close_now=False)
        self._report()

    def _drop(self, channel: _TimedChannel, *, close_now: bool) -> None:
        if close_now:
            channel.close()
        else:
            channel.will_close = True
        self._count_drop(str(channel.addr))

    def _count_drop(self, client: str) -> None:
        self.dropped += 1
        self.last_dropped = client

    def _report(self) -> None:
        if self.dropped and time.monotonic() - self._reported >= LOG_EVERY_S:
            log.warning(
                "metrics: dropped %d HTTP client(s) too slow to send their request (over %g s) or past %d "
                "connections (the last: %s)",
                self.dropped,
                self.limits.request_timeout,
                self.limits.connections,
                self.last_dropped,
            )
            self.dropped = 0
            self._reported = time.monotonic()


class LimitedHttpServer:
    """Serves ``handle(method, path) -> Response`` on ``address:port`` in a thread of its own, within ``limits``."""

    def __init__(
        self, address: str, port: int, handle: Callable[[str, str], Response], limits: HttpLimits = DEFAULT_LIMITS
    ) -> None:
        self._handle = handle
        adjustments = Adjustments(
            host=address,
            port=port,
            threads=limits.threads,
            connection_limit=limits.connections + 100,  # never reached: _BoundedServer evicts at limits.connections
            channel_timeout=limits.idle_timeout,
            cleanup_interval=1,
            max_request_header_size=limits.max_header_bytes,
            max_request_body_size=limits.max_body_bytes,
            asyncore_use_poll=True,  # select() stops at file descriptor 1024
            expose_tracebacks=False,
            ident="devplug",
        )
        self._server = _BoundedServer(self._wsgi, {}, adj=adjustments, sockinfo=adjustments.listen[0], limits=limits)
        self._thread = threading.Thread(target=self._server.run, name="metrics-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.effective_port)

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving: every connection and the listening socket closed, the threads ended."""
        server = self._server
        if self._thread.is_alive():
            server.trigger.pull_trigger(self._close_all)
            self._thread.join(timeout)
        else:
            self._close_all()
        server.task_dispatcher.shutdown(timeout=timeout)

    def _close_all(self) -> None:
        """On the server's own thread: close everything in its socket map (its loop ends when that is empty)."""
        for dispatcher in list(self._server._map.values()):
            dispatcher.close()

    def _wsgi(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        method = str(environ.get("REQUEST_METHOD", ""))
        if method not in ("GET", "HEAD"):
            status, body, ctype = 405, b"only GET\n", "text/plain; charset=utf-8"
        else:
            status, body, ctype = self._handle(method, str(environ.get("PATH_INFO", "")))
        start_response(
            f"{status} {_REASONS.get(status, 'Error')}", [("Content-Type", ctype), ("Content-Length", str(len(body)))]
        )
        return [b"" if method == "HEAD" else body]
