"""A model of the Kubernetes API server's core/v1 Pod storage, for what a node-liveness check reads.

:class:`~devplug.testing.leaseapi.LeaseApiServer` serves it over HTTP beside
the Leases; tests also drive it in process, as the scheduler and the kubelets
would (bind a pod to a node, report its phase, confirm its deletion). It
follows the API server of Kubernetes v1.32 for each behaviour it has:

* **paths** -- ``/api/v1/namespaces/{ns}/pods[/{name}[/status]]`` and, for a
  list across namespaces, ``/api/v1/pods`` (``installer.go``);
* **create** -- ``201``; the server sets ``metadata.uid``,
  ``creationTimestamp``, ``resourceVersion``, and replaces whatever status was
  sent by ``phase: Pending`` (``podStrategy.PrepareForCreate`` in
  ``pkg/registry/core/pod/strategy.go``); ``spec.containers`` must hold at least
  one container with a name (``422 Invalid`` otherwise, ``pkg/apis/core/validation``);
  an existing name is ``409 AlreadyExists``;
* **status** -- ``PUT .../status`` changes the status only (the spec and
  metadata sent are ignored, ``podStatusStrategy.PrepareForUpdate``), with the
  same optimistic concurrency on ``resourceVersion`` as any update;
* **delete** -- graceful for a pod bound to a node and not finished
  (``podStrategy.CheckGracefulDelete``): the object stays, with
  ``metadata.deletionTimestamp`` and ``deletionGracePeriodSeconds`` (the
  request's ``gracePeriodSeconds``, else ``spec.terminationGracePeriodSeconds``,
  30 by default), until a delete with ``gracePeriodSeconds: 0`` (the kubelet's,
  once the containers stopped); an unbound or finished pod, or grace 0, goes at
  once; ``200`` with the object in both cases (``ReturnDeletedObject`` is true
  for pods);
* **list** -- ``PodList`` with ``metadata.resourceVersion``;
  ``fieldSelector`` terms ``k=v``, ``k==v``, ``k!=v`` on the fields pods
  support (``ToSelectableFields`` in ``strategy.go``: ``metadata.name``,
  ``metadata.namespace``, ``spec.nodeName``, ``spec.restartPolicy``,
  ``spec.schedulerName``, ``spec.serviceAccountName``, ``spec.hostNetwork``,
  ``status.phase``, ``status.podIP``, ``status.nominatedNodeName``); any other
  field is ``400 BadRequest`` "field label not supported: <field>" (the
  conversion funcs of ``pkg/apis/core/v1/conversion.go``); ``labelSelector`` as
  for Leases.

Not modelled: watch, patch, ephemeral containers, the binding subresource,
admission, and every other kind.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from devplug.testing.leaseapi import ApiStatusError, Revisions, match_labels

__all__ = ["PodStore", "match_fields", "pod_fields"]

_KIND = "pods"
_GROUP = ""
#: The fields a field selector on pods may name (``ToSelectableFields`` and object metadata).
SELECTABLE = (
    "metadata.name",
    "metadata.namespace",
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
)
#: ``spec.terminationGracePeriodSeconds``' default (``pkg/apis/core/v1/defaults.go``).
DEFAULT_GRACE_S = 30


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _copy(obj: Mapping[str, Any]) -> dict[str, Any]:
    copied: dict[str, Any] = json.loads(json.dumps(obj))
    return copied


def _status_error(code: int, reason: str, message: str, name: str | None = None) -> ApiStatusError:
    return ApiStatusError(code, reason, message, name, group=_GROUP, kind=_KIND)


def pod_fields(pod: Mapping[str, Any]) -> dict[str, str]:
    """The selectable fields of ``pod``, as the API server computes them for a field selector."""
    meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    ips = status.get("podIPs") or []
    return {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.restartPolicy": spec.get("restartPolicy", ""),
        "spec.schedulerName": spec.get("schedulerName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "spec.hostNetwork": "true" if spec.get("hostNetwork") else "false",
        "status.phase": status.get("phase", ""),
        "status.podIP": ips[0].get("ip", "") if ips else "",
        "status.nominatedNodeName": status.get("nominatedNodeName", ""),
    }


def _terms(selector: str) -> list[tuple[str, str, bool]]:
    """A field selector's terms as (field, value, negated); 400 for a field pods do not support."""
    terms = []
    for raw in selector.split(","):
        term = raw.strip()
        if not term:
            continue
        negated = "!=" in term
        key, _, value = term.replace("!=", "=", 1).replace("==", "=", 1).partition("=")
        key = key.strip()
        if key not in SELECTABLE:
            raise _status_error(400, "BadRequest", f"field label not supported: {key}")
        terms.append((key, value.strip(), negated))
    return terms


