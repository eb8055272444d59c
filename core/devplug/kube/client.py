"""devplug's Kubernetes client: an async lightkube client from the pod's service account or a kubeconfig.

One way to the API server for everything that talks to it: the DRA front end
(ResourceSlices, ResourceClaims, discovery of the ``resource.k8s.io`` versions
served) and the per-node profiles (the daemon's Node). lightkube (async,
server-side apply, typed ``resource.k8s.io`` models of v1, v1beta2 and v1beta1) is
imported only when a client is made: a daemon that needs neither runs without it
installed (``pip install 'devplug[kubernetes]'`` brings it), and the modules that
use it import it inside their functions, and only for typing at module level.

Credentials, in this order:

* ``kubeconfig`` (a path the config names): its ``current-context``, or
  ``context``; a context without a user talks to the server without credentials
  (as kubectl does);
* else the pod's service account, as client-go's ``rest.InClusterConfig``:
  ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``, the bearer token
  in ``token`` (read again when the server answers 401: kubelets rotate projected
  tokens) and the CA in ``ca.crt`` of ``/var/run/secrets/kubernetes.io/serviceaccount``.

Every call has an overall deadline (``deadline``, 30 s): the client's ``timeout`` bounds
each read, so an answer trickling one byte every few seconds would hold a call for
ever; now connecting, sending and reading the whole answer must end within the
deadline, or the call fails naming the request and how much came. An answer is
read up to :data:`MAX_ANSWER_BYTES` (a ResourceClaim, a Node and a node's slices
of one driver are kilobytes; the API server stores objects up to 1.5 MiB, etcd's
``--max-request-bytes`` default, k8s.io/apiserver ``options/etcd.go``), and a
redirect (which the API server never sends) is an error naming where it points,
not lightkube's ``KeyError: 'Content-Type'``. A watch's stream has no overall
deadline (its answer lasts); its start has, and no line of it may exceed the cap.
These are :class:`~devplug.errors.KubeApiError`.

Paths that are no resource (discovery: ``/apis/resource.k8s.io``, ``/version``)
are read with :func:`get_json`. A ``404`` is either an object that is not there
(a ``Status`` naming it) or a path the server does not serve: a group or version
it does not serve answers the handler chain's plain-text ``404 page not found``
(Go's ``http.NotFound``, up to Kubernetes 1.36), which lightkube raises as httpx's
``HTTPStatusError``, not as an ``ApiError``. :func:`not_served` tells the second
kind apart, and :func:`describe_api_error` words both.

Nothing else is tried (no ``~/.kube/config``, no ``$KUBECONFIG``): a daemon
talks to the cluster its config says, and a missing piece is a
:class:`KubeClientConfigError` naming it. Proxy variables of the environment are
ignored (``trust_env=False``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devplug.errors import ConfigError, KubeApiError

if TYPE_CHECKING:
    import httpx2
    from lightkube import AsyncClient
    from lightkube.config.kubeconfig import SingleConfig

__all__ = [
    "DEFAULT_DEADLINE",
    "MAX_ANSWER_BYTES",
    "SERVICE_ACCOUNT_DIR",
    "KubeClientConfigError",
    "cluster_config",
    "describe_api_error",
    "get_json",
    "make_client",
    "not_served",
]

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: Seconds an API request may take (connect, each read, write) before it fails.
DEFAULT_TIMEOUT = 10.0
#: Seconds an API call may take in all, its whole answer read (a watch: until its answer starts).
DEFAULT_DEADLINE = 30.0
#: Bytes of an answer (of a watch: of one event's line) read at most.
MAX_ANSWER_BYTES = 16 * 1024 * 1024


class KubeClientConfigError(ConfigError):
    """No API server credentials: a missing or broken kubeconfig, or a service account that is not there."""


def _in_cluster(account: Path, environ: Mapping[str, str]) -> SingleConfig:
    from lightkube.config.kubeconfig import KubeConfig
    from lightkube.config.models import Cluster, User

    missing = [v for v in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT") if not environ.get(v)]
    if missing:
        raise KubeClientConfigError(
            f"no kubeconfig is configured and this is not a pod: {' and '.join(missing)} not set (the kubelet sets "
            "them in every container); name a kubeconfig file in the config to run outside a cluster"
        )
    token, ca = account / "token", account / "ca.crt"
    for path, what in ((token, "service account token"), (ca, "cluster CA certificate")):
        try:
            content = path.read_text()
        except FileNotFoundError:
            raise KubeClientConfigError(
                f"{path}: no {what}: the pod mounts none (set automountServiceAccountToken: true in its spec)"
            ) from None
        except OSError as exc:
            raise KubeClientConfigError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
        if not content.strip():
            raise KubeClientConfigError(f"{path}: the {what} is empty")
    host, port = environ["KUBERNETES_SERVICE_HOST"], environ["KUBERNETES_SERVICE_PORT"]
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    namespace_file = account / "namespace"
    namespace = namespace_file.read_text().strip() if namespace_file.is_file() else None
    config = KubeConfig.from_one(
        cluster=Cluster(server=f"https://{host}:{port}", certificate_auth=str(ca)),
        user=User(token_file=str(token)),
        namespace=namespace or None,
    ).get()
    assert config is not None
    return config


def _server_of(data: Mapping[str, Any], cluster: str) -> object:
    """The ``server`` the file itself gives the named cluster (None when it gives none)."""
    for entry in data.get("clusters") or ():
        if isinstance(entry, Mapping) and entry.get("name") == cluster and isinstance(entry.get("cluster"), Mapping):
            return entry["cluster"].get("server")
    return None


def _from_file(path: Path, context: str | None) -> SingleConfig:
    import yaml  # type: ignore[import-untyped]
    from lightkube.config.kubeconfig import KubeConfig
    from lightkube.config.models import User
    from lightkube.core.exceptions import ConfigError as LightkubeConfigError

    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise KubeClientConfigError(f"kubeconfig {path}: no such file") from None
    except OSError as exc:
        raise KubeClientConfigError(f"kubeconfig {path}: cannot read it: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise KubeClientConfigError(f"kubeconfig {path}: not YAML: {exc}") from None
    if not isinstance(data, dict):
        raise KubeClientConfigError(f"kubeconfig {path}: not a kubeconfig (a YAML mapping with clusters and contexts)")
    for key in ("clusters", "contexts"):
        if not isinstance(data.get(key), list) or not data[key]:
            raise KubeClientConfigError(f"kubeconfig {path}: no {key}")
    try:
        loaded = KubeConfig.from_dict(data, fname=path)
    except Exception as exc:  # msgspec's, KeyError, TypeError: the file's shape is wrong
        raise KubeClientConfigError(f"kubeconfig {path}: malformed: {type(exc).__name__}: {exc}") from None
    chosen = context or loaded.current_context
    if chosen is None:
        raise KubeClientConfigError(f"kubeconfig {path}: no current-context, and the config names no context")
    found = loaded.contexts.get(chosen)
    if found is None:
        raise KubeClientConfigError(
            f"kubeconfig {path}: no context {chosen!r} (it has {', '.join(sorted(loaded.contexts)) or 'none'})"
        )
    if found.cluster not in loaded.clusters:
        raise KubeClientConfigError(f"kubeconfig {path}: context {chosen!r} names cluster {found.cluster!r}, not there")
    if found.user and found.user not in loaded.users:
        raise KubeClientConfigError(f"kubeconfig {path}: context {chosen!r} names user {found.user!r}, not there")
    if not _server_of(data, found.cluster):  # lightkube would talk to its default, http://localhost:8080
        raise KubeClientConfigError(f"kubeconfig {path}: cluster {found.cluster!r} has no server")
    try:
        config = loaded.get(chosen)
    except LightkubeConfigError as exc:
        raise KubeClientConfigError(f"kubeconfig {path}: {exc}") from None
    assert config is not None
    if config.user is None:  # no credentials, as kubectl does; lightkube insists on a user
        config = config._replace(user=User())
    return config


def cluster_config(
    kubeconfig: Path | None = None,
    *,
    context: str | None = None,
    service_account: Path = SERVICE_ACCOUNT_DIR,
    environ: Mapping[str, str] | None = None,
) -> SingleConfig:
    """Where the API server is and how to authenticate (see the module's docstring); raises
    :class:`KubeClientConfigError` naming the file, variable or key that is missing."""
    if kubeconfig is not None:
        return _from_file(Path(kubeconfig), context)
    if context is not None:
        raise KubeClientConfigError(f"a kubeconfig context ({context!r}) is given without a kubeconfig file")
    return _in_cluster(service_account, os.environ if environ is None else environ)


def make_client(
    kubeconfig: Path | None = None,
    *,
    field_manager: str,
    context: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    deadline: float = DEFAULT_DEADLINE,
    max_answer: int = MAX_ANSWER_BYTES,
    service_account: Path = SERVICE_ACCOUNT_DIR,
    environ: Mapping[str, str] | None = None,
) -> AsyncClient:
    """An async lightkube client of the cluster (see :func:`cluster_config`) writing as ``field_manager``; each
    call within ``deadline`` seconds in all, its answer at most ``max_answer`` bytes (see the module docstring).

    Raises :class:`KubeClientConfigError` when the credentials are incomplete or the CA or a client certificate
    cannot be loaded. Close it with ``await client.close()``.
    """
    import ssl

    import httpx2
    from lightkube import AsyncClient
    from lightkube.config.client_adapter import verify_cluster

    config = cluster_config(kubeconfig, context=context, service_account=service_account, environ=environ)
    try:
        assert config.user is not None
        # the transport lightkube would make (TLS as the config says), bounded
        verify = verify_cluster(config.cluster, config.user, config.abs_file, trust_env=False)
        inner = httpx2.AsyncHTTPTransport(verify=verify, trust_env=False)
        return AsyncClient(
            config,
            timeout=httpx2.Timeout(timeout),
            field_manager=field_manager,
            trust_env=False,
            transport=_bounded_transport(inner, deadline, max_answer),
        )
    except (OSError, ssl.SSLError) as exc:
        where = kubeconfig if kubeconfig is not None else service_account
        raise KubeClientConfigError(f"{where}: a certificate or key cannot be loaded: {exc}") from None


def _what(request: httpx2.Request) -> str:
    """``GET /apis/resource.k8s.io/v1/...`` (no host, no query: short, and no secret is in a path)."""
    return f"{request.method} {request.url.path}"


def _bounded_transport(inner: httpx2.AsyncBaseTransport, deadline: float, max_answer: int) -> httpx2.AsyncBaseTransport:
    """``inner``, each request within ``deadline`` seconds whole and its answer capped (the module docstring)."""
    import asyncio

    import httpx2

    class BoundedStream(httpx2.AsyncByteStream):
        def __init__(self, stream: httpx2.AsyncByteStream, what: str, end: float | None) -> None:
            self._stream = stream
            self._what = what
            self._end = end

        async def __aiter__(self) -> Any:
            total = line = 0
            chunks = self._stream.__aiter__()
            while True:
                try:
                    if self._end is None:
                        chunk = await chunks.__anext__()
                    else:
                        async with asyncio.timeout_at(self._end):
                            chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    raise KubeApiError(
                        f"{self._what}: the answer did not come whole within {deadline:g} s (the deadline of an API "
                        f"call; {total} bytes came)"
                    ) from None
                total += len(chunk)
                if self._end is None:  # a watch: one event per line
                    newline = chunk.rfind(b"\n")
                    line = len(chunk) - newline - 1 if newline >= 0 else line + len(chunk)
                    too_big = line > max_answer
                else:
                    too_big = total > max_answer
                if too_big:
                    raise KubeApiError(
                        f"{self._what}: the answer{' (one watch event)' if self._end is None else ''} is larger than "
                        f"{max_answer} bytes, more than any object the API server stores; not read further"
                    )
                yield chunk

        async def aclose(self) -> None:
            await self._stream.aclose()

    class BoundedTransport(httpx2.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            what = _what(request)
            watching = request.url.params.get("watch") in ("true", "1")
            end = asyncio.get_running_loop().time() + deadline
            try:
                async with asyncio.timeout_at(end):
                    response = await inner.handle_async_request(request)
            except TimeoutError:
                raise KubeApiError(f"{what}: no answer within {deadline:g} s (the deadline of an API call)") from None
            if 300 <= response.status_code < 400:
                await response.aclose()
                location = response.headers.get("Location", "nowhere")
                raise KubeApiError(
                    f"{what}: the API server answered {response.status_code} (a redirect to {location[:200]}), which "
                    "it never does; devplug follows no redirect (is the kubeconfig's server an API server?)"
                )
            assert isinstance(response.stream, httpx2.AsyncByteStream)
            return httpx2.Response(
                response.status_code,
                headers=response.headers,
                stream=BoundedStream(response.stream, what, None if watching else end),
                extensions=response.extensions,
            )

        async def aclose(self) -> None:
            await inner.aclose()

    return BoundedTransport()


async def get_json(client: AsyncClient, path: str) -> Any:
    """The JSON answer to ``GET <path>`` of a path that is no resource (``apis/resource.k8s.io``, ``version``),
    through the client's transport (credentials, deadline, cap); an HTTP error raises as lightkube's requests do
    (``ApiError`` for a ``Status``, else httpx's ``HTTPStatusError``)."""
    from lightkube.core.generic_client import BasicRequest

    generic: Any = client._client  # lightkube's GenericAsyncClient: the same transport, credentials and timeouts
    response = await generic.send(generic.build_adapter_request(BasicRequest(method="GET", url=path.lstrip("/"))))
    generic.raise_for_status(response)
    return response.json()


def not_served(exc: BaseException) -> bool:
    """True when a request failed because the server does not serve its path (a group, version or resource it does
    not have): a ``404`` whose body is no ``Status`` (the handler chain's ``404 page not found``), or a ``Status``
    that names no object (go-restful's "the server could not find the requested resource"); False for a named
    object that is not there (``resourceclaims.resource.k8s.io "c1" not found``) and for every other failure."""
    import httpx2
    from lightkube import ApiError

    if isinstance(exc, ApiError):
        details = exc.status.details
        return exc.status.code == 404 and not (details is not None and details.name)
    return isinstance(exc, httpx2.HTTPStatusError) and exc.response.status_code == 404


def describe_api_error(exc: Exception) -> tuple[str, float | None]:
    """A one-line account of a failed API request (the ``Status`` of an HTTP error, else the exception), and the
    ``Retry-After`` seconds the server gave, if any."""
    import httpx2
    from lightkube import ApiError

    if isinstance(exc, ApiError):
        status = exc.status
        retry = None
        if exc.response is not None:
            with contextlib.suppress(TypeError, ValueError):
                retry = float(exc.response.headers.get("Retry-After", ""))
        return f"{status.code} {status.reason}: {status.message}", retry
    if isinstance(exc, httpx2.HTTPStatusError):  # an answer that is no Status: its status line and first line
        response = exc.response
        text = ""
        with contextlib.suppress(Exception):  # a stream's body may be unread
            text = response.text.strip().splitlines()[0][:200] if response.text.strip() else ""
        shown = f": {text}" if text else ""
        return f"{response.status_code} {response.reason_phrase}{shown} ({_what(exc.request)})", None
    if isinstance(exc, KubeApiError):
        return str(exc), None
    text = str(exc)
    request = getattr(exc, "_request", None)  # httpx's errors keep the request they are about
    where = f" ({request.method} {request.url.path})" if request is not None else ""
    if not text:  # httpx's timeouts say nothing: say what timed out
        text = "timed out" if "Timeout" in type(exc).__name__ else "no detail given"
    return f"{type(exc).__name__}: {text}{where}", None
