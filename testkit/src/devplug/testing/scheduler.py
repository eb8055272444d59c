"""A stand-in for kube-scheduler's DRA plugin: it allocates devices of published ResourceSlices to a pod's claims.

It writes through the API server stand-in's storage (:mod:`devplug.testing.apiserver`) as ``kube-scheduler``, in
the order the scheduler's ``dynamicresources`` plugin does in PreBind (``pkg/scheduler/framework/plugins/
dynamicresources/dynamicresources.go``, ``extendeddynamicresources.go``, Kubernetes 1.36):

1. the pod's claims: each ``spec.resourceClaims[].resourceClaimName`` (must exist; templates are not modelled);
   and, for KEP-5004, the extended resources of its containers that a DeviceClass maps
   (``spec.extendedResourceName``, or the implicit ``deviceclass.resource.kubernetes.io/<class>``; the class
   created last wins, then the name sorted first) when the node's ``status.allocatable`` does not offer them
   (a device plugin's resource wins): one claim made for the pod, ``generateName: <pod>-extended-resources-``,
   owned by the pod (``controller: true``), annotated ``resource.kubernetes.io/extended-resource-claim: "true"``,
   one request per container and resource, ``container-<index>-request-<index of the resource among the
   container's sorted requests>``, ``exactly`` ``{deviceClassName, allocationMode: ExactCount, count}``;
2. for each claim not yet allocated: the finalizer ``resource.kubernetes.io/delete-protection``, then the status
   (``status`` subresource): ``allocation.devices.results`` (request, driver, pool, device per device),
   ``allocation.devices.config`` (each class config ``FromClass`` for the requests of that class, then the
   claim's own ``FromClaim``), ``allocation.nodeSelector`` (``matchFields metadata.name In [node]``),
   ``allocationTimestamp``; and ``reservedFor`` gains the pod (``resource: pods``, name, uid);
3. the pod: ``status.extendedResourceClaimStatus`` (request mappings and the claim's name) when a claim was made
   for it, then the binding to the node.

Simplified against the real allocator (``k8s.io/dynamic-resource-allocation/structured``): one node is given,
not chosen; devices come from that node's slices (``spec.nodeName``) and ``allNodes`` slices of the newest pool
generation, pools with fewer slices than ``resourceSliceCount`` are skipped; the first free devices in slice name
and device order are taken (no backtracking over several requests, no constraints, no ``firstAvailable``, no
admin access, no consumable capacity or counters, no tolerations: a device with a ``NoSchedule``/``NoExecute``
taint is never used); a device allocated to any other claim is not free. CEL selectors (the class's and the
request's) are understood only as ``&&``-joined comparisons ``device.driver == "<name>"`` and
``device.attributes["<domain>"].<name> == <string|int|bool>``; anything else is refused naming the expression,
rather than matched wrongly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from devplug.testing.apiserver.errors import ApiStatusError
from devplug.testing.apiserver.resources import by_plural
from devplug.testing.apiserver.storage import Storage, Writer, now_text

__all__ = ["EXTENDED_CLAIM_ANNOTATION", "FINALIZER", "SchedulerStandIn", "SchedulingError"]

FINALIZER = "resource.kubernetes.io/delete-protection"
EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"
_WRITER = Writer("kube-scheduler")
_TERM = re.compile(
    r'^\s*device\.(?:driver|attributes\["(?P<domain>[^"]+)"\]\.(?P<attr>[A-Za-z_][A-Za-z0-9_]*))\s*==\s*(?P<value>"[^"]*"|-?\d+|true|false)\s*$'
)


class SchedulingError(Exception):
    """The pod cannot be scheduled (no such claim or class, not enough free devices, a selector not modelled)."""


@dataclass(frozen=True)
class _Device:
    driver: str
    pool: str
    name: str
    attributes: Mapping[str, Any]


def _terms(expression: str) -> list[re.Match[str]]:
    """The comparisons of a selector the model understands; SchedulingError naming any other expression."""
    terms = []
    for term in expression.split("&&"):
        match = _TERM.match(term)
        if match is None:
            raise SchedulingError(
                f"the scheduler stand-in does not model the CEL selector {expression!r}: it understands only "
                '&&-joined device.driver == "..." and device.attributes["<domain>"].<name> == <literal>'
            )
        terms.append(match)
    return terms


def _selector_matches(expression: str, device: _Device) -> bool:
    for match in _terms(expression):
        value = json.loads(match["value"])
        if match["attr"] is None:
            if device.driver != value:
                return False
            continue
        domain, attr = match["domain"], match["attr"]
        found = device.attributes.get(f"{domain}/{attr}")
        if found is None and domain == device.driver:
            found = device.attributes.get(attr)  # an attribute without a domain is in the driver's
        if not isinstance(found, Mapping) or value not in [found.get(k) for k in ("string", "int", "bool", "version")]:
            return False
    return True


class SchedulerStandIn:
    """Schedules pods onto a given node, allocating their claims from the node's published devices."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._claims = by_plural("resourceclaims")
        self._pods = by_plural("pods")

    # --- what is published and taken

    def _devices(self, node: str) -> list[_Device]:
        slices = [
            s
            for s in self.storage.objects(by_plural("resourceslices"))
            if s["spec"].get("nodeName") == node or s["spec"].get("allNodes") is True
        ]
        newest: dict[tuple[str, str], int] = {}
        for s in slices:
            key = (s["spec"]["driver"], s["spec"]["pool"]["name"])
            newest[key] = max(newest.get(key, 0), int(s["spec"]["pool"].get("generation", 0)))
        usable = []
        for s in sorted(slices, key=lambda s: s["metadata"]["name"]):
            pool = s["spec"]["pool"]
            key = (s["spec"]["driver"], pool["name"])
            if int(pool.get("generation", 0)) != newest[key]:
                continue
            complete = sum(
                1
                for o in slices
                if (o["spec"]["driver"], o["spec"]["pool"]["name"]) == key
                and int(o["spec"]["pool"].get("generation", 0)) == newest[key]
            )
            if complete < int(pool.get("resourceSliceCount", 1)):
                continue
            for device in s["spec"].get("devices") or []:
                if any(t.get("effect") in ("NoSchedule", "NoExecute") for t in device.get("taints") or []):
                    continue
                usable.append(
                    _Device(s["spec"]["driver"], pool["name"], device["name"], device.get("attributes") or {})
                )
        return usable

    def _taken(self, except_uid: str) -> set[tuple[str, str, str]]:
        taken = set()
        for claim in self.storage.objects(self._claims):
            if claim["metadata"]["uid"] == except_uid:
                continue
            allocation = (claim.get("status") or {}).get("allocation") or {}
            for result in (allocation.get("devices") or {}).get("results") or []:
                taken.add((result["driver"], result["pool"], result["device"]))
        return taken

    def _class(self, name: str) -> dict[str, Any]:
        try:
            return self.storage.get(by_plural("deviceclasses"), "", name)
        except ApiStatusError as exc:
            raise SchedulingError(f"device class {name!r} does not exist") from exc

    # --- allocation

    def _allocate(self, claim: Mapping[str, Any], node: str) -> dict[str, Any]:
        free = [
            d for d in self._devices(node) if (d.driver, d.pool, d.name) not in self._taken(claim["metadata"]["uid"])
        ]
        results: list[dict[str, Any]] = []
        configs: list[dict[str, Any]] = []
        chosen: set[tuple[str, str, str]] = set()
        devices = (claim.get("spec") or {}).get("devices") or {}
        for request in devices.get("requests") or []:
            exactly = request.get("exactly")
            if exactly is None:
                raise SchedulingError(
                    f"request {request.get('name')!r}: the stand-in allocates only `exactly` requests"
                )
            device_class = self._class(exactly["deviceClassName"])
            selectors = [
                s["cel"]["expression"]
                for s in (device_class["spec"].get("selectors") or []) + (exactly.get("selectors") or [])
            ]
            for expression in selectors:
                _terms(expression)  # refused before any device is looked at
            matching = [
                d
                for d in free
                if (d.driver, d.pool, d.name) not in chosen and all(_selector_matches(expr, d) for expr in selectors)
            ]
            mode = exactly.get("allocationMode", "ExactCount")
            wanted = len(matching) if mode == "All" else int(exactly.get("count", 1))
            if len(matching) < wanted or wanted == 0:
                raise SchedulingError(
                    f"claim {claim['metadata']['name']}: request {request['name']!r} wants {wanted or 'all'} "
                    f"device(s) of class {exactly['deviceClassName']!r}; node {node} has {len(matching)} free"
                )
            for device in matching[:wanted]:
                chosen.add((device.driver, device.pool, device.name))
                results.append(
                    {"request": request["name"], "driver": device.driver, "pool": device.pool, "device": device.name}
                )
            for config in device_class["spec"].get("config") or []:
                configs.append(
                    {"source": "FromClass", "requests": [request["name"]], **{k: v for k, v in config.items()}}
                )
        for config in devices.get("config") or []:
            configs.append({"source": "FromClaim", **{k: v for k, v in config.items()}})
        allocation: dict[str, Any] = {
            "devices": {"results": results},
            "nodeSelector": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
            },
            "allocationTimestamp": now_text(),
        }
        if configs:
            allocation["devices"]["config"] = configs
        return allocation

    def _reserve(self, claim: dict[str, Any], pod: Mapping[str, Any], node: str) -> dict[str, Any]:
        namespace, name = claim["metadata"]["namespace"], claim["metadata"]["name"]
        finalizers = claim["metadata"].get("finalizers") or []
        if FINALIZER not in finalizers:
            claim = self.storage.update(
                self._claims,
                namespace,
                name,
                {**claim, "metadata": {**claim["metadata"], "finalizers": [*finalizers, FINALIZER]}},
                _WRITER,
            )
        status = dict(claim.get("status") or {})
        if status.get("allocation") is None:
            status["allocation"] = self._allocate(claim, node)
        reserved = list(status.get("reservedFor") or [])
        if all(r.get("uid") != pod["metadata"]["uid"] for r in reserved):
            reserved.append({"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]})
        status["reservedFor"] = reserved
        return self.storage.update(self._claims, namespace, name, {**claim, "status": status}, _WRITER, "status")

    # --- KEP-5004: extended resources through DRA

    def _class_for(self, resource_name: str) -> dict[str, Any] | None:
        candidates = [
            c
            for c in self.storage.objects(by_plural("deviceclasses"))
            if c["spec"].get("extendedResourceName") == resource_name
            or IMPLICIT_PREFIX + c["metadata"]["name"] == resource_name
        ]
        if not candidates:
            return None
        candidates.sort(key=lambda c: c["metadata"]["name"])
        candidates.sort(key=lambda c: c["metadata"]["creationTimestamp"], reverse=True)
        return candidates[0]

    def _extended_claim(
        self, pod: Mapping[str, Any], node: Mapping[str, Any]
    ) -> tuple[dict[str, Any], list[dict[str, str]]] | None:
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        spec = pod.get("spec") or {}
        containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        requests: list[dict[str, Any]] = []
        mappings: list[dict[str, str]] = []
        for index, container in enumerate(containers):
            resources = container.get("resources") or {}
            wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
            for rindex, resource_name in enumerate(sorted(wanted)):
                device_class = self._class_for(resource_name)
                count = int(str(wanted[resource_name]))
                if device_class is None or count == 0 or str(allocatable.get(resource_name, "0")) not in ("0", ""):
                    continue
                request_name = f"container-{index}-request-{rindex}"
                requests.append(
                    {
                        "name": request_name,
                        "exactly": {
                            "deviceClassName": device_class["metadata"]["name"],
                            "allocationMode": "ExactCount",
                            "count": count,
                        },
                    }
                )
                mappings.append(
                    {"containerName": container["name"], "resourceName": resource_name, "requestName": request_name}
                )
        if not requests:
            return None
        meta = pod["metadata"]
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "generateName": f"{meta['name']}-extended-resources-",
                "namespace": meta["namespace"],
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"], "controller": True}
                ],
                "annotations": {EXTENDED_CLAIM_ANNOTATION: "true"},
            },
            "spec": {"devices": {"requests": sorted(requests, key=lambda r: str(r["name"]))}},
        }
        return claim, mappings

    # --- the pod

    def schedule(self, namespace: str, pod_name: str, node_name: str) -> list[dict[str, Any]]:
        """Allocate the pod's claims on ``node_name``, reserve them for it, bind it; the claims as stored."""
        pod = self.storage.get(self._pods, namespace, pod_name)
        node = self.storage.get(by_plural("nodes"), "", node_name)
        claims = []
        for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
            claim_name = entry.get("resourceClaimName")
            if not claim_name:
                raise SchedulingError(
                    f"pod {namespace}/{pod_name}: claim {entry.get('name')!r} comes from a template, which the "
                    "stand-in does not model"
                )
            try:
                claims.append(self.storage.get(self._claims, namespace, claim_name))
            except ApiStatusError as exc:
                raise SchedulingError(
                    f"pod {namespace}/{pod_name}: resource claim {claim_name!r} does not exist"
                ) from exc
        extended = self._extended_claim(pod, node)
        if extended is not None:
            made = self.storage.create(self._claims, namespace, extended[0], _WRITER)
            claims.append(made)
        stored = [self._reserve(claim, pod, node_name) for claim in claims]
        if extended is not None:
            status = {
                **(pod.get("status") or {}),
                "extendedResourceClaimStatus": {
                    "requestMappings": extended[1],
                    "resourceClaimName": stored[-1]["metadata"]["name"],
                },
            }
            pod = self.storage.update(self._pods, namespace, pod_name, {**pod, "status": status}, _WRITER, "status")
        self.storage.bind(namespace, pod_name, node_name, _WRITER)
        return stored

    def deallocate(self, namespace: str, claim_name: str) -> dict[str, Any]:
        """What the resourceclaim controller does once no pod uses a claim: clear ``reservedFor`` and the
        allocation, then drop the finalizer (so a claim being deleted goes)."""
        claim = self.storage.get(self._claims, namespace, claim_name)
        claim = self.storage.update(self._claims, namespace, claim_name, {**claim, "status": {}}, _WRITER, "status")
        finalizers = [f for f in claim["metadata"].get("finalizers") or [] if f != FINALIZER]
        return self.storage.update(
            self._claims,
            namespace,
            claim_name,
            {**claim, "metadata": {**claim["metadata"], "finalizers": finalizers}},
            _WRITER,
        )
