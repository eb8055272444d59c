"""The ResourceSlice validation of issue 41's fields: counter sets, counter consumption, per-device node selection
and the request policies of consumable capacity.

Each rule follows ``pkg/apis/resource/validation/validation.go`` of Kubernetes 1.36 (the function named in its
docstring) and the limits of ``k8s.io/api/resource/v1/types.go``: ``ResourceSliceMaxCounterSets`` = 8,
``ResourceSliceMaxCountersPerCounterSet`` = 32, ``ResourceSliceMaxDeviceCounterConsumptionsPerDevice`` = 2,
``ResourceSliceMaxCountersPerDeviceCounterConsumption`` = 32, ``CapacityRequestPolicyDiscreteMaxOptions`` = 10.
Called by :func:`devplug.testing.apiserver.validation.resource_slice` on every create and update; each returns the
field errors of its part, with the field paths the real server gives.

What only the scheduler checks (a counter set a device names must exist in its pool, counter set names unique in
the pool: ``pools_incubating.go``) is not refused here, as the real server does not refuse it either.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from devplug.testing.apiserver.errors import FieldError
from devplug.testing.apiserver.quantity import Quantity, QuantityError, parse

__all__ = ["counter_sets", "device_extras"]

MAX_COUNTER_SETS = 8
MAX_COUNTERS_PER_SET = 32
MAX_CONSUMPTIONS_PER_DEVICE = 2
MAX_COUNTERS_PER_CONSUMPTION = 32
MAX_VALID_VALUES = 10
_INT64_MAX = 2**63 - 1


def _dns_label(value: Any, field: str) -> list[FieldError]:
    from devplug.testing.apiserver.validation import dns_label  # validation imports this module

    return dns_label(value, field)


def _counter_map(counters: Any, field: str, limit: int) -> list[FieldError]:
    """``validateMap(..., validateCounterName, validateDeviceCounter, ...)``: at most ``limit`` counters (the size
    check short-circuits), each name a DNS label (reported on the map's path), any parsed quantity."""
    if not counters:
        return [FieldError("required", field)]
    if not isinstance(counters, Mapping):
        return [FieldError("invalid", field, counters, "must be an object")]
    if len(counters) > limit:
        return [FieldError("too_many", field, len(counters), f"must have at most {limit} items")]
    errors: list[FieldError] = []
    for name in sorted(counters):
        errors += _dns_label(name, field)
    return errors


def _validate_set(value: Any, path: str, limit: int, key: str, counters_limit: int) -> list[FieldError]:
    """``validateSet`` of ``validation.go`` for a list of counter entries: at most ``limit`` items (short-circuits),
    each's ``key`` a DNS label and its ``counters`` 1 to ``counters_limit`` of them, keys unique."""
    items = list(value) if isinstance(value, list) else []
    if len(items) > limit:
        return [FieldError("too_many", path, len(items), f"must have at most {limit} items")]
    errors: list[FieldError] = []
    for i, item in enumerate(items):
        entry = item if isinstance(item, Mapping) else {}
        errors += _dns_label(entry.get(key), f"{path}[{i}].{key}")
        errors += _counter_map(entry.get("counters"), f"{path}[{i}].counters", counters_limit)
    seen: set[Any] = set()
    for i, item in enumerate(items):
        name = item.get(key) if isinstance(item, Mapping) else None
        if name in seen:
            errors.append(FieldError("duplicate", f"{path}[{i}]", name))
        seen.add(name)
    return errors


def counter_sets(sets: Any) -> list[FieldError]:
    """``validateSet(spec.SharedCounters, ResourceSliceMaxCounterSets, validateCounterSet, ...)``: at most 8 sets
    (short-circuits), each named by a DNS label with 1 to 32 counters, names unique in the slice."""
    if sets is None:
        return []
    return _validate_set(sets, "spec.sharedCounters", MAX_COUNTER_SETS, "name", MAX_COUNTERS_PER_SET)


def _consumes(consumptions: Any, path: str) -> list[FieldError]:
    """``validateSet(device.ConsumesCounters, 2, validateDeviceCounterConsumption, ...)``."""
    return _validate_set(consumptions, path, MAX_CONSUMPTIONS_PER_DEVICE, "counterSet", MAX_COUNTERS_PER_CONSUMPTION)


_PER_DEVICE = (
    "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when `perDeviceNodeSelection` is set to "
    "true in the ResourceSlice spec"
)


def _node_selection(device: Mapping[str, Any], path: str, per_device: bool) -> list[FieldError]:
    """``validateDevice``'s per-device node selection rules."""
    errors: list[FieldError] = []
    if not per_device:
        if any(device.get(k) is not None for k in ("nodeName", "nodeSelector", "allNodes")):
            errors.append(
                FieldError(
                    "invalid",
                    path,
                    None,
                    "`nodeName`, `nodeSelector` and `allNodes` can only be set if `perDeviceNodeSelection` is set "
                    "to true in the ResourceSlice spec",
                )
            )
        return errors
    chosen = []
    if device.get("nodeName") is not None:
        if device["nodeName"]:
            chosen.append("`nodeName`")
        else:
            errors.append(FieldError("invalid", f"{path}.nodeName", "", "must not be empty"))
    if device.get("nodeSelector") is not None:
        chosen.append("`nodeSelector`")
    if device.get("allNodes") is not None:
        if device["allNodes"] is True:
            chosen.append("`allNodes`")
        else:
            errors.append(
                FieldError("invalid", f"{path}.allNodes", device["allNodes"], "must be either unset or set to true")
            )
    if not chosen:
        errors.append(FieldError("required", path, detail=_PER_DEVICE))
    elif len(chosen) > 1:
        errors.append(FieldError("invalid", path, "{" + ", ".join(chosen) + "}", _PER_DEVICE))
    return errors


def _q(value: Any) -> Quantity | None:
    try:
        return parse(value)
    except QuantityError:
        return None


def _text(q: Quantity) -> str:
    return q.text()


def _int64(q: Quantity, field: str) -> list[FieldError]:
    """``validateInt64Range``: within [0, MaxInt64], where ``Value()`` can be reasoned with."""
    if q.value < 0:
        return [FieldError("invalid", field, _text(q), "must be greater than or equal to 0")]
    if q.value > _INT64_MAX:
        return [FieldError("invalid", field, _text(q), "must not be larger than 9223372036854775807")]
    return []


def _valid_values(default: Quantity, capacity: Quantity, values: list[Any], path: str) -> list[FieldError]:
    """``validateRequestPolicyValidValues``: sorted, at most 10, none above the capacity, unique (by ``Value()``),
    the default one of them."""
    errors: list[FieldError] = []
    parsed = [_q(v) for v in values]
    for i in range(len(parsed) - 1):
        a, b = parsed[i], parsed[i + 1]
        if a is not None and b is not None and a.value > b.value:
            errors.append(
                FieldError("invalid", f"{path}[{i + 1}]", _text(b), "values must be sorted in ascending order")
            )
    if len(parsed) > MAX_VALID_VALUES:
        errors.append(FieldError("too_many", path, len(parsed), f"must have at most {MAX_VALID_VALUES} items"))
        found = False
    else:
        found = False
        keys: set[int] = set()
        for i, option in enumerate(parsed):
            if option is None:
                continue
            if option.value > capacity.value:
                errors.append(
                    FieldError(
                        "invalid",
                        f"{path}[{i}]",
                        _text(option),
                        f"option is larger than capacity value: {_text(capacity)}",
                    )
                )
            if option.value == default.value:
                found = True
        for i, option in enumerate(parsed):
            if option is None:
                continue
            key = math.ceil(option.value)
            if key in keys:
                errors.append(FieldError("duplicate", f"{path}[{i}]", str(key)))
            keys.add(key)
    if not found:
        errors.append(
            FieldError("invalid", path, _text(default), "default value is not valid according to the requestPolicy")
        )
    return errors


def _step_check(value: Quantity, minimum: Quantity, step: Quantity, path: str) -> list[FieldError]:
    """``validateRequestPolicyRangeStep`` on ``Value()``s."""
    if (math.ceil(value.value) - math.ceil(minimum.value)) % math.ceil(step.value):
        return [
            FieldError(
                "invalid",
                path,
                _text(value),
                f"value is not a multiple of a given step ({_text(step)}) from ({_text(minimum)})",
            )
        ]
    return []


def _valid_range(default: Quantity, capacity: Quantity, valid_range: Mapping[str, Any], path: str) -> list[FieldError]:
    """``validateRequestPolicyRange`` (the default's errors are reported under ``validRange.default``, as the real
    server does)."""
    minimum = _q(valid_range.get("min")) if valid_range.get("min") is not None else None
    if minimum is None:
        return [FieldError("required", f"{path}.min", detail="required when validRange is defined")]
    errors: list[FieldError] = []
    if minimum.value > capacity.value:
        errors.append(
            FieldError(
                "invalid", f"{path}.min", _text(minimum), f"min is larger than capacity value: {_text(capacity)}"
            )
        )
    if default.value < minimum.value:
        errors.append(
            FieldError("invalid", f"{path}.default", _text(default), f"default is less than min: {_text(minimum)}")
        )
    maximum = _q(valid_range["max"]) if valid_range.get("max") is not None else None
    if maximum is not None:
        if minimum.value > maximum.value:
            errors.append(
                FieldError("invalid", f"{path}.max", _text(minimum), f"min is larger than max: {_text(maximum)}")
            )
        if maximum.value > capacity.value:
            errors.append(
                FieldError(
                    "invalid", f"{path}.max", _text(maximum), f"max is larger than capacity value: {_text(capacity)}"
                )
            )
        if default.value > maximum.value:
            errors.append(
                FieldError("invalid", f"{path}.default", _text(default), f"default is more than max: {_text(maximum)}")
            )
    step = _q(valid_range["step"]) if valid_range.get("step") is not None else None
    if step is None:
        return errors
    if step.value <= 0:
        errors.append(FieldError("invalid", f"{path}.step", _text(step), "must be greater than zero"))
        return errors
    one_step = Quantity(minimum.value + step.value, minimum.format)
    if one_step.value > capacity.value:
        errors.append(
            FieldError(
                "invalid",
                f"{path}.step",
                _text(step),
                f"one step {_text(one_step)} is larger than capacity value: {_text(capacity)}",
            )
        )
    unsafe: list[FieldError] = []
    for name, q in (("default", default), ("min", minimum), ("max", maximum), ("step", step)):
        if q is not None:
            unsafe += _int64(q, f"{path}.{name}")
    if unsafe:
        return errors + unsafe
    errors += _step_check(default, minimum, step, f"{path}.step")
    if maximum is not None:
        errors += _step_check(maximum, minimum, step, f"{path}.step")
    return errors


def _request_policy(capacity: Quantity, policy: Mapping[str, Any], path: str) -> list[FieldError]:
    """``validateRequestPolicy`` and ``validateValidRequestValues``."""
    values, valid_range = policy.get("validValues"), policy.get("validRange")
    if values and valid_range is not None:
        return [
            FieldError(
                "forbidden",
                path,
                detail="exactly one policy can be specified, "
                'cannot specify "validValues" and "validRange" at the same time',
            )
        ]
    default = _q(policy["default"]) if policy.get("default") is not None else None
    if values:
        if default is None:
            return [FieldError("required", f"{path}.default", detail="required when validValues is defined")]
        return _valid_values(default, capacity, list(values), f"{path}.validValues")
    if isinstance(valid_range, Mapping):
        if default is None:
            return [FieldError("required", f"{path}.default", detail="required when validRange is defined")]
        return _valid_range(default, capacity, valid_range, f"{path}.validRange")
    return []


def _capacity(device: Mapping[str, Any], old_device: Mapping[str, Any] | None, path: str) -> list[FieldError]:
    """``validateDevice``'s capacity rules, run only for a new or changed capacity map: with
    ``allowMultipleAllocations`` each ``requestPolicy`` is checked (``validateMultiAllocatableDeviceCapacity``),
    without it a ``requestPolicy`` is forbidden (``validateSingleAllocatableDeviceCapacity``)."""
    capacity = device.get("capacity")
    if not isinstance(capacity, Mapping) or (old_device is not None and old_device.get("capacity") == capacity):
        return []
    multiple = device.get("allowMultipleAllocations") is True
    errors: list[FieldError] = []
    for name in sorted(capacity):
        entry = capacity[name]
        policy = entry.get("requestPolicy") if isinstance(entry, Mapping) else None
        if policy is None:
            continue
        policy_path = f"{path}.capacity[{name}].requestPolicy"
        if not multiple:
            errors.append(FieldError("forbidden", policy_path, detail="allowMultipleAllocations must be true"))
            continue
        value = _q(entry.get("value"))
        if value is not None and isinstance(policy, Mapping):
            errors += _request_policy(value, policy, policy_path)
    return errors


def device_extras(
    device: Mapping[str, Any], old_device: Mapping[str, Any] | None, path: str, per_device: bool
) -> list[FieldError]:
    """``validateDevice``'s rules for issue 41's fields: capacity request policies, ``consumesCounters`` and per-device
    node selection."""
    errors = _capacity(device, old_device, path)
    if device.get("consumesCounters") is not None:
        errors += _consumes(device.get("consumesCounters"), f"{path}.consumesCounters")
    return errors + _node_selection(device, path, per_device)
