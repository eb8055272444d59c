"""``resource.k8s.io`` as each control-plane release serves it: its versions, their order, their fields, and the
conversions between each version and the one form the stand-in stores.

Sources, checked for each release:

* **which versions a release can serve, and which a control plane set up for DRA serves**: the API types
  (kubernetes/api, tags v0.32.0 .. v0.36.0: ``resource/v1beta1`` from 1.32, ``resource/v1beta2`` from 1.33,
  ``resource/v1`` from 1.34), beta APIs off by default (KEP-3136: every beta group version since 1.24 is served only
  with ``--runtime-config``), and the kubernetes.io task "Set Up DRA in a Cluster" of each release: 1.32 enables
  ``resource.k8s.io/v1beta1``, 1.33 ``v1beta1`` and ``v1beta2``; from 1.34 "DRA reached GA ... and is enabled by
  default", v1 only, the betas "if and only if support for those is desired". ``v1alpha3`` (alpha, off by default
  in every release; ResourceSlices only until 1.33) is not modelled;
* **discovery's order** (the first is ``preferredVersion``): ``pkg/apis/resource/install/install.go``'s
  ``SetVersionPriority``: 1.32 ``v1beta1``; 1.33 ``v1beta1, v1beta2`` (so a 1.33 server *prefers* the older one:
  a client must choose the newest it knows itself); 1.34 on ``v1, v1beta2`` then ``v1beta1`` (the tree after 1.36
  leaves v1beta1 out of the priority list, so it comes last);
* **fields**: each struct's JSON fields in ``types.go`` at each tag (:data:`_FIELDS` says when each field came);
* **conversions** (``pkg/apis/resource/v1beta1/conversion.go``): a v1beta1 Device wraps everything but its name in
  ``basic`` (``Convert_resource_Device_To_v1beta1_Device`` always sets ``basic``, ``{}`` for a bare device); a
  v1beta1 DeviceRequest has the exact request's fields itself, where v1beta2 and v1 nest them in ``exactly``
  (``Convert_v1beta1_DeviceRequest_To_resource_DeviceRequest`` makes ``exactly`` when any of them is set); a v1beta1
  slice's ``nodeName`` ``""`` and ``allNodes`` ``false`` are unset (``Convert_v1beta1_ResourceSliceSpec_To_...``).
  v1beta2 and v1 have the same shape as the stored form, which is v1's;
* **feature gates off by default** (``pkg/features/kube_features.go``, each gate's ``VersionedSpecs``; :data:`GATES`):
  ``DRADeviceTaints`` alpha (off) 1.33, beta (on) 1.36; ``DRAAdminAccess`` alpha 1.32, beta 1.34, GA 1.36;
  ``DRAResourceClaimDeviceStatus`` alpha 1.32, beta 1.33; ``DRAPartitionableDevices`` alpha 1.33, beta 1.36;
  ``DRAConsumableCapacity`` alpha 1.34, beta 1.36. A gate is modelled only from the release whose types have its
  fields (before, the fields are pruned whatever the gate says).

Only the structs devplug and the scheduler stand-in touch are described (a slice's spec, pool, devices, their
taints and capacities; a claim's requests, constraints, allocation, results and device statuses; a class's spec);
fields elsewhere (metadata, selectors, configs, counter sets' contents) are passed through unchecked.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GATES",
    "GROUP",
    "INTERNAL",
    "NEWEST_FIRST",
    "RELEASES",
    "KindSchema",
    "Release",
    "from_version",
    "prune",
    "release",
    "schema",
    "to_version",
    "unknown_fields",
]

GROUP = "resource.k8s.io"
#: The form the stand-in stores (the hub of the conversions): v1's shape.
INTERNAL = "v1"
#: The versions modelled, newest first.
NEWEST_FIRST = ("v1", "v1beta2", "v1beta1")
KINDS = ("ResourceSlice", "ResourceClaim", "DeviceClass")


@dataclass(frozen=True)
class Release:
    """One control-plane release (``"1.32"``): the ``resource.k8s.io`` versions it can serve, in discovery's order,
    those a control plane set up for DRA serves, and the feature gates it has off by default."""

    name: str
    versions: tuple[str, ...]
    default: tuple[str, ...]
    off_by_default: frozenset[str]

    @property
    def minor(self) -> int:
        return int(self.name.split(".")[1])

    @property
    def git_version(self) -> str:
        return f"v{self.name}.0"

    def ordered(self, versions: tuple[str, ...] | list[str] | set[str]) -> tuple[str, ...]:
        """``versions`` in discovery's order (ValueError naming what the release has, for one it does not)."""
        wanted = set(versions)
        unknown = sorted(wanted - set(self.versions))
        if unknown:
            raise ValueError(
                f"Kubernetes {self.name} has no resource.k8s.io {', '.join(unknown)}: it has "
                f"{', '.join(self.versions)} (v1alpha3 is not modelled)"
            )
        return tuple(v for v in self.versions if v in wanted)


