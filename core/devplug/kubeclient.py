"""devplug's Kubernetes client: an async lightkube client from the pod's service account or a kubeconfig.

One way to the API server for everything that talks to it: the DRA front end
(ResourceSlices, ResourceClaims) and the per-node profiles (the daemon's Node).
lightkube (async, server-side apply, typed ``resource.k8s.io/v1`` models) is
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

from devplug.errors import ConfigError

if TYPE_CHECKING:
    from lightkube import AsyncClient
    from lightkube.config.kubeconfig import SingleConfig

__all__ = ["SERVICE_ACCOUNT_DIR", "KubeClientConfigError", "cluster_config", "describe_api_error", "make_client"]

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: Seconds an API request may take (connect, each read, write) before it fails.
DEFAULT_TIMEOUT = 10.0


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
    service_account: Path = SERVICE_ACCOUNT_DIR,
    environ: Mapping[str, str] | None = None,
) -> AsyncClient:
    """An async lightkube client of the cluster (see :func:`cluster_config`) writing as ``field_manager``.

    Raises :class:`KubeClientConfigError` when the credentials are incomplete or the CA or a client certificate
    cannot be loaded. Close it with ``await client.close()``.
    """
    import ssl

    import httpx2
    from lightkube import AsyncClient

    config = cluster_config(kubeconfig, context=context, service_account=service_account, environ=environ)
    try:
        return AsyncClient(config, timeout=httpx2.Timeout(timeout), field_manager=field_manager, trust_env=False)
    except (OSError, ssl.SSLError) as exc:
        where = kubeconfig if kubeconfig is not None else service_account
        raise KubeClientConfigError(f"{where}: a certificate or key cannot be loaded: {exc}") from None


def describe_api_error(exc: Exception) -> tuple[str, float | None]:
    """A one-line account of a failed API request (the ``Status`` of an HTTP error, else the exception), and the
    ``Retry-After`` seconds the server gave, if any."""
    from lightkube import ApiError

    if isinstance(exc, ApiError):
        status = exc.status
        retry = None
        if exc.response is not None:
            with contextlib.suppress(TypeError, ValueError):
                retry = float(exc.response.headers.get("Retry-After", ""))
        return f"{status.code} {status.reason}: {status.message}", retry
    return f"{type(exc).__name__}: {exc}", None
