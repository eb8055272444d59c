"""What the backends share: checks of their common options."""

from __future__ import annotations

import math

__all__ = ["check_seconds"]


def check_seconds(key: str, value: float, low: float, high: float) -> None:
    """``ValueError`` naming ``key`` unless ``value`` is a finite number of seconds in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{key}: expected a finite number of seconds, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{key}: must be {low:g}-{high:g} seconds, got {value!r}")