#: The feature gates the stand-in models: (gate, the release (minor) whose default turns it on, the release whose
#: types first have its fields). ``pkg/features/kube_features.go``: DRAAdminAccess ``{1.32 Alpha false, 1.34 Beta
#: true, 1.36 GA true locked}``; DRAResourceClaimDeviceStatus ``{1.32 Alpha false, 1.33 Beta true}``;
#: DRADeviceTaints ``{1.33 Alpha false, 1.36 Beta true}``; DRAPartitionableDevices ``{1.33 Alpha false, 1.36 Beta
#: true}``; DRAConsumableCapacity ``{1.34 Alpha false, 1.36 Beta true}``.
GATES: tuple[tuple[str, int, int], ...] = (
    ("DRAAdminAccess", 34, 32),
    ("DRAResourceClaimDeviceStatus", 33, 32),
    ("DRADeviceTaints", 36, 33),
    ("DRAPartitionableDevices", 36, 33),
    ("DRAConsumableCapacity", 36, 34),
)


def _off(minor: int) -> frozenset[str]:
    """The modelled gates a release of ``minor`` has, off by default."""
    return frozenset(gate for gate, on_from, since in GATES if since <= minor < on_from)


RELEASES: dict[str, Release] = {
    "1.32": Release("1.32", ("v1beta1",), ("v1beta1",), _off(32)),
    "1.33": Release("1.33", ("v1beta1", "v1beta2"), ("v1beta1", "v1beta2"), _off(33)),
    "1.34": Release("1.34", ("v1", "v1beta2", "v1beta1"), ("v1",), _off(34)),
    "1.35": Release("1.35", ("v1", "v1beta2", "v1beta1"), ("v1",), _off(35)),
    "1.36": Release("1.36", ("v1", "v1beta2", "v1beta1"), ("v1",), _off(36)),
}


def release(name: str) -> Release:
    """The release ``name`` (``"1.32"`` .. ``"1.36"``); ValueError naming the modelled ones."""
    try:
        return RELEASES[name]
    except KeyError:
        raise ValueError(f"the API server stand-in models Kubernetes {', '.join(RELEASES)}, not {name!r}") from None


