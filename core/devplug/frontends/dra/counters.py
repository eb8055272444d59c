"""Parts of a parent device as counter sets and ``consumesCounters`` (KEP-4815, ``DRAPartitionableDevices``).

A device the driver declares a part of a bigger one (:class:`~devplug.types.Partition`: an FPGA card's regions, a
PF's VFs) shares the parent's counters with its other parts. Where the API server keeps the fields
(:mod:`~devplug.frontends.dra.apiversions` finds out by a dry run), each distinct parent is a *counter set* of the
pool and each part names what it consumes of it:

.. code-block:: json

    {"sharedCounters": [{"name": "card0", "counters": {"regions": {"value": "4"}}}]}
    {"devices": [{"name": "card0-port0", "consumesCounters": [{"counterSet": "card0",
                  "counters": {"regions": {"value": "1"}}}], "attributes": {}}]}

The scheduler's allocator then never allocates parts whose consumption together exceeds a counter (it sums the
``consumesCounters`` of every allocated device of the pool against the set's counters: ``staging/src/k8s.io/
dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go``).

Rules followed (``pkg/apis/resource/validation/validation.go``): a counter set's name and its counters' names are DNS
labels (``validateCounterSet``, ``validateCounterName``); a set has 1 to 32 counters
(``ResourceSliceMaxCountersPerCounterSet``); a slice holds at most 8 counter sets
(``ResourceSliceMaxCounterSets``) and, from 1.35, either ``sharedCounters`` or ``devices``, never both
(``validateResourceSliceSpec``: "only one of `sharedCounters` or `devices` is allowed"), so counter sets go in slices
of their own in the same pool; a device has at most 2 consumptions
(``ResourceSliceMaxDeviceCounterConsumptionsPerDevice``; devplug gives one, its parent's), each with 1 to 32
counters; a slice with a device that consumes counters holds at most 64 devices
(``ResourceSliceMaxDevicesWithTaintsOrConsumesCounters``, ``haveConsumesCounters``).

A counter set is named after its parent's ID as a device is (:func:`~devplug.frontends.dra.devicenames.device_name`:
the ID itself when it is a DNS label, else a stem and a hash): stable across nodes and restarts, and two parents that
would share a name are refused naming both. All parts of one parent must give the same counters; two that differ are
refused naming both devices (the counters are the parent's, not the part's).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from devplug.frontends.dra.capacity import quantity_text
from devplug.frontends.dra.devicenames import DeviceNameCollisionError, DeviceNameMap
from devplug.types import Device

__all__ = ["MAX_COUNTER_SETS", "CounterSet", "CounterSetError", "consumes_entry", "counter_sets"]

#: ``ResourceSliceMaxCounterSets``: counter sets per slice.
MAX_COUNTER_SETS = 8


class CounterSetError(ValueError):
    """Parts of one parent disagree on its counters, or two parents' counter sets would share a name."""


@dataclass(frozen=True)
class CounterSet:
    """One parent's counter set as published: its name, the parent's ID, its counters and the device that gave
    them first (named when another part disagrees)."""

    name: str
    parent: str
    counters: Mapping[str, int]
    given_by: str

    def entry(self) -> dict[str, Any]:
        """The set as an entry of ``spec.sharedCounters``."""
        return {
            "name": self.name,
            "counters": {k: {"value": quantity_text(v)} for k, v in sorted(self.counters.items())},
        }


def counter_sets(devices: Iterable[Device]) -> dict[str, CounterSet]:
    """The counter set of every distinct parent of ``devices`` (by parent ID). Raises :class:`CounterSetError`
    naming both devices when two parts of one parent give different counters, and both parents when their sets
    would share a name."""
    found: dict[str, CounterSet] = {}
    for dev in devices:
        part = dev.partition
        if part is None:
            continue
        known = found.get(part.parent)
        if known is None:
            found[part.parent] = CounterSet("", part.parent, dict(part.counters), dev.id)
        elif dict(known.counters) != dict(part.counters):
            raise CounterSetError(
                f"devices {known.given_by!r} and {dev.id!r} are parts of {part.parent!r} but give it different "
                f"counters ({dict(known.counters)} and {dict(part.counters)}): the counters are the parent's, the "
                "same in every part"
            )
    try:
        names = DeviceNameMap(found)
    except DeviceNameCollisionError as exc:
        raise CounterSetError(f"counter sets: {exc}".replace("device IDs", "parent IDs")) from exc
    return {p: CounterSet(names[p], p, s.counters, s.given_by) for p, s in found.items()}


def consumes_entry(dev: Device, sets: Mapping[str, CounterSet]) -> list[dict[str, Any]] | None:
    """A part's ``consumesCounters`` (its parent's set and what it takes of it), or ``None`` when ``dev`` is no part
    or consumes nothing."""
    part = dev.partition
    if part is None or not part.consumes:
        return None
    counters = {k: {"value": quantity_text(v)} for k, v in sorted(part.consumes.items())}
    return [{"counterSet": sets[part.parent].name, "counters": counters}]
