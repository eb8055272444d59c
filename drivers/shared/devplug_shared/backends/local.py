"""The ``local`` backend: claims in an SQLite file, for one node or several daemons on one machine.

::

    coordination = { backend = "local" }                      # <state dir>/.../driver/slots.sqlite
    coordination = { backend = "local", path = "/var/lib/devplug-shared/slots.sqlite", lease_ttl = 10.0 }

The same semantics as etcd's: each node has one lease row (``node``,
``lease_id``, ``expires`` = last renewal + ``lease_ttl``, ``held_until`` =
last renewal + ``hold_ttl``), renewed while the daemon lives; a claim row names
the slot, its holder and the lease it hangs on. A node whose ``expires``
passed has a daemon that stopped renewing; its claims stand until
``held_until`` (its pods may still use the slots), and are dead after it. A
restart before then resumes the lease (claims kept); after it, the node starts
a new lease and its old claims are dead. Every change runs in an ``IMMEDIATE``
transaction (SQLite's writer lock), so a claim of several slots is all or
nothing. Daemons sharing the file must share a clock (one machine); a file that
stays locked past ``timeout`` counts as an unreachable store. A file written
before ``held_until`` existed gets the column; its rows hold until ``expires``.

:meth:`LocalBackend.watch` tells the driver at once when another daemon commits
to the file (inotify on its folder), so a slot freed on one node is seen on the
others without waiting for their next read.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from devplug.host.watch import DirectoryWatcher
from devplug_shared.backends.common import check_absolute, check_seconds
from devplug_shared.slots import Claim, SlotTakenError, StoreUnavailableError, sorted_slots

__all__ = ["LocalBackend", "LocalOptions"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (node TEXT PRIMARY KEY, lease_id TEXT NOT NULL, expires REAL NOT NULL,
                                   renewed REAL NOT NULL);
CREATE TABLE IF NOT EXISTS claims (resource TEXT NOT NULL, slot TEXT NOT NULL, holder TEXT NOT NULL,
                                   lease_id TEXT NOT NULL, since REAL NOT NULL, PRIMARY KEY (resource, slot));
"""


@dataclass(frozen=True)
class LocalOptions:
    """``path``: the SQLite file (default in the driver's state folder); ``lease_ttl``, ``hold_ttl``,
    ``timeout`` (seconds)."""

    path: Path | None = None
    lease_ttl: float = 10.0
    hold_ttl: float = 360.0
    timeout: float = 5.0

    def __post_init__(self) -> None:
        check_absolute("path", self.path)
        check_seconds("lease_ttl", self.lease_ttl, 1.0, 3600.0)
        check_seconds("hold_ttl", self.hold_ttl, 1.0, 86400.0)
        if self.hold_ttl < self.lease_ttl:
            raise ValueError(
                f"hold_ttl: {self.hold_ttl!r} is shorter than lease_ttl ({self.lease_ttl!r}); claims must stand at "
                "least as long as the daemon that holds them counts as alive"
            )
        check_seconds("timeout", self.timeout, 0.05, 60.0)


