"""The allocation ledger: which devices this daemon handed out, and which still need releasing.

One ledger per resource. Its records (:mod:`devplug.engine.records`) are
immutable: every change is a method of :class:`Ledger` that puts a changed
copy in place, keeps the device index right and notes the record for the next
:meth:`Ledger.save`, which appends the changed records to the journal
(:mod:`devplug.engine.ledgerfile`) before the kubelet gets an answer. A daemon
killed at any point finds after restart every device either still used by a
pod or still owed its release. What a change costs does not grow with the
number of allocations held (an index maps devices to records; only touched
records are written).

Records are named by ID in every change: a caller holding a record across an
``await`` reads the current one again (:meth:`Ledger.get`), since another
task may have changed or released it meanwhile.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from devplug.engine.journal import encode_frame, frame_payload
from devplug.engine.ledgerfile import COMPACT_BYTES, FORMAT_VERSION, MIN_FREE_BYTES, LedgerFile
from devplug.engine.observer import NULL_OBSERVER, ResourceObserver
from devplug.engine.records import (
    QUARANTINE_PREFIX,
    AllocationRecord,
    QuarantinedRecord,
    new_record_id,
    prepared_summary,
    record_json,
    replaced,
)
from devplug.errors import StateError
from devplug.text.compactjson import compact_json
from devplug.types import ContainerAllocation

__all__ = [
    "COMPACT_BYTES",
    "FORMAT_VERSION",
    "MIN_FREE_BYTES",
    "QUARANTINE_PREFIX",
    "AllocationRecord",
    "ClaimTenant",
    "Ledger",
    "LedgerSnapshot",
    "QuarantinedRecord",
    "new_record_id",
    "read_ledger_records",
]

log = logging.getLogger("devplug.engine")


@dataclass(frozen=True)
class ClaimTenant:
    """The DRA claim a tenancy is for: its UID, ``namespace/name`` and the UIDs of the pods it is reserved for."""

    uid: str
    name: str
    pods: tuple[str, ...] = ()


@dataclass(frozen=True)
class LedgerSnapshot:
    """The records an Allocate's :meth:`Ledger.begin` may change, as they were (see :meth:`Ledger.snapshot`)."""

    touched: Mapping[str, AllocationRecord]


def _kept_quarantine(index: int, entry: object) -> QuarantinedRecord:
    """A record quarantined by an earlier load, as the file keeps it."""
    if isinstance(entry, dict) and isinstance(entry.get("reason"), str) and "record" in entry:
        return QuarantinedRecord(index=index, reason=entry["reason"], raw=entry["record"])
    return QuarantinedRecord(index=index, reason="malformed quarantine entry", raw=entry)


def _merged(first: Iterable[str], more: Iterable[str]) -> tuple[str, ...]:
    """``first``, then the IDs of ``more`` not among them, in order."""
    return tuple(dict.fromkeys([*first, *more]))


