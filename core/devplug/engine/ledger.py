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

import asyncio
import copy
import itertools
import json
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devplug.atomic import write_atomic
from devplug.errors import StateError
from devplug.types import ContainerAllocation

__all__ = ["FORMAT_VERSION", "AllocationRecord", "Ledger", "QuarantinedRecord"]

FORMAT_VERSION = 1
log = logging.getLogger("devplug.engine")
_ids = itertools.count(1)


@dataclass
class AllocationRecord:
    """One allocation (one tenancy of its devices) and where it is in its life.

    ``post_stop_begun`` and ``deallocate_begun`` are written before the driver's
    hook is called, ``post_stopped`` and the record's removal after it returned:
    a daemon killed in between calls the hook again after its restart, with
    ``retry=True`` (the hooks' contract is at-least-once, the retry flagged).
    """

    id: str
    devices: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    created: float = 0.0
    pod: str | None = None
    pod_uid: str | None = None
    seen_at: float | None = None
    allocated_at: float | None = None
    releasing: bool = False
    post_stop_done: bool = False
    post_stopped: list[str] = field(default_factory=list)
    post_stop_begun: list[str] = field(default_factory=list)
    deallocate_begun: bool = False
    kep_at: float | None = None
    adopted: str | None = None
    prepared: dict[str, Any] = field(default_factory=dict)

    def mark_post_stopped(self, device_ids: Iterable[str]) -> None:
        """These devices had their post-stop; ``post_stop_done`` once every device did."""
        self.post_stopped.extend(d for d in device_ids if d not in self.post_stopped)
        self.post_stop_done = all(d in self.post_stopped for d in self.devices)

    def all_devices(self) -> list[str]:
        return [*self.devices, *(d for d in self.pending if d not in self.devices)]

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FIELD_CHECKS}

    @classmethod
    def from_json(cls, data: object) -> AllocationRecord:
        """A record from its JSON form, every field checked; :class:`ValueError` naming the bad field."""
        if not isinstance(data, dict):
            raise ValueError(f"an allocation record must be an object, not {type(data).__name__}")
        unknown = sorted(set(data) - set(_FIELD_CHECKS))
        if unknown:
            raise ValueError(f"unknown fields {unknown}")
        if "id" not in data:
            raise ValueError("no 'id'")
        for name, value in data.items():
            check = _FIELD_CHECKS[name]
            if not check(value):
                raise ValueError(f"field {name!r} has a bad value {_short(value)}")
        return cls(**data)


