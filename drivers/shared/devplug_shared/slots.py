"""Slots: the device IDs a shared device is advertised under, and what the store says about them.

A shared device named ``cam-a`` with ``capacity = 2`` is advertised as the two
device IDs ``cam-a-0`` and ``cam-a-1`` on every node that discovers it, so the
IDs are identical cluster-wide and a claim on ``cam-a-1`` in the coordination
store means the same slot to every node.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from devplug import DriverError

__all__ = [
    "Claim",
    "SlotTakenError",
    "StoreUnavailableError",
    "check_device_name",
    "device_of",
    "slot_ids",
]

#: What a device name may be: it becomes part of device IDs, etcd keys and Lease names.
_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")


def check_device_name(name: str, where: str) -> str:
    """Return ``name`` if it may name a shared device (lowercase letters, digits, ``-``, ``.``; at most 63)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"{where}: device name {name!r} must be 1-63 lowercase letters, digits, '-' or '.', "
            "starting and ending with a letter or digit (it becomes the slot IDs <name>-<slot>)"
        )
    return name


def slot_ids(device: str, capacity: int) -> list[str]:
    """The slot IDs of ``device``: ``<device>-0`` .. ``<device>-<capacity-1>``."""
    return [f"{device}-{slot}" for slot in range(capacity)]


def device_of(slot_id: str) -> str:
    """The device a slot ID belongs to (``cam-a-1`` -> ``cam-a``)."""
    device, _, _ = slot_id.rpartition("-")
    return device


@dataclass(frozen=True)
class Claim:
    """One slot's claim in the coordination store: who holds it and since when (wall-clock seconds).

    ``renewed`` is when the holder last proved it is alive (its lease's last
    renewal, where the store tells; else ``since``). ``kept`` says why a claim
    whose holder's daemon stopped renewing it still stands (its node is alive and
    a pod there may use the slot, or the backend's hold has not run out); None
    for a claim its holder keeps renewing.
    """

    slot: str
    holder: str
    since: float
    renewed: float | None = None
    kept: str | None = None

    def age(self, now: float | None = None) -> float:
        """Seconds since the claim was made."""
        return max(0.0, (time.time() if now is None else now) - self.since)


class SlotTakenError(DriverError):
    """A slot asked for is held by another node; nothing of the request was claimed.

    Built with :meth:`of`; the plain ``(message)`` constructor stays, so the
    engine can rebuild it like any :class:`devplug.DriverError`.
    """

    claim: Claim | None = None

    @classmethod
    def of(cls, resource: str, claim: Claim) -> SlotTakenError:
        """The error for ``claim``, naming the slot, the resource and the holder."""
        kept = f"; {claim.kept}" if claim.kept else ""
        error = cls(
            f"shared: slot {claim.slot} of {resource} is held by node {claim.holder} "
            f"(claimed {claim.age():.1f} s ago{kept}); nothing of this request was claimed"
        )
        error.claim = claim
        return error


class StoreUnavailableError(DriverError):
    """The coordination store could not be reached or answered with an error (built with :meth:`of`)."""

    @classmethod
    def of(cls, store: str, action: str, slots: Iterable[str], cause: object) -> StoreUnavailableError:
        """The error for ``action`` on ``slots``, naming the store and the cause."""
        listed = ", ".join(sorted(slots)) or "no slot"
        return cls(f"shared: cannot {action} ({listed}): the coordination store {store} is unreachable: {cause}")


def sorted_slots(slots: Iterable[str]) -> Sequence[str]:
    """Slots in a stable order (device, then slot number), for deterministic store requests."""

    def key(slot: str) -> tuple[str, int]:
        device, _, number = slot.rpartition("-")
        return device, int(number) if number.isdigit() else -1

    return sorted(set(slots), key=key)
