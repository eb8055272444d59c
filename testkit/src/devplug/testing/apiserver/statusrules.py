"""The ResourceClaim status validation of issue 41's fields: ``status.devices`` (KEP-4817) and the results'
``shareID`` (KEP-5075).

Follows ``pkg/apis/resource/validation/validation.go`` of Kubernetes 1.36: ``validateResourceClaimStatusUpdate``
(``status.devices`` is a set keyed by driver, pool, device and share ID, each entry checked by
``validateDeviceStatus`` against the allocation being written: an entry naming a device the claim has not been
allocated, or any entry while the claim has no allocation, is ``must be an allocated device in the claim``),
``validateDeviceStatus`` (driver, pool and device names; ``shareID`` a UID; at most
``AllocatedDeviceStatusMaxConditions`` = 8 conditions, each checked by ``metav1validation.ValidateConditions``;
``data`` a JSON object of at most ``AllocatedDeviceStatusDataMaxLength`` = 10 KiB (``validateRawExtension``);
``networkData``: ``interfaceName`` at most 256 bytes, ``hardwareAddress`` at most 128, at most 16 ``ips``, unique,
each an interface address in canonical CIDR form (``validateNetworkDeviceData``,
``k8s.io/apimachinery/pkg/util/validation/ip.go``'s ``IsValidInterfaceAddress``)),
``validateDeviceRequestAllocationResult`` (``shareID``: ``validateUID``, RFC 4122 in lowercase).
Called by :func:`devplug.testing.apiserver.validation.resource_claim_status` on every write of the ``status``
subresource.
"""

from __future__ import annotations

import ipaddress
import json
import re
import uuid
from collections.abc import Mapping
from typing import Any

from devplug.testing.apiserver.errors import FieldError

__all__ = ["device_statuses", "share_id"]

MAX_CONDITIONS = 8
MAX_DATA = 10 * 1024
MAX_INTERFACE_NAME = 256
MAX_HARDWARE_ADDRESS = 128
MAX_IPS = 16
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
_REASON_MSG = (
    "a condition reason must start with alphabetic character, optionally followed by a string of alphanumeric "
    "characters or '_,:', and must end with an alphanumeric character or '_' (e.g. 'my_name',  or 'MY_NAME',  or "
    "'MyName',  or 'ReasonA,ReasonB',  or 'ReasonA:ReasonB', regex used for validation is "
    "'[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?')"
)


def share_id(value: Any, field: str) -> list[FieldError]:
    """``validateUID``: a UUID, in its 36-character lowercase form."""
    text = value if isinstance(value, str) else ""
    try:
        uuid.UUID(text)
    except ValueError as exc:
        return [FieldError("invalid", field, value, f"error validating uid: {exc}")]
    if len(text) != 36 or text != text.lower():
        return [
            FieldError(
                "invalid",
                field,
                value,
                "uid must be in RFC 4122 normalized form, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` with lowercase "
                "hexadecimal characters",
            )
        ]
    return []


def device_key(entry: Mapping[str, Any]) -> str:
    """``structured.SharedDeviceID``'s ``String()``: ``driver/pool/device[/shareID]``."""
    text = f"{entry.get('driver', '')}/{entry.get('pool', '')}/{entry.get('device', '')}"
    return f"{text}/{entry['shareID']}" if entry.get("shareID") else text


def _conditions(conditions: Any, path: str) -> list[FieldError]:
    """``metav1validation.ValidateConditions``: unique types; each a type (a qualified name), a status
    True/False/Unknown, a ``lastTransitionTime``, a reason (CamelCase-ish, at most 1024) and a message of at most
    32768."""
    from devplug.testing.apiserver.validation import label_key_problems  # it imports this module

    items = list(conditions) if isinstance(conditions, list) else []
    errors: list[FieldError] = []
    if len(items) > MAX_CONDITIONS:
        errors.append(FieldError("too_many", path, len(items), f"must have at most {MAX_CONDITIONS} items"))
    seen: set[Any] = set()
    for i, raw in enumerate(items):
        condition = raw if isinstance(raw, Mapping) else {}
        at = f"{path}[{i}]"
        kind = condition.get("type")
        if not kind:
            errors.append(FieldError("required", f"{at}.type", detail="must be set"))
        else:  # ValidateQualifiedName (IsQualifiedName: what label keys are)
            errors.extend(FieldError("invalid", f"{at}.type", kind, m) for m in label_key_problems(str(kind)))
        if kind and kind in seen:
            errors.append(FieldError("duplicate", f"{at}.type", kind))
        seen.add(kind)
        if condition.get("status") not in ("True", "False", "Unknown"):
            errors.append(
                FieldError(
                    "not_supported",
                    f"{at}.status",
                    condition.get("status", ""),
                    'supported values: "False", "True", "Unknown"',
                )
            )
        if not condition.get("lastTransitionTime"):
            errors.append(FieldError("required", f"{at}.lastTransitionTime", detail="must be set"))
        reason = condition.get("reason")
        if not reason:
            errors.append(FieldError("required", f"{at}.reason", detail="must be set"))
        else:
            if not _REASON.match(str(reason)):
                errors.append(FieldError("invalid", f"{at}.reason", reason, _REASON_MSG))
            if len(str(reason)) > 1024:
                errors.append(FieldError("too_long", f"{at}.reason", detail="may not be more than 1024 bytes"))
        if len(str(condition.get("message", ""))) > 32768:
            errors.append(FieldError("too_long", f"{at}.message", detail="may not be more than 32768 bytes"))
    return errors