class Ledger:
    """The allocation records of one resource: in memory, indexed by device, persisted as snapshot + journal."""

    def __init__(
        self,
        resource_name: str,
        path: Path,
        write: Callable[[Path, bytes], Awaitable[None]] | None = None,
        on_saved: Callable[[], None] = lambda: None,
        observer: ResourceObserver = NULL_OBSERVER,
    ) -> None:
        self.resource_name = resource_name
        self.file = LedgerFile(resource_name, path, write, observer, on_saved)
        self._records: dict[str, AllocationRecord] = {}
        #: device ID -> IDs of the records holding it (devices and pending).
        self._index: dict[str, set[str]] = {}
        #: IDs of the records being released.
        self._releasing: set[str] = set()
        #: DRA claim UID -> the ID of the record of its tenancy.
        self._claims: dict[str, str] = {}
        #: IDs of the records changed, and of those removed, since the last save.
        self._changed: set[str] = set()
        self._removed: set[str] = set()
        #: Each record's JSON as last journaled, reused by compaction (which then serializes only the records
        #: changed since their last save, off nothing but a join).
        self._encoded: dict[str, str] = {}
        #: Counts saves that wrote (for the status, which is rebuilt only when something changed).
        self.version = 0
        #: Entries that failed their checks on load; their devices are withheld until released or cleared.
        self.quarantined: list[QuarantinedRecord] = []
        #: True when there was no ledger to load (first start, or the file was lost or corrupt):
        #: what the kubelet's checkpoint says pods held is then adopted (see the resource's start).
        self.lost = False
        #: Device -> the quarantined entry whose record holds it (those devices are withheld).
        self._quarantine_holds: dict[str, QuarantinedRecord] = {}
        #: Keys of quarantined entries dropped since the last save (journaled as ``unquarantine``).
        self._unquarantined: list[str] = []

    # --- the file

    @property
    def path(self) -> Path:
        return self.file.path

    @property
    def write_error(self) -> str | None:
        """Why the last write failed (a full disk), until one succeeds, or why allocations are refused (a file of
        the ledger vanished while the daemon ran); shown in ``devplug status``."""
        return self.file.vanished or self.file.write_error

    @property
    def recovered_from_corruption(self) -> Path | None:
        """Where a corrupt snapshot was moved aside at load, if it was."""
        return self.file.recovered_from_corruption

    def load(self) -> None:
        """Read the snapshot and replay the journal (see :meth:`LedgerFile.load`).

        A snapshot that is not a ledger of this resource at all is moved aside
        and the ledger is flagged :attr:`lost`, so what pods hold is adopted. A
        single malformed record is quarantined instead: logged, kept in the
        snapshot under ``quarantined``, shown in ``devplug status``, and its
        devices withheld until released through the driver or cleared.
        """
        self._reset()
        if not self.file.load(_Loader(self)):
            self.lost = True
        self._changed.clear()
        self._removed.clear()
        self._hold_quarantined(time.time())

    def _reset(self) -> None:
        self._records = {}
        self._index = {}
        self._releasing = set()
        self._claims = {}
        self._encoded = {}
        self.quarantined = []
        self._quarantine_holds = {}
        self._unquarantined = []

    def check_room(self) -> None:
        """Raise ``OSError`` (ENOSPC) when the state filesystem is nearly full (see :meth:`LedgerFile.check_room`),
        and :class:`~devplug.errors.StateWriteError` when a file of the ledger vanished while the daemon ran
        (:meth:`LedgerFile.check_present`).

        Called before an Allocate writes anything: either refuses it before the driver's hook runs.
        """
        self.file.check_present(self.serialize)
        self.file.check_room()

    async def save(self, *, sync: bool = False, look: bool = True) -> None:
        """Append the records changed since the last save (and the IDs removed) to the journal.

        One plain ``write()``: it survives ``kill -9`` as soon as it returns.
        ``sync=True`` also makes it survive a power loss (``fdatasync``, in a
        thread). ``OSError`` (a full disk) leaves the journal without the
        entries and the changes pending; the failure is kept as
        :attr:`write_error` until a write succeeds. ``look=False``: no look
        for a vanished file afterwards (see :meth:`LedgerFile.written`).
        """
        frames = []
        for record_id in self._changed:
            record = self._records.get(record_id)
            if record is not None:
                text = self._encoded[record_id] = record_json(record)
                frames.append(frame_payload(b'{"put":' + text.encode() + b"}"))
        frames.extend(encode_frame({"del": i}) for i in self._removed if i not in self._records)
        frames.extend(encode_frame({"unquarantine": key}) for key in self._unquarantined)
        if frames:
            await self.file.append(b"".join(frames), sync=sync)
            self._changed.clear()
            self._removed.clear()
            self._unquarantined.clear()
            self.version += 1
        self.file.written(self.serialize, look=look)

    async def compact(self) -> None:
        """Fold the journal into a new snapshot now (see :meth:`LedgerFile.compact`)."""
        await self.file.compact(self.serialize)

    def serialize(self, journal_seq: int | None = None) -> bytes:
        """The snapshot file's bytes: every record, the quarantined ones, and the last journal segment it covers.

        Records unchanged since their last save reuse the JSON that save
        wrote, so the cost does not grow with what is held beyond a join.
        """
        head: dict[str, Any] = {
            "format": FORMAT_VERSION,
            "resource": self.resource_name,
            "journal_seq": self.file.snapshot_seq if journal_seq is None else journal_seq,
        }
        if self.quarantined:
            head["quarantined"] = [{"reason": q.reason, "record": q.raw} for q in self.quarantined]
        records = ",".join(self._json_of(record_id, record) for record_id, record in self._records.items())
        return (compact_json(head)[:-1] + ',"allocations":[' + records + "]}\n").encode()

    def _json_of(self, record_id: str, record: AllocationRecord) -> str:
        text = self._encoded.get(record_id)
        if text is None or record_id in self._changed:
            text = self._encoded[record_id] = record_json(record)
        return text

    def close(self) -> None:
        """Close the journal segment (at shutdown)."""
        self.file.close()

    # --- quarantined entries

    def _hold_quarantined(self, now: float) -> None:
        """Give each quarantined entry's devices (those no valid record holds) a record of their own, so they are
        withheld and released through the driver like an adopted allocation (``retry=True``); written at the
        next save."""
        self._quarantine_holds = {}
        for bad in self.quarantined:
            record = self._records.get(bad.record_id)
            if record is None:
                fresh = tuple(d for d in bad.devices() if d and not self.holds(d))
                if not fresh:
                    continue
                record = AllocationRecord(
                    bad.record_id, devices=fresh, created=now, pod_uid=bad.pod_uid(), adopted=bad.describe()
                )
                self._put(record)
                log.error(
                    "[%s] %s names %s: withheld until they are released through the driver (post_stop and "
                    "deallocate with retry=True, once no pod holds them) or cleared with `devplug quarantine clear`",
                    self.resource_name,
                    bad.describe(),
                    ", ".join(fresh),
                )
            for dev in record.all_devices():
                self._quarantine_holds[dev] = bad

    def quarantined_devices(self) -> dict[str, str]:
        """Device -> the quarantined entry holding it (described), for the devices withheld because of one."""
        return {dev: bad.describe() for dev, bad in self._quarantine_holds.items()} if self._quarantine_holds else {}

    def _unquarantine(self, record_id: str) -> QuarantinedRecord | None:
        """The record holding a quarantined entry's devices is gone: drop the entry (journaled at the next save)."""
        for number, bad in enumerate(self.quarantined):
            if bad.record_id == record_id:
                del self.quarantined[number]
                self._unquarantined.append(bad.key)
                self._quarantine_holds = {d: q for d, q in self._quarantine_holds.items() if q is not bad}
                return bad
        return None

    def clear_quarantined(self, keys: Iterable[str] | None = None) -> list[QuarantinedRecord]:
        """The operator says these entries' devices are clean (all when ``keys`` is None): drop the entries and
        the records holding their devices, without calling the driver. Returns the entries dropped."""
        wanted = None if keys is None else set(keys)
        dropped = []
        for bad in list(self.quarantined):
            if wanted is not None and bad.key not in wanted:
                continue
            if bad.record_id in self._records:
                self._drop(bad.record_id)
            if self._unquarantine(bad.record_id) is not None:
                dropped.append(bad)
        return dropped

    # --- the index (every change of a record goes through _put or _drop)

    def _put(self, record: AllocationRecord) -> AllocationRecord:
        """Put ``record`` in place of the record of its ID (if any), index it and note it for the next save."""
        old = self._records.get(record.id)
        if old is None:
            for dev in record.all_devices():
                self._index.setdefault(dev, set()).add(record.id)
        elif old.devices != record.devices or old.pending != record.pending:
            devices = record.all_devices()
            # Fast path (issue 42): a confirm moves the pending devices to ``devices``, the same set: the index
            # stays as it is instead of being taken down and put back (a confirm's put of 4 devices: 1.9 -> 1.3 us
            # in a loop).
            if set(devices) != set(old.all_devices()):
                self._unindex(old)
                for dev in devices:
                    self._index.setdefault(dev, set()).add(record.id)
        if record.releasing:
            self._releasing.add(record.id)
        else:
            self._releasing.discard(record.id)
        if record.claim_uid is not None:
            self._claims[record.claim_uid] = record.id
        self._records[record.id] = record
        self._changed.add(record.id)
        self._removed.discard(record.id)
        return record

    def _unindex(self, record: AllocationRecord) -> None:
        for dev in record.all_devices():
            holders = self._index.get(dev)
            if holders is not None:
                holders.discard(record.id)
                if not holders:
                    del self._index[dev]

    def _drop(self, record_id: str) -> None:
        record = self._records.pop(record_id, None)
        if record is not None:
            self._unindex(record)
            if record.claim_uid is not None and self._claims.get(record.claim_uid) == record_id:
                del self._claims[record.claim_uid]
        self._releasing.discard(record_id)
        self._encoded.pop(record_id, None)
        self._changed.discard(record_id)
        self._removed.add(record_id)

    def _current(self, record_id: str) -> AllocationRecord:
        """The record of ``record_id``; :class:`StateError` when it is gone (a caller's bug: a change of a record
        released meanwhile)."""
        record = self._records.get(record_id)
        if record is None:
            raise StateError(f"{self.resource_name}: allocation record {record_id} is not in the ledger any more")
        return record

    def _change(self, record_id: str, **changes: Any) -> AllocationRecord:
        """Put a copy of the record of ``record_id`` with ``changes``."""
        return self._put(replaced(self._current(record_id), **changes))

    # --- queries

    @property
    def records(self) -> Mapping[str, AllocationRecord]:
        """Every record by ID (a read-only view)."""
        return MappingProxyType(self._records)

    def get(self, record_id: str) -> AllocationRecord | None:
        """The record of ``record_id`` as it is now, or None once it was released or dropped."""
        return self._records.get(record_id)

    def __iter__(self) -> Iterator[AllocationRecord]:
        return iter(list(self._records.values()))

    def __len__(self) -> int:
        return len(self._records)

    def for_claim(self, claim_uid: str) -> AllocationRecord | None:
        """The record of the DRA claim ``claim_uid``'s tenancy, or None."""
        record_id = self._claims.get(claim_uid)
        return None if record_id is None else self._records.get(record_id)

    def holders(self, device_id: str) -> list[AllocationRecord]:
        return [self._records[i] for i in self._index.get(device_id, ())]

    def holds(self, device_id: str) -> bool:
        return device_id in self._index

    def held_among(self, device_ids: Iterable[str]) -> set[str]:
        """The IDs of ``device_ids`` some record holds (one set operation)."""
        return self._index.keys() & set(device_ids)

    def holds_any(self, device_ids: Iterable[str]) -> bool:
        """True when some record holds one of ``device_ids`` (one set operation)."""
        return not self._index.keys().isdisjoint(device_ids)

    def held_devices(self) -> set[str]:
        return set(self._index)

    def releasing_devices(self) -> set[str]:
        """The devices of the records being released (through their index: no scan of every record)."""
        return {d for i in self._releasing for d in self._records[i].all_devices()}

    # --- an Allocate

    def snapshot(self, device_ids: Iterable[str]) -> LedgerSnapshot:
        """What :meth:`begin` for ``device_ids`` may change, to :meth:`restore` it: the records holding those
        devices now (found through the index; records never change, so no copies)."""
        ids = set(device_ids)
        if not self.holds_any(ids):
            return LedgerSnapshot({})
        return LedgerSnapshot({r.id: r for i in ids for r in self.holders(i)})

    def restore(self, snapshot: LedgerSnapshot, inflight: Iterable[str]) -> None:
        """Undo :meth:`begin`: drop the records it created, put back the ones it changed.

        ``inflight`` are the records the Allocate's ``begin`` calls returned;
        records of other Allocates in flight meanwhile are left alone.
        """
        for record_id in inflight:
            if record_id not in snapshot.touched:
                self._drop(record_id)
        for record in snapshot.touched.values():
            self._put(record)

    def begin(self, device_ids: Iterable[str], now: float, tenant: ClaimTenant | None = None) -> AllocationRecord:
        """Record that ``device_ids`` are being allocated to one container (or DRA claim: ``tenant``).

        Devices already held by a live allocation are reused (same pod): that
        allocation absorbs the new devices. Returns the record that holds them.
        """
        ids = tuple(dict.fromkeys(device_ids))
        if tenant is not None:  # a DRA claim is a tenancy of its own: admission settled every earlier holder
            return self._put(
                AllocationRecord(
                    new_record_id(),
                    pending=ids,
                    created=now,
                    claim_uid=tenant.uid,
                    claim=tenant.name,
                    pod_uid=tenant.pods[0] if tenant.pods else None,
                    pod_uids=tenant.pods[1:],
                )
            )
        if not self.holds_any(ids):  # the usual case: a new record, indexed as it is put
            return self._put(AllocationRecord(new_record_id(), pending=ids, created=now))
        overlapping = list({r.id: r for i in ids for r in self.holders(i) if not r.releasing}.values())
        if not overlapping:
            target = self._put(AllocationRecord(new_record_id(), created=now))
        else:
            target = overlapping[0]
            for other in overlapping[1:]:  # one pod's allocations joined by a container using both
                target = replaced(
                    target,
                    devices=_merged(target.devices, other.devices),
                    pending=_merged(target.pending, other.pending),
                )
                self._drop(other.id)
        held = {*target.devices, *target.pending}
        return self._put(replaced(target, pending=_merged(target.pending, (d for d in ids if d not in held))))

    def confirm(self, record_id: str, allocation: ContainerAllocation, now: float) -> AllocationRecord:
        """The Allocate of the record's pending devices succeeded (answered at ``now``)."""
        record = self._current(record_id)
        return self._change(
            record_id,
            devices=tuple(record.all_devices()),
            pending=(),
            allocated_at=now,
            prepared=prepared_summary(allocation),
        )

    def hold_for_undo(
        self, device_ids: Iterable[str], now: float, *, deallocate_tried: bool = False
    ) -> AllocationRecord:
        """A record, releasing, of devices the driver may still hold after an admission was rolled back: an
        allocate that outlived its timeout (undone once it returns), or an undo whose ``deallocate`` failed
        (``deallocate_tried``: its retries are flagged ``retry=True``). They stay withheld until released (after a
        crash too)."""
        return self._put(
            AllocationRecord(
                new_record_id(),
                pending=tuple(device_ids),
                created=now,
                releasing=True,
                deallocate_begun=deallocate_tried,
            )
        )

    # --- what the kubelet reports

    def settle_pending(self, record_id: str) -> AllocationRecord:
        """A record's pending devices are allocated after all (its pod was seen using them). The record holds the
        same devices, so the index does not change."""
        record = self._current(record_id)
        if not record.pending:
            return record
        return self._change(record_id, devices=tuple(record.all_devices()), pending=())

    def note_seen(self, record_id: str, pod: str, now: float) -> AllocationRecord:
        """A front end saw ``pod`` use the record's devices (PodResources listed them) at ``now``: its pending
        devices are allocated, and the pod is known to have run with them (``seen_at``: first seen). Returns
        the record, the same object when nothing changed."""
        record = self.settle_pending(record_id)
        if record.pod == pod and record.seen_at is not None:
            return record
        return self._change(record_id, pod=pod, seen_at=record.seen_at if record.seen_at is not None else now)

    def set_claim_pods(self, record_id: str, pod_uids: Iterable[str]) -> AllocationRecord:
        """The pods sharing the record's DRA claim now (its ``reservedFor``): all are waited for at release."""
        pods = tuple(dict.fromkeys(pod_uids))
        return self._change(record_id, pod_uid=pods[0] if pods else None, pod_uids=pods[1:])

    def set_pod_uid(self, record_id: str, pod_uid: str) -> AllocationRecord:
        """The UID of the pod holding the record's devices (from the kubelet's checkpoint or PodResources)."""
        return self._change(record_id, pod_uid=pod_uid)

    def adopt(
        self, devices: Iterable[str], now: float, source: str, *, pod: str | None = None, pod_uid: str | None = None
    ) -> AllocationRecord | None:
        """Take into the ledger devices a pod holds that no record has (a lost or rebuilt ledger).

        ``source`` says where they were found ("PodResources", "the kubelet's
        checkpoint"); hooks called for an adopted record are flagged as retries,
        since the daemon may have called them before it lost its ledger.
        Returns the new record, or None when every device was held already.
        """
        fresh = tuple(sorted({d for d in devices if not self.holds(d)}))
        if not fresh:
            return None
        seen = now if pod is not None else None
        return self._put(
            AllocationRecord(
                new_record_id(), devices=fresh, created=now, pod=pod, pod_uid=pod_uid, seen_at=seen, adopted=source
            )
        )

    # --- a release

    def begin_release(self, record_id: str) -> AllocationRecord:
        """The record's release starts: its devices are withheld until it is removed."""
        record = self._current(record_id)
        return record if record.releasing else self._change(record_id, releasing=True)

    def post_stop_begun(self, record_id: str, device_ids: Iterable[str]) -> AllocationRecord:
        """The driver's post_stop for these devices is about to be called (written before the call)."""
        record = self._current(record_id)
        return self._change(record_id, post_stop_begun=_merged(record.post_stop_begun, device_ids))

    def post_stopped(self, record_id: str, device_ids: Iterable[str]) -> AllocationRecord:
        """These devices had their post_stop; ``post_stop_done`` once every device of the record did."""
        record = self._current(record_id)
        done = _merged(record.post_stopped, device_ids)
        return self._change(record_id, post_stopped=done, post_stop_done=all(d in done for d in record.devices))

    def deallocate_begun(self, record_id: str, *, kep_at: float | None = None) -> AllocationRecord:
        """The driver's deallocate is about to be called (written before the call): the record is releasing.
        ``kep_at``: the time of the kubelet's KEP Deallocate that asked for it."""
        record = self._current(record_id)
        kep = record.kep_at if kep_at is None else kep_at
        return self._change(record_id, releasing=True, deallocate_begun=True, kep_at=kep)

    def release_abandoned(self, record_id: str, *, deallocate_done: bool = False) -> AllocationRecord:
        """A KEP Deallocate is over for this record without removing it: it is live again. ``deallocate_done``
        when the driver's deallocate returned (of the record's devices it named, dropped already)."""
        changes: dict[str, Any] = {"releasing": False}
        if deallocate_done:
            changes["deallocate_begun"] = False
        return self._change(record_id, **changes)

    def kep_touched(self, record_id: str, now: float) -> AllocationRecord:
        """The kubelet called a KEP hook (PostStopContainer) for the record's devices at ``now``."""
        return self._change(record_id, kep_at=now)

    def remove(self, record_id: str) -> None:
        """The allocation was released (a quarantined entry's record: the entry goes too)."""
        self._drop(record_id)
        if self._quarantine_holds and record_id.startswith(QUARANTINE_PREFIX):
            self._unquarantine(record_id)

    def drop_devices(self, device_ids: Iterable[str]) -> list[AllocationRecord]:
        """Forget ``device_ids`` (released through the KEP's Deallocate); returns the records emptied (as they
        were before)."""
        ids = set(device_ids)
        emptied = []
        for record in {r.id: r for i in ids for r in self.holders(i)}.values():
            devices = tuple(d for d in record.devices if d not in ids)
            pending = tuple(d for d in record.pending if d not in ids)
            if devices or pending:
                self._put(replaced(record, devices=devices, pending=pending))
            else:
                self.remove(record.id)
                emptied.append(record)
        return emptied


