"""The discovery documents of the stand-in: ``/api``, ``/api/v1``, ``/apis``, ``/apis/<group>``,
``/apis/<group>/<version>`` and ``/version``, as the real server answers them for the kinds it serves.

Follows ``k8s.io/apimachinery/pkg/apis/meta/v1`` (``APIVersions``, ``APIGroupList``, ``APIGroup`` with
``preferredVersion``, ``APIResourceList``) and ``k8s.io/apiserver/pkg/endpoints/discovery`` (the legacy,
unaggregated documents: ``/apis`` lists each group with its versions in priority order, the first being
``preferredVersion``; a subresource is an entry ``<plural>/<sub>`` of the parent's kind, no singular name, and the
verbs it takes); ``/version`` is ``version.Info`` (only ``major``, ``minor`` and ``gitVersion`` say something here).
A group or version not served is no document: ``404`` as any unserved path (:mod:`.server`).

Not modelled: aggregated discovery (``Accept: application/json;g=apidiscovery.k8s.io;v=v2``: the legacy documents
are answered whatever is asked), ``storageVersionHash``, short names and categories, the groups of kinds the stand-in
does not serve.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from devplug.testing.apiserver import versions
from devplug.testing.apiserver.resources import RESOURCES, Resource

__all__ = ["api_group", "api_group_list", "api_resource_list", "api_versions", "version_info"]

_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
_SUBRESOURCE_VERBS = {"status": ["get", "patch", "update"], "binding": ["create"]}
_SUBRESOURCE_KIND = {"binding": "Binding"}


def _group_versions(group: str, resource_versions: Sequence[str]) -> list[str]:
    """The versions of ``group`` served, in priority order (empty: the group is not served)."""
    if group == versions.GROUP:
        return list(resource_versions)
    return sorted({r.version for r in RESOURCES if r.group == group})


def _version_entry(group: str, version: str) -> dict[str, str]:
    return {"groupVersion": f"{group}/{version}", "version": version}


def api_group(group: str, resource_versions: Sequence[str]) -> dict[str, Any] | None:
    """``/apis/<group>``: the ``APIGroup`` (None: not served)."""
    served = _group_versions(group, resource_versions)
    if not served or group == "":
        return None
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": [_version_entry(group, v) for v in served],
        "preferredVersion": _version_entry(group, served[0]),
    }


def api_group_list(resource_versions: Sequence[str]) -> dict[str, Any]:
    """``/apis``: every served group's ``APIGroup`` (without kind and apiVersion, as in the list)."""
    groups = []
    for group in dict.fromkeys(r.group for r in RESOURCES if r.group):
        found = api_group(group, resource_versions)
        if found is not None:
            groups.append({k: v for k, v in found.items() if k not in ("kind", "apiVersion")})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def _entries(resource: Resource) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {
            "name": resource.plural,
            "singularName": resource.kind.lower(),
            "namespaced": resource.namespaced,
            "kind": resource.kind,
            "verbs": list(_VERBS),
        }
    ]
    for sub in sorted(resource.subresources):
        out.append(
            {
                "name": f"{resource.plural}/{sub}",
                "singularName": "",
                "namespaced": resource.namespaced,
                "kind": _SUBRESOURCE_KIND.get(sub, resource.kind),
                "verbs": list(_SUBRESOURCE_VERBS.get(sub, ["get", "patch", "update"])),
            }
        )
    return out


def api_resource_list(group: str, version: str, resource_versions: Sequence[str]) -> dict[str, Any] | None:
    """``/apis/<group>/<version>`` (``/api/v1`` for ``group`` ``""``): the ``APIResourceList`` (None: not served)."""
    if version not in _group_versions(group, resource_versions) and not (group == "" and version == "v1"):
        return None
    kinds = [r for r in RESOURCES if r.group == group and (group == versions.GROUP or r.version == version)]
    entries = [entry for r in sorted(kinds, key=lambda r: r.plural) for entry in _entries(r)]
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": entries,
    }


def api_versions(server_address: str) -> dict[str, Any]:
    """``/api``: the core group's versions."""
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def version_info(release: versions.Release) -> dict[str, str]:
    """``/version`` of ``release``."""
    major, minor = release.name.split(".")
    return {
        "major": major,
        "minor": minor,
        "gitVersion": release.git_version,
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "",
        "goVersion": "",
        "compiler": "gc",
        "platform": "linux/amd64",
    }