class LocalBackend:
    """Slot claims in an SQLite database file."""

    def __init__(self, options: LocalOptions, *, node: str, resource: str, state_dir: Path) -> None:
        self.options = options
        self.node = node
        self.resource = resource
        self.path = Path(options.path) if options.path is not None else state_dir / "slots.sqlite"
        self.description = f"sqlite file {self.path}"
        self._db: sqlite3.Connection | None = None
        self._lease_id: str | None = None
        self._lock = threading.Lock()
        #: SQLite's ``data_version`` of this connection when :meth:`watch` last looked (None: not yet).
        self._data_version: int | None = None

    @contextmanager
    def _txn(self, action: str, slots: Sequence[str] = ()) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction; SQLite errors become :class:`StoreUnavailableError` naming the action."""
        with self._lock:
            try:
                if self._db is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    db = sqlite3.connect(
                        self.path, timeout=self.options.timeout, isolation_level=None, check_same_thread=False
                    )
                    db.executescript(_SCHEMA)
                    columns = {row[1] for row in db.execute("PRAGMA table_info(leases)")}
                    if "held_until" not in columns:  # a file of an earlier version: its rows hold until expires
                        db.execute("ALTER TABLE leases ADD COLUMN held_until REAL")
                    self._db = db
                db = self._db
                db.execute("BEGIN IMMEDIATE")
                try:
                    yield db
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StoreUnavailableError.of(self.description, action, slots, exc) from exc
            except OSError as exc:
                raise StoreUnavailableError.of(self.description, action, slots, exc) from exc

    def open(self) -> None:
        """Resume this node's lease while its claims still stand, else start a new one (old claims are then dead)."""
        now = time.time()
        with self._txn("start the node's lease") as db:
            row = db.execute(
                "SELECT lease_id, COALESCE(held_until, expires) FROM leases WHERE node = ?", (self.node,)
            ).fetchone()
            lease_id = str(row[0]) if row is not None and row[1] > now else uuid.uuid4().hex
            db.execute(
                "INSERT OR REPLACE INTO leases (node, lease_id, expires, renewed, held_until) VALUES (?, ?, ?, ?, ?)",
                (self.node, lease_id, now + self.options.lease_ttl, now, now + self.options.hold_ttl),
            )
        self._lease_id = lease_id

    def keepalive(self, held: Sequence[str]) -> bool:
        """Push the lease ``lease_ttl`` and its claims ``hold_ttl`` ahead; False if the hold had run out (the
        node's claims are dead)."""
        now = time.time()
        with self._txn("renew the node's lease", held) as db:
            cur = db.execute(
                "UPDATE leases SET expires = ?, renewed = ?, held_until = ? "
                "WHERE node = ? AND lease_id = ? AND COALESCE(held_until, expires) > ?",
                (now + self.options.lease_ttl, now, now + self.options.hold_ttl, self.node, self._lease_id, now),
            )
            return cur.rowcount == 1

    def _live(self, db: sqlite3.Connection, now: float) -> dict[str, Claim]:
        rows = db.execute(
            "SELECT c.slot, c.holder, c.since, l.renewed, l.expires, COALESCE(l.held_until, l.expires) "
            "FROM claims c JOIN leases l ON l.node = c.holder AND l.lease_id = c.lease_id "
            "WHERE c.resource = ? AND COALESCE(l.held_until, l.expires) > ?",
            (self.resource, now),
        ).fetchall()
        claims = {}
        for slot, holder, since, renewed, expires, held_until in rows:
            kept = None
            if expires <= now and holder != self.node:
                until = time.strftime("%H:%M:%S", time.localtime(float(held_until)))
                kept = (
                    f"kept: node {holder}'s daemon stopped renewing its lease; its claims stand until {until} "
                    "(hold_ttl after its last renewal), as its pods may still use them"
                )
            claims[str(slot)] = Claim(str(slot), str(holder), float(since), float(renewed), kept)
        return claims

    def claim(self, slots: Sequence[str]) -> None:
        """Claim all of ``slots`` in one transaction, or none (:class:`SlotTakenError` naming the holder)."""
        now = time.time()
        ordered = sorted_slots(slots)
        with self._txn("claim slot(s)", ordered) as db:
            live = self._live(db, now)
            for slot in ordered:
                claim = live.get(slot)
                if claim is not None and claim.holder != self.node:
                    raise SlotTakenError.of(self.resource, claim)
            for slot in ordered:
                mine = live.get(slot)
                db.execute(
                    "INSERT OR REPLACE INTO claims (resource, slot, holder, lease_id, since) VALUES (?, ?, ?, ?, ?)",
                    (self.resource, slot, self.node, self._lease_id, mine.since if mine is not None else now),
                )

    def release(self, slots: Sequence[str]) -> None:
        """Delete this node's claims on ``slots``."""
        ordered = sorted_slots(slots)
        with self._txn("release slot(s)", ordered) as db:
            db.executemany(
                "DELETE FROM claims WHERE resource = ? AND slot = ? AND holder = ?",
                [(self.resource, slot, self.node) for slot in ordered],
            )

    def holders(self) -> Mapping[str, Claim]:
        """Every live claim on this resource."""
        with self._txn("read the slots' holders") as db:
            return self._live(db, time.time())

    def watch(self, changed: Callable[[], None]) -> DirectoryWatcher | None:
        """Call ``changed`` (in a thread of the watch's) soon after another connection committed to the file; None
        when the folder can only be polled (``DEVPLUG_WATCH_POLL=1``, no inotify): the driver's periodic read then
        does that job, at no extra cost.

        Fast path (issue 42): a claim another daemon deletes is read at once instead of at the next
        ``refresh_interval`` read, which saved up to that interval (1 s by default, half on average) of every
        hand-over. inotify reports the folder's changes; the file's and its journal's wake the check, which
        compares SQLite's ``data_version`` (unchanged by this connection's own commits, so this node's claims and
        renewals wake nobody here). The last event of a transaction comes after its commit (the journal deleted,
        or the WAL's commit frame written), so no commit is checked for too early. Another node's lease renewal
        (every third of ``lease_ttl``) also wakes one read.
        """
        own = {self.path.name + suffix for suffix in ("", "-journal", "-wal")}

        def on_change(names: frozenset[str]) -> None:
            if names and names.isdisjoint(own):
                return  # other files in the folder (a state folder's own files)
            if self._committed_elsewhere():
                changed()

        self.path.parent.mkdir(parents=True, exist_ok=True)
        watcher = DirectoryWatcher(self.path.parent, on_change)
        if not watcher.uses_inotify:
            return None
        watcher.start()
        if not watcher.uses_inotify:  # inotify could not be set up after all: the watcher polls
            watcher.close()
            return None
        return watcher

    def _committed_elsewhere(self) -> bool:
        """Whether another connection committed to the file since the last look (True when it cannot tell)."""
        with self._lock:
            db = self._db
            if db is None:
                return True
            try:
                version = int(db.execute("PRAGMA data_version").fetchone()[0])
            except sqlite3.Error:
                return True
            seen, self._data_version = self._data_version, version
        return version != seen

    def close(self) -> None:
        """Close the file; the lease row stays and expires on its own."""
        with self._lock:
            db, self._db = self._db, None
        if db is not None:
            db.close()
