"""What the backends share: checks of their common options."""

from __future__ import annotations

import math
from pathlib import Path

__all__ = ["check_absolute", "check_seconds"]


def check_seconds(key: str, value: float, low: float, high: float) -> None:
    """``ValueError`` naming ``key`` unless ``value`` is a finite number of seconds in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{key}: expected a finite number of seconds, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{key}: must be {low:g}-{high:g} seconds, got {value!r}")


def check_absolute(key: str, value: Path | None) -> None:
    """``ValueError`` naming ``key`` unless ``value`` is None or an absolute path.

    Paths inside the ``coordination`` table are not resolved against the
    config file's folder (only top-level options are), so they must be absolute.
    """
    if value is not None and not Path(value).is_absolute():
        raise ValueError(f"{key}: {value} must be an absolute path")
