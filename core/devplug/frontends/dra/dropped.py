"""Gated fields an apply's answer lacks: the publisher's second line after discovery's dry run.

Discovery (:mod:`~devplug.frontends.dra.apiversions`) finds before the first write whether the API server keeps
device taints, consumable capacity and counters. A gate turned off since (an API server restarted with other flags
between two of its watch's restarts) shows in the answer to an apply: the server dropped the fields it was sent
(``dropDisabledFields`` of ``pkg/registry/resource/resourceslice/strategy.go``; a slice already holding them keeps
them, ``...FeatureInUse``, so only new content shows it). :func:`fall_back` finds which, logs each once, and tells
:class:`~devplug.frontends.dra.apiversions.DraApi`, so the pool is built again in the older form at once:
unavailable devices left out, one device per replica, parts without counters.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from devplug.frontends.dra.apiversions import DraApi
from devplug.frontends.dra.slicecontent import Pool

__all__ = ["dropped_fields", "fall_back"]

log = logging.getLogger("devplug.frontends.dra")

#: Each gated device field devplug sends: what it is, its gate, what the publisher does without it.
_FIELDS = {
    "taints": ("the device taints", "DRADeviceTaints", "unavailable devices are left out of the slices"),
    "allowMultipleAllocations": (
        "consumable capacity (allowMultipleAllocations)",
        "DRAConsumableCapacity",
        "shared devices are published one device per replica",
    ),
    "consumesCounters": (
        "the counters (consumesCounters)",
        "DRAPartitionableDevices",
        "parts are published without counters",
    ),
}


def dropped_fields(pool: Pool, applied: list[dict[str, Any]]) -> list[str]:
    """The gated device fields sent in ``pool`` and missing from the apply's answers ``applied``: ``taints``,
    ``allowMultipleAllocations`` (a capacity's ``requestPolicy`` goes with it) and ``consumesCounters``
    (``sharedCounters`` goes with it), each named once."""
    dropped = []
    for name in _FIELDS:
        sent = {d["name"] for _, spec in pool.slices for d in spec.get("devices") or () if d.get(name)}
        kept = {d["name"] for s in applied for d in s["spec"].get("devices") or () if d.get(name)}
        if sent - kept:
            dropped.append(name)
    return dropped


def fall_back(api: DraApi, pool: Pool, applied: list[dict[str, Any]], *, driver: str, node: str) -> bool:
    """Tell ``api`` of every gated field the answers dropped (logged once each); True when there was one (the pool
    must be built again)."""
    drops: dict[str, Callable[[str], None]] = {
        "taints": api.taints_dropped,
        "allowMultipleAllocations": api.consumable_capacity_dropped,
        "consumesCounters": api.partitionable_dropped,
    }
    dropped = dropped_fields(pool, applied)
    for name in dropped:
        what, gate, instead = _FIELDS[name]
        log.warning(
            "ResourceSlices of %s on node %s: the API server dropped %s (feature gate %s off): %s instead",
            driver,
            node,
            what,
            gate,
            instead,
            extra={"driver": driver},
        )
        drops[name](f"dropped from the answer to an apply (feature gate {gate} off)")
    return bool(dropped)
