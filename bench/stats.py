"""Percentiles and time conversions."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ms", "percentile", "summary_ms"]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), linear between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ms(ns: float) -> float:
    """Nanoseconds to milliseconds."""
    return ns / 1e6


def summary_ms(samples_ns: Sequence[int]) -> dict[str, float]:
    """p50 and p99 (and the count) of nanosecond samples, in milliseconds."""
    return {
        "p50": ms(percentile(samples_ns, 50)),
        "p99": ms(percentile(samples_ns, 99)),
        "n": float(len(samples_ns)),
    }
