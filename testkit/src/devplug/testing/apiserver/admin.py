"""Admin access to devices (KEP-5018): who may ask for it, by the label of the claim's namespace.

Follows ``pkg/registry/resource/authz.go`` of Kubernetes 1.36 (``AuthorizedForAdmin``, called by the
resourceclaim strategy's ``Validate`` on create only, the spec being immutable; ``AuthorizedForAdminStatus``,
called by the status strategy's ``ValidateUpdate``) and ``pkg/apis/resource/types.go``
(``DRAAdminNamespaceLabelKey`` = ``resource.kubernetes.io/admin-access``):

* a claim whose request (``exactly.adminAccess``) is ``true`` is created only in a namespace labelled
  ``resource.kubernetes.io/admin-access: "true"``; otherwise ``Forbidden`` on
  ``spec.devices.requests[<first such request>].adminAccess``;
* a status update writing an allocation with a result ``adminAccess: true`` likewise (on
  ``status.allocation.devices.results[<i>].adminAccess``), unless the stored allocation already had one;
* the namespace is read from the API server's own store: when it does not exist the write fails with an
  ``InternalError`` field error ``could not retrieve namespace to verify admin access: namespaces "<ns>" not
  found`` (a 422 Invalid);
* in 1.34 and 1.35 (DRAAdminAccess beta) the check is skipped while the gate is off (the strategy has dropped the
  field by then anyway); 1.36 has it GA.

ResourceClaimTemplates (checked the same way by their strategy) are not served by the stand-in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from devplug.testing.apiserver.errors import FieldError

__all__ = ["LABEL", "authorized_for_admin"]

LABEL = "resource.kubernetes.io/admin-access"

#: Reads a Namespace by name from the store (None when there is none).
NamespaceLookup = Callable[[str], Mapping[str, Any] | None]


def _requested(obj: Mapping[str, Any]) -> str | None:
    """The path of the first request asking admin access, None when none does."""
    for i, request in enumerate(((obj.get("spec") or {}).get("devices") or {}).get("requests") or []):
        exactly = request.get("exactly") if isinstance(request, Mapping) else None
        if isinstance(exactly, Mapping) and exactly.get("adminAccess") is True:
            return f"spec.devices.requests[{i}].adminAccess"
    return None


def _granted(obj: Mapping[str, Any] | None) -> str | None:
    """``adminRequested``: the path of the first result with ``adminAccess: true``."""
    allocation = ((obj or {}).get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or [] if isinstance(allocation, Mapping) else []
    for i, result in enumerate(results):
        if isinstance(result, Mapping) and result.get("adminAccess") is True:
            return f"status.allocation.devices.results[{i}].adminAccess"
    return None


def authorized_for_admin(
    obj: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    subresource: str,
    namespace_of: NamespaceLookup,
    disabled: frozenset[str],
) -> list[FieldError]:
    """The field errors of a claim write that asks admin access where the namespace does not allow it (called by
    the storage before the claim's validation, on create and on ``status`` updates)."""
    if "DRAAdminAccess" in disabled:
        return []
    if subresource == "status":
        if _granted(old) is not None:
            return []
        path = _granted(obj)
    elif old is None:
        path = _requested(obj)
    else:
        return []  # "AuthorizedForAdmin isn't needed here because the spec is immutable."
    if path is None:
        return []
    name = str((obj.get("metadata") or {}).get("namespace", ""))
    namespace = namespace_of(name)
    if namespace is None:
        return [
            FieldError(
                "internal",
                path,
                detail=f'could not retrieve namespace to verify admin access: namespaces "{name}" not found',
            )
        ]
    if ((namespace.get("metadata") or {}).get("labels") or {}).get(LABEL) != "true":
        return [
            FieldError(
                "forbidden",
                path,
                detail=f"admin access to devices requires the `{LABEL}: true` label on the containing namespace",
            )
        ]
    return []