def _is_str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_time(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _optional(check: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: value is None or check(value)


def _is_id(value: object) -> bool:
    return isinstance(value, str) and bool(value)


#: Every field of a record and the check its JSON value must pass (also the order of the file's keys).
_FIELD_CHECKS: dict[str, Callable[[object], bool]] = {
    "id": _is_id,
    "devices": _is_str_list,
    "pending": _is_str_list,
    "created": _is_time,
    "pod": _optional(lambda v: isinstance(v, str)),
    "pod_uid": _optional(lambda v: isinstance(v, str)),
    "seen_at": _optional(_is_time),
    "allocated_at": _optional(_is_time),
    "releasing": lambda v: isinstance(v, bool),
    "post_stop_done": lambda v: isinstance(v, bool),
    "post_stopped": _is_str_list,
    "post_stop_begun": _is_str_list,
    "deallocate_begun": lambda v: isinstance(v, bool),
    "kep_at": _optional(_is_time),
    "adopted": _optional(lambda v: isinstance(v, str)),
    "prepared": lambda v: isinstance(v, dict),
}


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class QuarantinedRecord:
    """A ledger entry that failed its checks on load: kept aside, shown in ``devplug status``."""

    index: int
    reason: str
    raw: object

    def devices(self) -> list[str]:
        """The device IDs the entry seems to name (best effort, for the operator)."""
        if not isinstance(self.raw, dict):
            return []
        found: list[str] = []
        for key in ("devices", "pending"):
            value = self.raw.get(key)
            if isinstance(value, list):
                found.extend(v for v in value if isinstance(v, str) and v not in found)
        return found


@dataclass(frozen=True)
class LedgerSnapshot:
    """The ledger as it was before an Allocate began (see :meth:`Ledger.snapshot`)."""

    record_ids: frozenset[str]
    touched: dict[str, AllocationRecord]


async def _write_in_thread(path: Path, data: bytes) -> None:
    await asyncio.to_thread(write_atomic, path, data)


def _kept_quarantine(index: int, entry: object) -> QuarantinedRecord:
    """A record quarantined by an earlier load, as the file keeps it."""
    if isinstance(entry, dict) and isinstance(entry.get("reason"), str) and "record" in entry:
        return QuarantinedRecord(index=index, reason=entry["reason"], raw=entry["record"])
    return QuarantinedRecord(index=index, reason="malformed quarantine entry", raw=entry)


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

    def __init__(
        self,
        resource_name: str,
        path: Path,
        write: Callable[[Path, bytes], Awaitable[None]] | None = None,
        on_saved: Callable[[], None] = lambda: None,
    ) -> None:
        self.resource_name = resource_name
        self.path = path
        self._write = write or _write_in_thread
        self._on_saved = on_saved
        #: Why the last write failed (a full disk), until one succeeds; shown in ``devplug status``.
        self.write_error: str | None = None
        self.records: dict[str, AllocationRecord] = {}
        #: Entries that failed their checks on load; kept in the file, never acted on.
        self.quarantined: list[QuarantinedRecord] = []
        self.recovered_from_corruption: Path | None = None
        #: True when there was no ledger to load (first start, or the file was lost or corrupt):
        #: what the kubelet's checkpoint says pods held is then adopted (see the reconciler).
        self.lost = False

    # --- persistence

    def load(self) -> None:
        """Read the ledger file if there is one.

        A file that is not a ledger of this resource at all (not JSON, another
        format or resource) is moved aside (``ledger.json.corrupt-<time>``)
        with an error log line, and the ledger starts empty, flagged so the
        reconciler rebuilds it from PodResources and the kubelet's checkpoint.
        A single malformed record is quarantined instead: logged, kept in the
        file under ``quarantined`` and shown in ``devplug status``, while every
        other record is loaded and acted on as usual.
        """
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            self.lost = True
            return
        except OSError as exc:
            raise StateError(f"{self.path}: cannot read the allocation ledger: {exc}") from exc
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION:
                raise ValueError(f"unsupported format {data.get('format') if isinstance(data, dict) else data!r}")
            if data.get("resource") != self.resource_name:
                raise ValueError(f"it belongs to resource {data.get('resource')!r}")
            entries = data["allocations"]
            if not isinstance(entries, list):
                raise ValueError("'allocations' is not a list")
            kept = data.get("quarantined", [])
            if not isinstance(kept, list):
                raise ValueError("'quarantined' is not a list")
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            os.replace(self.path, aside)
            self.recovered_from_corruption = aside
            self.lost = True
            log.error(
                "[%s] allocation ledger %s is corrupt (%s); moved it to %s and rebuilding from PodResources",
                self.resource_name,
                self.path,
                exc,
                aside,
            )
            return
        self.records = {}
        self.quarantined = [_kept_quarantine(i, entry) for i, entry in enumerate(kept)]
        for index, entry in enumerate(entries):
            try:
                record = AllocationRecord.from_json(entry)
                if record.id in self.records:
                    raise ValueError(f"record id {record.id!r} is used twice")
            except ValueError as exc:
                bad = QuarantinedRecord(index=index, reason=str(exc), raw=entry)
                self.quarantined.append(bad)
                log.error(
                    "[%s] allocation ledger %s: record #%d quarantined (%s); devices it names: %s",
                    self.resource_name,
                    self.path,
                    index,
                    exc,
                    ", ".join(bad.devices()) or "none",
                )
                continue
            self.records[record.id] = record

    async def save(self) -> None:
        """Write the ledger to its file (atomically, through ``write``); ``OSError`` when it cannot be.

        A failure is kept as :attr:`write_error` until a write succeeds; every
        outcome is reported through ``on_saved`` (the status is rewritten).
        """
        try:
            await self._write(self.path, self.serialize())
        except OSError as exc:
            self.write_error = f"cannot write {self.path}: {exc.strerror or exc} (at {time.time():.0f})"
            self._on_saved()
            raise
        self.write_error = None
        self._on_saved()

    def serialize(self) -> bytes:
        data: dict[str, Any] = {
            "format": FORMAT_VERSION,
            "resource": self.resource_name,
            "allocations": [r.to_json() for r in self.records.values()],
        }
        if self.quarantined:
            data["quarantined"] = [{"reason": q.reason, "record": q.raw} for q in self.quarantined]
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

    def confirm(self, record: AllocationRecord, allocation: ContainerAllocation, now: float) -> None:
        """The Allocate for ``record``'s pending devices succeeded (answered at ``now``)."""
        record.allocated_at = now
        record.devices.extend(d for d in record.pending if d not in record.devices)
        record.pending.clear()
        record.prepared = prepared_summary(allocation)

    def add(self, record: AllocationRecord) -> None:
        """Keep a record made elsewhere (an undo in progress)."""
        self.records[record.id] = record

    def adopt(
        self, devices: Iterable[str], now: float, source: str, *, pod: str | None = None, pod_uid: str | None = None
    ) -> AllocationRecord | None:
        """Take into the ledger devices a pod holds that no record has (a lost or rebuilt ledger).

        ``source`` says where they were found ("PodResources", "the kubelet's
        checkpoint"); hooks called for an adopted record are flagged as retries,
        since the daemon may have called them before it lost its ledger.
        Returns the new record, or None when every device was held already.
        """
        held = self.held_devices()
        fresh = sorted({d for d in devices if d not in held})
        if not fresh:
            return None
        seen = now if pod is not None else None
        record = AllocationRecord(
            id=new_record_id(), devices=fresh, created=now, pod=pod, pod_uid=pod_uid, seen_at=seen, adopted=source
        )
        self.records[record.id] = record
        return record

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
