"""The core/v1 pods of the API server stand-in, in process, as node-liveness checks and their tests use them.

The behaviour is :mod:`devplug.testing.apiserver`'s (``pkg/registry/core/pod/strategy.go``: status ``Pending``
on create, the ``status`` subresource, graceful deletion of a bound pod until the kubelet's delete with grace 0,
the field selectors pods support); tests drive it as the scheduler and the kubelets would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from devplug.testing.apiserver.resources import by_plural
from devplug.testing.apiserver.selectors import FieldSelector
from devplug.testing.apiserver.storage import Storage
from devplug.testing.apiserver.views import KindView

__all__ = ["PodStore", "match_fields", "pod_fields"]


def pod_fields(pod: Mapping[str, Any]) -> dict[str, str]:
    """The selectable fields of ``pod``, as the API server computes them for a field selector."""
    return by_plural("pods").fields(pod)


def match_fields(fields: Mapping[str, str], selector: str) -> bool:
    """Whether ``fields`` satisfy a field selector (``a=b,c!=d``); 400 for a field pods do not support."""
    return FieldSelector(selector, by_plural("pods").selectable).matches(fields)


class PodStore(KindView):
    """The pods of a storage, in process."""

    def __init__(self, storage: Storage) -> None:
        super().__init__(storage, "pods")

    def update_status(self, namespace: str, name: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """``PUT .../status``: the status of ``obj`` replaces the stored one (spec and metadata untouched)."""
        return self.storage.update(self.resource, namespace, name, obj, self.writer, "status")

    def set_phase(self, namespace: str, name: str, phase: str) -> dict[str, Any]:
        """What the kubelet's status manager does: report the pod's phase (an update of the status)."""
        current = self.get(namespace, name)
        return self.update_status(namespace, name, {**current, "status": {**current.get("status", {}), "phase": phase}})

    def delete(  # type: ignore[override]
        self, namespace: str, name: str, grace_period_seconds: int | None = None
    ) -> dict[str, Any]:
        """``DELETE``: graceful for a bound pod still running (marked, kept), else at once; the object either way."""
        options = {} if grace_period_seconds is None else {"gracePeriodSeconds": grace_period_seconds}
        return self.storage.delete(self.resource, namespace, name, options, self.writer)
