"""A model of the Kubernetes API server's ``coordination.k8s.io/v1`` Lease endpoints, over real HTTP on loopback.

For drivers that coordinate through Leases (devplug-shared's ``kubernetes``
backend) and for their tests: any Kubernetes client (lightkube, the official
client, ``kubectl --server``) talks to it as to an API server without
authentication. It serves only namespaced Leases, and follows the API server
of Kubernetes v1.32 for each behaviour it has:

* **Paths** -- ``/apis/coordination.k8s.io/v1/namespaces/{ns}/leases[/{name}]``
  (the REST layout of ``k8s.io/apiserver/pkg/endpoints/installer.go``);
* **create** (``POST``) -- ``201 Created`` with ``metadata.uid``,
  ``creationTimestamp`` and ``resourceVersion`` set by the server; an existing
  name is ``409`` with reason ``AlreadyExists`` (``errors.NewAlreadyExists``,
  from ``registry/generic/registry/store.go`` ``Create``);
* **get** -- ``404`` reason ``NotFound`` for a missing name (``errors.NewNotFound``);
* **update** (``PUT``) -- optimistic concurrency: a ``metadata.resourceVersion``
  that is not the stored one is ``409`` reason ``Conflict``, "the object has
  been modified; please apply your changes to the latest version and try
  again" (``store.go`` ``Update`` → ``GuaranteedUpdate``, the API conventions'
  "Concurrency Control and Consistency"); an update without a resourceVersion
  is applied unconditionally (the Lease strategy's
  ``AllowUnconditionalUpdate`` is true, ``pkg/registry/coordination/lease/strategy.go``);
  a missing object is ``404`` (``AllowCreateOnUpdate`` is false); a name in
  the body other than the URL's is ``400 BadRequest``; every successful write
  gives a new, larger resourceVersion (etcd's revision), even when nothing changed;
* **delete** -- ``200`` with a ``Status`` of ``Success`` (the generic store
  returns the deleted object only for kinds with ``ReturnDeletedObject``,
  which Leases lack); ``404`` when missing; a ``DeleteOptions`` body with
  ``preconditions.resourceVersion`` (or ``uid``) that does not match is
  ``409 Conflict`` ("Precondition failed: ...", ``storage.NewInvalidObjError``
  in ``etcd3/store.go`` ``checkPreconditions``);
* **list** -- ``LeaseList`` whose ``metadata.resourceVersion`` is the current
  revision; ``labelSelector`` with ``k=v``, ``k==v``, ``k!=v``, ``k`` and ``!k``
  terms, comma-separated (``labels.Parse``; set-based terms are not modelled);
* **validation** (``pkg/apis/coordination/validation``) -- the name is a
  DNS-1123 subdomain; ``spec.leaseDurationSeconds`` and
  ``spec.leaseTransitions`` when set are ``> 0`` and ``>= 0``; else ``422
  Invalid`` naming the field;
* errors are ``Status`` objects (``kind: Status``, ``status: Failure``,
  ``reason``, ``code``, ``details.name/group/kind``), as ``apierrors`` build them.

Not modelled: watch, patch, authentication/RBAC, managed fields, the
``Lease`` ``strategicMergePatch``, and ``resourceVersion`` on reads.

The server also serves core/v1 pods (:mod:`devplug.testing.podapi`, same
storage and revision counter); the kubelets' node Leases in
``kube-node-lease`` are ordinary Leases, kept by
:class:`devplug.testing.nodelease.NodeLeaseHeartbeat`.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:
    from devplug.testing.podapi import PodStore

__all__ = ["ApiStatusError", "LeaseApiServer", "LeaseStore", "Revisions", "match_labels"]

_PATH = re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/([a-z0-9-]+)/leases(?:/([^/]+))?/?$")
_POD_PATH = re.compile(r"^/api/v1/(?:namespaces/([a-z0-9-]+)/)?pods(?:/([^/]+)(/status)?)?/?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_GROUP = "coordination.k8s.io"


class ApiStatusError(Exception):
    """An API error: its HTTP code, reason and message become a ``Status`` body."""

    def __init__(
        self, code: int, reason: str, message: str, name: str | None = None, group: str = _GROUP, kind: str = "leases"
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.name = name
        self.group = group
        self.kind = kind

    def status(self) -> dict[str, Any]:
        details: dict[str, Any] = {"group": self.group, "kind": self.kind}
        if self.name is not None:
            details["name"] = self.name
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": str(self),
            "reason": self.reason,
            "details": details,
            "code": self.code,
        }


def _qualified(name: str) -> str:
    return f'leases.{_GROUP} "{name}"'


def _copy(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy, as the object comes out of storage (callers never share the stored one)."""
    copied: dict[str, Any] = json.loads(json.dumps(obj))
    return copied


