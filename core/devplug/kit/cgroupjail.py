"""A transient cgroup per external command, so that nothing it starts outlives it (:mod:`devplug.kit.command`).

A process group does not hold a command: a child that calls ``setsid()``
leaves it, and ``killpg`` no longer reaches it. A cgroup does: a process
cannot leave its cgroup without write access to ``cgroup.procs`` files, and
every child is born in its parent's. Where the node allows it (a writable
cgroup v2 hierarchy; as root, or with the daemon's cgroup delegated to it),
each command runs in a cgroup of its own, made under the daemon's own cgroup
(``/proc/self/cgroup``'s ``0::`` line, under the cgroup2 mount of
``/proc/self/mountinfo``) and named ``devplug-cmd-<daemon pid>-<n>`` (those of a daemon that died, once
empty, are removed by the next one's first command). The child
joins it before the program starts: it is started as ``/bin/sh -c 'echo 0 >
"$0" || exit 125; exec "$@"' <cgroup.procs> <argv...>``, which moves itself
into the cgroup and then becomes the program (same pid, same session, the
program's own argv), so it and everything it starts are inside before the
program's first instruction. (Moving the child between ``fork`` and ``exec``
from Python, ``preexec_fn``, would need a real ``fork()`` in a daemon full of
gRPC threads, whose fork handlers then run: the child crashed with SIGSEGV.)

Killing it: ``cgroup.kill`` (Linux 5.14 and later, ``Documentation/admin-guide/cgroup-v2.rst``) kills every
process in it at once, forks racing included; on an older kernel every pid of
``cgroup.procs`` is killed through a pidfd opened on it and checked to be in
the cgroup still, until it is empty. The cgroup is removed once empty.

Where cgroups cannot be used (no cgroup2 mount, a read-only one, no
permission, the daemon's cgroup not ours to divide), commands run in their own
process group only, as before; which of the two is said once in the log
(``devplug.kit``).
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import signal
import threading
import time
from pathlib import Path

__all__ = [
    "PREFIX",
    "CommandCgroup",
    "command_cgroup",
    "command_failed_to_join",
    "is_command_cgroup",
    "kill_cgroup",
    "kill_cgroup_of",
    "remove_cgroup",
]

log = logging.getLogger("devplug.kit")

#: The name every transient command cgroup starts with.
PREFIX = "devplug-cmd-"
#: How long an emptied cgroup is waited for before its removal is given up (a process stuck in the kernel).
REMOVE_WAIT_S = 1.0

_lock = threading.Lock()
_counter = itertools.count(1)
#: The folder command cgroups are made in, once found; None when they cannot be used.
_base: Path | None = None
_decided = False


def _cgroup2_mount() -> tuple[Path, str] | None:
    """The cgroup2 mount point and the cgroup path it shows as its root (``proc(5)``, mountinfo fields 5 and 4)."""
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle:
        for line in handle:
            fields = line.split()
            if " - " not in line:
                continue
            fstype = line.split(" - ", 1)[1].split()[0]
            if fstype == "cgroup2":
                return Path(fields[4].replace("\\040", " ")), fields[3]
    return None


def _own_cgroup() -> str | None:
    with open("/proc/self/cgroup", encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if line.startswith("0::"):
                return line[3:].strip()
    return None


def _find_base() -> tuple[Path | None, str]:
    """Where command cgroups go, and how that was decided (for the one log line)."""
    try:
        mount = _cgroup2_mount()
        own = _own_cgroup()
    except OSError as exc:
        return None, f"cannot read /proc/self ({exc.strerror or exc})"
    if mount is None:
        return None, "no cgroup2 file system is mounted"
    if own is None:
        return None, "the daemon is in no cgroup v2 (/proc/self/cgroup has no 0:: line)"
    point, root = mount
    if own != root and not own.startswith(root.rstrip("/") + "/"):
        return None, f"the daemon's cgroup {own} is outside the cgroup2 mount at {point}"
    base = point / os.path.relpath(own, root)
    probe = base / f"{PREFIX}{os.getpid()}-probe"
    try:
        probe.mkdir()
        has_kill = (probe / "cgroup.kill").exists()
        probe.rmdir()
    except OSError as exc:
        return None, f"cannot make a cgroup in {base}: {exc.strerror or exc}"
    kill = "cgroup.kill" if has_kill else "killing each pid of cgroup.procs (no cgroup.kill before Linux 5.14)"
    return base, f"in {base}, killed by {kill}"


def _decide() -> Path | None:
    global _base, _decided
    with _lock:
        if not _decided:
            _base, how = _find_base()
            _decided = True
            if _base is not None:
                _remove_abandoned(_base)
            if _base is not None:
                log.info(
                    "external commands run each in a transient cgroup of its own (%s): nothing they start "
                    "outlives them",
                    how,
                )
            else:
                log.info(
                    "external commands run in their own process group only (%s): a process that leaves the "
                    "group (setsid) can outlive its command",
                    how,
                )
        return _base


def _remove_abandoned(base: Path) -> None:
    """Remove the empty command cgroups of runners that are gone (a daemon killed mid-command leaves its cgroup;
    one still holding a process is left for :func:`kill_cgroup_of`, as ``rmdir`` refuses a populated cgroup)."""
    try:
        names = [n for n in os.listdir(base) if n.startswith(PREFIX)]
    except OSError:
        return
    for name in names:
        owner = name[len(PREFIX) :].split("-", 1)[0]
        if not owner.isdigit() or int(owner) == os.getpid() or os.path.exists(f"/proc/{owner}"):
            continue
        try:
            (base / name).rmdir()
        except OSError:
            continue


def _cannot_use(reason: str) -> None:
    """Cgroups looked usable but a command could not be put in one: use process groups from now on."""
    global _base
    with _lock:
        if _base is not None:
            _base = None
            log.warning("external commands run in their own process group only from now on: %s", reason)


class CommandCgroup:
    """One command's transient cgroup: made before the command starts, killed and removed when it is over."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def procs(self) -> Path:
        """Its ``cgroup.procs``: a process that writes ``0`` there moves into it."""
        return self.path / "cgroup.procs"

    def holds(self, pid: int) -> bool:
        """Whether the process ``pid`` is in this cgroup."""
        relative = _relative(self.path)
        return relative is not None and _in_cgroup(pid, relative)

    def kill(self) -> None:
        """SIGKILL every process in the cgroup (a no-op when it is empty)."""
        kill_cgroup(self.path)

    def remove(self) -> None:
        """Remove the cgroup once it is empty (waited for at most :data:`REMOVE_WAIT_S`)."""
        remove_cgroup(self.path)


