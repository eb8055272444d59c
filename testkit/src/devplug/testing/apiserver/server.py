"""The stand-in over real HTTP on loopback: REST paths, JSON bodies, chunked watch streams; test hooks.

Paths follow ``k8s.io/apiserver/pkg/endpoints/installer.go``: ``/api/v1/[namespaces/<ns>/]<plural>[/<name>[/<sub>]]``
for core kinds, ``/apis/<group>/<version>/...`` for the others; a namespaced kind is listed and watched across
namespaces without ``namespaces/<ns>``. A path under a served group version that names nothing served is ``404``
with the ``Status`` "the server could not find the requested resource" (go-restful's route miss, written by the
generic server's ``serviceErrorHandler``); any other path, a group or version not served among them (``/apis/
resource.k8s.io/v1/...`` of a 1.32 server), reaches the end of the handler chain: ``404`` with the text ``404 page not
found`` (``text/plain; charset=utf-8``: ``k8s.io/apiserver/pkg/util/notfoundhandler`` calls Go's ``http.NotFound``
up to 1.36; kubernetes/kubernetes#138219 makes it a JSON ``Status`` after). lightkube raises no ``ApiError`` for
that one (its body is no ``Status``) but httpx's ``HTTPStatusError``. Discovery (:mod:`.discovery`): ``/api``,
``/api/v1``, ``/apis``, ``/apis/<group>``, ``/apis/<group>/<version>``, ``/version``.

A watch is ``GET`` on a collection with ``watch=true``: ``200``, ``Transfer-Encoding: chunked``, one JSON object per
line (``{"type": ..., "object": ...}``); without ``timeoutSeconds`` it lasts a random time between
``min_request_timeout`` and twice that (``--min-request-timeout``, 1800 s), as the real server's watch handler does.

The HTTP server is the standard library's ``ThreadingHTTPServer``, not waitress (which serves devplug's metrics):
a watch is a long-lived response streamed event by event, each flushed at once, that a test may also cut
mid-stream; ``ThreadingHTTPServer`` gives each connection its own thread and the handler the socket, where
waitress serves WSGI apps from a fixed pool of worker threads (a few open watches would starve every other
request) and buffers what an app yields.

HTTPS and bearer tokens, for testing how a client finds and presents its credentials (the in-cluster service
account: a CA file and a token file the kubelet rotates): ``ApiServer(tls=context)`` serves HTTPS with a server-side
``ssl.SSLContext`` (the handshake runs in the connection's thread), and ``ApiServer(tokens={...})`` authenticates
every request by ``Authorization: Bearer <token>`` against that set (:attr:`ApiServer.tokens`, which a test may
replace to rotate tokens). A request without a known token is ``401 Unauthorized`` with the ``Status`` the real
server's authentication filter writes (``k8s.io/apiserver/pkg/endpoints/filters/authentication.go``: ``Unauthorized``
answers ``apierrors.NewUnauthorized("Unauthorized")``), before any routing, as with ``--anonymous-auth=false``
(with anonymous requests allowed, a request without a token would be ``system:anonymous`` and meet authorization,
which the stand-in does not model). The token file authenticator (``--token-auth-file``) is the model: a fixed set
of tokens, no TokenReview, no expiry.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import select
import socket
import ssl
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from devplug.testing.apiserver import discovery, versions
from devplug.testing.apiserver.codec import Codec
from devplug.testing.apiserver.errors import ApiStatusError, bad_request
from devplug.testing.apiserver.resources import RESOURCES, Resource, by_path, by_plural
from devplug.testing.apiserver.storage import APPLY_MEDIA, RequestRecord, Storage, Writer

__all__ = ["ApiServer", "Fault", "Faults"]

_CORE = re.compile(
    r"^/api/v1/(?:namespaces/(?P<ns>[^/]+)/)?(?P<plural>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?/?$"
)
_GROUP = re.compile(
    r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/(?:namespaces/(?P<ns>[^/]+)/)?(?P<plural>[^/]+)"
    r"(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?/?$"
)
_REASONS = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}


def _not_served() -> ApiStatusError:
    return ApiStatusError(404, "NotFound", "the server could not find the requested resource")


class _PageNotFound(Exception):
    """A path no handler serves (a group or version not served among them): Go's ``http.NotFound``."""


