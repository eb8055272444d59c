"""Which process holds a state dir's lock, proven, so that a signal reaches the daemon and nothing else.

The lock file names the daemon that took it (``<pid> <start time>``, see
:class:`~devplug.daemon.lock.StateLock`), but a name is no proof: after the
daemon died (``kill -9`` leaves the file as it was) the pid may belong to any
process, and a daemon in another PID namespace (a container) wrote a pid that
means something else here. :func:`prove_holder` accepts the pid only when

1. a pidfd opens on it (``pidfd_open(2)``): from then on the process is pinned,
   and a signal sent through the pidfd reaches that process or fails, never a
   later owner of the pid;
2. its start time (``/proc/<pid>/stat``, field 22, in clock ticks since boot) is
   the one the daemon recorded: the pid was not reused since;
3. the kernel says that pid holds the ``flock`` on the lock file's inode
   (``/proc/locks``, whose pids are given in the reader's PID namespace, 0 for a
   process outside it; ``Documentation/filesystems/proc.rst``, "locks");
4. the pidfd's process is still alive after 2 and 3 (a pidfd polls readable once
   its process exited, ``pidfd_open(2)``), so what 2 and 3 read was about it.

Anything else is a :class:`~devplug.errors.StateError` saying what was found,
and nothing is signalled.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from devplug.errors import StateError

__all__ = ["LockHolder", "describe_process", "process_start_ticks", "process_started_at", "prove_holder"]

#: Bytes of the lock file read: ``<pid> <start>\n`` is far shorter.
_LOCK_READ = 200


def process_start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22); None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read().decode(errors="replace")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces and parentheses: split after the last ')'.
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 overall: 20th after the state (field 3)
    except (IndexError, ValueError):
        return None


def process_started_at(pid: int) -> float | None:
    """When process ``pid`` started, as ``time.time()`` would have said (to a clock tick, 10 ms); None if gone.

    The start in ticks since boot (:func:`process_start_ticks`) against ``CLOCK_BOOTTIME`` now: a handover's
    profile shows how long the new process took from its start to its request (imports, config, construction)."""
    ticks = process_start_ticks(pid)
    if ticks is None:
        return None
    since_start = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - since_start


def describe_process(pid: int) -> str:
    """``pid N (its command line)``, as far as ``/proc`` tells."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmdline = ""
    return f"pid {pid}" + (f" ({cmdline[:200]})" if cmdline else "")


def _flock_holders(st: os.stat_result) -> list[int]:
    """The pids ``/proc/locks`` gives for the ``flock`` locks held (not waited for) on the inode of ``st``."""
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    holders = []
    with open("/proc/locks") as handle:
        for line in handle:
            parts = line.split()
            # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:2146540 0 EOF"; a blocked waiter has "->" after the number.
            if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == inode:
                with contextlib.suppress(ValueError):
                    holders.append(int(parts[4]))
    return holders


def _exited(pidfd: int) -> bool:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


@dataclass
class LockHolder:
    """The process proven to hold a state dir's lock, pinned by a pidfd; :meth:`close` when done."""

    pid: int
    pidfd: int

    def send(self, sig: signal.Signals) -> None:
        """Send ``sig`` to this process (through its pidfd: never to a later owner of the pid)."""
        try:
            signal.pidfd_send_signal(self.pidfd, sig)
        except ProcessLookupError:
            raise StateError(f"the devplug daemon (pid {self.pid}) is gone; nothing was signalled") from None
        except PermissionError:
            raise StateError(f"not allowed to signal the devplug daemon (pid {self.pid}): run as its user") from None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.pidfd)

    def __enter__(self) -> LockHolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_lock(lock: Path, state_dir: Path) -> tuple[os.stat_result, int, int | None]:
    """The lock file's inode and the pid (and start time, when recorded) it names."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise StateError(
            f"no devplug daemon runs with the state dir {state_dir} ({lock} does not exist); if the config now "
            "names another [state] dir, pass the running daemon's with --state-dir"
        ) from None
    except OSError as exc:
        raise StateError(f"{lock}: cannot read the daemon lock: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StateError(f"{lock}: the daemon lock is not a regular file; nothing was signalled")
        text = os.pread(fd, _LOCK_READ, 0).decode(errors="replace")
    finally:
        os.close(fd)
    words = text.split()
    if not words or not all(w.isascii() and w.isdigit() for w in words[:2]):
        raise StateError(f"no devplug daemon runs with the state dir {state_dir} ({lock} names no process)")
    return st, int(words[0]), int(words[1]) if len(words) > 1 else None


def prove_holder(state_dir: Path, lock: Path) -> LockHolder:
    """The daemon holding ``lock`` (the lock file of ``state_dir``), proven as the module docstring says;
    :class:`StateError` naming what was found otherwise."""
    st, pid, recorded = _read_lock(lock, state_dir)
    prefix = f"no devplug daemon holds {lock}: it names pid {pid}"
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        raise StateError(f"{prefix}, which is gone (the daemon died?); nothing was signalled") from None
    except OSError as exc:
        raise StateError(f"{prefix}, which cannot be checked ({exc.strerror or exc}); nothing was signalled") from exc
    try:
        started = process_start_ticks(pid)
        if recorded is not None and started != recorded:
            raise StateError(
                f"{prefix}, which is now another process, {describe_process(pid)}, started at tick {started} "
                f"of this boot, not at tick {recorded} as the daemon that wrote the lock (its pid was reused); "
                "nothing was signalled"
            )
        try:
            holders = _flock_holders(st)
        except OSError as exc:
            raise StateError(
                f"cannot tell who holds {lock}: /proc/locks: {exc.strerror or exc}; nothing was signalled"
            ) from exc
        if pid not in holders:
            if not holders:
                found = f"but nobody holds the lock ({describe_process(pid)} does not)"
            elif set(holders) == {0}:
                found = (
                    "but the lock is held by a process outside this PID namespace: the daemon runs in another "
                    "container or on the host; run devplug reload where it runs"
                )
            else:
                found = f"but the lock is held by {', '.join(describe_process(h) for h in sorted(set(holders)))}"
            raise StateError(f"{prefix}, {found}; nothing was signalled")
        if _exited(pidfd):
            raise StateError(f"the devplug daemon (pid {pid}) exited while it was being checked; nothing was signalled")
    except BaseException:
        os.close(pidfd)
        raise
    return LockHolder(pid, pidfd)