def match_labels(labels: Mapping[str, str], selector: str) -> bool:
    """Whether ``labels`` satisfy an equality-based label selector (``a=b,c!=d,e,!f``)."""
    for raw in selector.split(","):
        term = raw.strip()
        if not term:
            continue
        if "!=" in term:
            key, value = (p.strip() for p in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (p.strip() for p in term.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


class Revisions:
    """The revision counter of the API server's storage (etcd's): every write of any object takes the next one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.current = 1

    def next(self) -> str:
        with self._lock:
            self.current += 1
            return str(self.current)


class LeaseStore:
    """The API server's storage of Leases, one revision counter like etcd's; thread-safe."""

    def __init__(self, revisions: Revisions | None = None) -> None:
        self._lock = threading.Lock()
        self.revisions = revisions or Revisions()
        self._objects: dict[tuple[str, str], dict[str, Any]] = {}
        #: Every request served, as (method, namespace, name or None, HTTP code), for tests.
        self.requests: list[tuple[str, str, str | None, int]] = []

    @property
    def _revision(self) -> int:
        return self.revisions.current

    def _next(self) -> str:
        return self.revisions.next()

    @staticmethod
    def _validate(obj: Mapping[str, Any], name: str) -> None:
        if not _SUBDOMAIN.match(name) or len(name) > 253:
            raise ApiStatusError(
                422,
                "Invalid",
                f'Lease.{_GROUP} "{name}" is invalid: metadata.name: Invalid value: "{name}": '
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'",
                name,
            )
        spec = obj.get("spec") or {}
        duration = spec.get("leaseDurationSeconds")
        if duration is not None and (not isinstance(duration, int) or duration <= 0):
            raise ApiStatusError(
                422,
                "Invalid",
                f'Lease.{_GROUP} "{name}" is invalid: spec.leaseDurationSeconds: Invalid value: {duration}: '
                "must be greater than 0",
                name,
            )
        transitions = spec.get("leaseTransitions")
        if transitions is not None and (not isinstance(transitions, int) or transitions < 0):
            raise ApiStatusError(
                422,
                "Invalid",
                f'Lease.{_GROUP} "{name}" is invalid: spec.leaseTransitions: Invalid value: {transitions}: '
                "must be greater than or equal to 0",
                name,
            )

    def create(self, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        meta = dict(obj.get("metadata") or {})
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise ApiStatusError(422, "Invalid", f"Lease.{_GROUP} is invalid: metadata.name: Required value")
        self._validate(obj, name)
        with self._lock:
            if (namespace, name) in self._objects:
                raise ApiStatusError(409, "AlreadyExists", f"{_qualified(name)} already exists", name)
            meta.update(
                namespace=namespace,
                uid=str(uuid.uuid4()),
                creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                resourceVersion=self._next(),
            )
            stored = {"apiVersion": f"{_GROUP}/v1", "kind": "Lease", "metadata": meta, "spec": obj.get("spec") or {}}
            self._objects[(namespace, name)] = stored
            return _copy(stored)

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            found = self._objects.get((namespace, name))
            if found is None:
                raise ApiStatusError(404, "NotFound", f"{_qualified(name)} not found", name)
            return _copy(found)

    def update(self, namespace: str, name: str, obj: dict[str, Any]) -> dict[str, Any]:
        meta = dict(obj.get("metadata") or {})
        if meta.get("name") not in (None, name):
            raise ApiStatusError(
                400, "BadRequest", f"the name of the object ({meta.get('name')}) does not match the name on the URL"
            )
        self._validate(obj, name)
        with self._lock:
            found = self._objects.get((namespace, name))
            if found is None:
                raise ApiStatusError(404, "NotFound", f"{_qualified(name)} not found", name)
            wanted = meta.get("resourceVersion")
            if wanted not in (None, "") and wanted != found["metadata"]["resourceVersion"]:
                raise ApiStatusError(
                    409,
                    "Conflict",
                    f"Operation cannot be fulfilled on {_qualified(name)}: the object has been modified; "
                    "please apply your changes to the latest version and try again",
                    name,
                )
            kept = found["metadata"]
            meta.update(
                name=name,
                namespace=namespace,
                uid=kept["uid"],
                creationTimestamp=kept["creationTimestamp"],
                resourceVersion=self._next(),
            )
            stored = {"apiVersion": f"{_GROUP}/v1", "kind": "Lease", "metadata": meta, "spec": obj.get("spec") or {}}
            self._objects[(namespace, name)] = stored
            return _copy(stored)

    def delete(self, namespace: str, name: str, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        preconditions = (options or {}).get("preconditions") or {}
        with self._lock:
            found = self._objects.get((namespace, name))
            if found is None:
                raise ApiStatusError(404, "NotFound", f"{_qualified(name)} not found", name)
            meta = found["metadata"]
            for key in ("resourceVersion", "uid"):
                wanted = preconditions.get(key)
                if wanted is not None and wanted != meta[key]:
                    raise ApiStatusError(
                        409,
                        "Conflict",
                        f"Operation cannot be fulfilled on {_qualified(name)}: Precondition failed: "
                        f"{key[0].upper() + key[1:]} in precondition: {wanted}, {key} in object meta: {meta[key]}",
                        name,
                    )
            del self._objects[(namespace, name)]
            self._next()
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {"name": name, "group": _GROUP, "kind": "leases", "uid": meta["uid"]},
        }

    def list(self, namespace: str, selector: str = "") -> dict[str, Any]:
        with self._lock:
            items = [
                _copy(obj)
                for (ns, _), obj in sorted(self._objects.items())
                if ns == namespace and match_labels(obj["metadata"].get("labels") or {}, selector)
            ]
            revision = str(self._revision)
        return {
            "apiVersion": f"{_GROUP}/v1",
            "kind": "LeaseList",
            "metadata": {"resourceVersion": revision},
            "items": items,
        }


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return {}
        data = json.loads(self.rfile.read(length) or b"{}")
        if not isinstance(data, dict):
            raise ApiStatusError(400, "BadRequest", "the request body is not an object")
        return data

    def _answer(self, code: int, body: Mapping[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _serve_pods(self, method: str, match: re.Match[str], query: str) -> None:
        pods = self.server.pods
        namespace, name, status = match.group(1), match.group(2), match.group(3)
        code = 200
        try:
            params = parse_qs(query)
            if method == "GET" and name is None:
                labels = params.get("labelSelector", [""])[0]
                body = pods.list(namespace, labels, params.get("fieldSelector", [""])[0])
            elif namespace is None:
                raise ApiStatusError(405, "MethodNotAllowed", f"{method} is not supported on /api/v1/pods", kind="pods")
            elif method == "GET" and name is not None and not status:
                body = pods.get(namespace, name)
            elif method == "POST" and name is None:
                body, code = pods.create(namespace, self._body()), 201
            elif method == "PUT" and name is not None and status:
                body = pods.update_status(namespace, name, self._body())
            elif method == "DELETE" and name is not None and not status:
                grace = (self._body() or {}).get("gracePeriodSeconds", params.get("gracePeriodSeconds", [None])[0])
                body = pods.delete(namespace, name, None if grace is None else int(grace))
            else:
                raise ApiStatusError(405, "MethodNotAllowed", f"{method} is not supported here", kind="pods")
        except ApiStatusError as exc:
            code, body = exc.code, exc.status()
        except ValueError as exc:
            code, body = 400, ApiStatusError(400, "BadRequest", f"malformed request: {exc}", kind="pods").status()
        pods.requests.append((method, namespace or "*", name, code))
        self._answer(code, body)

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        pod_match = _POD_PATH.match(url.path)
        if pod_match is not None:
            self._serve_pods(method, pod_match, url.query)
            return
        match = _PATH.match(url.path)
        store = self.server.store
        namespace, name = (match.group(1), match.group(2)) if match else ("", None)
        code = 200
        try:
            if match is None:
                raise ApiStatusError(404, "NotFound", "the server could not find the requested resource")
            if method == "GET" and name is None:
                selector = parse_qs(url.query).get("labelSelector", [""])[0]
                body = store.list(namespace, selector)
            elif method == "GET" and name is not None:
                body = store.get(namespace, name)
            elif method == "POST" and name is None:
                body, code = store.create(namespace, self._body()), 201
            elif method == "PUT" and name is not None:
                body = store.update(namespace, name, self._body())
            elif method == "DELETE" and name is not None:
                body = store.delete(namespace, name, self._body())
            else:
                raise ApiStatusError(405, "MethodNotAllowed", f"{method} is not supported on {url.path}")
        except ApiStatusError as exc:
            code, body = exc.code, exc.status()
        except ValueError as exc:
            code, body = 400, ApiStatusError(400, "BadRequest", f"malformed request body: {exc}").status()
        store.requests.append((method, namespace, name, code))
        self._answer(code, body)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    store: LeaseStore
    pods: PodStore

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-request (a killed daemon) is no error of the server's."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class LeaseApiServer:
    """The Lease API on ``http://127.0.0.1:<port>`` (a free port), served from a thread; a context manager. It
    serves the pods of :mod:`devplug.testing.podapi` too (``/api/v1/...``), which node-liveness checks read."""

    def __init__(
        self, store: LeaseStore | None = None, host: str = "127.0.0.1", port: int = 0, pods: PodStore | None = None
    ) -> None:
        from devplug.testing.podapi import PodStore

        self.store = store or LeaseStore()
        #: The pods (:mod:`devplug.testing.podapi`), in the same storage: one revision counter.
        self.pods = pods or PodStore(self.store.revisions)
        self._server = _Server((host, port), _Handler)
        self._server.store = self.store
        self._server.pods = self.pods
        self._thread = threading.Thread(target=self._server.serve_forever, name="lease-api", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> LeaseApiServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> LeaseApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