_DISCOVERY_GROUP = re.compile(r"^/apis/(?P<group>[^/]+)(?:/(?P<version>[^/]+))?/?$")


@dataclass
class Fault:
    """Requests to fail: the next ``count`` matching ``verb`` and ``resource`` (None: any) get ``code``."""

    code: int
    count: int
    verb: str | None
    resource: str | None
    retry_after: int | None

    def error(self) -> ApiStatusError:
        if self.code == 429:
            message = "Too many requests, please try again later."
        elif self.code == 500:
            message = "Internal error occurred: a fault injected by the test (devplug.testing.apiserver)"
        else:
            message = "a fault injected by the test (devplug.testing.apiserver)"
        return ApiStatusError(
            self.code, _REASONS.get(self.code, "InternalError"), message, retry_after=self.retry_after
        )


class Faults:
    """Faults injected into the HTTP requests (not into in-process calls)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[Fault] = []
        self._silent: list[Fault] = []

    def fail(
        self,
        code: int = 500,
        *,
        count: int = 1,
        verb: str | None = None,
        resource: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        """Fail the next ``count`` requests of ``verb`` (``get``, ``list``, ``watch``, ``create``, ``update``,
        ``patch``, ``delete``, ``deletecollection``) on ``resource`` (a plural) with ``code`` (429 answers
        ``TooManyRequests`` with ``Retry-After: retry_after``, default 1, as the API server's priority and
        fairness does)."""
        if code == 429 and retry_after is None:
            retry_after = 1
        with self._lock:
            self._pending.append(Fault(code, count, verb, resource, retry_after))

    def silence_watches(self, *, count: int = 1, resource: str | None = None) -> None:
        """Answer the next ``count`` watches of ``resource`` (a plural; None: any) ``200`` and then send nothing at
        all, no event and no BOOKMARK, until the client goes away, :meth:`ApiServer.close_watches` or the server
        stops: what a client sees of a stream a proxy or load balancer holds open without passing anything on, or
        of a connection that died without a FIN. (Watches already open keep streaming: cut them with
        :meth:`ApiServer.close_watches` so the client's next one is silent.)"""
        with self._lock:
            self._silent.append(Fault(200, count, "watch", resource, None))

    def take_silence(self, resource: str) -> bool:
        """Whether this watch of ``resource`` is to stay silent (:meth:`silence_watches`)."""
        with self._lock:
            for fault in self._silent:
                if fault.resource in (None, resource):
                    fault.count -= 1
                    if fault.count <= 0:
                        self._silent.remove(fault)
                    return True
        return False

    def take(self, verb: str, resource: str) -> ApiStatusError | None:
        with self._lock:
            for fault in self._pending:
                if fault.verb in (None, verb) and fault.resource in (None, resource):
                    fault.count -= 1
                    if fault.count <= 0:
                        self._pending.remove(fault)
                    return fault.error()
        return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    api: ApiServer
    tls: ssl.SSLContext | None = None

    def get_request(self) -> tuple[Any, Any]:
        """Each connection, wrapped in TLS when the server serves HTTPS; the handshake happens on the handler's
        first read, in the connection's own thread (a client that never completes one stalls only itself)."""
        sock, address = super().get_request()
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-request (a killed daemon, a closed watch) is no error of the server's."""
        if not isinstance(sys.exc_info()[1], (ConnectionError, OSError)):
            super().handle_error(request, client_address)


def _flag(value: str | None) -> bool:
    return value is not None and value.lower() in ("true", "1")


def _verb(method: str, name: str | None, query: Mapping[str, str]) -> str:
    """The API verb of a request on a kind's path."""
    if method == "GET":
        return "get" if name else ("watch" if _flag(query.get("watch")) else "list")
    if method == "DELETE":
        return "delete" if name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    #: TCP_NODELAY on every connection, as Go's net package sets it on every TCP connection the API server accepts
    #: (``net/tcpsock.go``, ``newTCPConn``). Without it a keep-alive client's request waits out the delayed ACK of
    #: the headers written before the body (about 40 ms on Linux): every call would look 40 ms slower than it is.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    # --- plumbing

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _answer(
        self, code: int, body: Mapping[str, Any], retry_after: int | None = None, warnings: list[str] | None = None
    ) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if retry_after is not None:
            self.send_header("Retry-After", str(retry_after))
        for text in warnings or ():  # k8s.io/apiserver/pkg/endpoints/filters/warning.go: 299, agent "-", quoted
            self.send_header("Warning", f"299 - {json.dumps(text)}")
        self.end_headers()
        self.wfile.write(data)

    def _page_not_found(self) -> None:
        """Go's ``http.NotFound``: ``404 page not found`` as plain text."""
        data = b"404 page not found\n"
        self.send_response(404)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    @staticmethod
    def _decode(raw: bytes, media: str) -> Any:
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            if media != APPLY_MEDIA:
                raise bad_request(f"couldn't get version/kind; json parse error: {exc}") from None
        try:
            import yaml  # type: ignore[import-untyped]
        except ImportError:
            raise ApiStatusError(
                415,
                "UnsupportedMediaType",
                "the stand-in reads YAML apply bodies with PyYAML, which is not installed; send JSON (YAML's subset)",
            ) from None
        try:
            return yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise bad_request(f"error decoding YAML: {exc}") from None

    # --- dispatch

    def _discovery(self, path: str) -> dict[str, Any] | None:
        """The discovery document at ``path`` (None: ``path`` is no discovery path); :class:`_PageNotFound` for a
        group or version not served."""
        api = self.server.api
        served = api.resource_versions
        found: dict[str, Any] | None
        if path in ("/api", "/api/"):
            host, port = self.server.server_address[:2]
            return discovery.api_versions(f"{host!s}:{port}")
        if path in ("/api/v1", "/api/v1/"):
            found = discovery.api_resource_list("", "v1", served)
        elif path in ("/apis", "/apis/"):
            return discovery.api_group_list(served)
        elif path in ("/version", "/version/"):
            return discovery.version_info(api.release)
        else:
            match = _DISCOVERY_GROUP.match(path)
            if match is None:
                return None
            if match["version"] is None:
                found = discovery.api_group(match["group"], served)
            else:
                found = discovery.api_resource_list(match["group"], match["version"], served)
        if found is None:
            raise _PageNotFound(path)
        return found

    def _served_version(self, group: str, version: str) -> bool:
        if group == versions.GROUP:
            return version in self.server.api.resource_versions
        return any(r.group == group and r.version == version for r in RESOURCES)

    def _route(self) -> tuple[Resource, str | None, str | None, str, str]:
        """The kind, namespace, name, subresource and version a resource path names."""
        path = urlsplit(self.path).path
        core, group = _CORE.match(path), _GROUP.match(path)
        if core is not None:
            match, resource, version = core, by_path("", "v1", core["plural"]), "v1"
        elif group is not None:
            version = group["version"]
            if not self._served_version(group["group"], version):
                raise _PageNotFound(path)
            if group["group"] == versions.GROUP:
                found = [r for r in RESOURCES if r.group == versions.GROUP and r.plural == group["plural"]]
                resource = found[0] if found else None
            else:
                resource = by_path(group["group"], version, group["plural"])
            match = group
        else:
            raise _PageNotFound(path)
        if resource is None:
            raise _not_served()
        namespace = unquote(match["ns"]) if match["ns"] else None
        name = unquote(match["name"]) if match["name"] else None
        sub = match["sub"] or ""
        if (namespace is not None and not resource.namespaced) or (sub and sub not in resource.subresources):
            raise _not_served()
        return resource, namespace, name, sub, version

    def _serve(self, method: str) -> None:
        api = self.server.api
        query = {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query, keep_blank_values=True).items()}
        raw = self._read_body()
        resource_name, namespace, name, sub, verb = "", "", None, "", method.lower()
        path = urlsplit(self.path).path
        codec: Codec | None = None
        try:
            self._authenticate(api.tokens)
            if method == "GET":
                document = self._discovery(path)
                if document is not None:
                    verb = "get"
                    fault = api.faults.take(verb, "")
                    if fault is not None:
                        raise fault
                    api.storage.requests.append(RequestRecord("get", method, "", "", None, "", 200, query, path=path))
                    self._answer(200, document)
                    return
            resource, ns, name, sub, version = self._route()
            codec = Codec(resource, version, api.release)
            resource_name, namespace = resource.plural, ns or ""
            verb = _verb(method, name, query)
            if resource.namespaced and ns is None and verb not in ("list", "watch", "deletecollection"):
                raise _not_served()
            fault = api.faults.take(verb, resource.plural)
            if fault is not None:
                raise fault
            if verb == "watch":
                self._watch(resource, ns, query, codec)
                return
            code, body = self._dispatch(verb, resource, namespace, name, sub, query, raw, codec)
        except _PageNotFound:
            group = _GROUP.match(path)  # a kind's path in a version not served: recorded as its kind's request
            if group is not None:
                resource_name, name = group["plural"], unquote(group["name"]) if group["name"] else None
                verb = _verb(method, name, query)
            record = RequestRecord(verb, method, resource_name, namespace, name, sub, 404, query, path=path)
            api.storage.requests.append(record)
            self._page_not_found()
            return
        except ApiStatusError as exc:
            code, body = exc.code, exc.status()
            record = RequestRecord(verb, method, resource_name, namespace, name, sub, code, query, path=path)
            api.storage.requests.append(record)
            self._answer(code, body, exc.retry_after)
            return
        api.storage.requests.append(
            RequestRecord(verb, method, resource_name, namespace, name, sub, code, query, path=path)
        )
        self._answer(code, body, warnings=codec.warnings if codec is not None else None)

    def _authenticate(self, tokens: frozenset[str] | None) -> None:
        """401 ``Unauthorized`` unless the request bears one of ``tokens`` (None: no authentication)."""
        if tokens is None:
            return
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or token.strip() not in tokens:
            raise ApiStatusError(401, "Unauthorized", "Unauthorized")

    def _writer(self, query: Mapping[str, str], codec: Codec | None = None) -> Writer:
        manager = query.get("fieldManager") or (self.headers.get("User-Agent") or "unknown").split("/")[0]
        dry_run = query.get("dryRun")
        if dry_run not in (None, "", "All"):
            raise bad_request(f'dryRun: Unsupported value: "{dry_run}": supported values: "All"')
        return Writer(manager, dry_run == "All", codec.api_version if codec is not None else None)

    def _dispatch(
        self,
        verb: str,
        resource: Resource,
        namespace: str,
        name: str | None,
        sub: str,
        query: Mapping[str, str],
        raw: bytes,
        codec: Codec,
    ) -> tuple[int, Any]:
        storage = self.server.api.storage
        media = (self.headers.get("Content-Type") or "application/json").split(";")[0].strip()
        validation = query.get("fieldValidation")
        if verb == "get":
            return 200, codec.out(storage.get(resource, namespace, name or "", query.get("resourceVersion")))
        if verb == "list":
            limit = query.get("limit")
            return 200, codec.out_list(
                storage.list(
                    resource,
                    namespace or None,
                    label_selector=query.get("labelSelector", ""),
                    field_selector=query.get("fieldSelector", ""),
                    resource_version=query.get("resourceVersion"),
                    resource_version_match=query.get("resourceVersionMatch"),
                    limit=int(limit) if limit else None,
                    continue_token=query.get("continue"),
                )
            )
        body = self._decode(raw, media)
        if verb == "create" and sub == "binding":
            target = ((body or {}).get("target") or {}).get("name")
            if not target:
                raise bad_request("a Binding needs target.name")
            storage.bind(namespace, name or "", target, self._writer(query))
            return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
        if verb == "create":
            if name:
                raise _not_served()
            body = codec.into(body or {}, apply=False, validation=validation)
            return 201, codec.out(storage.create(resource, namespace, body, self._writer(query, codec)))
        if verb == "update":
            body = codec.into(body or {}, apply=False, validation=validation)
            return 200, codec.out(
                storage.update(resource, namespace, name or "", body, self._writer(query, codec), sub)
            )
        if verb == "patch":
            writer = self._writer(query, codec)
            view = None
            if media == APPLY_MEDIA:
                if not query.get("fieldManager"):  # required, never the user agent's
                    writer = Writer("", writer.dry_run, writer.api_version)
                body = codec.into(body, apply=True, validation=validation)
            elif codec.schema is not None:
                view = (codec.out, lambda patched: codec.into(patched, apply=False, validation=validation))
            return 200, codec.out(
                storage.patch(
                    resource,
                    namespace,
                    name or "",
                    body,
                    media,
                    writer,
                    sub,
                    force=_flag(query.get("force")),
                    view=view,
                )
            )
        options = dict(body or {})
        for key in ("propagationPolicy", "gracePeriodSeconds", "orphanDependents"):
            if key in query and key not in options:
                options[key] = (
                    int(query[key])
                    if key == "gracePeriodSeconds"
                    else (_flag(query[key]) if key == "orphanDependents" else query[key])
                )
        if verb == "delete":
            return 200, codec.out(storage.delete(resource, namespace, name or "", options, self._writer(query, codec)))
        return 200, codec.out_list(
            storage.delete_collection(
                resource,
                namespace or None,
                label_selector=query.get("labelSelector", ""),
                field_selector=query.get("fieldSelector", ""),
                options=options,
                writer=self._writer(query, codec),
            )
        )

    def _watch(self, resource: Resource, namespace: str | None, query: Mapping[str, str], codec: Codec) -> None:
        api = self.server.api
        timeout = query.get("timeoutSeconds")
        send_initial = query.get("sendInitialEvents")
        stream = api.storage.watch(
            resource,
            namespace,
            label_selector=query.get("labelSelector", ""),
            field_selector=query.get("fieldSelector", ""),
            resource_version=query.get("resourceVersion"),
            resource_version_match=query.get("resourceVersionMatch"),
            allow_bookmarks=_flag(query.get("allowWatchBookmarks")),
            send_initial_events=None if send_initial is None else _flag(send_initial),
            timeout_s=float(timeout) if timeout else api.min_request_timeout * (random.random() + 1.0),
        )
        api.storage.requests.append(
            RequestRecord(
                "watch", "GET", resource.plural, namespace or "", None, "", 200, query, path=urlsplit(self.path).path
            )
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        stop = threading.Event()
        if api.faults.take_silence(resource.plural):
            with api.track(stop):
                self._stay_silent(stop)
            self.close_connection = True
            return
        with api.track(stop):
            try:
                for event in stream.events(stop):
                    self._chunk(json.dumps(codec.event(event)).encode() + b"\n")
            except (ConnectionError, OSError):
                self.close_connection = True
                return
        if stream.cut:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _stay_silent(self, stop: threading.Event) -> None:
        """Send nothing until the client goes away, the watches are closed or the server stops (a silent watch)."""
        storage = self.server.api.storage
        epoch = storage.watch_epoch
        while not (stop.wait(0.1) or storage.closed or storage.watch_epoch != epoch):
            if self.server.tls is None:
                readable, _, _ = select.select([self.connection], [], [], 0)
                if readable:
                    try:
                        if not self.connection.recv(1, socket.MSG_PEEK):
                            return  # the client closed its end
                    except OSError:
                        return
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")


class _Tracked:
    def __init__(self, api: ApiServer, stop: threading.Event) -> None:
        self.api, self.stop = api, stop

    def __enter__(self) -> None:
        with self.api._watch_lock:
            self.api._watch_stops.add(self.stop)

    def __exit__(self, *exc: object) -> None:
        with self.api._watch_lock:
            self.api._watch_stops.discard(self.stop)


def _gates(rel: versions.Release, disabled: Iterable[str] | None, enabled: Iterable[str]) -> frozenset[str]:
    """The gates off: ``disabled`` (default: the release's off-by-default ones) less ``enabled``."""
    off = rel.off_by_default if disabled is None else frozenset(disabled)
    return off - frozenset(enabled)


class ApiServer:
    """The API server stand-in on ``http://127.0.0.1:<free port>``, served from threads; a context manager.

    ``storage`` holds the objects (in-process calls take the same path as HTTP ones); ``faults`` injects
    failures; the garbage collector runs in a thread of its own while the server runs (``gc=False`` leaves it
    to :meth:`collect_garbage`). ``tls`` (a server-side ``ssl.SSLContext``) serves HTTPS instead, and ``tokens``
    makes every request need one of these bearer tokens (see the module's docstring).

    The control plane modelled: ``release`` (``"1.32"`` .. ``"1.36"``, default ``"1.36"``) serves the
    ``resource.k8s.io`` versions a control plane of that release set up for DRA serves (1.32: v1beta1; 1.33:
    v1beta1 and v1beta2; 1.34 on: v1), or ``resource_versions`` (any of that release's: ``("v1", "v1beta1")`` for
    a 1.34 server with ``--runtime-config=resource.k8s.io/v1beta1=true``), and stores only the fields that
    release's types have; ``disabled_features`` names the feature gates that are off (default: those the release
    has off, :data:`devplug.testing.apiserver.versions.GATES`: e.g. ``DRADeviceTaints``, ``DRAPartitionableDevices``
    and ``DRAConsumableCapacity`` on 1.34 and 1.35; ``()`` turns them all on), ``enabled_features`` those turned on
    beside the default (``--feature-gates=DRAConsumableCapacity=true`` on a 1.34 server:
    ``enabled_features={"DRAConsumableCapacity"}``). :meth:`restart` changes these as an upgrade or a restart with
    other flags does. See :mod:`devplug.testing.apiserver.versions`.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        storage: Storage | None = None,
        history_limit: int = 10_000,
        bookmark_interval: float = 60.0,
        min_request_timeout: float = 1800.0,
        gc: bool = True,
        tls: ssl.SSLContext | None = None,
        tokens: Iterable[str] | None = None,
        disabled_features: Iterable[str] | None = None,
        release: str = "1.36",
        resource_versions: Iterable[str] | None = None,
        enabled_features: Iterable[str] = (),
    ) -> None:
        self.release = versions.release(release)
        #: The ``resource.k8s.io`` versions served, in discovery's order (the first is ``preferredVersion``).
        self.resource_versions = self.release.ordered(
            list(self.release.default if resource_versions is None else resource_versions)
        )
        features = _gates(self.release, disabled_features, enabled_features)
        self.storage = storage or Storage(
            history_limit=history_limit, bookmark_interval=bookmark_interval, disabled_features=features
        )
        self.storage.release = self.release
        self.faults = Faults()
        self.min_request_timeout = min_request_timeout
        self._server = _Server((host, port), _Handler)
        self._server.api = self
        self._server.tls = tls
        #: The bearer tokens accepted (None: requests are not authenticated); replace it to rotate tokens.
        self.tokens: frozenset[str] | None = None if tokens is None else frozenset(tokens)
        self._thread = threading.Thread(target=self._server.serve_forever, name="apiserver-standin", daemon=True)
        self._gc_thread = (
            threading.Thread(target=self._collect, name="apiserver-standin-gc", daemon=True) if gc else None
        )
        self._watch_lock = threading.Lock()
        self._watch_stops: set[threading.Event] = set()
        self._started = False

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        scheme = "https" if self._server.tls is not None else "http"
        return f"{scheme}://{host!s}:{port}"

    def start(self) -> ApiServer:
        if not self._started:
            self._started = True
            self._thread.start()
            if self._gc_thread is not None:
                self._gc_thread.start()
        return self

    def close(self) -> None:
        """Stop serving: open watches end, the garbage collector stops, the port is closed."""
        self.storage.close()
        with self._watch_lock:
            for stop in self._watch_stops:
                stop.set()
        if self._started:
            self._server.shutdown()
        self._server.server_close()
        if self._gc_thread is not None and self._gc_thread.is_alive():
            self._gc_thread.join(5.0)

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def track(self, stop: threading.Event) -> _Tracked:
        return _Tracked(self, stop)

    def restart(
        self,
        *,
        release: str | None = None,
        resource_versions: Iterable[str] | None = None,
        disabled_features: Iterable[str] | None = None,
        enabled_features: Iterable[str] = (),
    ) -> None:
        """The API server restarts, keeping its storage (etcd): as another ``release`` (an upgrade; default: the
        same), serving ``resource_versions`` (default: that release's default) with ``disabled_features`` (default:
        that release's): every watch is cut mid-stream, as a restarting server's connections are, and requests
        from now on meet the new server. Objects keep their fields until they are written again."""
        self.release = versions.release(release) if release is not None else self.release
        self.resource_versions = self.release.ordered(
            list(self.release.default if resource_versions is None else resource_versions)
        )
        self.storage.release = self.release
        self.storage.disabled_features = _gates(self.release, disabled_features, enabled_features)
        self.storage.close_watches(abrupt=True)

    def _collect(self) -> None:
        storage = self.storage
        while not storage.closed:
            storage.gc_wanted.wait(1.0)
            storage.gc_wanted.clear()
            for _ in range(100):  # until a pass writes nothing (bounded)
                if storage.closed or storage.collect_garbage() == 0:
                    break

    # --- for tests: reading, writing as a controller would, faults

    @staticmethod
    def resource(plural: str) -> Resource:
        return by_plural(plural)

    def as_version(self, plural: str, obj: Mapping[str, Any], version: str) -> dict[str, Any]:
        """A stored object (an answer of :meth:`get`) as a client of ``resource.k8s.io/<version>`` of this
        server's release sees it."""
        return Codec(by_plural(plural), version, self.release).out(obj)

    def get(self, plural: str, name: str, namespace: str = "") -> dict[str, Any]:
        return self.storage.get(by_plural(plural), namespace, name)

    def objects(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return self.storage.objects(by_plural(plural), namespace)

    def create(
        self, plural: str, obj: Mapping[str, Any], namespace: str = "", manager: str = "devplug-testing"
    ) -> dict[str, Any]:
        return self.storage.create(by_plural(plural), namespace, obj, Writer(manager))

    def update(
        self,
        plural: str,
        obj: Mapping[str, Any],
        namespace: str = "",
        manager: str = "devplug-testing",
        subresource: str = "",
    ) -> dict[str, Any]:
        name = str((obj.get("metadata") or {}).get("name", ""))
        return self.storage.update(by_plural(plural), namespace, name, obj, Writer(manager), subresource)

    def apply(
        self,
        plural: str,
        obj: Mapping[str, Any],
        manager: str,
        namespace: str = "",
        *,
        force: bool = False,
        subresource: str = "",
    ) -> dict[str, Any]:
        name = str((obj.get("metadata") or {}).get("name", ""))
        return self.storage.apply(by_plural(plural), namespace, name, obj, Writer(manager), subresource, force=force)

    def delete(self, plural: str, name: str, namespace: str = "", **options: Any) -> dict[str, Any]:
        return self.storage.delete(by_plural(plural), namespace, name, options)

    def compact(self, revision: int | None = None) -> int:
        return self.storage.compact(revision)

    def close_watches(self, *, abrupt: bool = False) -> None:
        self.storage.close_watches(abrupt=abrupt)

    def bookmark(self) -> None:
        self.storage.bookmark()

    def collect_garbage(self) -> int:
        """Run the garbage collector until it has nothing left to do; the writes it made."""
        total = 0
        for _ in range(100):
            done = self.storage.collect_garbage()
            total += done
            if done == 0:
                break
        return total

    @property
    def requests(self) -> list[RequestRecord]:
        return list(self.storage.requests)

    def count(self, verb: str | None = None, resource: str | None = None, code: int | None = None) -> int:
        """How many HTTP requests matched ``verb``, ``resource`` (plural) and ``code`` (None: any)."""
        return sum(
            1
            for r in self.storage.requests
            if verb in (None, r.verb) and resource in (None, r.resource) and code in (None, r.code)
        )
