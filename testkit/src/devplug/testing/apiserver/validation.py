"""The validation the stand-in applies, each rule from the API server's own validation code.

Sources: ``k8s.io/apimachinery/pkg/util/validation`` (``IsDNS1123Label``, ``IsDNS1123Subdomain``, their messages),
``pkg/apis/resource/validation/validation.go`` (``ValidateResourceSlice``, ``ValidateResourceClaim``,
``ValidateResourceClaimStatusUpdate``, ``ValidateDeviceClass``), ``pkg/apis/coordination/validation`` (Leases),
``pkg/apis/core/validation`` (pods, nodes), ``k8s.io/apimachinery/pkg/api/validate/content/kube.go``
(``IsLabelKey``, ``IsLabelValue``: every object's labels, through ``ValidateLabels`` of
``apimachinery/pkg/apis/meta/v1/validation``) and the limits of ``k8s.io/api/resource/v1/types.go`` at v0.36.3
(``ResourceSliceMaxDevices`` = 128, 64 when a device uses taints, counters or list attributes;
``DriverNameMaxLength`` = 63; ``PoolNameMaxLength`` = 253; ``ResourceClaimReservedForMaxSize`` = 256;
``AllocationResultsMaxSize`` = 32 = ``DeviceRequestsMaxSize``; ``DeviceConfigMaxSize`` = 32;
``ResourceSliceMaxAttributesAndCapacitiesPerDevice`` = 32).

What is checked is listed in :mod:`devplug.testing.apiserver`'s documentation; a rule not listed there is not
modelled (the stand-in then accepts what the real server might refuse: test against a real cluster before
relying on such input).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from devplug.testing.apiserver import slicerules, statusrules
from devplug.testing.apiserver.errors import FieldError

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*)?"
    r"(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?$"
)
LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end "
    "with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start "
    "and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)

_LABEL_KEY_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_KEY_NAME_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
    "character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
    "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start "
    "and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for "
    "validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
LABEL_MAX = 63

MAX_DEVICES = 128
MAX_DEVICES_ADVANCED = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_REQUESTS = 32
MAX_CONFIG = 32
MAX_RESERVED_FOR = 256
DRIVER_NAME_MAX = 63
POOL_NAME_MAX = 253
ALLOCATION_MODES = ("ExactCount", "All")


def dns_label(value: Any, field: str) -> list[FieldError]:
    """``ValidateDNS1123Label``."""
    if not isinstance(value, str) or not value:
        return [FieldError("required", field)]
    errors = []
    if len(value) > 63:
        errors.append(FieldError("invalid", field, value, "must be no more than 63 characters"))
    if not _LABEL.match(value):
        errors.append(FieldError("invalid", field, value, LABEL_MSG))
    return errors


def dns_subdomain(value: Any, field: str) -> list[FieldError]:
    """``ValidateDNS1123Subdomain`` (names of most objects: ``NameIsDNSSubdomain``)."""
    if not isinstance(value, str) or not value:
        return [FieldError("required", field)]
    errors = []
    if len(value) > 253:
        errors.append(FieldError("invalid", field, value, "must be no more than 253 characters"))
    if not _SUBDOMAIN.match(value):
        errors.append(FieldError("invalid", field, value, SUBDOMAIN_MSG))
    return errors


def driver_name(value: Any, field: str) -> list[FieldError]:
    """``ValidateCSIDriverName``, which DRA driver names reuse: required, at most 63 characters, a DNS subdomain."""
    if not isinstance(value, str) or not value:
        return [FieldError("required", field)]
    errors = []
    if len(value) > DRIVER_NAME_MAX:
        errors.append(FieldError("too_long", field, value, f"may not be more than {DRIVER_NAME_MAX} bytes"))
    if not _SUBDOMAIN.match(value.lower()):
        errors.append(FieldError("invalid", field, value, SUBDOMAIN_MSG))
    return errors


def pool_name(value: Any, field: str) -> list[FieldError]:
    """``validatePoolName``: DNS subdomains separated by slashes, at most 253 characters."""
    if not isinstance(value, str) or not value:
        return [FieldError("required", field)]
    errors = []
    if len(value) > POOL_NAME_MAX:
        errors.append(FieldError("too_long", field, value, f"may not be more than {POOL_NAME_MAX} bytes"))
    for part in value.split("/"):
        errors.extend(dns_subdomain(part, field) if part else [FieldError("required", field)])
    return errors


def _qualified_name(name: str, field: str) -> list[FieldError]:
    """``validateQualifiedName``: a C identifier of at most 32 characters, optionally ``<driver-like domain>/``."""
    parts = name.split("/")
    if len(parts) > 2:
        return [FieldError("invalid", field, name, "must not contain more than one slash")]
    errors = []
    if len(parts) == 2:
        errors.extend(
            driver_name(parts[0], field)
            if parts[0]
            else [FieldError("invalid", field, "", "the domain must not be empty")]
        )
    ident = parts[-1]
    if len(ident) > 32:
        errors.append(FieldError("too_long", field, ident, "may not be more than 32 bytes"))
    if not _C_IDENTIFIER.match(ident):
        errors.append(
            FieldError(
                "invalid",
                field,
                ident,
                "a valid C identifier must start with alphabetic character or '_', followed by a string of "
                "alphanumeric characters or '_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName', regex used for "
                "validation is '[A-Za-z_][A-Za-z0-9_]*')",
            )
        )
    return errors


def _device(device: Any, field: str) -> list[FieldError]:
    if not isinstance(device, Mapping):
        return [FieldError("invalid", field, device, "must be an object")]
    errors = dns_label(device.get("name"), f"{field}.name")
    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        errors.append(
            FieldError(
                "invalid",
                field,
                len(attributes) + len(capacity),
                f"the total number of attributes and capacities must not exceed {MAX_ATTRIBUTES_AND_CAPACITIES}",
            )
        )
    for key, attribute in sorted(attributes.items()):
        errors.extend(_qualified_name(key, f"{field}.attributes"))
        path = f"{field}.attributes[{key}]"
        kinds = [
            k
            for k in ("bool", "int", "string", "version", "bools", "ints", "strings", "versions")
            if k in (attribute or {})
        ]
        if len(kinds) != 1:
            errors.append(
                FieldError("invalid", path, "" if not kinds else attribute, "exactly one value must be specified")
            )
            continue
        value = attribute[kinds[0]]
        if kinds[0] == "string" and isinstance(value, str) and len(value) > 64:
            errors.append(FieldError("too_long", f"{path}.string", value, "may not be more than 64 bytes"))
        if kinds[0] == "version" and (not isinstance(value, str) or not _SEMVER.match(value)):
            errors.append(
                FieldError(
                    "invalid", f"{path}.version", value, "must be a string compatible with semver.org spec 2.0.0"
                )
            )
    for key in sorted(capacity):
        errors.extend(_qualified_name(key, f"{field}.capacity"))
        if "value" not in (capacity[key] or {}):
            errors.append(FieldError("required", f"{field}.capacity[{key}].value"))
    return errors


def _advanced(devices: list[Any]) -> bool:
    """Devices using taints, counters or list attributes lower the limit to 64 (``haveDeviceTaints`` & co)."""
    for device in devices:
        if not isinstance(device, Mapping):
            continue
        if device.get("taints") or device.get("consumesCounters"):
            return True
        for attribute in (device.get("attributes") or {}).values():
            if any(k in (attribute or {}) for k in ("bools", "ints", "strings", "versions")):
                return True
    return False


def resource_slice(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """``ValidateResourceSlice`` / ``ValidateResourceSliceUpdate`` for what the model checks."""
    spec = obj.get("spec") or {}
    errors = driver_name(spec.get("driver"), "spec.driver")
    pool = spec.get("pool") or {}
    errors += pool_name(pool.get("name"), "spec.pool.name")
    count = pool.get("resourceSliceCount")
    if not isinstance(count, int) or count <= 0:
        errors.append(FieldError("invalid", "spec.pool.resourceSliceCount", count or 0, "must be greater than zero"))
    generation = pool.get("generation", 0)
    if not isinstance(generation, int) or generation < 0:
        errors.append(
            FieldError("invalid", "spec.pool.generation", generation, "must be greater than or equal to zero")
        )
    if old is not None:
        old_spec = old.get("spec") or {}
        for path, new_value, old_value in (
            ("spec.pool.name", pool.get("name"), (old_spec.get("pool") or {}).get("name")),
            ("spec.driver", spec.get("driver"), old_spec.get("driver")),
            ("spec.nodeName", spec.get("nodeName"), old_spec.get("nodeName")),
        ):
            if new_value != old_value:
                errors.append(FieldError("invalid", path, new_value, "field is immutable"))
    chosen = []
    node_name = spec.get("nodeName")
    if node_name is not None:
        if node_name == "":
            errors.append(
                FieldError("invalid", "spec.nodeName", "", "must be either unset or set to a non-empty string")
            )
        else:
            chosen.append("`nodeName`")
            errors += dns_subdomain(node_name, "spec.nodeName")
    if spec.get("nodeSelector") is not None:
        chosen.append("`nodeSelector`")
        terms = (spec.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
        if len(terms) != 1:
            errors.append(
                FieldError(
                    "invalid", "spec.nodeSelector.nodeSelectorTerms", terms, "must have exactly one node selector term"
                )
            )
    for key in ("allNodes", "perDeviceNodeSelection"):
        if spec.get(key) is True:
            chosen.append(f"`{key}`")
        elif spec.get(key) is not None:
            errors.append(FieldError("invalid", f"spec.{key}", spec.get(key), "must be either unset or set to true"))
    one_of = "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
    if not chosen:
        errors.append(FieldError("required", "spec", detail=one_of))
    elif len(chosen) > 1:
        errors.append(
            FieldError("invalid", "spec", "{" + ", ".join(chosen) + "}", one_of + ", but multiple fields are set")
        )
    devices = spec.get("devices")
    if devices is not None and spec.get("sharedCounters") is not None:
        errors.append(FieldError("invalid", "spec", "", "only one of `sharedCounters` or `devices` is allowed"))
    devices = list(devices or [])
    limit = MAX_DEVICES_ADVANCED if _advanced(devices) else MAX_DEVICES
    if len(devices) > limit:  # validateSet: the size check short-circuits the rest (DOS protection)
        errors.append(FieldError("too_many", "spec.devices", len(devices), f"must have at most {limit} items"))
        return errors
    seen: set[Any] = set()
    old_devices = {
        d.get("name"): d for d in ((old or {}).get("spec") or {}).get("devices") or [] if isinstance(d, Mapping)
    }
    per_device = spec.get("perDeviceNodeSelection") is True
    for i, device in enumerate(devices):
        errors += _device(device, f"spec.devices[{i}]")
        if isinstance(device, Mapping):
            old_device = old_devices.get(device.get("name")) if old is not None else None
            errors += slicerules.device_extras(device, old_device, f"spec.devices[{i}]", per_device)
    errors += slicerules.counter_sets(spec.get("sharedCounters"))
    for i, device in enumerate(devices):
        name = device.get("name") if isinstance(device, Mapping) else None
        if name in seen:
            errors.append(FieldError("duplicate", f"spec.devices[{i}]", name))
        seen.add(name)
    return errors


def _request_name_ref(name: Any, field: str, names: set[str]) -> list[FieldError]:
    if not isinstance(name, str) or name.split("/")[0] not in names:
        return [
            FieldError(
                "invalid",
                field,
                name,
                "must be the name of a request in the claim or the name of a request and a subrequest separated by '/'",
            )
        ]
    return []


def _opaque(config: Any, field: str) -> list[FieldError]:
    opaque = (config or {}).get("opaque") if isinstance(config, Mapping) else None
    if opaque is None:
        return [FieldError("required", f"{field}.opaque")]
    errors = driver_name(opaque.get("driver"), f"{field}.opaque.driver")
    parameters = opaque.get("parameters")
    if parameters is None:
        errors.append(FieldError("required", f"{field}.opaque.parameters"))
    elif not isinstance(parameters, Mapping):
        errors.append(
            FieldError("invalid", f"{field}.opaque.parameters", "<value omitted>", "must be a valid JSON object")
        )
    elif len(json.dumps(parameters)) > 10 * 1024:
        errors.append(FieldError("too_long", f"{field}.opaque.parameters", "", "may not be more than 10240 bytes"))
    return errors


def resource_claim(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """``ValidateResourceClaim`` (create) and ``ValidateResourceClaimUpdate`` (the spec is immutable)."""
    spec = obj.get("spec") or {}
    if old is not None:
        if spec != (old.get("spec") or {}):
            return [FieldError("invalid", "spec", "<value omitted>", "field is immutable")]
        return []
    devices = spec.get("devices") or {}
    requests = list(devices.get("requests") or [])
    errors: list[FieldError] = []
    if len(requests) > MAX_REQUESTS:
        return [
            FieldError("too_many", "spec.devices.requests", len(requests), f"must have at most {MAX_REQUESTS} items")
        ]
    names: set[str] = set()
    for i, raw_request in enumerate(requests):
        path = f"spec.devices.requests[{i}]"
        request = raw_request if isinstance(raw_request, Mapping) else {}
        errors += dns_label(request.get("name"), f"{path}.name")
        exactly, first = request.get("exactly"), request.get("firstAvailable")
        if exactly is None and not first:
            errors.append(
                FieldError("required", path, detail="exactly one of `exactly` or `firstAvailable` is required")
            )
        elif exactly is not None and first:
            errors.append(
                FieldError(
                    "invalid",
                    path,
                    None,
                    "exactly one of `exactly` or `firstAvailable` is required, but multiple fields are set",
                )
            )
        for sub_path, raw_sub in ([(f"{path}.exactly", exactly)] if exactly is not None else []) + [
            (f"{path}.firstAvailable[{j}]", s) for j, s in enumerate(first or [])
        ]:
            sub = raw_sub if isinstance(raw_sub, Mapping) else {}
            if "firstAvailable" in sub_path:
                errors += dns_label(sub.get("name"), f"{sub_path}.name")
            errors += dns_subdomain(sub.get("deviceClassName"), f"{sub_path}.deviceClassName")
            mode = sub.get("allocationMode", "ExactCount")
            count = sub.get("count", 1 if mode == "ExactCount" else 0)
            if mode == "All" and count:
                errors.append(
                    FieldError(
                        "invalid", f"{sub_path}.count", count, "must not be specified when allocationMode is 'All'"
                    )
                )
            elif mode == "ExactCount" and (not isinstance(count, int) or count <= 0):
                errors.append(FieldError("invalid", f"{sub_path}.count", count, "must be greater than zero"))
            elif mode not in ALLOCATION_MODES:
                errors.append(
                    FieldError(
                        "not_supported", f"{sub_path}.allocationMode", mode, 'supported values: "All", "ExactCount"'
                    )
                )
        name = request.get("name")
        if name in names:
            errors.append(FieldError("duplicate", path, name))
        if isinstance(name, str):
            names.add(name)
    configs = list(devices.get("config") or [])
    if len(configs) > MAX_CONFIG:
        errors.append(
            FieldError("too_many", "spec.devices.config", len(configs), f"must have at most {MAX_CONFIG} items")
        )
    else:
        for i, config in enumerate(configs):
            for j, ref in enumerate((config or {}).get("requests") or []):
                errors += _request_name_ref(ref, f"spec.devices.config[{i}].requests[{j}]", names)
            errors += _opaque(config, f"spec.devices.config[{i}]")
    return errors


def resource_claim_status(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """``ValidateResourceClaimStatusUpdate`` for what the model checks (``status.devices`` and result share IDs:
    :mod:`.statusrules`)."""
    status, old_status = obj.get("status") or {}, (old or {}).get("status") or {}
    names = {
        r.get("name")
        for r in ((obj.get("spec") or {}).get("devices") or {}).get("requests") or []
        if isinstance(r, Mapping)
    }
    errors: list[FieldError] = []
    reserved = list(status.get("reservedFor") or [])
    if len(reserved) > MAX_RESERVED_FOR:
        errors.append(
            FieldError("too_many", "status.reservedFor", len(reserved), f"must have at most {MAX_RESERVED_FOR} items")
        )
    errors += statusrules.device_statuses(status)
    uids: set[Any] = set()
    for i, ref in enumerate(reserved):
        for key in ("resource", "name", "uid"):
            if not (ref or {}).get(key):
                errors.append(FieldError("required", f"status.reservedFor[{i}].{key}"))
        uid = (ref or {}).get("uid")
        if uid in uids:
            errors.append(FieldError("duplicate", f"status.reservedFor[{i}]", ref))
        uids.add(uid)
    allocation, old_allocation = status.get("allocation"), old_status.get("allocation")
    if reserved and allocation is None:
        errors.append(
            FieldError("forbidden", "status.reservedFor", detail="may not be specified when `allocated` is not set")
        )
    if reserved and allocation is not None and (obj.get("metadata") or {}).get("deletionTimestamp"):
        new_uids = {(r or {}).get("uid") for r in reserved} - {
            (r or {}).get("uid") for r in old_status.get("reservedFor") or []
        }
        if new_uids:
            errors.append(
                FieldError(
                    "forbidden",
                    "status.reservedFor",
                    detail="new entries may not be added while `deallocationRequested` or `deletionTimestamp` are set",
                )
            )
    if old_allocation is not None and allocation is not None:
        if allocation != old_allocation:
            errors.append(FieldError("invalid", "status.allocation", "<value omitted>", "field is immutable"))
    elif allocation is not None:
        results = list(((allocation or {}).get("devices") or {}).get("results") or [])
        if len(results) > MAX_REQUESTS:
            errors.append(
                FieldError(
                    "too_many",
                    "status.allocation.devices.results",
                    len(results),
                    f"must have at most {MAX_REQUESTS} items",
                )
            )
        for i, raw_result in enumerate(results):
            path = f"status.allocation.devices.results[{i}]"
            result = raw_result if isinstance(raw_result, Mapping) else {}
            errors += _request_name_ref(
                result.get("request"), f"{path}.request", {n for n in names if isinstance(n, str)}
            )
            errors += driver_name(result.get("driver"), f"{path}.driver")
            errors += pool_name(result.get("pool"), f"{path}.pool")
            errors += dns_label(result.get("device"), f"{path}.device")
            if result.get("shareID") is not None:
                errors += statusrules.share_id(result.get("shareID"), f"{path}.shareID")
        for i, config in enumerate(((allocation or {}).get("devices") or {}).get("config") or []):
            source = (config or {}).get("source")
            if source not in ("FromClass", "FromClaim"):
                errors.append(
                    FieldError(
                        "not_supported",
                        f"status.allocation.devices.config[{i}].source",
                        source,
                        'supported values: "FromClaim", "FromClass"',
                    )
                )
            errors += _opaque(config, f"status.allocation.devices.config[{i}]")
    return errors


def _extended_resource_name(name: str) -> bool:
    """``IsExtendedResourceName``: a qualified name with a domain outside ``kubernetes.io``, not ``requests.``."""
    domain, slash, _ = name.partition("/")
    if not slash or name.startswith("requests."):
        return False
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return domain.startswith("deviceclass.resource.kubernetes.io")
    return bool(_SUBDOMAIN.match(domain)) and bool(
        re.match(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$", name.partition("/")[2])
    )


def device_class(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """``ValidateDeviceClass``: selectors need ``cel``, configs an opaque config, ``extendedResourceName`` a valid
    extended resource name."""
    spec = obj.get("spec") or {}
    errors: list[FieldError] = []
    for i, selector in enumerate(spec.get("selectors") or []):
        if not ((selector or {}).get("cel") or {}).get("expression"):
            errors.append(FieldError("required", f"spec.selectors[{i}].cel"))
    for i, config in enumerate(spec.get("config") or []):
        errors += _opaque(config, f"spec.config[{i}]")
    name = spec.get("extendedResourceName")
    if name is not None and not (isinstance(name, str) and _extended_resource_name(name)):
        errors.append(
            FieldError("invalid", "spec.extendedResourceName", name, "must be a valid extended resource name")
        )
    return errors


def lease(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """``ValidateLeaseSpec``: ``leaseDurationSeconds`` > 0 and ``leaseTransitions`` >= 0 when set."""
    spec = obj.get("spec") or {}
    errors = []
    duration = spec.get("leaseDurationSeconds")
    if duration is not None and (not isinstance(duration, int) or duration <= 0):
        errors.append(FieldError("invalid", "spec.leaseDurationSeconds", duration, "must be greater than 0"))
    transitions = spec.get("leaseTransitions")
    if transitions is not None and (not isinstance(transitions, int) or transitions < 0):
        errors.append(FieldError("invalid", "spec.leaseTransitions", transitions, "must be greater than or equal to 0"))
    return errors


def pod(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """``ValidatePodSpec``, the part modelled: at least one container, each with a name; ``spec.nodeName`` may
    not change once set (``ValidatePodSpecificAnnotationUpdates`` and the binding rule of ``ValidatePodUpdate``)."""
    containers = (obj.get("spec") or {}).get("containers") or []
    if not containers or not all(isinstance(c, Mapping) and c.get("name") for c in containers):
        return [FieldError("required", "spec.containers")]
    if old is not None:
        before = (old.get("spec") or {}).get("nodeName")
        if before and (obj.get("spec") or {}).get("nodeName") != before:
            return [FieldError("forbidden", "spec", detail=_POD_UPDATE)]
    return []


_POD_UPDATE = (
    "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,"
    "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),"
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"
)


def namespace(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """``ValidateNamespace``, the part modelled: the name a DNS label (``ValidateNamespaceName``)."""
    name = (obj.get("metadata") or {}).get("name")
    return [e for e in dns_label(name, "metadata.name") if e.type != "required"]


def node(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """``ValidateNode``, the part modelled: taints need a key and a known effect."""
    errors = []
    for i, taint in enumerate((obj.get("spec") or {}).get("taints") or []):
        if not (taint or {}).get("key"):
            errors.append(FieldError("required", f"spec.taints[{i}].key"))
        effect = (taint or {}).get("effect")
        if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            errors.append(
                FieldError(
                    "not_supported",
                    f"spec.taints[{i}].effect",
                    effect,
                    'supported values: "NoExecute", "NoSchedule", "PreferNoSchedule"',
                )
            )
    return errors


def label_key_problems(key: str) -> list[str]:
    """``content.IsLabelKey``: an optional DNS subdomain prefix and ``/``, then a name of at most 63 characters."""
    parts = key.split("/")
    if len(parts) > 2:
        return [
            "a valid label key must consist of alphanumeric characters, '-', '_' or '.', and must start and end with "
            "an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
            "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. "
            "'example.com/MyName')"
        ]
    problems = []
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            problems.append("prefix part must be non-empty")
        else:
            if len(prefix) > 253:
                problems.append("prefix part must be no more than 253 characters")
            if not _SUBDOMAIN.match(prefix):
                problems.append("prefix part " + SUBDOMAIN_MSG)
    name = parts[-1]
    if not name:
        problems.append("name part must be non-empty")
    elif len(name) > LABEL_MAX:
        problems.append(f"name part must be no more than {LABEL_MAX} characters")
    if not _LABEL_KEY_NAME.match(name):
        problems.append(LABEL_KEY_NAME_MSG)
    return problems


def label_value_problems(value: str) -> list[str]:
    """``content.IsLabelValue``: empty, or at most 63 alphanumerics, ``-``, ``_``, ``.`` starting and ending with an
    alphanumeric."""
    problems = []
    if len(value) > LABEL_MAX:
        problems.append(f"must be no more than {LABEL_MAX} characters")
    if not _LABEL_VALUE.match(value):
        problems.append(LABEL_VALUE_MSG)
    return problems


def _labels(labels: Mapping[str, str]) -> list[FieldError]:
    """``ValidateLabels``: each key a label key, each value a label value, both reported on ``metadata.labels``."""
    errors: list[FieldError] = []
    for key, value in labels.items():
        errors.extend(FieldError("invalid", "metadata.labels", key, msg) for msg in label_key_problems(key))
        errors.extend(FieldError("invalid", "metadata.labels", value, msg) for msg in label_value_problems(value))
    return errors


def object_meta(obj: Mapping[str, Any], kind_name_validator: str = "subdomain") -> list[FieldError]:
    """``ValidateObjectMeta`` for the name (and ``ValidateOwnerReferences``: apiVersion, kind, name, uid set)."""
    meta = obj.get("metadata") or {}
    errors = dns_subdomain(meta.get("name"), "metadata.name") if kind_name_validator == "subdomain" else []
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        for key in ("apiVersion", "kind", "name", "uid"):
            if not (ref or {}).get(key):
                errors.append(
                    FieldError(
                        "invalid",
                        f"metadata.ownerReferences[{i}].{key}",
                        (ref or {}).get(key, ""),
                        f"{key} must not be empty",
                    )
                )
    for key in ("labels", "annotations"):
        value = meta.get(key)
        if value is not None and not (isinstance(value, Mapping) and all(isinstance(v, str) for v in value.values())):
            errors.append(FieldError("invalid", f"metadata.{key}", value, "must map strings to strings"))
        elif key == "labels" and value is not None:
            errors.extend(_labels(value))
    return errors