#: Each described struct's fields and the release (minor) whose types first have it.
_FIELDS: dict[str, tuple[tuple[str, int], ...]] = {
    "slice_spec": (
        ("driver", 32),
        ("pool", 32),
        ("nodeName", 32),
        ("nodeSelector", 32),
        ("allNodes", 32),
        ("devices", 32),
        ("perDeviceNodeSelection", 33),
        ("sharedCounters", 33),
    ),
    "pool": (("name", 32), ("generation", 32), ("resourceSliceCount", 32)),
    # a Device's fields but its name (in v1beta1: BasicDevice's)
    "device": (
        ("attributes", 32),
        ("capacity", 32),
        ("consumesCounters", 33),
        ("nodeName", 33),
        ("nodeSelector", 33),
        ("allNodes", 33),
        ("taints", 33),
        ("bindsToNode", 34),
        ("bindingConditions", 34),
        ("bindingFailureConditions", 34),
        ("allowMultipleAllocations", 34),
        ("nodeAllocatableResourceMappings", 36),
    ),
    "taint": (("key", 33), ("value", 33), ("effect", 33), ("timeAdded", 33)),
    # ExactDeviceRequest's (in v1beta1: the DeviceRequest's own, beside its name)
    "exact": (
        ("deviceClassName", 32),
        ("selectors", 32),
        ("allocationMode", 32),
        ("count", 32),
        ("adminAccess", 32),
        ("tolerations", 33),
        ("capacity", 34),
    ),
    "sub_request": (
        ("name", 33),
        ("deviceClassName", 33),
        ("selectors", 33),
        ("allocationMode", 33),
        ("count", 33),
        ("tolerations", 33),
        ("capacity", 34),
    ),
    "class_spec": (("selectors", 32), ("config", 32), ("extendedResourceName", 34)),
    # DeviceCapacity (a value of Device.capacity)
    "capacity": (("value", 32), ("requestPolicy", 34)),
    "constraint": (("requests", 32), ("matchAttribute", 32), ("distinctAttribute", 34)),
    # AllocatedDeviceStatus (an entry of ResourceClaimStatus.devices)
    "device_status": (
        ("driver", 32),
        ("pool", 32),
        ("device", 32),
        ("conditions", 32),
        ("data", 32),
        ("networkData", 32),
        ("shareID", 34),
    ),
    "allocation": (("devices", 32), ("nodeSelector", 32), ("allocationTimestamp", 34)),
    "result": (
        ("request", 32),
        ("driver", 32),
        ("pool", 32),
        ("device", 32),
        ("adminAccess", 32),
        ("tolerations", 33),
        ("bindingConditions", 34),
        ("bindingFailureConditions", 34),
        ("shareID", 34),
        ("consumedCapacity", 34),
    ),
}
_EXACT_FIELDS = tuple(name for name, _ in _FIELDS["exact"])


@dataclass(frozen=True)
class _Struct:
    """A struct whose fields are known: a field outside ``fields`` is unknown; a field's value is described by its
    entry (None: not described, anything goes)."""

    fields: Mapping[str, _Node | None]


@dataclass(frozen=True)
class _List:
    item: _Struct


@dataclass(frozen=True)
class _Map:
    """A map of any keys to values of one struct (a device's ``capacity``)."""

    item: _Struct


_Node = _Struct | _List | _Map


def _known(struct: str, minor: int, **described: _Node) -> dict[str, _Node | None]:
    return {name: described.get(name) for name, since in _FIELDS[struct] if since <= minor}


@dataclass(frozen=True)
class KindSchema:
    """What one kind holds in one version of one release (see :func:`schema`)."""

    kind: str
    version: str
    release: Release
    root: _Struct