class _Loader:
    """What a load hands the ledger, entry by entry (the :class:`~devplug.engine.ledgerfile.LoadSink`)."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def kept_quarantine(self, entries: list[object]) -> None:
        self._ledger.quarantined = [_kept_quarantine(i, entry) for i, entry in enumerate(entries)]

    def put(self, entry: object, where: str, index: int) -> None:
        ledger = self._ledger
        try:
            record = AllocationRecord.from_json(entry)
        except ValueError as exc:
            bad = QuarantinedRecord(index=index, reason=str(exc), raw=entry)
            ledger.quarantined.append(bad)
            log.error(
                "[%s] allocation ledger %s: %s quarantined (%s); devices it names: %s",
                ledger.resource_name,
                ledger.path,
                where,
                exc,
                ", ".join(bad.devices()) or "none",
            )
            return
        ledger._put(record)

    def delete(self, record_id: str) -> None:
        self._ledger._drop(record_id)

    def unquarantine(self, key: str) -> None:
        self._ledger.quarantined = [q for q in self._ledger.quarantined if q.key != key]


def load_readonly(path: Path, resource_name: str) -> Ledger:
    """The ledger a daemon would load from ``path`` (snapshot and journal), read without moving, deleting or
    writing anything (for status, tools and tests); read again when a compaction ran meanwhile."""
    ledger = Ledger(resource_name, path)
    attempts = 20
    for attempt in range(attempts):  # a compaction between reading the snapshot and the segments: read again
        before = _stamp(path)
        ledger._reset()
        try:
            ledger.file.load(_Loader(ledger), readonly=True)
        except StateError:
            if attempt == attempts - 1:
                raise  # not a compaction: a file that cannot be read (a FIFO, a link), said as the daemon says it
            continue  # a segment deleted under us by that compaction
        if _stamp(path) == before:
            break
    return ledger


def read_ledger_records(path: Path, resource_name: str) -> list[dict[str, Any]]:
    """The records a daemon would load from ``path`` (snapshot and journal), as JSON objects; for tests and tools.

    Reads only: nothing is moved aside, nothing is written.
    """
    return [r.to_json() for r in load_readonly(path, resource_name).records.values()]


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns)
