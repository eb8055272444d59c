"""An append-only journal of ledger changes: length- and checksum-framed entries, written with plain ``write()``.

Each frame is a little-endian ``u32`` payload length, the payload's ``u32``
CRC-32, then the payload (one JSON object). A frame is appended with one
``write()`` to a file opened ``O_APPEND``: once it returns, the bytes are in the
kernel's page cache and survive ``kill -9`` of the daemon (the kernel writes
them out on its own); only a power loss or a kernel crash can lose or tear the
tail, and :func:`read_journal` drops a torn tail (and says so) instead of
failing. Callers that must survive a power loss too pass ``sync=True`` (one
``fdatasync``).

A ledger is a snapshot (``ledger.json``, written atomically and fsynced by
compaction) plus the journal segments written after it
(``ledger.journal.<seq>``); see :class:`~devplug.engine.ledger.Ledger`.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devplug.engine.statedir import read_state_file
from devplug.text.compactjson import compact_json

__all__ = [
    "JournalSegment",
    "encode_frame",
    "frame_payload",
    "read_journal",
    "segment_path",
    "segments",
    "sync_and_close",
]

_HEADER = struct.Struct("<II")
#: A frame larger than this is taken for garbage (a torn length), not allocated.
MAX_FRAME = 16 * 1024 * 1024


def encode_frame(entry: dict[str, Any]) -> bytes:
    """One entry as a frame."""
    return frame_payload(compact_json(entry).encode())


def frame_payload(payload: bytes) -> bytes:
    """An entry already encoded as JSON (``payload``) as a frame."""
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def read_journal(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """Every whole entry of a segment, in order, and why the rest was dropped (None when nothing was).

    Read as every state file is (:func:`~devplug.engine.statedir.read_state_file`): a FIFO or a link planted as a
    segment is a :class:`~devplug.errors.StateError`, never a read that blocks."""
    data = read_state_file(path, "a segment of the allocation journal")
    entries: list[dict[str, Any]] = []
    offset = 0
    while offset < len(data):
        if len(data) - offset < _HEADER.size:
            return entries, f"a torn frame header at byte {offset}"
        length, crc = _HEADER.unpack_from(data, offset)
        start = offset + _HEADER.size
        if length > MAX_FRAME or start + length > len(data):
            return entries, f"a torn frame at byte {offset} ({length} bytes announced)"
        payload = data[start : start + length]
        if zlib.crc32(payload) != crc:
            return entries, f"a frame with a bad checksum at byte {offset}"
        try:
            entry = json.loads(payload)
        except ValueError:
            return entries, f"a frame that is not JSON at byte {offset}"
        if not isinstance(entry, dict):
            return entries, f"a frame that is not an object at byte {offset}"
        entries.append(entry)
        offset = start + length
    return entries, None


def segment_path(ledger_path: Path, seq: int) -> Path:
    return ledger_path.with_name(f"{ledger_path.name.removesuffix('.json')}.journal.{seq}")


def segments(ledger_path: Path) -> list[tuple[int, Path]]:
    """The journal segments beside ``ledger_path``, by sequence number."""
    prefix = f"{ledger_path.name.removesuffix('.json')}.journal."
    found = []
    try:
        names = os.listdir(ledger_path.parent)
    except FileNotFoundError:
        return []
    for name in names:
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            found.append((int(name[len(prefix) :]), ledger_path.parent / name))
    return sorted(found)


@dataclass
class JournalSegment:
    """The segment being appended to: opened on first use (``O_APPEND``, no symlink followed), closed on rotation."""

    path: Path
    fd: int | None = None
    size: int = 0

    def append(self, frames: bytes) -> None:
        """One ``write()`` of whole frames; ``OSError`` (ENOSPC...) leaves the file without them."""
        if self.fd is None:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
            self.fd = os.open(self.path, flags, 0o600)
            self.size = os.fstat(self.fd).st_size
        written = os.write(self.fd, frames)
        if written != len(frames):  # a short write to a regular file: the disk filled up mid-way
            os.ftruncate(self.fd, self.size)
            raise OSError(28, "No space left on device", str(self.path))
        self.size += written

    def sync_handle(self) -> int | None:
        """A duplicate of the segment's descriptor for an ``fdatasync`` in another thread (:func:`sync_and_close`),
        or None before the first append. The duplicate stays valid when the segment is closed meanwhile (a
        compaction rotates segments while the sync runs): a sync of ``self.fd`` from the thread could meet it
        closed (EBADF) or, worse, reused by another file, leaving these frames unsynced."""
        return os.dup(self.fd) if self.fd is not None else None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def sync_and_close(fd: int | None) -> None:
    """``fdatasync`` a descriptor of :meth:`JournalSegment.sync_handle` and close it (in a worker thread)."""
    if fd is None:
        return
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)
