"""The engine's side of partitions for one resource (contract 1.1, KEP-4815): which physical parts occupy hardware
now, which parts cannot be allocated now (withheld), an admission's check, a preferred allocation kept to parts
that fit, and each parent's use for the status.

:mod:`devplug.engine.partitions` does the sums (pure); this module feeds them
what is held, from the ledger (allocated, pending, being released), its
quarantined records and the devices a hook still running keeps busy (the
guard's, through ``busy``): a part still being cleaned still occupies the
hardware. Every call costs what is held and the parents a request names, not
the size of the table; a resource without partitions never calls it (the
table's ``partitions`` is None).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container, Iterable, Sequence

from devplug.engine.devicetable import DeviceTable
from devplug.engine.ledger import Ledger
from devplug.engine.partitions import ParentUsage, PartitionMap

__all__ = ["PartitionGuard"]

log = logging.getLogger("devplug.engine")


class PartitionGuard:
    """Partitions as one resource's guard sees them (:class:`~devplug.engine.guard.DeviceGuard` owns one)."""

    def __init__(
        self, resource_name: str, table: DeviceTable, ledger: Ledger, busy: Callable[[], Iterable[str]]
    ) -> None:
        self.resource_name = resource_name
        self.table = table
        self.ledger = ledger
        #: The physical devices a hook still running keeps busy (kept past its timeout, or an overdue release).
        self._busy = busy
        #: The parents whose parts disagree about their counters, as last logged.
        self._conflicts: dict[str, str] = {}
        #: What :meth:`blocked` found last, to recompute only the parents whose held parts changed: the map it was
        #: found in and the held physical parts then, each parent's blocked parts, and their advertised IDs.
        self._seen: tuple[PartitionMap | None, frozenset[str]] = (None, frozenset())
        self._blocked_by_parent: dict[str, set[str]] = {}
        self._blocked_ids: set[str] = set()

    def held(self) -> set[str]:
        """The physical devices that occupy hardware now, for the partition counters: every device an allocation
        record holds (allocated, pending, being released), a quarantined record names, or a hook still running
        keeps busy."""
        held = self.ledger.held_devices()
        held.update(self.ledger.quarantined_devices())
        phys = self.table.physical_id_set(held)
        phys.update(self._busy())
        return phys

    def check(self, requested: Sequence[str], *, settling: bool = False) -> None:
        """Refuse (:class:`~devplug.engine.partitions.PartitionOverflow` or
        :class:`~devplug.engine.partitions.PartitionBusy`, naming the parts, the parent, the counter and the
        amounts) an admission of ``requested`` whose parts, with the held ones, exceed a counter of their parent.

        Called by the admission before any hook of its own runs: up front with ``settling`` (the devices of the
        records holding requested devices do not count: the admission may release them first), then, the locks
        held and earlier tenancies settled, exactly (nothing is awaited between that check and the ledger's
        ``begin``, so two admissions of parts of one parent cannot both pass)."""
        parts = self.table.partitions
        if parts is None:
            return
        phys = self.table.physical_id_set(requested)
        settled: set[str] = set()
        if settling and self.ledger.holds_any(requested):
            devices = {d for i in requested for r in self.ledger.holders(i) for d in r.all_devices()}
            settled = self.table.physical_id_set(devices) - phys
        parts.check(phys, _HeldParts(self.table, self.ledger, self._busy(), settled), self.resource_name)

    def fitting(
        self, chosen: Sequence[str], available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        """A preferred allocation whose parts fit their parents' counters with the held ones (the kubelet asks for
        several devices at once and may take two free parts that never fit together): ``must_include``, then
        those of ``chosen`` that fit, then those of ``available`` that fit, at most ``size``; when that finds
        fewer than ``size``, the same with the devices that consume least first (a whole card chosen first leaves
        no room for a second device; two of its regions fit). Called by
        :class:`~devplug.engine.choice.DeviceChoice` when the table has partitions."""
        parts = self.table.partitions
        musts = list(dict.fromkeys(must_include))[:size]
        candidates = [i for i in dict.fromkeys([*chosen, *available]) if i not in musts]
        if parts is None:
            return [*musts, *candidates][:size]
        held = _HeldParts(self.table, self.ledger, self._busy(), set())

        def greedy(order: Iterable[str]) -> list[str]:
            result = list(musts)
            taken = self.table.physical_id_set(result)
            for dev_id in order:
                if len(result) >= size:
                    break
                phys = self.table.physical_of(dev_id)
                if parts.fits(phys, taken, held):
                    result.append(dev_id)
                    taken.add(phys)
            return result

        first = greedy(candidates)
        if len(first) >= size:
            return first

        def consumption(dev_id: str) -> int:
            part = parts.part(self.table.physical_of(dev_id))
            return 0 if part is None else sum(part.consumes.values())

        second = greedy(sorted(candidates, key=consumption))
        return second if len(second) > len(first) else first

    def usage(self) -> list[ParentUsage]:
        """Every parent now (see :meth:`PartitionMap.usage`; empty without partitions), with the blocked parts the
        last :meth:`blocked` (the guard's ``sync_withheld``) found when nothing was held or released since."""
        parts = self.table.partitions
        if parts is None:
            return []
        held = frozenset(self.held())
        seen_map, seen_held = self._seen
        return parts.usage(held, self._blocked_by_parent if seen_map is parts and seen_held == held else None)

    def _log_conflicts(self, parts: PartitionMap) -> None:
        """Log each parent whose parts newly disagree about its counters (a driver error, named once)."""
        for parent, why in parts.conflicts.items():
            if self._conflicts.get(parent) != why:
                log.error("[%s] driver error: %s", self.resource_name, why)
        self._conflicts = dict(parts.conflicts)

    def blocked(self, parts: PartitionMap) -> set[str]:
        """The advertised IDs of the parts that cannot be allocated now (every replica of each).

        Called by the guard's ``sync_withheld``, after every allocation and release: only the parents whose held
        parts changed since the last call are summed again (set differences in C, then a pass over those parents'
        parts), unless the parts changed.
        """
        held = frozenset(self.held())
        seen_map, seen_held = self._seen
        if seen_map is not parts:  # the parts changed (or the first call): every parent again
            self._log_conflicts(parts)
            self._blocked_by_parent = {}
            self._blocked_ids = set()
            touched = parts.parents_of(held) | set(parts.conflicts)
        else:
            touched = parts.parents_of(held.symmetric_difference(seen_held))
        self._seen = (parts, held)
        replicas = self.table.replica_ids
        for parent in touched:
            before = self._blocked_by_parent.pop(parent, set())
            blocked = parts.blocked_in(parent, held)
            if blocked:
                self._blocked_by_parent[parent] = blocked
            if blocked != before:  # the replicas of the parts no longer blocked, then those newly blocked
                self._blocked_ids.difference_update(r for phys in before - blocked for r in replicas(phys))
                self._blocked_ids.update(r for phys in blocked - before for r in replicas(phys))
        return self._blocked_ids


class _HeldParts(Container[str]):
    """Whether a physical device is held (:meth:`PartitionGuard.held`), asked per part of the parents a request
    names: lookups in the ledger's index instead of a set of every held device on each Allocate."""

    __slots__ = ("_busy", "_ledger", "_quarantined", "_settled", "_table")

    def __init__(self, table: DeviceTable, ledger: Ledger, busy: Iterable[str], settled: set[str]) -> None:
        self._table = table
        self._ledger = ledger
        self._settled = settled
        self._quarantined = ledger.quarantined_devices()
        self._busy = set(busy)

    def __contains__(self, physical_id: object) -> bool:
        if not isinstance(physical_id, str) or physical_id in self._settled:
            return False
        if physical_id in self._busy:
            return True
        holds, quarantined = self._ledger.holds, self._quarantined
        return any(holds(i) or i in quarantined for i in self._table.all_replica_ids(physical_id))
