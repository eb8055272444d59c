"""Consumable capacity (KEP-5075) as kube-scheduler's structured allocator computes it: what one allocation of a
device consumes of each of its capacities, and whether that fits.

Follows ``k8s.io/dynamic-resource-allocation/structured/internal/incubating/consumable_capacity.go`` of Kubernetes
1.36 (the variant the scheduler runs while ``DRAConsumableCapacity`` is beta):

* ``CmpRequestOverCapacity`` (:func:`fits`): a device whose capacities do not have every key the request names is
  skipped (``requestsContainNonExistCapacity``: the request's keys are looked up *as they are* in the device's
  ``capacity`` map: a device publishing ``shares`` matches a request for ``shares``, not for
  ``<driver>/shares``; the domain-resolving lookup, ``resolveCapacityName``, is in the tree after 1.37);
  then for **every** capacity of the device (not only the requested ones) the consumed amount
  (:func:`consumed`) must satisfy the policy (:func:`violates_policy`) and, added to what allocated claims
  (``AggregatedCapacity``) and this allocation run have consumed, stay within the capacity's ``value``;
* ``calculateConsumedCapacity`` (:func:`consumed`): no amount requested: the policy's ``default``, else the whole
  ``value`` (``fillEmptyRequest``); no policy: the amount requested; ``validRange`` with ``min``: below ``min``
  becomes ``min``, otherwise rounded up to ``min + n * step`` (``roundUpRange``, on ``Value()``s: integers,
  fractions rounded up; ``DRAFractionalCapacityRange``'s milli arithmetic is 1.37's); ``validValues``: the first
  value at least the amount, or the amount itself when none is (``roundUpValidValues``);
* ``violatesPolicy`` (:func:`violates_policy`): the default never violates; above ``validRange.max``, or off the
  ``step`` grid from ``min``, or (``validValues``) not one of the values, violates;
* ``GetConsumedCapacityFromRequest`` (:func:`consumed_capacity`): the result's ``consumedCapacity``, one entry per
  capacity of the device, keyed as the device publishes it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from devplug.testing.apiserver.quantity import Quantity, QuantityError, parse

__all__ = ["consumed", "consumed_capacity", "fits", "violates_policy"]


def _value(q: Quantity) -> int:
    """``Quantity.Value()``: the value rounded up to an integer."""
    return math.ceil(q.value)


def _q(value: Any) -> Quantity | None:
    try:
        return parse(value) if value is not None else None
    except QuantityError:
        return None


def consumed(requested: Quantity | None, capacity: Mapping[str, Any]) -> Quantity:
    """``calculateConsumedCapacity``: what one allocation consumes of ``capacity`` (a device's ``{value,
    requestPolicy}``) when ``requested`` (None: not named by the request) is asked for."""
    policy = capacity.get("requestPolicy")
    value = _q(capacity.get("value")) or Quantity(Fraction(0))
    if requested is None:
        default = _q(policy.get("default")) if isinstance(policy, Mapping) else None
        return default if default is not None else value
    if not isinstance(policy, Mapping):
        return requested
    valid_range = policy.get("validRange")
    minimum = _q(valid_range.get("min")) if isinstance(valid_range, Mapping) else None
    if isinstance(valid_range, Mapping) and minimum is not None:
        if requested.value < minimum.value:
            return minimum
        step = _q(valid_range.get("step"))
        if step is None:
            return requested
        added = _value(requested) - _value(minimum)
        n = -(-added // _value(step))
        return Quantity(Fraction(_value(minimum) + _value(step) * n), step.format)
    values = policy.get("validValues")
    if values is not None:
        for text in values:
            valid = _q(text)
            if valid is not None and requested.value <= valid.value:
                return valid
    return requested


def violates_policy(amount: Quantity, policy: Any) -> bool:
    """``violatesPolicy``: whether consuming ``amount`` breaks the capacity's ``requestPolicy``."""
    if not isinstance(policy, Mapping):
        return False
    default = _q(policy.get("default"))
    if default is not None and default.value == amount.value:
        return False
    valid_range = policy.get("validRange")
    if isinstance(valid_range, Mapping):
        maximum, step, minimum = (_q(valid_range.get(k)) for k in ("max", "step", "min"))
        if maximum is not None and amount.value > maximum.value:
            return True
        if step is None or not _value(step):
            return False
        return (_value(amount) - _value(minimum or Quantity(Fraction(0)))) % _value(step) != 0
    values = policy.get("validValues") or []
    if values:
        return all((_q(v) or Quantity(Fraction(-1))).value != amount.value for v in values)
    return False


def _requests(requests: Mapping[str, Any] | None) -> dict[str, Quantity]:
    return {str(k): q for k, v in (requests or {}).items() if (q := _q(v)) is not None}


def fits(
    allocated: Mapping[str, Fraction],
    requests: Mapping[str, Any] | None,
    capacity: Mapping[str, Any],
    allocating: Mapping[str, Fraction],
) -> bool:
    """``CmpRequestOverCapacity``: whether one more allocation asking ``requests`` (a request's
    ``capacity.requests``) fits a device of ``capacity``, beside ``allocated`` (other claims' consumption) and
    ``allocating`` (this run's)."""
    wanted = _requests(requests)
    if any(name not in capacity for name in wanted):
        return False
    for name, cap in capacity.items():
        if not isinstance(cap, Mapping):
            continue
        amount = consumed(wanted.get(name), cap)
        if violates_policy(amount, cap.get("requestPolicy")):
            return False
        total = allocated.get(name, Fraction(0)) + amount.value + allocating.get(name, Fraction(0))
        limit = _q(cap.get("value"))
        if limit is None or total > limit.value:
            return False
    return True


def consumed_capacity(requests: Mapping[str, Any] | None, capacity: Mapping[str, Any]) -> dict[str, Quantity]:
    """``GetConsumedCapacityFromRequest``: what the allocation consumes of each of the device's capacities."""
    wanted = _requests(requests)
    return {name: consumed(wanted.get(name), cap) for name, cap in capacity.items() if isinstance(cap, Mapping)}
