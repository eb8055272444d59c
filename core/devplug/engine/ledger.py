"""The allocation ledger: which devices this daemon handed out, and which still need releasing.

One ledger per resource, under ``<state dir>/resources/<domain>/<name>/``: a
snapshot ``ledger.json`` (written atomically and fsynced by compaction, in the
background) and the journal segments appended since (``ledger.journal.<seq>``,
see :mod:`devplug.engine.journal`). Every change is appended as the records it
touched, with one plain ``write()`` before the kubelet gets an answer: a daemon
killed at any point finds after restart every device either still used by a pod
or still owed its release. What a change costs does not grow with the number of
allocations held (an index maps devices to records; only touched records are
written). Compaction folds the journal into a new snapshot when it grows
(:data:`COMPACT_BYTES`) and when the ledger has been idle for a while.

A :class:`AllocationRecord` is one allocation: the devices of one container,
plus the devices of later containers of the same pod that reused some of them
(the kubelet hands the devices of finished init containers to app containers
without any release in between, so those form one allocation and are
released once). ``pending`` devices are being prepared by an Allocate that has
not answered yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import itertools
import json
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from devplug.atomic import write_atomic
from devplug.compactjson import compact_json
from devplug.engine.journal import JournalSegment, encode_frame, frame_payload, read_journal, segment_path, segments
from devplug.engine.observer import NULL_OBSERVER, ResourceObserver
from devplug.errors import StateError
from devplug.types import ContainerAllocation

__all__ = [
    "COMPACT_BYTES",
    "FORMAT_VERSION",
    "QUARANTINE_PREFIX",
    "AllocationRecord",
    "Ledger",
    "QuarantinedRecord",
    "read_ledger_records",
]

#: An Allocate is refused before the driver's hook when the state filesystem has less room than this: its two
#: journal appends must not run out of space between them (the hook would have run, to be undone).
MIN_FREE_BYTES = 64 * 1024
#: While the filesystem has at least this much room, its free space is looked at again only after a second.
_ROOMY_BYTES = 16 * 1024 * 1024

#: Compact the journal into a new snapshot once the segment being written holds this many bytes...
COMPACT_BYTES = 256 * 1024
#: ...or once nothing was written for this many seconds.
COMPACT_IDLE_S = 2.0

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
    #: The owning ledger's set of changed record IDs (not a field of the file); see ``__setattr__``.
    _changed: set[str] | None = field(default=None, compare=False, repr=False)
    #: The owning ledger's set of releasing record IDs (its index of ``releasing``; not a field of the file).
    _releasing: set[str] | None = field(default=None, compare=False, repr=False)

    def __setattr__(self, name: str, value: Any) -> None:
        """Every field set marks the record changed in its ledger, so the next save writes it;
        ``releasing`` also keeps the ledger's index of releasing records right."""
        object.__setattr__(self, name, value)
        changed = self.__dict__.get("_changed")
        if changed is not None and name[0] != "_":
            changed.add(self.id)
        if name == "releasing":
            releasing = self.__dict__.get("_releasing")
            if releasing is not None:
                if value:
                    releasing.add(self.id)
                else:
                    releasing.discard(self.id)

    @classmethod
    def new(cls, record_id: str, created: float, **values: Any) -> AllocationRecord:
        """A record not in a ledger yet, with ``values`` for other fields than the defaults.

        The same record as the constructor's, made without its ``__setattr__``
        per field (an Allocate makes one per container).
        """
        record = cls.__new__(cls)
        data = record.__dict__
        data.update(_DEFAULTS)
        for name, factory in _DEFAULT_FACTORIES:
            data[name] = factory()
        unknown = values.keys() - data.keys()
        if unknown:
            raise TypeError(f"AllocationRecord has no field {', '.join(sorted(unknown))}")
        data.update(values, id=record_id, created=created)
        return record

    def mark_post_stopped(self, device_ids: Iterable[str]) -> None:
        """These devices had their post-stop; ``post_stop_done`` once every device did."""
        self.post_stopped = [*self.post_stopped, *(d for d in device_ids if d not in self.post_stopped)]
        self.post_stop_done = all(d in self.post_stopped for d in self.devices)

    def mark_post_stop_begun(self, device_ids: Iterable[str]) -> None:
        """The driver's post_stop for these devices is about to be called (written before the call)."""
        self.post_stop_begun = [*self.post_stop_begun, *(d for d in device_ids if d not in self.post_stop_begun)]

    def copy(self) -> AllocationRecord:
        """An unowned copy (its lists copied), for rolling an Allocate back."""
        data: dict[str, Any] = {k: (list(v) if isinstance(v, list) else v) for k, v in self.to_json().items()}
        data["prepared"] = dict(self.prepared)
        return AllocationRecord(**data)

    def all_devices(self) -> list[str]:
        if not self.pending:
            return list(self.devices)
        return [*self.devices, *[d for d in self.pending if d not in self.devices]]

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


