"""One daemon per state folder: an exclusive lock naming its holder."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from devplug.errors import AlreadyRunningError, StateError

__all__ = ["StateLock"]


def _describe(pid_text: str) -> str:
    pid = pid_text.split(maxsplit=1)[0] if pid_text.split() else "?"
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        cmdline = ""
    return f"pid {pid}" + (f" ({cmdline})" if cmdline else "")


class StateLock:
    """``<state dir>/devplug.lock``, held with ``flock`` for the daemon's lifetime (released by the kernel on exit)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "devplug.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`AlreadyRunningError` naming the process that holds it."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StateError(f"{self.path}: cannot open the daemon lock: {exc.strerror or exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace")
            os.close(fd)
            raise AlreadyRunningError(
                f"another devplug daemon holds {self.path}: {_describe(holder)}; "
                "stop it first (two daemons would fight over the same resources)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None
