"""The kinds the stand-in serves and each one's strategy (``pkg/registry/<group>/<kind>/strategy.go``).

* ``resource.k8s.io/v1`` **ResourceSlice** (cluster-scoped; ``resourceslice/strategy.go``): ``metadata.generation``
  1 on create, +1 on every change of the spec; field selectors ``metadata.name``, ``spec.nodeName``,
  ``spec.driver`` (``toSelectableFields``; ``spec.nodeName`` is empty for a slice without one); a device taint
  without ``timeAdded`` gets the time of the write, to the second (``SetDefaults_DeviceTaint``,
  ``pkg/apis/resource/v1/defaults.go``: defaulting runs on every create, update, patch and apply, so a writer
  that leaves the time out gets a new one on each write that touches the device list, which is atomic); with the
  feature gate ``DRADeviceTaints``, ``DRAPartitionableDevices`` or ``DRAConsumableCapacity`` off
  (``ApiServer(disabled_features={...})``; which are off by default in each release: :mod:`.versions`), the fields
  they cover are dropped on write unless the stored slice already uses them (:mod:`.gates`).
* **ResourceClaim** (namespaced, ``resourceclaim/strategy.go``): the status is cleared on create and kept by
  updates of the main resource; the ``status`` subresource changes the status only (``PrepareForUpdate`` keeps
  the spec and ``ResetObjectMetaForStatus`` the labels, annotations, finalizers, owner references); field
  selectors ``metadata.name``, ``metadata.namespace``; with ``DRAAdminAccess``, ``DRAConsumableCapacity`` or
  ``DRAResourceClaimDeviceStatus`` off the fields they cover are dropped, and a status update that deallocates
  devices drops their ``status.devices`` entries (:mod:`.gates`).
* **DeviceClass** (cluster-scoped, ``deviceclass/strategy.go``): generation as for slices; ``metadata.name``.
* core/v1 **Node** (cluster-scoped, ``pkg/registry/core/node/strategy.go``): updates keep the status, the
  ``status`` subresource changes only it; field selectors ``metadata.name``, ``spec.unschedulable``.
* core/v1 **Namespace** (cluster-scoped, ``pkg/registry/core/namespace/strategy.go``): status ``phase: Active``
  and the ``kubernetes`` finalizer on create, the label ``kubernetes.io/metadata.name: <name>`` on every write
  (``SetDefaults_Namespace``), the name a DNS label (``ValidateNamespaceName``); field selectors
  ``metadata.name``, ``status.phase``. Only read by the claims' admin-access check (:mod:`.admin`): objects of
  other kinds may still name a namespace that does not exist, and a deleted namespace goes at once (no
  ``Terminating`` phase, no deletion of its contents).
* core/v1 **Pod** (namespaced, ``pkg/registry/core/pod/strategy.go``): status ``phase: Pending`` on create,
  graceful deletion, ``status`` and ``binding`` subresources, the field selectors ``ToSelectableFields`` lists.
* ``coordination.k8s.io/v1`` **Lease** (namespaced, ``pkg/registry/coordination/lease/strategy.go``).

Every kind allows unconditional updates (an update without ``metadata.resourceVersion``) and no create on
update, as all six strategies say.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from devplug.testing.apiserver import admin, gates, validation
from devplug.testing.apiserver.errors import FieldError
from devplug.testing.apiserver.fields import Schema

__all__ = ["RESOURCES", "Resource", "by_plural"]

Validator = Callable[[Mapping[str, Any], Mapping[str, Any] | None], list[FieldError]]
Fields = Callable[[Mapping[str, Any]], dict[str, str]]

_META_LIST_MAPS: dict[tuple[str, ...], tuple[str, ...]] = {("metadata", "ownerReferences"): ("uid",)}
_META_SETS = frozenset({("metadata", "finalizers")})


def _meta_fields(obj: Mapping[str, Any], namespaced: bool) -> dict[str, str]:
    meta = obj.get("metadata") or {}
    fields = {"metadata.name": str(meta.get("name", ""))}
    if namespaced:
        fields["metadata.namespace"] = str(meta.get("namespace", ""))
    return fields


def _slice_fields(obj: Mapping[str, Any]) -> dict[str, str]:
    spec = obj.get("spec") or {}
    return {
        **_meta_fields(obj, False),
        "spec.nodeName": spec.get("nodeName") or "",
        "spec.driver": spec.get("driver", ""),
    }


def _slice_defaults(obj: dict[str, Any]) -> None:
    """``SetDefaults_DeviceTaint``: a device taint without ``timeAdded`` gets now, truncated to the second."""
    from devplug.testing.apiserver import storage  # the one clock of the stand-in (storage imports this module)

    now = storage.now_text()
    for device in (obj.get("spec") or {}).get("devices") or ():
        for taint in (device or {}).get("taints") or ():
            if isinstance(taint, dict) and not taint.get("timeAdded"):
                taint["timeAdded"] = now


def _namespace_fields(obj: Mapping[str, Any]) -> dict[str, str]:
    return {**_meta_fields(obj, False), "status.phase": str((obj.get("status") or {}).get("phase", ""))}


def _namespace_defaults(obj: dict[str, Any]) -> None:
    """``namespaceStrategy.PrepareForCreate`` (the ``kubernetes`` finalizer) and ``SetDefaults_Namespace`` (the
    ``kubernetes.io/metadata.name`` label naming it)."""
    meta = obj.setdefault("metadata", {})
    labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else {}
    meta["labels"] = {**labels, "kubernetes.io/metadata.name": str(meta.get("name", ""))}
    spec = obj.setdefault("spec", {})
    if isinstance(spec, dict) and "kubernetes" not in (spec.get("finalizers") or []):
        spec["finalizers"] = [*(spec.get("finalizers") or []), "kubernetes"]


def _node_fields(obj: Mapping[str, Any]) -> dict[str, str]:
    unschedulable = bool((obj.get("spec") or {}).get("unschedulable"))
    return {**_meta_fields(obj, False), "spec.unschedulable": "true" if unschedulable else "false"}


def _pod_fields(pod: Mapping[str, Any]) -> dict[str, str]:
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
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


@dataclass(frozen=True)
class Resource:
    """One kind as the API server serves it: where, how it is selected, its strategy and its validation."""

    plural: str
    kind: str
    group: str
    version: str
    namespaced: bool
    selectable: tuple[str, ...]
    fields: Fields
    validate: Validator
    schema: Schema
    #: ``status`` (and ``binding`` for pods): the subresources served.
    subresources: frozenset[str] = frozenset()
    #: ``metadata.generation`` is 1 on create and +1 on every change of the spec.
    generation: bool = False
    #: The status a create stores, whatever was sent (None: keep what was sent).
    status_on_create: Mapping[str, Any] | None = None
    #: ``ReturnDeletedObject``: a delete answers with the object, not a ``Status``.
    return_deleted_object: bool = False
    validate_status: Validator | None = None
    #: The kind's defaulting (``SetDefaults_*``), run on the object of every create and update (patch, apply).
    defaults: Callable[[dict[str, Any]], None] | None = None
    #: The strategy's ``dropDisabledFields``: (new object, old object or None, the disabled feature gates).
    drop_disabled: Callable[[dict[str, Any], Mapping[str, Any] | None, frozenset[str]], None] | None = None
    #: Checks of the strategy's ``Validate`` that read other objects: (new, old or None, subresource, a namespace
    #: lookup, the disabled gates) -> field errors (claims: :func:`.admin.authorized_for_admin`).
    authorize: (
        Callable[
            [Mapping[str, Any], Mapping[str, Any] | None, str, admin.NamespaceLookup, frozenset[str]], list[FieldError]
        ]
        | None
    ) = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``<plural>.<group>`` as error messages name the resource (``pods`` for core)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def describe(self, name: str) -> str:
        return f'{self.qualified} "{name}"'


def _schema(
    atomic: frozenset[tuple[str, ...]] = frozenset(), list_maps: Mapping[tuple[str, ...], tuple[str, ...]] | None = None
) -> Schema:
    return Schema(atomic=atomic, list_maps={**_META_LIST_MAPS, **(list_maps or {})}, sets=_META_SETS)


RESOURCES: tuple[Resource, ...] = (
    Resource(
        "resourceslices",
        "ResourceSlice",
        "resource.k8s.io",
        "v1",
        False,
        ("metadata.name", "spec.nodeName", "spec.driver"),
        _slice_fields,
        validation.resource_slice,
        _schema(frozenset({("spec", "nodeSelector")})),
        generation=True,
        defaults=_slice_defaults,
        drop_disabled=gates.slice_drop_disabled,
    ),
    Resource(
        "resourceclaims",
        "ResourceClaim",
        "resource.k8s.io",
        "v1",
        True,
        ("metadata.name", "metadata.namespace"),
        lambda obj: _meta_fields(obj, True),
        validation.resource_claim,
        _schema(
            frozenset({("status", "allocation", "nodeSelector")}),
            {("status", "reservedFor"): ("uid",), ("status", "devices"): ("driver", "device", "pool", "shareID")},
        ),
        subresources=frozenset({"status"}),
        status_on_create={},
        validate_status=validation.resource_claim_status,
        drop_disabled=gates.claim_drop_disabled,
        authorize=admin.authorized_for_admin,
    ),
    Resource(
        "deviceclasses",
        "DeviceClass",
        "resource.k8s.io",
        "v1",
        False,
        ("metadata.name",),
        lambda obj: _meta_fields(obj, False),
        validation.device_class,
        _schema(),
        generation=True,
    ),
    Resource(
        "nodes",
        "Node",
        "",
        "v1",
        False,
        ("metadata.name", "spec.unschedulable"),
        _node_fields,
        validation.node,
        _schema(),
        subresources=frozenset({"status"}),
    ),
    Resource(
        "namespaces",
        "Namespace",
        "",
        "v1",
        False,
        ("metadata.name", "status.phase"),
        _namespace_fields,
        validation.namespace,
        _schema(),
        subresources=frozenset({"status"}),
        status_on_create={"phase": "Active"},
        defaults=_namespace_defaults,
    ),
    Resource(
        "pods",
        "Pod",
        "",
        "v1",
        True,
        tuple(_pod_fields({})),
        _pod_fields,
        validation.pod,
        _schema(),
        subresources=frozenset({"status", "binding"}),
        status_on_create={"phase": "Pending"},
        return_deleted_object=True,
    ),
    Resource(
        "leases",
        "Lease",
        "coordination.k8s.io",
        "v1",
        True,
        ("metadata.name", "metadata.namespace"),
        lambda obj: _meta_fields(obj, True),
        validation.lease,
        _schema(),
    ),
)
_BY_PLURAL = {r.plural: r for r in RESOURCES}
_BY_KIND = {(r.api_version, r.kind): r for r in RESOURCES}


def by_plural(plural: str) -> Resource:
    """The resource named ``plural`` (``resourceslices``, ``pods``, ...); KeyError naming the served ones."""
    try:
        return _BY_PLURAL[plural]
    except KeyError:
        raise KeyError(
            f"the API server stand-in serves no {plural!r}; it serves {', '.join(sorted(_BY_PLURAL))}"
        ) from None


def by_kind(api_version: str, kind: str) -> Resource | None:
    """The resource of an owner reference's ``apiVersion`` and ``kind`` (None for kinds not served)."""
    return _BY_KIND.get((api_version, kind))


def by_path(group: str, version: str, plural: str) -> Resource | None:
    found = _BY_PLURAL.get(plural)
    return found if found is not None and (found.group, found.version) == (group, version) else None
