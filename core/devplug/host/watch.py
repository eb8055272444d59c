"""Directory watching for hot-plug: be told which entries of a folder changed.

A driver whose devices appear as files (``/dev`` nodes, sysfs entries, a mock
folder) starts a :class:`DirectoryWatcher` in its ``start`` hook and pushes what
changed through the :class:`~devplug.DriverContext`::

    self._watcher = DirectoryWatcher(folder, self._on_change)
    self._watcher.start()
    ...
    def _on_change(self, names: frozenset[str]) -> None:
        if not names:          # rescan everything
            ctx.set_devices(self.list_devices())
        else:
            ...                # re-read only ``names``

On Linux the watcher uses inotify and sleeps in ``poll(2)`` until the kernel
reports a change: no wake-ups while idle. Everywhere else, or when the
environment sets ``DEVPLUG_WATCH_POLL=1``, it compares ``os.scandir``
snapshots every ``poll_interval`` seconds. Either way the callback runs in the
watcher's own daemon thread, gets the names of the changed entries, and gets
an empty set when it must rescan everything: the kernel's event queue
overflowed, or the folder itself was deleted, moved or (re)created. A folder
that is missing (at start or later) is looked for again every
``poll_interval`` seconds; so is a path that is not a folder (a file put in
its place) or cannot be watched (no permission).

The watcher never stops by itself: an unexpected error in its thread is
logged and the watch restarted after a capped backoff
(:data:`RESTART_BACKOFF`), with a rescan once it is armed again. While the
watch cannot do its job (the path is not a folder, cannot be read, or the
thread is waiting to restart) :attr:`DirectoryWatcher.problem` says why, and
``on_problem`` is told at every change; a driver passes its
:meth:`devplug.DriverContext.report_problem`, so that ``devplug status`` and
``/readyz`` name the problem meanwhile::

    DirectoryWatcher(folder, self._on_change, on_problem=ctx.report_problem)
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from devplug.backoff import CappedBackoff
from devplug.host.inotify import (
    IN_ATTRIB,
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_MODIFY,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_ONLYDIR,
    IN_Q_OVERFLOW,
    IN_UNMOUNT,
    Inotify,
    inotify,
)

__all__ = ["POLL_ENV", "RESTART_BACKOFF", "DirectoryWatcher"]

#: Set to ``1`` to make every watcher poll instead of using inotify.
POLL_ENV = "DEVPLUG_WATCH_POLL"

log = logging.getLogger("devplug.host.watch")

#: How long the watcher waits before restarting after an unexpected error: 0.5 s, doubling, at most 30 s. A watch
#: that then ran for ``retry_max`` seconds starts again from ``retry_min`` after its next failure.
RESTART_BACKOFF = CappedBackoff(retry_min=0.5, retry_max=30.0)

_WATCH_MASK = (
    IN_CREATE
    | IN_DELETE
    | IN_MODIFY
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_ATTRIB
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
)
# The watched folder is gone (or its watch was dropped): re-arm and rescan.
_GONE = IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT | IN_IGNORED

_EVENT_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name
_READ_SIZE = 64 * 1024

_Snapshot = dict[str, tuple[int, int, int]]


_inotify_lib: Inotify | None = inotify


def _snapshot(directory: Path) -> _Snapshot | None:
    """Name -> (inode, mtime_ns, size) of every entry, or ``None`` if the folder is missing; ``OSError`` when the
    path is not a folder or cannot be read."""
    snap: _Snapshot = {}
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                snap[entry.name] = (st.st_ino, st.st_mtime_ns, st.st_size)
    except FileNotFoundError:
        return None
    return snap


def _unwatchable(directory: Path, exc: OSError, every: float) -> str:
    """Why ``directory`` cannot be watched, for :attr:`DirectoryWatcher.problem`."""
    what = "is not a folder" if exc.errno == errno.ENOTDIR else f"cannot be watched ({exc.strerror or exc})"
    return f"{directory} {what}; looking for the folder every {every:g} s"


def _diff(old: _Snapshot, new: _Snapshot) -> frozenset[str]:
    return frozenset(name for name in old.keys() | new.keys() if old.get(name) != new.get(name))


class DirectoryWatcher:
    """Calls ``callback(names)`` from a background thread when entries of ``directory`` change.

    ``names`` holds the names (not paths) of the entries created, deleted,
    modified, renamed or whose attributes changed since the last call; an empty
    set means "rescan everything". Changes reported by one read of the kernel's
    queue (or one polling round) come in one call. The callback runs in the
    watcher's thread, one call at a time; an exception it raises is logged and
    the watcher goes on.

    ``on_problem``, when given, is called (in the watcher's thread, or in the
    caller's during :meth:`start`) with :attr:`problem` each time it changes:
    a one-line reason while the watch cannot do its job, ``None`` once it
    works again (see the module docstring).

    Use :meth:`start` and :meth:`close`, or the watcher as a context manager
    (which starts it on entry and closes it on exit).

    With ``each_write=False`` (inotify only) a file's new content is reported
    once its writer closes it (``IN_CLOSE_WRITE``), or when a file is renamed
    into place, and not at every ``write``: for folders that also hold a file a
    long-lived writer appends to while keeping it open (the mock's call log),
    whose appends would otherwise wake the watcher for nothing. Writers that
    keep a device file open and change it in place need the default.
    """

    def __init__(
        self,
        directory: Path,
        callback: Callable[[frozenset[str]], None],
        *,
        poll_interval: float = 1.0,
        each_write: bool = True,
        on_problem: Callable[[str | None], None] | None = None,
    ) -> None:
        if poll_interval <= 0:
            raise ValueError(f"DirectoryWatcher: poll_interval must be > 0 seconds, got {poll_interval!r}")
        self.directory = Path(directory)
        self.poll_interval = float(poll_interval)
        self._mask = _WATCH_MASK if each_write else _WATCH_MASK & ~IN_MODIFY
        self._callback = callback
        self._on_problem = on_problem
        #: Why the watch cannot do its job now (the path is not a folder or unreadable, the thread restarts after
        #: an error), or ``None`` while it works (a missing folder included: it is looked for, as documented).
        self.problem: str | None = None
        self._problem_lock = threading.Lock()  # start() holds _lock while it arms the watch
        #: True when the inotify path is active (decided for good by :meth:`start`).
        self.uses_inotify: bool = _inotify_lib is not None and os.environ.get(POLL_ENV, "") not in {"1"}
        self._lock = threading.Lock()
        #: Held while queued changes are read and delivered: by the thread, or by :meth:`sync`.
        self._delivering = threading.RLock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._released = False
        self._wake_r = -1
        self._wake_w = -1
        self._ifd = -1
        self._wd: int | None = None
        self._snap: _Snapshot | None = None

    # --- public

    def start(self) -> None:
        """Arm the watch and start the watcher thread.

        Returns once the watch is armed: a change made after ``start`` returns
        is reported. A missing folder is not an error: the watcher looks for it
        every ``poll_interval`` and reports an empty set when it appears. Nor
        is a path that is not a folder or cannot be read: the watcher looks
        for the folder the same way, with :attr:`problem` set meanwhile.
        Raises ``RuntimeError`` when started twice or after :meth:`close`, and
        ``OSError`` when the process has no file descriptor left.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("DirectoryWatcher.start: the watcher is closed")
            if self._thread is not None:
                raise RuntimeError("DirectoryWatcher.start: already started")
            self._wake_r, self._wake_w = os.pipe()
            try:
                os.set_blocking(self._wake_w, False)
                if self.uses_inotify:
                    self._arm_inotify()
                if not self.uses_inotify:
                    self._snap = self._take_snapshot()
            except BaseException:
                self._release_fds()
                raise
            self._thread = threading.Thread(target=self._run, name=f"devplug-watch:{self.directory}", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the watcher thread and release its file descriptors.

        Wakes the thread at once (no timeout to wait out) and returns once it
        has ended, unless called from the callback itself, in which case the
        thread ends when the callback returns. Safe to call more than once,
        and before :meth:`start`.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            if thread is None:
                return
            with contextlib.suppress(BlockingIOError):  # pipe full: the thread is being woken anyway
                os.write(self._wake_w, b"x")
        if thread is not threading.current_thread():
            thread.join()
            self._release_fds()  # _closed is set for good: no lock needed to decide

    def sync(self) -> None:
        """Deliver, before returning and in the calling thread, every change made before the call.

        The kernel queues an inotify event within the system call that made
        the change, so after ``sync`` the callback has seen every change made
        before it, whatever the watcher's thread was doing: a driver can then
        answer from what its callback keeps instead of re-reading every file.
        When polling, ``sync`` compares a fresh snapshot at once. The callback
        runs under the same lock as the thread's calls, so still one at a
        time. Does nothing before :meth:`start`, after :meth:`close`, or while
        the folder is missing (the thread reports it when it appears).
        """
        with self._lock:
            if self._thread is None or self._closed:
                return
        with self._delivering:
            if self._released:  # closed meanwhile
                return
            if self.uses_inotify:
                if self._wd is not None:
                    self._deliver_queued()
            else:
                self._deliver_poll()

    def __enter__(self) -> DirectoryWatcher:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        how = "inotify" if self.uses_inotify else f"polling every {self.poll_interval}s"
        return f"<DirectoryWatcher {str(self.directory)!r} ({how})>"

    # --- setup and teardown

    def _arm_inotify(self) -> None:
        assert _inotify_lib is not None
        try:
            self._ifd = _inotify_lib.init()
        except OSError as exc:  # e.g. EMFILE: fs.inotify.max_user_instances reached
            log.warning("inotify unavailable for %s (%s); polling every %ss", self.directory, exc, self.poll_interval)
            self.uses_inotify = False
            return
        self._wd = self._try_add_watch()

    def _release_fds(self) -> None:
        with self._delivering:  # never under a sync() that reads the inotify descriptor
            if self._released:
                return
            self._released = True
            for fd in (self._ifd, self._wake_r, self._wake_w):
                if fd >= 0:
                    os.close(fd)
            self._ifd = self._wake_r = self._wake_w = -1

    # --- the thread

    def _try_add_watch(self) -> int | None:
        """The watch descriptor, or ``None`` when the folder does not exist (yet), is not a folder or cannot be
        watched (then with :attr:`problem` set)."""
        assert _inotify_lib is not None
        try:
            wd = _inotify_lib.add_watch(self._ifd, self.directory, self._mask)
        except FileNotFoundError:
            self._set_problem(None)
            return None
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.EBADF, errno.ENOSPC):
                raise  # not the path's doing: the thread restarts
            self._set_problem(_unwatchable(self.directory, exc, self.poll_interval))
            return None
        self._set_problem(None)
        return wd

    def _take_snapshot(self) -> _Snapshot | None:
        """A snapshot, or ``None`` when the folder is missing, is not a folder or cannot be read (then with
        :attr:`problem` set)."""
        try:
            snap = _snapshot(self.directory)
        except OSError as exc:
            self._set_problem(_unwatchable(self.directory, exc, self.poll_interval))
            return None
        self._set_problem(None)
        return snap

    def _set_problem(self, problem: str | None) -> None:
        """Note why the watch cannot do its job (``None``: it works); log and tell ``on_problem`` of a change."""
        with self._problem_lock:
            if problem == self.problem:
                return
            self.problem = problem
        if problem is not None:
            log.warning("the watch on %s cannot do its job: %s", self.directory, problem)
        else:
            log.info("the watch on %s works again", self.directory)
        if self._on_problem is not None:
            try:
                self._on_problem(problem)
            except Exception:
                log.exception("on_problem of the watcher on %s failed", self.directory)

    def _notify(self, names: frozenset[str]) -> None:
        if self._closed:
            return
        try:
            self._callback(names)
        except Exception:
            log.exception("callback of the watcher on %s failed with names %s", self.directory, sorted(names))

    def _run(self) -> None:
        """Watch until :meth:`close`; after an unexpected error, restart with backoff (the module docstring)."""
        failures = 0
        try:
            while not self._closed:
                started = time.monotonic()
                try:
                    if self.uses_inotify:
                        self._run_inotify()
                    else:
                        self._run_polling()
                    return  # closed
                except Exception as exc:
                    if self._closed:
                        return
                    if time.monotonic() - started >= RESTART_BACKOFF.retry_max:
                        failures = 0  # it worked for a while: start the backoff again
                    failures += 1
                    delay = RESTART_BACKOFF.delay(failures)
                    log.exception("the watcher on %s failed; restarting it in %g s", self.directory, delay)
                    self._set_problem(
                        f"the watch on {self.directory} failed ({type(exc).__name__}: {exc}); restarting it in "
                        f"{delay:g} s"
                    )
                    if not self._sleep(delay):
                        return
                    self._rearm()
        finally:
            with self._lock:
                closed = self._closed
            if closed:
                self._release_fds()

    def _sleep(self, seconds: float) -> bool:
        """Wait ``seconds``; False when woken by :meth:`close`."""
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        self._wait(poller, seconds)
        return not self._closed

    def _rearm(self) -> None:
        """Drop the watch so the loop arms it again and reports a rescan once the folder is there (after an
        unexpected error: whatever happened meanwhile was missed)."""
        with self._delivering:
            if self.uses_inotify:
                assert _inotify_lib is not None
                if self._wd is not None:
                    with contextlib.suppress(OSError):
                        _inotify_lib.rm_watch(self._ifd, self._wd)
                    self._wd = None
            else:
                self._snap = None

    def _wait(self, poller: select.poll, timeout: float | None) -> list[int]:
        """The ready file descriptors, or ``[]`` on timeout or when woken to close."""
        ms = None if timeout is None else max(1, int(timeout * 1000))
        while True:
            try:
                ready = [fd for fd, _ in poller.poll(ms)]
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries poll itself
                continue
        if self._wake_r in ready:
            return []
        return ready

    def _run_polling(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        while not self._closed:
            self._wait(poller, self.poll_interval)
            if self._closed:
                return
            with self._delivering:
                self._deliver_poll()

    def _deliver_poll(self) -> None:
        """Compare a fresh snapshot with the last one and report the difference (``_delivering`` held)."""
        snap = self._take_snapshot()
        old, self._snap = self._snap, snap
        if old is None or snap is None:
            if old is not snap:  # the folder appeared or vanished
                self._notify(frozenset())
            return
        changed = _diff(old, snap)
        if changed:
            self._notify(changed)

    def _run_inotify(self) -> None:
        assert _inotify_lib is not None
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        poller.register(self._ifd, select.POLLIN)
        while not self._closed:
            if self._wd is None:
                # The folder is missing: look for it again every poll_interval.
                self._wait(poller, self.poll_interval)
                if self._closed:
                    return
                with self._delivering:
                    with contextlib.suppress(OSError):
                        self._drain()  # stale events of the old watch
                    self._wd = self._try_add_watch()
                    if self._wd is not None:
                        log.info("watching %s again", self.directory)
                        self._notify(frozenset())
                continue
            if not self._wait(poller, None) or self._closed:
                continue
            with self._delivering:
                self._deliver_queued()

    def _deliver_queued(self) -> None:
        """Read the kernel's queue and report what changed (``_delivering`` held; the watch is armed)."""
        assert _inotify_lib is not None and self._wd is not None
        names, rescan, gone = self._read_events()
        if gone:
            _inotify_lib.rm_watch(self._ifd, self._wd)
            self._wd = self._try_add_watch()
            if self._wd is None:
                log.warning("%s is gone; looking for it every %ss", self.directory, self.poll_interval)
        if rescan or gone:
            self._notify(frozenset())
        elif names:
            self._notify(frozenset(names))

    def _drain(self) -> bytes:
        chunks = []
        while True:
            try:
                chunk = os.read(self._ifd, _READ_SIZE)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)

    def _read_events(self) -> tuple[set[str], bool, bool]:
        """Everything queued: (changed names, queue overflowed, the folder itself is gone)."""
        data = self._drain()
        names: set[str] = set()
        rescan = gone = False
        offset = 0
        while offset + _EVENT_HEADER.size <= len(data):
            wd, mask, _cookie, length = _EVENT_HEADER.unpack_from(data, offset)
            offset += _EVENT_HEADER.size
            raw = data[offset : offset + length]
            offset += length
            if mask & IN_Q_OVERFLOW:
                rescan = True
                continue
            if wd != self._wd:
                continue  # a watch dropped earlier
            if mask & _GONE:
                gone = True
                continue
            name = os.fsdecode(raw.split(b"\0", 1)[0])
            if name:
                names.add(name)
        return names, rescan, gone
