"""An asynchronous lightkube client of the API server, for reading and watching the daemon's Node.

The credentials come from ``[kubernetes] kubeconfig`` when the config sets it, else from the pod's service
account (in-cluster: the token and CA under ``/var/run/secrets/kubernetes.io/serviceaccount`` and the
``KUBERNETES_SERVICE_HOST``/``_PORT`` environment, as lightkube's ``KubeConfig.from_service_account`` reads them).

lightkube is imported here only, and only when a config has profiles: the core's dependencies stay pluggy, grpcio,
protobuf and click (``pip install 'devplug[kubernetes]'`` brings lightkube). This module is deliberately small:
the DRA front end builds its client the same way, and the two are meant to become one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from devplug.errors import DevplugError

__all__ = ["ApiUnavailable", "make_async_client"]

#: Seconds an API request (connect, read a chunk) may take; a watch's stream is bounded by the server's timeout.
REQUEST_TIMEOUT_S = 10.0


class ApiUnavailable(DevplugError):
    """The daemon cannot reach the API server at all (no client library, no credentials): it says why."""


def make_async_client(kubeconfig: Path | None) -> Any:
    """A ``lightkube.AsyncClient`` from ``kubeconfig`` (None: in-cluster); :class:`ApiUnavailable` saying why
    there is none."""
    try:
        import httpx2
        from lightkube import AsyncClient, KubeConfig
        from lightkube.core.exceptions import ConfigError as LightkubeConfigError
    except ImportError as exc:
        raise ApiUnavailable(
            f"the Kubernetes client library is not installed ({exc.name}); pip install 'devplug[kubernetes]'"
        ) from None
    try:
        config = KubeConfig.from_file(kubeconfig) if kubeconfig is not None else KubeConfig.from_service_account()
    except (LightkubeConfigError, OSError, ValueError, KeyError) as exc:
        where = f"[kubernetes] kubeconfig {kubeconfig}" if kubeconfig is not None else "the pod's service account"
        raise ApiUnavailable(f"no credentials from {where}: {exc}") from None
    return AsyncClient(config, timeout=httpx2.Timeout(REQUEST_TIMEOUT_S), trust_env=False)