#: The fields' plain defaults and default factories, for :meth:`AllocationRecord.new`.
_DEFAULTS = {f.name: f.default for f in fields(AllocationRecord) if f.default is not MISSING}
_DEFAULT_FACTORIES = [(f.name, f.default_factory) for f in fields(AllocationRecord) if f.default_factory is not MISSING]


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


#: What a field's JSON value is when it holds its default (a field at its default is not written: loading fills
#: it in, as it does for records written before the field existed).
_JSON_DEFAULTS: dict[str, object] = {
    **{name: value for name, value in _DEFAULTS.items() if name in _FIELD_CHECKS},
    **{name: factory() for name, factory in _DEFAULT_FACTORIES},
}


#: Stands for "no default" in :data:`_JSON_DEFAULTS` lookups (equal to no field value).
_NO_DEFAULT = object()


def _record_json(record: AllocationRecord) -> str:
    """A record's JSON as the ledger writes it: the fields not at their defaults (a new record is three)."""
    data = record.__dict__
    return compact_json(
        {name: value for name in _FIELD_CHECKS if (value := data[name]) != _JSON_DEFAULTS.get(name, _NO_DEFAULT)}
    )


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: The ID prefix of the record that holds a quarantined entry's devices until they are released through the driver.
QUARANTINE_PREFIX = "quarantined-"


