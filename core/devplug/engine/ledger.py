"""The allocation ledger: which devices this daemon handed out, and which still need releasing.

One ledger per resource, kept on disk at ``<state dir>/resources/<socket
name>/ledger.json`` and rewritten atomically on every change, so that a daemon
killed at any point finds after restart every device either still used by a pod
or still owed its release.

A :class:`AllocationRecord` is one allocation: the devices of one container,
plus the devices of later containers of the same pod that reused some of them
(the kubelet hands the devices of finished init containers to app containers
without any release in between, so those form one allocation and are
released once). ``pending`` devices are being prepared by an Allocate that has
not answered yet; after a crash they are released, since the kubelet never got
the answer.
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devplug.errors import StateError
from devplug.types import ContainerAllocation

__all__ = ["FORMAT_VERSION", "AllocationRecord", "Ledger"]

FORMAT_VERSION = 1
log = logging.getLogger("devplug.engine")
_ids = itertools.count(1)


@dataclass
class AllocationRecord:
    """One allocation and where it is in its life."""

    id: str
    devices: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    created: float = 0.0
    pod: str | None = None
    seen_at: float | None = None
    releasing: bool = False
    post_stop_done: bool = False
    post_stopped: list[str] = field(default_factory=list)
    kep_at: float | None = None
    prepared: dict[str, Any] = field(default_factory=dict)

    def mark_post_stopped(self, device_ids: Iterable[str]) -> None:
        """These devices had their post-stop; ``post_stop_done`` once every device did."""
        self.post_stopped.extend(d for d in device_ids if d not in self.post_stopped)
        self.post_stop_done = all(d in self.post_stopped for d in self.devices)

    def all_devices(self) -> list[str]:
        return [*self.devices, *(d for d in self.pending if d not in self.devices)]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "devices": self.devices,
            "pending": self.pending,
            "created": self.created,
            "pod": self.pod,
            "seen_at": self.seen_at,
            "releasing": self.releasing,
            "post_stop_done": self.post_stop_done,
            "post_stopped": self.post_stopped,
            "kep_at": self.kep_at,
            "prepared": self.prepared,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AllocationRecord:
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}")
        record = cls(**data)
        if not isinstance(record.id, str) or not all(isinstance(d, str) for d in record.all_devices()):
            raise ValueError(f"malformed allocation record {data!r}")
        return record


@dataclass(frozen=True)
class LedgerSnapshot:
    """The ledger as it was before an Allocate began (see :meth:`Ledger.snapshot`)."""

    record_ids: frozenset[str]
    touched: dict[str, AllocationRecord]


def new_record_id() -> str:
    return f"{int(time.time() * 1000):x}-{os.getpid():x}-{next(_ids)}"


def prepared_summary(allocation: ContainerAllocation) -> dict[str, Any]:
    """What the driver prepared for a container, as kept in the ledger (for status and post-mortems)."""
    return {
        "envs": dict(allocation.envs),
        "mounts": [m.container_path for m in allocation.mounts],
        "devices": [d.container_path for d in allocation.devices],
        "annotations": dict(allocation.annotations),
        "cdi_devices": [c.name for c in allocation.cdi_devices],
    }


class Ledger:
    """The allocation records of one resource, in memory; :meth:`serialize` gives the file's bytes."""

    def __init__(self, resource_name: str, path: Path) -> None:
        self.resource_name = resource_name
        self.path = path
        self.records: dict[str, AllocationRecord] = {}
        self.recovered_from_corruption: Path | None = None

    # --- persistence

    def load(self) -> None:
        """Read the ledger file if there is one.

        A corrupt or unreadable file is moved aside (``ledger.json.corrupt-<time>``)
        with an error log line, and the ledger starts empty, flagged so the
        reconciler rebuilds it from PodResources.
        """
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StateError(f"{self.path}: cannot read the allocation ledger: {exc}") from exc
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION:
                raise ValueError(f"unsupported format {data.get('format') if isinstance(data, dict) else data!r}")
            if data.get("resource") != self.resource_name:
                raise ValueError(f"it belongs to resource {data.get('resource')!r}")
            records = [AllocationRecord.from_json(r) for r in data["allocations"]]
        except (ValueError, KeyError, TypeError) as exc:
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            os.replace(self.path, aside)
            self.recovered_from_corruption = aside
            log.error(
                "[%s] allocation ledger %s is corrupt (%s); moved it to %s and rebuilding from PodResources",
                self.resource_name,
                self.path,
                exc,
                aside,
            )
            return
        self.records = {r.id: r for r in records}

    def serialize(self) -> bytes:
        data = {
            "format": FORMAT_VERSION,
            "resource": self.resource_name,
            "allocations": [r.to_json() for r in self.records.values()],
        }
        # Compact: written twice per Allocate, so the C encoder (no indent, no key sorting) matters.
        return (json.dumps(data, separators=(",", ":")) + "\n").encode()

    # --- queries

    def __iter__(self) -> Iterator[AllocationRecord]:
        return iter(list(self.records.values()))

    def holders(self, device_id: str) -> list[AllocationRecord]:
        return [r for r in self.records.values() if device_id in r.devices or device_id in r.pending]

    def held_devices(self) -> set[str]:
        return {d for r in self.records.values() for d in r.all_devices()}

    def releasing_devices(self) -> set[str]:
        return {d for r in self.records.values() if r.releasing for d in r.all_devices()}

    def snapshot(self, device_ids: Iterable[str]) -> LedgerSnapshot:
        """What :meth:`begin` for ``device_ids`` may change, to :meth:`restore` it: copies of the
        records holding those devices, and which records exist."""
        ids = set(device_ids)
        touched = {r.id: copy.deepcopy(r) for r in self.records.values() if ids.intersection(r.all_devices())}
        return LedgerSnapshot(frozenset(self.records), touched)

    def restore(self, snapshot: LedgerSnapshot, created: Iterable[str]) -> None:
        """Undo :meth:`begin`: drop the records it ``created``, put back the ones it changed.

        Records of other Allocates in flight meanwhile are left alone.
        """
        for record_id in created:
            if record_id not in snapshot.record_ids:
                self.records.pop(record_id, None)
        self.records.update(snapshot.touched)

    # --- changes

    def begin(self, device_ids: Iterable[str], now: float) -> AllocationRecord:
        """Record that ``device_ids`` are being allocated to one container.

        Devices already held by a live allocation are reused (same pod): that
        allocation absorbs the new devices. Returns the record that holds them.
        """
        ids = list(dict.fromkeys(device_ids))
        overlapping = [r for r in self.records.values() if not r.releasing and set(ids) & set(r.all_devices())]
        if overlapping:
            target = overlapping[0]
            for other in overlapping[1:]:  # one pod's allocations joined by a container using both
                target.devices.extend(d for d in other.devices if d not in target.devices)
                target.pending.extend(d for d in other.pending if d not in target.pending)
                del self.records[other.id]
        else:
            target = AllocationRecord(id=new_record_id(), created=now)
            self.records[target.id] = target
        held = set(target.all_devices())
        target.pending.extend(d for d in ids if d not in held)
        return target

    def confirm(self, record: AllocationRecord, allocation: ContainerAllocation) -> None:
        """The Allocate for ``record``'s pending devices succeeded."""
        record.devices.extend(d for d in record.pending if d not in record.devices)
        record.pending.clear()
        record.prepared = prepared_summary(allocation)

    def remove(self, record: AllocationRecord) -> None:
        self.records.pop(record.id, None)

    def drop_devices(self, device_ids: Iterable[str]) -> list[AllocationRecord]:
        """Forget ``device_ids`` (released through the KEP's Deallocate); returns the records emptied."""
        ids = set(device_ids)
        emptied = []
        for record in list(self.records.values()):
            record.devices = [d for d in record.devices if d not in ids]
            record.pending = [d for d in record.pending if d not in ids]
            if not record.devices and not record.pending:
                del self.records[record.id]
                emptied.append(record)
        return emptied