def schema(kind: str, version: str, rel: Release) -> KindSchema:
    """The fields ``kind`` has in ``resource.k8s.io/<version>`` of ``rel`` (``version`` ``"v1"`` of a release
    without it: the stored form's shape with that release's fields)."""
    minor = rel.minor
    meta: dict[str, _Node | None] = {"apiVersion": None, "kind": None, "metadata": None}
    if kind == "ResourceSlice":
        taints = _List(_Struct(_known("taint", minor)))
        capacity = _Map(_Struct(_known("capacity", minor)))
        device = _known("device", minor, taints=taints, capacity=capacity)
        entry = (
            _Struct({"name": None, "basic": _Struct(device)})
            if version == "v1beta1"
            else _Struct({"name": None, **device})
        )
        spec = _Struct(_known("slice_spec", minor, pool=_Struct(_known("pool", minor)), devices=_List(entry)))
        root = _Struct({**meta, "spec": spec})
    elif kind == "ResourceClaim":
        exact = _known("exact", minor)
        first = {"firstAvailable": _List(_Struct(_known("sub_request", minor)))} if minor >= 33 else {}
        request = (
            _Struct({"name": None, **exact, **first})
            if version == "v1beta1"
            else _Struct({"name": None, "exactly": _Struct(exact), **first})
        )
        constraints = _List(_Struct(_known("constraint", minor)))
        spec = _Struct({"devices": _Struct({"requests": _List(request), "constraints": constraints, "config": None})})
        results = _Struct({"results": _List(_Struct(_known("result", minor))), "config": None})
        allocation = _Struct(_known("allocation", minor, devices=results))
        statuses = _List(_Struct(_known("device_status", minor)))
        status = _Struct({"allocation": allocation, "reservedFor": None, "devices": statuses})
        root = _Struct({**meta, "spec": spec, "status": status})
    elif kind == "DeviceClass":
        root = _Struct({**meta, "spec": _Struct(_known("class_spec", minor))})
    else:
        raise ValueError(f"{GROUP} has no kind {kind!r} in the model")
    return KindSchema(kind, version, rel, root)


# --- unknown fields and projection


def _unknown(node: _Node | None, value: Any, path: tuple[str, ...], out: list[tuple[str, ...]]) -> None:
    if node is None or value is None:
        return
    if isinstance(node, _Map):
        if isinstance(value, Mapping):
            for key, item in value.items():
                _unknown(node.item, item, (*path, str(key)), out)
        return
    if isinstance(node, _List):
        if isinstance(value, list):
            for i, item in enumerate(value):
                _unknown(node.item, item, (*path, f"[{i}]"), out)
        return
    if not isinstance(value, Mapping):
        return
    for key, child in value.items():
        if key not in node.fields:
            out.append((*path, key))
        else:
            _unknown(node.fields[key], child, (*path, key), out)


def unknown_fields(kind_schema: KindSchema, obj: Any) -> list[tuple[str, ...]]:
    """The paths of the fields of ``obj`` its schema does not have, in the order a decoder meets them (each path a
    tuple of names and ``[index]`` parts)."""
    out: list[tuple[str, ...]] = []
    _unknown(kind_schema.root, obj, (), out)
    return out


def _project(node: _Node | None, value: Any) -> Any:
    if node is None or value is None:
        return value
    if isinstance(node, _Map):
        return {k: _project(node.item, v) for k, v in value.items()} if isinstance(value, Mapping) else value
    if isinstance(node, _List):
        return [_project(node.item, item) for item in value] if isinstance(value, list) else value
    if not isinstance(value, Mapping):
        return value
    return {k: _project(node.fields[k], v) for k, v in value.items() if k in node.fields}