@dataclass(frozen=True)
class QuarantinedRecord:
    """A ledger entry that failed its checks on load: kept aside, shown in ``devplug status``.

    Its devices may have been handed to a pod and never cleaned: they are held by a record of their own
    (:attr:`record_id`), withheld from the kubelet, and released through the driver (``post_stop`` and
    ``deallocate`` with ``retry=True``) once no pod holds them; or the operator clears it
    (``devplug quarantine clear``). Either drops the entry.
    """

    index: int
    reason: str
    raw: object

    @property
    def key(self) -> str:
        """A name for the entry that does not change with its position (a digest of its content)."""
        text = json.dumps(self.raw, sort_keys=True, separators=(",", ":"), default=repr)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def record_id(self) -> str:
        """The ID of the record that holds its devices until they are released."""
        return QUARANTINE_PREFIX + self.key

    def pod_uid(self) -> str | None:
        """The pod UID the entry names, if it is readable."""
        uid = self.raw.get("pod_uid") if isinstance(self.raw, dict) else None
        return uid if isinstance(uid, str) and uid else None

    def describe(self) -> str:
        return f"quarantined ledger record #{self.index} ({self.reason})"

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
    """The records an Allocate's :meth:`Ledger.begin` may change, as they were (see :meth:`Ledger.snapshot`)."""

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
        self.path = path
        self._observer = observer
        self._write = write or _write_in_thread
        self._on_saved = on_saved
        self.records: dict[str, AllocationRecord] = {}
        #: device ID -> IDs of the records holding it (devices and pending).
        self._index: dict[str, set[str]] = {}
        self._changed: set[str] = set()
        self._removed: set[str] = set()
        #: IDs of the records being released (kept by the records' ``__setattr__``).
        self._releasing: set[str] = set()
        #: Each record's JSON as last journaled, reused by compaction (which then serializes only the
        #: records changed since their last save, off nothing but a join).
        self._encoded: dict[str, str] = {}
        self._segment = JournalSegment(segment_path(path, 1))
        self._snapshot_seq = 0
        self._compacting: asyncio.Task[None] | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        #: The event loop's time of the last save that wrote (for the idle compaction).
        self._last_write = 0.0
        #: Why the last write failed (a full disk), until one succeeds; shown in ``devplug status``.
        self.write_error: str | None = None
        #: Until when (``time.monotonic()``) the filesystem is known to have room (see :meth:`check_room`).
        self._roomy_until = 0.0
        #: Counts saves (for the status, which is rebuilt only when something changed).
        self.version = 0
        #: Entries that failed their checks on load; kept in the file, never acted on.
        self.quarantined: list[QuarantinedRecord] = []
        self.recovered_from_corruption: Path | None = None
        #: True when there was no ledger to load (first start, or the file was lost or corrupt):
        #: what the kubelet's checkpoint says pods held is then adopted (see the resource's start).
        self.lost = False
        #: Device -> the quarantined entry whose record holds it (those devices are withheld).
        self._quarantine_holds: dict[str, QuarantinedRecord] = {}
        #: Keys of quarantined entries dropped since the last save (journaled as ``unquarantine``).
        self._unquarantined: list[str] = []

    # --- loading

    def load(self) -> None:
        """Read the snapshot and replay the journal segments written after it.

        A snapshot that is not a ledger of this resource at all (not JSON,
        another format or resource) is moved aside (``ledger.json.corrupt-<time>``)
        with an error log line, and the ledger starts from the journal alone,
        flagged so what pods hold is adopted. A single malformed record is
        quarantined instead: logged, kept in the snapshot under ``quarantined``
        and shown in ``devplug status``. A torn journal tail (a power loss) is
        dropped with a log line.
        """
        self._reset_memory()
        snapshot_found = self._load_snapshot()
        replayed = self._replay_journal()
        if not snapshot_found and not replayed:
            self.lost = True
        newest = max([self._snapshot_seq, *(seq for seq, _ in segments(self.path))])
        self._segment.close()
        self._segment = JournalSegment(segment_path(self.path, newest + 1))  # never append after a torn tail
        self._changed.clear()
        self._removed.clear()
        self._hold_quarantined(time.time())

    def _hold_quarantined(self, now: float) -> None:
        """Give each quarantined entry's devices (those no valid record holds) a record of their own, so they are
        withheld and released through the driver like an adopted allocation (``retry=True``); written at the
        next save."""
        self._quarantine_holds = {}
        for bad in self.quarantined:
            record = self.records.get(bad.record_id)
            if record is None:
                fresh = [d for d in bad.devices() if d and not self.holds(d)]
                if not fresh:
                    continue
                record = AllocationRecord.new(
                    bad.record_id, now, devices=fresh, pod_uid=bad.pod_uid(), adopted=bad.describe()
                )
                self._put(record)
                self._changed.add(record.id)
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
            if bad.record_id in self.records:
                self._drop(bad.record_id)
            if self._unquarantine(bad.record_id) is None:
                continue
            dropped.append(bad)
        return dropped

    def _reset_memory(self) -> None:
        self.records = {}
        self._index = {}
        self._releasing = set()
        self._encoded = {}
        self.quarantined = []
        self._quarantine_holds = {}
        self._unquarantined = []
        self._snapshot_seq = 0

    def _load_snapshot(self, readonly: bool = False) -> bool:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return False
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
            seq = data.get("journal_seq", 0)
            if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
                raise ValueError(f"'journal_seq' is not a sequence number: {seq!r}")
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            if readonly:
                return False
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
            return False
        self._snapshot_seq = seq
        self.quarantined = [_kept_quarantine(i, entry) for i, entry in enumerate(kept)]
        for index, entry in enumerate(entries):
            self._load_record(entry, f"record #{index}", index)
        return True

    def _load_record(self, entry: object, where: str, index: int) -> None:
        try:
            record = AllocationRecord.from_json(entry)
        except ValueError as exc:
            self._quarantine(entry, str(exc), where, index)
            return
        self._put(record)

    def _quarantine(self, entry: object, reason: str, where: str, index: int) -> None:
        bad = QuarantinedRecord(index=index, reason=reason, raw=entry)
        self.quarantined.append(bad)
        log.error(
            "[%s] allocation ledger %s: %s quarantined (%s); devices it names: %s",
            self.resource_name,
            self.path,
            where,
            reason,
            ", ".join(bad.devices()) or "none",
        )

    def _replay_journal(self, readonly: bool = False) -> bool:
        replayed = False
        for seq, path in segments(self.path):
            if seq <= self._snapshot_seq:
                if not readonly:
                    with contextlib.suppress(OSError):
                        path.unlink()  # folded into the snapshot by a compaction that was cut short
                continue
            try:
                entries, torn = read_journal(path)
            except OSError as exc:
                raise StateError(f"{path}: cannot read the allocation journal: {exc}") from exc
            if torn is not None:
                log.warning(
                    "[%s] allocation journal %s ends with %s (a power loss?); dropped it, kept %d entries before it",
                    self.resource_name,
                    path,
                    torn,
                    len(entries),
                )
            for number, entry in enumerate(entries):
                replayed = True
                if "put" in entry:
                    self._load_record(entry["put"], f"journal {path.name} entry #{number}", number)
                elif isinstance(entry.get("del"), str):
                    self._drop(entry["del"])
                elif isinstance(entry.get("unquarantine"), str):
                    key = entry["unquarantine"]
                    self.quarantined = [q for q in self.quarantined if q.key != key]
                else:
                    log.error("[%s] %s entry #%d is neither put nor del; ignored", self.resource_name, path, number)
        return replayed

    # --- saving

    def check_room(self) -> None:
        """Raise ``OSError`` (ENOSPC) when the state filesystem has less than :data:`MIN_FREE_BYTES` free (for
        root, the blocks reserved for it count), keeping the failure as :attr:`write_error` like a failed save.

        Called before an Allocate writes anything: on a full disk it is refused before the driver's hook runs.
        """
        now = time.monotonic()
        if now < self._roomy_until:
            return
        try:
            st = os.statvfs(self.path.parent)
        except OSError:
            return  # the appends themselves will say what is wrong
        free = (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize
        if free >= _ROOMY_BYTES:
            self._roomy_until = now + 1.0
        if free < MIN_FREE_BYTES:
            exc = OSError(
                errno.ENOSPC,
                f"{os.strerror(errno.ENOSPC)} ({free} bytes free, {MIN_FREE_BYTES} needed)",
                str(self.path.parent),
            )
            self._write_failed(exc)
            raise exc

    async def save(self, *, sync: bool = False) -> None:
        """Append the records changed since the last save (and the IDs removed) to the journal.

        One plain ``write()``: it survives ``kill -9`` as soon as it returns.
        ``sync=True`` also makes it survive a power loss (``fdatasync``, in a
        thread). ``OSError`` (a full disk) leaves the journal without the
        entries; the failure is kept as :attr:`write_error` until a write
        succeeds, and every outcome is reported through ``on_saved``.
        """
        puts = []
        for record_id in self._changed:
            record = self.records.get(record_id)
            if record is not None:
                text = self._encoded[record_id] = _record_json(record)
                puts.append(frame_payload(b'{"put":' + text.encode() + b"}"))
        if self._removed:
            puts.extend([encode_frame({"del": i}) for i in self._removed if i not in self.records])
        if self._unquarantined:
            puts.extend([encode_frame({"unquarantine": key}) for key in self._unquarantined])
        frames = b"".join(puts)
        if frames:
            started = time.perf_counter()
            try:
                self._segment.append(frames)
                if sync:
                    await asyncio.to_thread(self._segment.sync)
            except OSError as exc:
                self._write_failed(exc)
                raise
            self._observer.ledger_written("journal", time.perf_counter() - started)
            self._changed.clear()
            self._removed.clear()
            self._unquarantined.clear()
            self.version += 1
        self.write_error = None
        self._on_saved()
        self._schedule_compaction()

    def _write_failed(self, exc: OSError) -> None:
        """Keep why the journal cannot be written as :attr:`write_error` (until a save succeeds) and report it."""
        self.write_error = f"cannot write {self._segment.path}: {exc.strerror or exc} (at {time.time():.0f})"
        self._on_saved()

    def _schedule_compaction(self) -> None:
        if self._compacting is not None and not self._compacting.done():
            return
        loop = asyncio.get_running_loop()
        if self._segment.size >= COMPACT_BYTES:
            self._compacting = loop.create_task(self.compact())
            return
        self._last_write = loop.time()
        if self._segment.size and self._idle_timer is None:  # one timer, not a cancel and a new one per save
            self._idle_timer = loop.call_later(COMPACT_IDLE_S, self._compact_when_idle)

    def _compact_when_idle(self) -> None:
        """Compact once no save came for :data:`COMPACT_IDLE_S`; a save meanwhile moves the check later."""
        self._idle_timer = None
        if not self._segment.size:
            return
        loop = asyncio.get_running_loop()
        quiet_for = loop.time() - self._last_write
        if quiet_for < COMPACT_IDLE_S:
            self._idle_timer = loop.call_later(COMPACT_IDLE_S - quiet_for, self._compact_when_idle)
        elif self._compacting is None or self._compacting.done():
            self._compacting = loop.create_task(self.compact())

    async def compact(self) -> None:
        """Fold the journal into a new snapshot (atomic, fsynced, in the writer thread), then drop old segments.

        New changes go to a fresh segment from the moment the snapshot is
        taken, so nothing is lost whatever the order of crashes. A failure
        (a full disk) is logged and retried at the next compaction.
        """
        covered = int(self._segment.path.name.rsplit(".", 1)[1])
        if not self._segment.size and not any(seq <= covered for seq, _ in segments(self.path)):
            return  # nothing journaled since the last snapshot
        data = self.serialize(journal_seq=covered)
        self._segment.close()
        self._segment = JournalSegment(segment_path(self.path, covered + 1))
        started = time.perf_counter()
        try:
            await self._write(self.path, data)
        except OSError as exc:
            log.warning("[%s] compacting the allocation ledger failed, will retry: %s", self.resource_name, exc)
            return
        self._observer.ledger_written("snapshot", time.perf_counter() - started)
        self._snapshot_seq = covered
        for seq, path in segments(self.path):
            if seq <= covered:
                with contextlib.suppress(OSError):
                    path.unlink()

    def serialize(self, journal_seq: int | None = None) -> bytes:
        """The snapshot file's bytes: every record, the quarantined ones, and the last journal segment it covers.

        Records unchanged since their last save reuse the JSON that save
        wrote, so the cost does not grow with what is held beyond a join.
        """
        head: dict[str, Any] = {
            "format": FORMAT_VERSION,
            "resource": self.resource_name,
            "journal_seq": self._snapshot_seq if journal_seq is None else journal_seq,
        }
        if self.quarantined:
            head["quarantined"] = [{"reason": q.reason, "record": q.raw} for q in self.quarantined]
        records = ",".join(self._json_of(record_id, record) for record_id, record in self.records.items())
        return (compact_json(head)[:-1] + ',"allocations":[' + records + "]}\n").encode()

    def _json_of(self, record_id: str, record: AllocationRecord) -> str:
        text = self._encoded.get(record_id)
        if text is None or record_id in self._changed:
            text = self._encoded[record_id] = _record_json(record)
        return text

    def close(self) -> None:
        """Close the journal segment (at shutdown)."""
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._segment.close()

    # --- the index

    def _put(self, record: AllocationRecord) -> None:
        old = self.records.get(record.id)
        if old is not None:
            self._unindex(old)
            if old is not record:  # the replaced object no longer speaks for this ledger
                object.__setattr__(old, "_changed", None)
                object.__setattr__(old, "_releasing", None)
        object.__setattr__(record, "_changed", self._changed)
        object.__setattr__(record, "_releasing", self._releasing)
        if record.releasing:
            self._releasing.add(record.id)
        else:
            self._releasing.discard(record.id)
        self._encoded.pop(record.id, None)
        self.records[record.id] = record
        for dev in record.all_devices():
            self._index.setdefault(dev, set()).add(record.id)
        self._removed.discard(record.id)

    def _unindex(self, record: AllocationRecord) -> None:
        for dev in record.all_devices():
            holders = self._index.get(dev)
            if holders is not None:
                holders.discard(record.id)
                if not holders:
                    del self._index[dev]

    def _drop(self, record_id: str) -> None:
        record = self.records.pop(record_id, None)
        if record is not None:
            self._unindex(record)
            object.__setattr__(record, "_changed", None)
            object.__setattr__(record, "_releasing", None)
        self._releasing.discard(record_id)
        self._encoded.pop(record_id, None)
        self._changed.discard(record_id)
        self._removed.add(record_id)

    def _reindex(self, record: AllocationRecord, devices: Iterable[str], pending: Iterable[str]) -> None:
        """Change a record's device lists, keeping the index right."""
        self._unindex(record)
        record.devices = list(devices)
        record.pending = list(pending)
        for dev in record.all_devices():
            self._index.setdefault(dev, set()).add(record.id)

    # --- queries

    def __iter__(self) -> Iterator[AllocationRecord]:
        return iter(list(self.records.values()))

    def holders(self, device_id: str) -> list[AllocationRecord]:
        return [self.records[i] for i in self._index.get(device_id, ())]

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
        return {d for i in self._releasing for d in self.records[i].all_devices()}

    def snapshot(self, device_ids: Iterable[str]) -> LedgerSnapshot:
        """What :meth:`begin` for ``device_ids`` may change, to :meth:`restore` it: copies of the records
        holding those devices (found through the index, whatever else is held)."""
        ids = set(device_ids)
        if not self.holds_any(ids):
            return LedgerSnapshot({})
        touched = {r.id: r.copy() for i in ids for r in self.holders(i)}
        return LedgerSnapshot(touched)

    def restore(self, snapshot: LedgerSnapshot, inflight: Iterable[str]) -> None:
        """Undo :meth:`begin`: drop the records it created, put back the ones it changed.

        ``inflight`` are the records the Allocate's ``begin`` calls returned;
        records of other Allocates in flight meanwhile are left alone.
        """
        for record_id in inflight:
            if record_id not in snapshot.touched:
                self._drop(record_id)
        for record in snapshot.touched.values():
            copy_ = record.copy()
            self._put(copy_)
            self._changed.add(copy_.id)

    # --- changes

    def begin(self, device_ids: Iterable[str], now: float) -> AllocationRecord:
        """Record that ``device_ids`` are being allocated to one container.

        Devices already held by a live allocation are reused (same pod): that
        allocation absorbs the new devices. Returns the record that holds them.
        """
        ids = list(dict.fromkeys(device_ids))
        if not self.holds_any(ids):  # the usual case: a new record, indexed as it is put
            target = AllocationRecord.new(new_record_id(), now, pending=ids)
            self._put(target)
            self._changed.add(target.id)
            return target
        overlapping = list({r.id: r for i in ids for r in self.holders(i) if not r.releasing}.values())
        if overlapping:
            target = overlapping[0]
            devices, pending = list(target.devices), list(target.pending)
            for other in overlapping[1:]:  # one pod's allocations joined by a container using both
                devices.extend(d for d in other.devices if d not in devices)
                pending.extend(d for d in other.pending if d not in pending)
                self._drop(other.id)
        else:
            target = AllocationRecord.new(new_record_id(), now)
            self._put(target)
            self._changed.add(target.id)
            devices, pending = [], []
        held = {*devices, *pending}
        pending.extend(d for d in ids if d not in held)
        self._reindex(target, devices, pending)
        return target

    def confirm(self, record: AllocationRecord, allocation: ContainerAllocation, now: float) -> None:
        """The Allocate for ``record``'s pending devices succeeded (answered at ``now``)."""
        record.allocated_at = now
        self.settle_pending(record)
        record.prepared = prepared_summary(allocation)

    def settle_pending(self, record: AllocationRecord) -> None:
        """A record's pending devices are allocated after all (its Allocate answered, or a pod turned out to use
        them). The record holds the same devices, so the index does not change."""
        if record.pending:
            record.devices = record.all_devices()
            record.pending = []

    def add(self, record: AllocationRecord) -> None:
        """Keep a record made elsewhere (an undo in progress)."""
        self._put(record)
        self._changed.add(record.id)

    def adopt(
        self, devices: Iterable[str], now: float, source: str, *, pod: str | None = None, pod_uid: str | None = None
    ) -> AllocationRecord | None:
        """Take into the ledger devices a pod holds that no record has (a lost or rebuilt ledger).

        ``source`` says where they were found ("PodResources", "the kubelet's
        checkpoint"); hooks called for an adopted record are flagged as retries,
        since the daemon may have called them before it lost its ledger.
        Returns the new record, or None when every device was held already.
        """
        fresh = sorted({d for d in devices if not self.holds(d)})
        if not fresh:
            return None
        seen = now if pod is not None else None
        record = AllocationRecord.new(
            new_record_id(), now, devices=fresh, pod=pod, pod_uid=pod_uid, seen_at=seen, adopted=source
        )
        self.add(record)
        return record

    def remove(self, record: AllocationRecord) -> None:
        """The allocation was released (a quarantined entry's record: the entry goes too)."""
        self._drop(record.id)
        if self._quarantine_holds and record.id.startswith(QUARANTINE_PREFIX):
            self._unquarantine(record.id)

    def drop_devices(self, device_ids: Iterable[str]) -> list[AllocationRecord]:
        """Forget ``device_ids`` (released through the KEP's Deallocate); returns the records emptied."""
        ids = set(device_ids)
        emptied = []
        for record in {r.id: r for i in ids for r in self.holders(i)}.values():
            self._reindex(
                record, [d for d in record.devices if d not in ids], [d for d in record.pending if d not in ids]
            )
            if not record.devices and not record.pending:
                self.remove(record)
                emptied.append(record)
        return emptied


def read_ledger_records(path: Path, resource_name: str) -> list[dict[str, Any]]:
    """The records a daemon would load from ``path`` (snapshot and journal), as JSON objects; for tests and tools.

    Reads only: nothing is moved aside, nothing is written.
    """
    for _ in range(20):  # a compaction between reading the snapshot and the segments: read again
        before = _stamp(path)
        ledger = Ledger(resource_name, path)
        ledger._load_snapshot(readonly=True)
        try:
            ledger._replay_journal(readonly=True)
        except StateError:
            continue  # a segment deleted under us by that compaction
        if _stamp(path) == before:
            break
    return [r.to_json() for r in ledger.records.values()]


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns)
