"""One daemon per state folder: an exclusive lock naming its holder.

The lock file is opened with ``O_NOFOLLOW`` and must be a regular file of the
daemon's user: a link planted at its place would otherwise get the daemon's
PID written into (and later truncate) whatever it points to. It holds
``<pid> <start time>\n``, the start time in clock ticks since boot, so that a
reader can tell the daemon from a later owner of its pid
(:mod:`devplug.daemon.lockholder`).

A second lock of the same kind, ``handover.lock`` (:func:`handover_gate`), is
the gate to the state lock: an instance holds it while it takes the state lock,
and a handover's new instance for the whole handover (from its request until it
serves). So only the instance a handover is for can take the state lock the old
one lets go, and its request counts only while it holds the gate
(:func:`gate_holder`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from pathlib import Path

from devplug.daemon.lockholder import process_start_ticks
from devplug.errors import AlreadyRunningError, StateError

__all__ = ["GATE_FILE", "GATE_RETRY_S", "GATE_TRIES", "StateLock", "gate_holder", "handover_gate"]

#: The gate to the state lock (see the module docstring).
GATE_FILE = "handover.lock"
#: How often, ``GATE_RETRY_S`` apart, an instance tries the gate before it says a handover is in progress (an old
#: instance checking a request holds it shared for microseconds).
GATE_TRIES = 5
GATE_RETRY_S = 0.02


def _describe(pid_text: str) -> str:
    pid = pid_text.split(maxsplit=1)[0] if pid_text.split() else "?"
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        cmdline = ""
    return f"pid {pid}" + (f" ({cmdline})" if cmdline else "")


def _target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


class StateLock:
    """``<state dir>/devplug.lock``, held with ``flock`` for the daemon's lifetime (released by the kernel on exit)."""

    def __init__(self, state_dir: Path, name: str = "devplug.lock") -> None:
        self.path = state_dir / name
        self._fd: int | None = None
        self._waiting_fd: int | None = None  # open while try_acquire waits for the lock

    def acquire(self) -> None:
        """Take the lock or raise :class:`AlreadyRunningError` naming the process that holds it."""
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace")
            os.close(fd)
            raise AlreadyRunningError(
                f"another devplug daemon holds {self.path}: {_describe(holder)}; "
                "stop it first (two daemons would fight over the same resources)"
            ) from None
        self._own(fd)

    def holder(self) -> str:
        """The process the lock file names, described (``pid N (command line)``), or "" when it names none."""
        try:
            fd = self._open()
        except StateError:
            return ""
        try:
            text = os.pread(fd, 200, 0).decode(errors="replace")
        finally:
            os.close(fd)
        return _describe(text) if text.split() else ""

    def try_acquire(self) -> bool:
        """Take the lock if it is free, else False; the file stays open between tries (closing it would
        signal a close to whoever watches the lock file, the waiting side of a handover included)."""
        if self._fd is not None:
            return True
        if self._waiting_fd is None:
            self._waiting_fd = self._open()
        try:
            fcntl.flock(self._waiting_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fd, self._waiting_fd = self._waiting_fd, None
        self._own(fd)
        return True

    def _open(self) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, flags, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StateError(
                    f"{self.path}: the daemon lock is a symbolic link (to {_target(self.path)}); devplug does not "
                    "follow links in its state dir: remove it"
                ) from exc
            raise StateError(f"{self.path}: cannot open the daemon lock: {exc.strerror or exc}") from exc
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            os.close(fd)
            what = "is not a regular file" if not stat.S_ISREG(st.st_mode) else f"belongs to uid {st.st_uid}"
            raise StateError(
                f"{self.path}: the daemon lock {what}, not a file of the daemon's user (uid {os.geteuid()}); remove it"
            )
        return fd

    def _own(self, fd: int) -> None:
        os.ftruncate(fd, 0)
        pid = os.getpid()
        os.pwrite(fd, f"{pid} {process_start_ticks(pid)}\n".encode(), 0)
        self._fd = fd

    @property
    def held(self) -> bool:
        """Whether this process holds the lock."""
        return self._fd is not None

    def release(self) -> None:
        """Let the lock go (the kernel does it too when the process dies)."""
        if self._waiting_fd is not None:
            os.close(self._waiting_fd)
            self._waiting_fd = None
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None


def handover_gate(state_dir: Path) -> StateLock:
    """The gate to ``state_dir``'s state lock (``handover.lock``)."""
    return StateLock(state_dir, GATE_FILE)


def gate_holder(state_dir: Path) -> tuple[int, int | None] | None:
    """Who holds the gate of ``state_dir`` now, as its holder wrote it (``(pid, start ticks)``), or None when
    nobody holds it.

    The proof is the kernel's: a shared ``flock`` on the gate file fails only while a process holds it
    exclusively (a file's contents alone, which any process of the daemon's user can write, never make a holder).
    The pid and start time are those the holder wrote into the file once it held the lock (in the holder's PID
    namespace: the new pod's, which is not this one's, so ``/proc/locks`` cannot name it here). The shared lock is
    let go at once; a new instance trying the gate at that instant tries again (``GATE_TRIES``).
    """
    path = state_dir / GATE_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None  # no gate file, or a link planted at its place: nobody holds it
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            words = os.pread(fd, 200, 0).decode(errors="replace").split()
            if not words or not all(w.isascii() and w.isdigit() for w in words[:2]):
                return None  # held, but by no instance that said who it is
            return int(words[0]), int(words[1]) if len(words) > 1 else None
        return None
    finally:
        os.close(fd)  # lets the shared lock go
