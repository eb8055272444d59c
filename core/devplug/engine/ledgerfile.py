"""One resource's allocation ledger on disk: a snapshot and the journal segments appended since.

Under ``<state dir>/resources/<domain>/<name>/``: ``ledger.json``, written
atomically and fsynced by a compaction (in the background), and the journal
segments appended since (``ledger.journal.<seq>``, see
:mod:`devplug.engine.journal`). Every change is appended with one plain
``write()`` before the kubelet gets an answer, so a daemon killed at any point
finds every change it answered for. Compaction folds the journal into a new
snapshot when the segment being written grows past :data:`COMPACT_BYTES`, and
once the ledger has been idle for :data:`COMPACT_IDLE_S`.

A ledger's files vanishing is loud, never a silent fresh start. While the
daemon runs, the snapshot it loaded or wrote and the segment it appends to are
looked at before each allocation and after each save (:meth:`LedgerFile.check_present`; an Allocate's first
save, of its intent, right after that look, is not followed by another: its second save is, before the answer):
one gone (deleted or moved by someone else) is a WARNING naming it, the records
in memory are written back as a new snapshot (so a restart finds them), and
every allocation is refused, naming the file, until the daemon is restarted.
At load, a missing snapshot where journal segments show one was written before
(the oldest segment left is not the first) is a WARNING.

:class:`LedgerFile` knows frames and files, not records: reading calls back a
:class:`LoadSink` (the :class:`~devplug.engine.ledger.Ledger`) for each entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from devplug.atomic import write_atomic
from devplug.engine.journal import JournalSegment, read_journal, segment_path, segments, sync_and_close
from devplug.engine.observer import NULL_OBSERVER, ResourceObserver
from devplug.engine.statedir import read_state_file
from devplug.errors import StateError, StateWriteError

__all__ = ["COMPACT_BYTES", "COMPACT_IDLE_S", "FORMAT_VERSION", "MIN_FREE_BYTES", "LedgerFile", "LoadSink"]

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


class LoadSink(Protocol):
    """What a load hands the ledger, entry by entry, in file order."""

    def kept_quarantine(self, entries: list[object]) -> None:
        """The snapshot's ``quarantined`` entries (records quarantined by an earlier load)."""

    def put(self, entry: object, where: str, index: int) -> None:
        """A record's JSON (from the snapshot or a journal ``put``); ``where`` names it for messages."""

    def delete(self, record_id: str) -> None:
        """A journal ``del``: the record was released or dropped."""

    def unquarantine(self, key: str) -> None:
        """A journal ``unquarantine``: the quarantined entry of that key was released or cleared."""


async def _write_in_thread(path: Path, data: bytes) -> None:
    await asyncio.to_thread(write_atomic, path, data)


