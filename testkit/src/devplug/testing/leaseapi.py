"""The ``coordination.k8s.io/v1`` Lease endpoints of the API server stand-in, under the names drivers' suites use.

:class:`LeaseApiServer` is :class:`devplug.testing.apiserver.ApiServer` (every kind it serves, one storage, one
revision counter; see that package for each behaviour and the Kubernetes source it follows), with two views for
in-process use: ``store`` (:class:`LeaseStore`, the Leases) and ``pods`` (:class:`devplug.testing.podapi.PodStore`).
The kubelets' node Leases in ``kube-node-lease`` are ordinary Leases, kept by
:class:`devplug.testing.nodelease.NodeLeaseHeartbeat`.
"""

from __future__ import annotations

from collections.abc import Mapping

from devplug.testing.apiserver import ApiServer, ApiStatusError
from devplug.testing.apiserver.selectors import LabelSelector
from devplug.testing.apiserver.storage import Storage
from devplug.testing.apiserver.views import KindView

__all__ = ["ApiStatusError", "LeaseApiServer", "LeaseStore", "match_labels"]


def match_labels(labels: Mapping[str, str], selector: str) -> bool:
    """Whether ``labels`` satisfy a label selector (``a=b,c!=d,e,!f,g in (x,y)``)."""
    return LabelSelector(selector).matches(labels)


class LeaseStore(KindView):
    """The Leases of a storage, in process (as a kubelet's heartbeat writes them)."""

    def __init__(self, storage: Storage) -> None:
        super().__init__(storage, "leases")


class LeaseApiServer(ApiServer):
    """The API server stand-in, with ``store`` (the Leases) and ``pods`` views; a context manager."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        from devplug.testing.podapi import PodStore

        super().__init__(host, port)
        self.store = LeaseStore(self.storage)
        #: The pods (:mod:`devplug.testing.podapi`), in the same storage: one revision counter.
        self.pods = PodStore(self.storage)

    def start(self) -> LeaseApiServer:
        super().start()
        return self

    def __enter__(self) -> LeaseApiServer:
        return self.start()
