"""One daemon per state folder: an exclusive lock naming its holder.

The lock file is opened with ``O_NOFOLLOW`` and must be a regular file of the
daemon's user: a link planted at its place would otherwise get the daemon's
PID written into (and later truncate) whatever it points to. It holds
``<pid> <start time>\n``, the start time in clock ticks since boot, so that a
reader can tell the daemon from a later owner of its pid
(:mod:`devplug.daemon.lockholder`).
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

__all__ = ["StateLock"]


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

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "devplug.lock"
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
