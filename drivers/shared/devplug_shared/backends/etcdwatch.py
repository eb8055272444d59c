"""A watch on one etcd key prefix through etcd's HTTP/JSON gateway (``/v3/watch``), kept open by a thread.

The ``etcd`` backend watches ``<prefix>/<resource>/`` with it, so the driver
reads the holders as soon as a claim is created or deleted (released, or its
hold lease ran out) instead of at its next ``refresh_interval`` read. The
stream is opened with the etcd3gw client the backend already uses (its
session carries the TLS settings); each message with events calls
``changed``. When the stream cannot be opened or ends (etcd restarted, the
network cut), the watch opens it again after a capped backoff, over the
endpoints in turn, and calls ``changed`` once it is back (events may have been
missed meanwhile). A stream that goes silent without ending is noticed by
the read timeout: etcd sends a progress notice on an idle watch every
10 minutes (``progress_notify``), so a stream with nothing for
:data:`READ_TIMEOUT` seconds is opened again. The driver's periodic read
stays the safety net meanwhile.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

from devplug.kit import CappedBackoff

__all__ = ["READ_TIMEOUT", "EtcdPrefixWatch"]

log = logging.getLogger("devplug_shared")

#: Seconds without a byte on the stream after which it is opened again (etcd's progress notices come every 600 s).
READ_TIMEOUT = 660.0
#: Seconds before the first attempt to open the stream again, doubling up to :data:`RETRY_MAX`.
RETRY_MIN = 0.5
RETRY_MAX = 30.0


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class EtcdPrefixWatch:
    """Calls ``changed()`` (in the watch's thread) at each batch of events under ``prefix``, until :meth:`close`.

    ``clients`` are etcd3gw clients, one per endpoint (tried in turn);
    ``connect_timeout`` bounds opening the stream.
    """

    def __init__(
        self, clients: Sequence[Any], prefix: str, changed: Callable[[], None], *, connect_timeout: float
    ) -> None:
        if not prefix.endswith("/"):
            raise ValueError(f"EtcdPrefixWatch: the prefix {prefix!r} must end with '/'")
        self.clients = list(clients)
        self.prefix = prefix
        self._changed = changed
        self._connect_timeout = connect_timeout
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._response: Any = None
        #: Whether the current stream was opened (etcd said ``created``): its end restarts the backoff.
        self._streamed = False
        #: Set once the first stream is open (tests and callers that must not miss the first change wait on it).
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"shared-etcd-watch:{prefix}", daemon=True)

    def start(self) -> EtcdPrefixWatch:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop the thread: the open stream is shut down (its read returns at once), no reconnection follows."""
        self._closed.set()
        with self._lock:
            response = self._response
        if response is not None:
            _shutdown(response)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def _create_request(self) -> dict[str, Any]:
        end = self.prefix[:-1] + chr(ord(self.prefix[-1]) + 1)
        return {"create_request": {"key": _b64(self.prefix), "range_end": _b64(end), "progress_notify": True}}

    def _run(self) -> None:
        schedule = CappedBackoff(RETRY_MIN, RETRY_MAX)  # devplug's one backoff, through the kit
        failures = 1  # the wait before the next attempt is the one after this many failures in a row
        delay = schedule.delay(failures)
        index = 0
        while not self._closed.is_set():
            client = self.clients[index % len(self.clients)]
            try:
                response = client.session.post(
                    client.get_url("/watch"),
                    json=self._create_request(),
                    stream=True,
                    timeout=(self._connect_timeout, READ_TIMEOUT),
                )
                with self._lock:
                    self._response = response
                if self._closed.is_set():
                    break
                response.raise_for_status()
                self._follow(response)
            except Exception as exc:  # any end of the stream (requests, JSON, etcd's answer): open it again
                if self._closed.is_set():
                    break
                if self._streamed:  # the stream worked: this failure starts the backoff again
                    self._streamed, failures = False, 1
                    delay = schedule.delay(failures)
                log.debug("shared: the etcd watch on %s ended (%s); opening it again in %g s", self.prefix, exc, delay)
                index += 1
            finally:
                with self._lock:
                    response, self._response = self._response, None
                if response is not None:
                    response.close()
            if self._closed.wait(delay):
                break
            failures += 1
            delay = schedule.delay(failures)

    def _follow(self, response: Any) -> None:
        """Read the stream until it ends; each message carrying events calls ``changed``."""
        for line in response.iter_lines():
            if self._closed.is_set():
                return
            if not line.strip():
                continue
            result = json.loads(line).get("result", {})
            if result.get("created"):
                self._streamed = True
                if self.ready.is_set():
                    self._changed()  # opened again: events may have been missed while the stream was down
                self.ready.set()
                continue
            if result.get("canceled"):
                raise RuntimeError(f"etcd cancelled the watch: {result.get('cancel_reason') or result}")
            if result.get("events"):
                self._changed()
        raise ConnectionError("the watch stream ended")


def _shutdown(response: Any) -> None:
    """Shut the stream's socket down from another thread, so its blocked read returns (etcd3gw's ``Watcher.stop``)."""
    with contextlib.suppress(Exception):
        fileno = response.raw._fp.fileno()
        sock = socket.fromfd(fileno, socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()
    with contextlib.suppress(Exception):
        response.close()