class LedgerFile:
    """The snapshot and journal of one resource's ledger."""

    def __init__(
        self,
        resource_name: str,
        path: Path,
        write: Callable[[Path, bytes], Awaitable[None]] | None = None,
        observer: ResourceObserver = NULL_OBSERVER,
        on_written: Callable[[], None] = lambda: None,
    ) -> None:
        self.resource_name = resource_name
        self.path = path
        #: ``path`` as text, for the look before every Allocate (:meth:`_missing`): ``os.lstat`` of a ``Path`` goes
        #: through ``__fspath__`` first, 2.65 us against 1.25 for the text in a loop on this VM (issue 42).
        self._path_text = os.fspath(path)
        self._write = write or _write_in_thread
        self._observer = observer
        self._on_written = on_written
        self._segment = JournalSegment(segment_path(path, 1))
        self._snapshot_seq = 0
        self._compacting: asyncio.Task[None] | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        #: The event loop's time of the last append (for the idle compaction).
        self._last_write = 0.0
        #: Why the last write failed (a full disk), until one succeeds; shown in ``devplug status``.
        self.write_error: str | None = None
        #: Until when (``time.monotonic()``) the filesystem is known to have room (see :meth:`check_room`).
        self._roomy_until = 0.0
        self.recovered_from_corruption: Path | None = None
        #: True once the snapshot is known to be on disk (loaded, or written by a compaction): from then on its
        #: disappearance is a loss (see :meth:`check_present`).
        self._snapshot_on_disk = False
        #: Why allocations are refused: a file of the ledger vanished while the daemon ran (None: none did).
        self.vanished: str | None = None

    # --- reading

    def load(self, sink: LoadSink, *, readonly: bool = False) -> bool:
        """Read the snapshot and replay the journal segments written after it into ``sink``; False when neither
        holds anything (a first start, or a lost ledger).

        A snapshot that is not a ledger of this resource at all (not JSON,
        another format or resource) is moved aside (``ledger.json.corrupt-<time>``)
        with an error log line, and the ledger starts from the journal alone.
        A torn journal tail (a power loss) is dropped with a log line. With
        ``readonly`` nothing is moved, deleted or opened for writing.
        """
        self._snapshot_seq = 0
        snapshot_found = self._load_snapshot(sink, readonly)
        found = segments(self.path)
        if not snapshot_found and found and found[0][0] > 1 and not readonly and not self.recovered_from_corruption:
            log.warning(
                "[%s] the allocation ledger %s is missing, but its journal starts at %s: a compaction wrote it "
                "before and it was deleted since; the records it held are lost (only the journal's changes since "
                "are loaded)",
                self.resource_name,
                self.path,
                found[0][1].name,
            )
        replayed = self._replay_journal(sink, readonly)
        if not readonly:
            newest = max([self._snapshot_seq, *(seq for seq, _ in segments(self.path))])
            self._segment.close()
            self._segment = JournalSegment(segment_path(self.path, newest + 1))  # never append after a torn tail
            self._snapshot_on_disk = snapshot_found
            self.vanished = None
        return snapshot_found or replayed

    def _load_snapshot(self, sink: LoadSink, readonly: bool) -> bool:
        try:
            raw = read_state_file(self.path, f"the allocation ledger of {self.resource_name}")
        except FileNotFoundError:
            return False
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
        sink.kept_quarantine(kept)
        for index, entry in enumerate(entries):
            sink.put(entry, f"record #{index}", index)
        return True

    def _replay_journal(self, sink: LoadSink, readonly: bool) -> bool:
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
                    sink.put(entry["put"], f"journal {path.name} entry #{number}", number)
                elif isinstance(entry.get("del"), str):
                    sink.delete(entry["del"])
                elif isinstance(entry.get("unquarantine"), str):
                    sink.unquarantine(entry["unquarantine"])
                else:
                    log.error("[%s] %s entry #%d is neither put nor del; ignored", self.resource_name, path, number)
        return replayed

    # --- a file vanishing under the daemon

    def _missing(self) -> Path | None:
        """The ledger's file that vanished while the daemon ran: the snapshot it loaded or wrote, or the journal
        segment it appends to (open, its last name gone); None when neither did."""
        if self._snapshot_on_disk:
            try:
                os.lstat(self._path_text)
            except FileNotFoundError:
                return self.path
            except OSError:
                pass  # unreadable is not gone: the writes say what is wrong
        fd = self._segment.fd
        if fd is not None:
            with contextlib.suppress(OSError):
                if os.fstat(fd).st_nlink == 0:
                    return self._segment.path
        return None

    def _notice_loss(self, snapshot: Callable[[int], bytes]) -> None:
        """Once a file of the ledger is found gone: a WARNING naming it, the records in memory written back as a
        new snapshot (``snapshot(journal_seq)`` makes its bytes), and :attr:`vanished` set (allocations refused)."""
        if self.vanished is not None:
            return
        gone = self._missing()
        if gone is None:
            return
        folder = self.path.parent
        self.vanished = (
            f"{self.resource_name}: the allocation ledger's file {gone} vanished while the daemon ran (deleted or "
            f"moved by something else); new allocations are refused until the daemon is restarted, once what "
            f"removes files from {folder} is found (the records held are written back to {self.path})"
        )
        log.warning("[%s] %s", self.resource_name, self.vanished.split(": ", 1)[1])
        self._on_written()  # the status shows it
        running = self._compacting

        async def write_back() -> None:
            if running is not None:  # one compaction at a time: each rotates the segment
                with contextlib.suppress(Exception):
                    await running
            await self.compact(snapshot, force=True)

        self._compacting = asyncio.get_running_loop().create_task(write_back())

    def check_present(self, snapshot: Callable[[int], bytes]) -> None:
        """Raise :class:`~devplug.errors.StateWriteError` naming the file when a file of the ledger vanished while
        the daemon ran (found now or before; see the module); ``snapshot`` makes the snapshot written back."""
        self._notice_loss(snapshot)
        if self.vanished is not None:
            raise StateWriteError(f"{self.vanished}; nothing was allocated", no_space=False)

    # --- writing

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

    async def append(self, frames: bytes, *, sync: bool) -> None:
        """Append journal frames with one plain ``write()`` (and ``fdatasync`` in a thread when ``sync``);
        ``OSError`` keeps the failure as :attr:`write_error` until a write succeeds."""
        started = time.perf_counter()
        try:
            self._segment.append(frames)
            if sync:
                await asyncio.to_thread(sync_and_close, self._segment.sync_handle())
        except OSError as exc:
            self._write_failed(exc)
            raise
        self._observer.ledger_written("journal", time.perf_counter() - started)

    def written(self, snapshot: Callable[[int], bytes], *, look: bool = True) -> None:
        """A save is over (whether it wrote or not): clear the failure, look whether a file of the ledger vanished
        (unless ``look`` is False: the caller looked just before and will look again before it answers), and
        schedule the compaction it may call for; ``snapshot(journal_seq)`` makes the snapshot's bytes."""
        self.write_error = None
        if look:
            self._notice_loss(snapshot)
        self._on_written()
        self._schedule_compaction(snapshot)

    def _write_failed(self, exc: OSError) -> None:
        """Keep why the journal cannot be written as :attr:`write_error` (until a save succeeds) and report it."""
        self.write_error = f"cannot write {self._segment.path}: {exc.strerror or exc} (at {time.time():.0f})"
        self._on_written()

    def _schedule_compaction(self, snapshot: Callable[[int], bytes]) -> None:
        if self._compacting is not None and not self._compacting.done():
            return
        loop = asyncio.get_running_loop()
        if self._segment.size >= COMPACT_BYTES:
            self._compacting = loop.create_task(self.compact(snapshot))
            return
        self._last_write = loop.time()
        if self._segment.size and self._idle_timer is None:  # one timer, not a cancel and a new one per save
            self._idle_timer = loop.call_later(COMPACT_IDLE_S, self._compact_when_idle, snapshot)

    def _compact_when_idle(self, snapshot: Callable[[int], bytes]) -> None:
        """Compact once no save came for :data:`COMPACT_IDLE_S`; a save meanwhile moves the check later."""
        self._idle_timer = None
        if not self._segment.size:
            return
        loop = asyncio.get_running_loop()
        quiet_for = loop.time() - self._last_write
        if quiet_for < COMPACT_IDLE_S:
            self._idle_timer = loop.call_later(COMPACT_IDLE_S - quiet_for, self._compact_when_idle, snapshot)
        elif self._compacting is None or self._compacting.done():
            self._compacting = loop.create_task(self.compact(snapshot))

    @property
    def snapshot_seq(self) -> int:
        """The last journal segment the snapshot on disk covers."""
        return self._snapshot_seq

    async def compact(self, snapshot: Callable[[int], bytes], *, force: bool = False) -> None:
        """Fold the journal into a new snapshot (atomic, fsynced, in the writer thread), then drop old segments.

        New changes go to a fresh segment from the moment the snapshot is
        taken, so nothing is lost whatever the order of crashes. A failure
        (a full disk) is logged and retried at the next compaction. ``force``:
        write the snapshot even when nothing was journaled since the last one
        (it vanished).
        """
        covered = int(self._segment.path.name.rsplit(".", 1)[1])
        if not force and not self._segment.size and not any(seq <= covered for seq, _ in segments(self.path)):
            return  # nothing journaled since the last snapshot
        data = snapshot(covered)
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
        self._snapshot_on_disk = True
        for seq, path in segments(self.path):
            if seq <= covered:
                with contextlib.suppress(OSError):
                    path.unlink()

    def close(self) -> None:
        """Close the journal segment (at shutdown)."""
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._segment.close()