def match_fields(fields: Mapping[str, str], selector: str) -> bool:
    """Whether ``fields`` satisfy a field selector (``a=b,c!=d``); ``ApiStatusError`` 400 for a field pods do
    not support."""
    return all((fields.get(key, "") == value) != negated for key, value, negated in _terms(selector))


class PodStore:
    """The API server's pods, with the revision counter of the :class:`~devplug.testing.leaseapi.LeaseStore` it
    may share (one etcd); thread-safe."""

    def __init__(self, revisions: Revisions | None = None) -> None:
        self._lock = threading.Lock()
        self.revisions = revisions or Revisions()
        self._objects: dict[tuple[str, str], dict[str, Any]] = {}
        #: Every request served over HTTP, as (method, namespace or ``*``, name or None, HTTP code), for tests.
        self.requests: list[tuple[str, str, str | None, int]] = []

    def _next(self) -> str:
        return self.revisions.next()

    @staticmethod
    def _validate(obj: Mapping[str, Any], name: str) -> None:
        containers = (obj.get("spec") or {}).get("containers") or []
        if not containers or not all(isinstance(c, dict) and c.get("name") for c in containers):
            raise _status_error(422, "Invalid", f'Pod "{name}" is invalid: spec.containers: Required value', name)

    def create(self, namespace: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """``POST``: store a new pod (its status set to ``Pending``, as the server does)."""
        meta = dict(obj.get("metadata") or {})
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise _status_error(422, "Invalid", "Pod is invalid: metadata.name: Required value")
        self._validate(obj, name)
        with self._lock:
            if (namespace, name) in self._objects:
                raise _status_error(409, "AlreadyExists", f'pods "{name}" already exists', name)
            meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=_now())
            meta["resourceVersion"] = self._next()
            meta.pop("deletionTimestamp", None)
            stored = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": meta,
                "spec": _copy(obj.get("spec") or {}),
                "status": {"phase": "Pending"},
            }
            self._objects[(namespace, name)] = stored
            return _copy(stored)

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            found = self._objects.get((namespace, name))
            if found is None:
                raise _status_error(404, "NotFound", f'pods "{name}" not found', name)
            return _copy(found)

    def update_status(self, namespace: str, name: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """``PUT .../status``: the status of ``obj`` replaces the stored one (spec and metadata untouched)."""
        wanted = (obj.get("metadata") or {}).get("resourceVersion")
        with self._lock:
            found = self._objects.get((namespace, name))
            if found is None:
                raise _status_error(404, "NotFound", f'pods "{name}" not found', name)
            if wanted not in (None, "") and wanted != found["metadata"]["resourceVersion"]:
                raise _status_error(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on pods "{name}": the object has been modified; please apply '
                    "your changes to the latest version and try again",
                    name,
                )
            found["status"] = _copy(obj.get("status") or {})
            found["metadata"]["resourceVersion"] = self._next()
            return _copy(found)

    def set_phase(self, namespace: str, name: str, phase: str) -> dict[str, Any]:
        """What the kubelet's status manager does: report the pod's phase (an update of the status)."""
        current = self.get(namespace, name)
        return self.update_status(namespace, name, {**current, "status": {**current["status"], "phase": phase}})

    def delete(self, namespace: str, name: str, grace_period_seconds: int | None = None) -> dict[str, Any]:
        """``DELETE``: graceful for a bound pod still running (marked, kept), else at once; the object either way."""
        with self._lock:
            found = self._objects.get((namespace, name))
            if found is None:
                raise _status_error(404, "NotFound", f'pods "{name}" not found', name)
            spec, meta = found["spec"], found["metadata"]
            grace = grace_period_seconds
            if grace is None:
                grace = int(spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_S))
            finished = found["status"].get("phase") in ("Succeeded", "Failed")
            if grace > 0 and spec.get("nodeName") and not finished:
                if "deletionTimestamp" not in meta:
                    meta["deletionTimestamp"] = _now()
                    meta["deletionGracePeriodSeconds"] = grace
                    meta["resourceVersion"] = self._next()
                return _copy(found)
            del self._objects[(namespace, name)]
            self._next()
            return _copy(found)

    def list(self, namespace: str | None, label_selector: str = "", field_selector: str = "") -> dict[str, Any]:
        """``GET``: the pods of ``namespace`` (every namespace for None) matching both selectors."""
        terms = _terms(field_selector)  # an unsupported field is refused even when no pod is stored
        with self._lock:
            items = [
                _copy(obj)
                for (ns, _), obj in sorted(self._objects.items())
                if (namespace is None or ns == namespace)
                and match_labels(obj["metadata"].get("labels") or {}, label_selector)
                and all((pod_fields(obj).get(k, "") == v) != neg for k, v, neg in terms)
            ]
            revision = str(self.revisions.current)
        return {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": revision}, "items": items}