def remove_cgroup(path: Path) -> None:
    """Remove the cgroup ``path``, killing what is left in it, waiting at most :data:`REMOVE_WAIT_S` for it to
    empty; a WARNING when it will not go (a process stuck in the kernel)."""
    deadline = time.monotonic() + REMOVE_WAIT_S
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                log.warning("cannot remove the command cgroup %s: %s", path, exc.strerror or exc)
                return
        kill_cgroup(path)
        time.sleep(0.01)


def command_cgroup() -> CommandCgroup | None:
    """A fresh transient cgroup for one command, or None where cgroups cannot be used (process groups only)."""
    base = _decide()
    if base is None:
        return None
    path = base / f"{PREFIX}{os.getpid()}-{next(_counter)}"
    try:
        path.mkdir()
    except OSError as exc:
        _cannot_use(f"cannot make {path}: {exc.strerror or exc}")
        return None
    return CommandCgroup(path)


def command_failed_to_join(cgroup: CommandCgroup, reason: str) -> None:
    """A command could not join its cgroup: give the cgroup up, and cgroups for the commands to come."""
    cgroup.remove()
    _cannot_use(f"a command could not join {cgroup.path}: {reason}")


def _in_cgroup(pid: int, relative: str) -> bool:
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as handle:
            return any(line.startswith("0::") and line[3:].strip() == relative for line in handle)
    except OSError:
        return False


def kill_cgroup(path: Path) -> None:
    """SIGKILL every process in the cgroup ``path``: ``cgroup.kill`` where the kernel has it, else each pid of
    ``cgroup.procs`` through a pidfd, checked to be in the cgroup still, until it is empty (bounded)."""
    try:
        fd = os.open(path / "cgroup.kill", os.O_WRONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = -1
    except OSError as exc:
        log.debug("cannot open %s/cgroup.kill: %s", path, exc)
        fd = -1
    if fd >= 0:
        try:
            os.write(fd, b"1")
            return
        except OSError as exc:
            log.debug("cannot write %s/cgroup.kill: %s", path, exc)
        finally:
            os.close(fd)
    relative = _relative(path)
    for _ in range(100):
        try:
            pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return
        if not pids:
            return
        for pid in pids:
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue  # gone already
            try:
                if relative is None or _in_cgroup(pid, relative):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except OSError:
                pass
            finally:
                os.close(pidfd)
        time.sleep(0.001)


def _relative(path: Path) -> str | None:
    """The cgroup path of the folder ``path`` as ``/proc/<pid>/cgroup`` shows it (None when it cannot tell)."""
    try:
        mount = _cgroup2_mount()
    except OSError:
        return None
    if mount is None or not path.is_relative_to(mount[0]):
        return None
    inside = "/" + str(path.relative_to(mount[0]))
    root = mount[1].rstrip("/")
    return (root + inside) if root else inside


def is_command_cgroup(relative: str) -> bool:
    """Whether a cgroup path (``/proc/<pid>/cgroup``'s ``0::`` value) is a transient command cgroup."""
    return Path(relative).name.startswith(PREFIX)


def kill_cgroup_of(pid: int) -> bool:
    """When the process ``pid`` is in a transient command cgroup (one a runner made, perhaps of a daemon that died
    since), kill everything in it and remove it; True if it did. Call only once ``pid`` is known to be the
    process a record names (its start time checked)."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as handle:
            own = next((line[3:].strip() for line in handle if line.startswith("0::")), None)
        mount = _cgroup2_mount()
    except OSError:
        return False
    if own is None or mount is None or not is_command_cgroup(own):
        return False
    point, root = mount
    if own != root and not own.startswith(root.rstrip("/") + "/"):
        return False
    path = point / os.path.relpath(own, root)
    kill_cgroup(path)
    remove_cgroup(path)
    return True