def _data(data: Any, path: str) -> list[FieldError]:
    """``validateRawExtension``: at most 10 KiB, a JSON object."""
    if data is None:
        return []
    if len(json.dumps(data, separators=(",", ":"))) > MAX_DATA:
        return [FieldError("too_long", path, detail=f"may not be more than {MAX_DATA} bytes")]
    if not isinstance(data, Mapping):
        return [FieldError("invalid", path, "<value omitted>", "must be a valid JSON object")]
    return []


def _interface_address(value: Any, path: str) -> list[FieldError]:
    """``IsValidInterfaceAddress``: an address with its prefix length, written canonically."""
    try:
        interface = ipaddress.ip_interface(str(value))
        if "/" not in str(value):
            raise ValueError(value)
    except ValueError:
        return [
            FieldError(
                "invalid", path, value, "must be a valid address in CIDR form, (e.g. 10.9.8.7/24 or 2001:db8::1/64)"
            )
        ]
    ip, bits = interface.ip, interface.network.prefixlen
    mapped = getattr(ip, "ipv4_mapped", None)
    if mapped is not None:  # Go parses an IPv4-mapped address as IPv4: "::ffff:192.168.0.1/120" -> "192.168.0.1/24"
        ip, bits = mapped, bits - 96 if bits > 32 else bits
    canonical = f"{ip}/{bits}"
    if value != canonical:
        return [FieldError("invalid", path, value, f'must be in canonical form ("{canonical}")')]
    return []


def _network(network: Any, path: str) -> list[FieldError]:
    """``validateNetworkDeviceData``."""
    if not isinstance(network, Mapping):
        return []
    errors: list[FieldError] = []
    if len(str(network.get("interfaceName", "")).encode()) > MAX_INTERFACE_NAME:
        errors.append(
            FieldError("too_long", f"{path}.interfaceName", detail=f"may not be more than {MAX_INTERFACE_NAME} bytes")
        )
    if len(str(network.get("hardwareAddress", "")).encode()) > MAX_HARDWARE_ADDRESS:
        errors.append(
            FieldError(
                "too_long", f"{path}.hardwareAddress", detail=f"may not be more than {MAX_HARDWARE_ADDRESS} bytes"
            )
        )
    ips = list(network.get("ips") or [])
    if len(ips) > MAX_IPS:
        return [*errors, FieldError("too_many", f"{path}.ips", len(ips), f"must have at most {MAX_IPS} items")]
    seen: set[Any] = set()
    for i, ip in enumerate(ips):
        errors += _interface_address(ip, f"{path}.ips[{i}]")
    for i, ip in enumerate(ips):
        if ip in seen:
            errors.append(FieldError("duplicate", f"{path}.ips[{i}]", ip))
        seen.add(ip)
    return errors


def device_statuses(status: Mapping[str, Any]) -> list[FieldError]:
    """``status.devices`` of a claim's new status: each entry valid and naming an allocated device (of the
    allocation in the same status), keys unique."""
    from devplug.testing.apiserver.validation import dns_label, driver_name, pool_name  # it imports this module

    entries = status.get("devices")
    if entries is None:
        return []
    allocation = status.get("allocation") or {}
    results = ((allocation.get("devices") or {}).get("results") or []) if isinstance(allocation, Mapping) else []
    allocated = {device_key(r) for r in results if isinstance(r, Mapping)}
    errors: list[FieldError] = []
    items = list(entries) if isinstance(entries, list) else []
    for i, raw in enumerate(items):
        entry = raw if isinstance(raw, Mapping) else {}
        path = f"status.devices[{i}]"
        errors += driver_name(entry.get("driver"), f"{path}.driver")
        errors += pool_name(entry.get("pool"), f"{path}.pool")
        errors += dns_label(entry.get("device"), f"{path}.device")
        if entry.get("shareID") is not None:
            errors += share_id(entry.get("shareID"), f"{path}.shareID")
        if device_key(entry) not in allocated:
            errors.append(FieldError("invalid", path, device_key(entry), "must be an allocated device in the claim"))
        errors += _conditions(entry.get("conditions"), f"{path}.conditions")
        errors += _data(entry.get("data"), f"{path}.data")
        errors += _network(entry.get("networkData"), f"{path}.networkData")
    seen: set[str] = set()
    for i, raw in enumerate(items):
        key = device_key(raw if isinstance(raw, Mapping) else {})
        if key in seen:
            errors.append(FieldError("duplicate", f"status.devices[{i}]", key))
        seen.add(key)
    return errors