def project(kind_schema: KindSchema, obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` without the fields its schema does not have (what decoding into that version's Go type keeps)."""
    projected: dict[str, Any] = _project(kind_schema.root, obj)
    return projected


# --- conversions


def _device_to_v1beta1(device: Any) -> Any:
    if not isinstance(device, Mapping):
        return device
    out: dict[str, Any] = {"name": device["name"]} if "name" in device else {}
    out["basic"] = {k: copy.deepcopy(v) for k, v in device.items() if k != "name"}
    return out


def _device_from_v1beta1(device: Any) -> Any:
    if not isinstance(device, Mapping):
        return device
    out = {k: copy.deepcopy(v) for k, v in device.items() if k != "basic"}
    basic = device.get("basic")
    if isinstance(basic, Mapping):
        out.update(copy.deepcopy(dict(basic)))
    return out


def _request_to_v1beta1(request: Any) -> Any:
    if not isinstance(request, Mapping):
        return request
    out = {k: copy.deepcopy(v) for k, v in request.items() if k != "exactly"}
    exactly = request.get("exactly")
    if isinstance(exactly, Mapping):
        out.update(copy.deepcopy(dict(exactly)))
    return out


#: The exact request's fields ``hasAnyMainRequestFieldsSet`` tests against nil (the others against "" and 0).
_POINTER_FIELDS = frozenset({"selectors", "adminAccess", "tolerations", "capacity"})


def _main_field_set(key: str, value: Any) -> bool:
    """``hasAnyMainRequestFieldsSet``'s test of one field: not its zero value."""
    if key in _POINTER_FIELDS:
        return value is not None
    return value is not None and value != "" and not (isinstance(value, int) and value == 0)


def _request_from_v1beta1(request: Any) -> Any:
    if not isinstance(request, Mapping):
        return request
    out = {k: copy.deepcopy(v) for k, v in request.items() if k not in _EXACT_FIELDS}
    main = {k: copy.deepcopy(request[k]) for k in _EXACT_FIELDS if k in request}
    if any(_main_field_set(k, v) for k, v in main.items()):
        out["exactly"] = {k: v for k, v in main.items() if v is not None}
    return out


def _map_list(obj: dict[str, Any], path: tuple[str, ...], each: Any) -> None:
    holder: Any = obj
    for key in path[:-1]:
        holder = holder.get(key) if isinstance(holder, Mapping) else None
        if holder is None:
            return
    if isinstance(holder, dict) and isinstance(holder.get(path[-1]), list):
        holder[path[-1]] = [each(item) for item in holder[path[-1]]]


def to_version(kind: str, version: str, rel: Release, obj: Mapping[str, Any]) -> dict[str, Any]:
    """A stored object as ``resource.k8s.io/<version>`` of ``rel`` gives it: converted, without the fields that
    version has not, ``apiVersion`` set."""
    out = copy.deepcopy(dict(obj))
    if version == "v1beta1":
        if kind == "ResourceSlice":
            _map_list(out, ("spec", "devices"), _device_to_v1beta1)
        elif kind == "ResourceClaim":
            _map_list(out, ("spec", "devices", "requests"), _request_to_v1beta1)
    projected = project(schema(kind, version, rel), out)
    if "apiVersion" in obj:
        projected["apiVersion"] = f"{GROUP}/{version}"
    return projected


def from_version(kind: str, version: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    """An object (or an apply configuration: any part of one) sent as ``resource.k8s.io/<version>``, in the stored
    form (the fields the version has not are to be dropped before: :func:`project`)."""
    out = copy.deepcopy(dict(obj))
    if version == "v1beta1":
        if kind == "ResourceSlice":
            _map_list(out, ("spec", "devices"), _device_from_v1beta1)
            spec = out.get("spec")
            if isinstance(spec, dict):
                if spec.get("nodeName") == "":
                    del spec["nodeName"]
                if spec.get("allNodes") is False:
                    del spec["allNodes"]
        elif kind == "ResourceClaim":
            _map_list(out, ("spec", "devices", "requests"), _request_from_v1beta1)
    if out.get("apiVersion") == f"{GROUP}/{version}":
        out["apiVersion"] = f"{GROUP}/{INTERNAL}"
    return out


def prune(kind: str, rel: Release, obj: dict[str, Any]) -> None:
    """Drop, in place, the fields of a stored object that ``rel``'s types do not have (its internal form cannot hold
    them: a 1.32 server has no device taints, whatever it is sent)."""
    if kind not in KINDS:
        return
    kept = project(schema(kind, INTERNAL, rel), obj)
    obj.clear()
    obj.update(kept)


def path_text(path: tuple[str, ...], *, leading_dot: bool) -> str:
    """``spec.devices[0].basic.taints`` (a strict decoding error's) or ``.spec.devices[0].basic.taints`` (a
    structured-merge-diff path's)."""
    text = ""
    for part in path:
        text += part if part.startswith("[") else f".{part}"
    return text if leading_dot else text.lstrip(".")
