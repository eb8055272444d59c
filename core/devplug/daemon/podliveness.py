"""Container liveness read from the kubelet's pod cgroups: the core's :class:`~devplug.engine.liveness.PodProbe`
(whether any process of a pod is left on the node) as the daemon gives it, over :mod:`devplug.host.cgroups` and
:mod:`devplug.host.inotify`.

Why the core asks (a forgotten pod's containers may still run) is in :mod:`devplug.engine.liveness`; the node's
cgroups can tell. Every container of a pod runs in
the pod's cgroup, named after the pod's UID under the kubelet's ``kubepods``
cgroup, in one of three QoS places, as :mod:`devplug.host.cgroups` spells it for
the cgroupfs and systemd drivers (``kubepods/besteffort/pod<uid>``;
``kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice``
with every ``-`` of the UID written ``_``; under a ``--cgroup-root`` of its own
with the systemd driver the root's name prefixes every slice).

A pod's containers still run while its cgroup is *populated*: on cgroup v2 its
``cgroup.events`` says ``populated 1`` (for the whole subtree), and a change of
that file raises an inotify ``IN_MODIFY`` event (the kernel's
``Documentation/admin-guide/cgroup-v2.rst``, "Core Interface Files"); on v1, a
``cgroup.procs`` of the pod's cgroup or of a cgroup below it is not empty
(``Documentation/admin-guide/cgroup-v1/cgroups.rst``). A pod cgroup that does
not exist has no process: the kubelet removes it once the pod is cleaned up.

:class:`ContainerLiveness` finds the kubelet's ``kubepods`` cgroup under the
configured mount (``[liveness]``), answers :meth:`~ContainerLiveness.pod` for
one UID, and calls back when a pod's last process is gone
(:meth:`~ContainerLiveness.on_exit`): on v2 from inotify, on v1 by polling the
pods being waited for every :data:`V1_POLL_S`. Where the cgroups cannot be
read (no mount, no ``kubepods``, no permission) every answer is ``unknown``
with the reason, and the layout is looked for again now and then.

What is read must be the kernel's cgroups, not files that look like them: the
mount's file system type is checked (``statfs(2)``: ``CGROUP2_SUPER_MAGIC``,
``CGROUP_SUPER_MAGIC``, or a ``tmpfs`` holding v1 hierarchies, each of which
must itself be a cgroup mount, as the default ``cgroup_mount`` is on a v1 or hybrid
host), and anything else is refused naming ``[liveness] cgroup_mount`` and the
type found. Each file is then opened without blocking (``O_NONBLOCK``,
``O_NOFOLLOW``) and used only when ``fstat`` shows a regular file on the
hierarchy's own file system: a FIFO planted where ``cgroup.events`` belongs
would otherwise block the event loop in ``open``. A pod folder that is not a
folder (a link, a FIFO, a loop of links) or a path that cannot be resolved is
``unknown``, never "no cgroup"; and a pod UID that is not a Kubernetes UID
(:mod:`devplug.kube.ids`) never names a path: its liveness is ``unknown``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import logging
import os
import stat
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devplug.config import LivenessConfig
from devplug.engine import PodLiveness, PodState
from devplug.host.cgroups import QOS_CLASSES, kubepods_name, literal_path, pod_name
from devplug.host.inotify import IN_IGNORED, IN_MODIFY, inotify
from devplug.kube.ids import uid_problem

__all__ = ["ContainerLiveness", "LivenessUnavailable", "PodCgroups", "find_pod_cgroups", "read_pod"]

log = logging.getLogger("devplug.engine")

#: How often, on cgroup v1, the pods being waited for are looked at (v1 has no notification of an empty cgroup
#: that a process without privileges can receive: ``release_agent`` is the host's).
V1_POLL_S = 0.05
#: How often the layout is looked for again while it cannot be found (the kubelet may create it later).
REDISCOVER_S = 2.0
#: A watched pod is read again this often even on v2, in case a notification was lost (inotify's queue overflowed).
RECHECK_S = 2.0
#: The v1 hierarchies to read, in order of preference: every container is in each hierarchy its runtime manages.
V1_HIERARCHIES = ("pids", "memory", "cpu,cpuacct", "cpu", "cpuacct", "systemd", "freezer", "blkio", "devices")
_EVENT = struct.Struct("iIII")

#: ``statfs(2)`` ``f_type`` values (``include/uapi/linux/magic.h``).
CGROUP2_SUPER_MAGIC = 0x63677270
CGROUP_SUPER_MAGIC = 0x27E0EB
TMPFS_MAGIC = 0x01021994
_FS_NAMES = {
    CGROUP2_SUPER_MAGIC: "cgroup2",
    CGROUP_SUPER_MAGIC: "cgroup",
    TMPFS_MAGIC: "tmpfs",
    0xEF53: "ext2/ext3/ext4",
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    0x794C7630: "overlayfs",
    0x9FA0: "proc",
    0x62656572: "sysfs",
}
#: The most of a cgroup file read at once (``cgroup.events`` is two lines; of ``cgroup.procs`` the first pid).
_READ_BYTES = 4096
_libc: ctypes.CDLL | None = None


def fs_type(path: Path, *, follow: bool = True) -> int:
    """The ``f_type`` of the file system holding the folder ``path`` (``fstatfs(2)`` on a descriptor of it; with
    ``follow`` False a final link is not followed); :class:`OSError` when it cannot be opened or asked."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        buffer = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit Linux, 64 on 32-bit
        if _libc.fstatfs(fd, buffer) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), str(path))
        # f_type is struct statfs's first field, a native word (__fsword_t); every magic fits in 32 bits.
        return ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF
    finally:
        os.close(fd)


def fs_name(magic: int) -> str:
    """A file system type as ``statfs`` gives it, for a message: its name when known, and its magic number."""
    name = _FS_NAMES.get(magic)
    return f"{name} (0x{magic:x})" if name else f"type 0x{magic:x}"


def read_cgroup_file(path: Path, device: int | None = None) -> bytes:
    """The start (at most 4 KiB) of a cgroup interface file, opened without blocking or following a link, read only
    when it is a regular file (on the file system ``device``, when given): :class:`OSError` (``EINVAL``) saying what
    was found instead."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"not a cgroup file ({_kind(st.st_mode)})", str(path))
        if device is not None and st.st_dev != device:
            raise OSError(errno.EXDEV, "not a cgroup file (on another file system than its hierarchy)", str(path))
        return os.read(fd, _READ_BYTES)
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISREG, "a regular file"),
    ):
        if test(mode):
            return name
    return f"mode 0o{mode:o}"


@dataclass(frozen=True)
class PodCgroups:
    """The kubelet's pod cgroups as found on this node: the cgroup version, its driver, the hierarchy read (the
    mount on v2, a controller's on v1), the kubelet's ``--cgroup-root`` and the ``kubepods`` folder found."""

    version: int
    driver: str
    kubepods: Path
    hierarchy: Path
    cgroup_root: str = "/"
    #: The hierarchy's file system (``st_dev``): every file read must be on it (None: not checked).
    device: int | None = None

    def pod_dirs(self, uid: str) -> list[Path]:
        """Where the cgroup of the pod with UID ``uid`` may be, one path per QoS class; :class:`ValueError` when
        ``uid`` is not a Kubernetes UID (it never names a path)."""
        problem = uid_problem(uid)
        if problem is not None:
            raise ValueError(problem)
        return [
            self.hierarchy / literal_path(pod_name(self.cgroup_root, qos, uid), self.driver).lstrip("/")
            for qos in QOS_CLASSES
        ]

    def describe(self) -> str:
        return f"cgroup v{self.version}, {self.driver} driver, pods under {self.kubepods}"


class LivenessUnavailable(Exception):
    """The pods' cgroups cannot be found or read; the message says why and what to configure."""


def _hierarchy_bases(mount: Path) -> list[tuple[int, Path]]:
    """The hierarchies to read under ``mount``, by its file system type; :class:`LivenessUnavailable` for a type
    that holds no cgroups."""
    key = f"[liveness] cgroup_mount ({mount})"
    try:
        kind = fs_type(mount)
    except OSError as exc:
        raise LivenessUnavailable(f"{key}: cannot tell its file system type: {exc.strerror or exc}") from exc
    if kind == CGROUP2_SUPER_MAGIC:
        if not (mount / "cgroup.controllers").exists():
            raise LivenessUnavailable(f"{key} is a cgroup2 file system without cgroup.controllers")
        return [(2, mount)]
    if kind == CGROUP_SUPER_MAGIC:  # one v1 hierarchy mounted right there
        return [(1, mount)]
    if kind != TMPFS_MAGIC:
        raise LivenessUnavailable(
            f"{key}: its file system is {fs_name(kind)}, not cgroup2, cgroup or a tmpfs holding cgroup v1 "
            "hierarchies: point it at the node's cgroup2 mount or at the folder of its v1 hierarchies (the default)"
        )
    bases, foreign = [], []
    for name in V1_HIERARCHIES:
        hierarchy = mount / name
        try:
            kind = fs_type(hierarchy, follow=False)  # a link (cpu -> cpu,cpuacct) is read through its target's name
        except OSError:
            continue  # not there (or not a folder): a controller this host does not mount
        if kind == CGROUP_SUPER_MAGIC:
            bases.append((1, hierarchy))
        else:
            foreign.append(f"{name} is {fs_name(kind)}")
    if not bases:
        found = f" ({'; '.join(foreign)})" if foreign else ""
        raise LivenessUnavailable(
            f"{mount} holds neither a cgroup v2 filesystem nor cgroup v1 hierarchies{found}: {key} is a tmpfs "
            "whose folders are not cgroup mounts"
        )
    return bases


def find_pod_cgroups(config: LivenessConfig) -> PodCgroups:
    """Find the kubelet's ``kubepods`` cgroup under ``config.cgroup_mount``; :class:`LivenessUnavailable` if none."""
    mount = config.cgroup_mount
    if not mount.is_dir():
        raise LivenessUnavailable(
            f"{mount} does not exist: mount the node's cgroup filesystem there (read-only is enough), or set "
            "[liveness] cgroup_mount"
        )
    bases = _hierarchy_bases(mount)
    drivers = ("cgroupfs", "systemd") if config.cgroup_driver == "auto" else (config.cgroup_driver,)
    looked = []
    for version, base in bases:
        for driver in drivers:
            kubepods = base / literal_path(kubepods_name(config.cgroup_root), driver).lstrip("/")
            if kubepods.is_dir():
                device = os.stat(base).st_dev
                return PodCgroups(version, driver, kubepods, base, config.cgroup_root, device)
            looked.append(str(kubepods))
    raise LivenessUnavailable(
        f"no kubepods cgroup at {' or '.join(looked[:2])}: is the kubelet running, and are [liveness] cgroup_root "
        f"({config.cgroup_root}) and cgroup_driver ({config.cgroup_driver}) its --cgroup-root and --cgroup-driver?"
    )


def _populated_v2(pod_dir: Path, device: int | None) -> bool:
    events = pod_dir / "cgroup.events"
    for line in read_cgroup_file(events, device).decode(errors="replace").splitlines():
        key, _, value = line.partition(" ")
        if key == "populated":
            return value.strip() == "1"
    raise OSError(errno.EINVAL, f"{events} has no 'populated' line")


def _first_process_v1(pod_dir: Path, device: int | None) -> tuple[str, Path] | None:
    """A pid left in the pod's cgroup or below it (v1: each cgroup lists only its own), and where; None if none."""
    for folder, _, _ in os.walk(pod_dir):  # os.walk follows no link to a folder
        try:
            first = read_cgroup_file(Path(folder, "cgroup.procs"), device).partition(b"\n")[0].strip()
        except FileNotFoundError:
            continue  # removed while we walked
        if first:
            return first.decode(errors="replace"), Path(folder)
    return None


def _pod_folder(layout: PodCgroups, pod_dir: Path) -> bool:
    """Whether the pod's cgroup folder is there (False: it is not, nor could it be); :class:`OSError` when the path
    holds something else than folders (a link, a FIFO, a file) or cannot be resolved: then nobody can tell."""
    try:
        st = os.lstat(pod_dir)
    except FileNotFoundError:
        # Missing: so is the cgroup, unless a parent on the way is not a folder (a dangling link: unknown).
        parent = pod_dir.parent
        while parent != layout.hierarchy and parent.is_relative_to(layout.hierarchy):
            with contextlib.suppress(FileNotFoundError):
                mode = os.lstat(parent).st_mode
                if not stat.S_ISDIR(mode):
                    raise OSError(errno.ENOTDIR, f"not a cgroup folder ({_kind(mode)})", str(parent)) from None
            parent = parent.parent
        return False
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, f"not a cgroup folder ({_kind(st.st_mode)})", str(pod_dir))
    if layout.device is not None and st.st_dev != layout.device:
        raise OSError(errno.EXDEV, "not a cgroup folder (on another file system than its hierarchy)", str(pod_dir))
    return True


def _reason(exc: OSError) -> str:
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or exc}"


def read_pod(layout: PodCgroups, uid: str) -> PodLiveness:
    """Whether the pod with UID ``uid`` has a process left, read from its cgroup now."""
    problem = uid_problem(uid)
    if problem is not None:
        return PodLiveness(PodState.UNKNOWN, f"pod UID {problem}: its cgroup is not looked for")
    try:
        for pod_dir in layout.pod_dirs(uid):
            if not _pod_folder(layout, pod_dir):
                continue
            if layout.version == 2:
                if _populated_v2(pod_dir, layout.device):
                    return PodLiveness(PodState.RUNNING, f"{pod_dir} is populated")
                return PodLiveness(PodState.EXITED, f"{pod_dir} has no process left")
            found = _first_process_v1(pod_dir, layout.device)
            if found is not None:
                return PodLiveness(PodState.RUNNING, f"pid {found[0]} is left in {found[1]}")
            return PodLiveness(PodState.EXITED, f"{pod_dir} has no process left")
    except OSError as exc:
        return PodLiveness(PodState.UNKNOWN, f"cannot read the cgroup of pod {uid}: {_reason(exc)}")
    return PodLiveness(PodState.EXITED, f"no cgroup of pod {uid} under {layout.kubepods}")


class _Watch:
    """The callbacks waiting for one pod's last process to be gone, and its inotify watch (v2)."""

    def __init__(self, uid: str) -> None:
        self.uid = uid
        self.callbacks: list[Callable[[PodLiveness], None]] = []
        self.wd: int | None = None
        self.checked = 0.0


class ContainerLiveness:
    """Whether pods' containers still run, for every resource of the daemon (event loop thread only)."""

    def __init__(self, config: LivenessConfig, *, poll_interval: float = V1_POLL_S) -> None:
        self.config = config
        self.poll_interval = poll_interval
        self.layout: PodCgroups | None = None
        #: Why the pods' cgroups cannot be read (None once found).
        self.problem: str | None = "not looked for yet"
        self._looked_at = -REDISCOVER_S
        self._watches: dict[str, _Watch] = {}
        self._by_wd: dict[int, _Watch] = {}
        self._inotify = inotify
        self._ifd = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._poller: asyncio.TimerHandle | None = None

    # --- the layout

    def start(self) -> None:
        """Look for the pods' cgroups and say what was found (called once the event loop runs)."""
        self._loop = asyncio.get_running_loop()
        self._discover(report=True)

    def reconfigure(self, config: LivenessConfig) -> None:
        """A reload changed ``[liveness]``: look for the layout again, waiting pods included."""
        if config == self.config:
            return
        self.config = config
        self._forget_layout()
        self._discover(report=True)

    def _forget_layout(self) -> None:
        for watch in self._watches.values():
            self._unwatch_inotify(watch)
        self.layout = None
        self.problem = "not looked for yet"

    def _discover(self, report: bool = False) -> PodCgroups | None:
        now = time.monotonic()
        if self.layout is not None:
            return self.layout
        if not report and now - self._looked_at < REDISCOVER_S:
            return None
        self._looked_at = now
        try:
            layout = find_pod_cgroups(self.config)
        except (LivenessUnavailable, OSError) as exc:
            problem = str(exc)
            if report or problem != self.problem:
                log.warning(
                    "container liveness unknown: %s; a tenancy whose pod vanished is released %g s later "
                    "([liveness] unknown_grace), whether or not its containers still run",
                    problem,
                    self.config.unknown_grace,
                )
            self.problem = problem
            return None
        self.layout, self.problem = layout, None
        how = "inotify on cgroup.events" if layout.version == 2 else f"polling every {self.poll_interval:g} s"
        log.info("container liveness: %s (waiting pods watched by %s)", layout.describe(), how)
        for watch in list(self._watches.values()):
            self._arm(watch)
        return layout

    def available(self) -> bool:
        """Whether the pods' cgroups can be read (looked for again, now and then, while they cannot)."""
        return self._discover() is not None

    @property
    def mode(self) -> str:
        """``cgroup v2``, ``cgroup v1`` or ``unknown``."""
        return f"cgroup v{self.layout.version}" if self.layout is not None else "unknown"

    def describe(self) -> dict[str, Any]:
        """For the status file."""
        layout = self.layout
        return {
            "state": self.mode,
            "driver": layout.driver if layout is not None else None,
            "kubepods": str(layout.kubepods) if layout is not None else None,
            "problem": self.problem,
            "required": self.config.required,
            "unknown_grace": self.config.unknown_grace,
            "watched_pods": len(self._watches),
        }

    # --- answers

    def pod(self, uid: str | None) -> PodLiveness:
        """Whether any process of the pod with UID ``uid`` is left (``uid`` None: no way to tell)."""
        if uid is None:
            return PodLiveness(PodState.UNKNOWN, "the pod's UID is unknown (the kubelet's checkpoint never named it)")
        layout = self._discover()
        if layout is None:
            return PodLiveness(PodState.UNKNOWN, f"container liveness unknown: {self.problem}")
        return read_pod(layout, uid)

    def on_exit(self, uid: str, callback: Callable[[PodLiveness], None]) -> Callable[[], None]:
        """Call ``callback`` (once, on the event loop) when the pod's last process is gone or liveness becomes
        unknown; returns a function that cancels the wait. Calls it soon if that is already so."""
        watch = self._watches.get(uid)
        if watch is None:
            watch = self._watches[uid] = _Watch(uid)
            self._arm(watch)
        watch.callbacks.append(callback)
        self._schedule_check(0.0)

        def cancel() -> None:
            with contextlib.suppress(ValueError):
                watch.callbacks.remove(callback)
            if not watch.callbacks and self._watches.get(uid) is watch:
                self._drop(watch)

        return cancel

    async def wait_exited(self, uid: str, timeout: float) -> PodLiveness:
        """The pod's liveness once its last process is gone, or as it is after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[PodLiveness] = loop.create_future()

        def exited(answer: PodLiveness) -> None:
            if not done.done():
                done.set_result(answer)

        cancel = self.on_exit(uid, exited)
        try:
            finished, _ = await asyncio.wait((done,), timeout=timeout)
        finally:
            cancel()
        return done.result() if finished else self.pod(uid)

    # --- watching

    def _arm(self, watch: _Watch) -> None:
        """Watch the pod's ``cgroup.events`` (v2) when the layout is known and inotify works; else it is polled."""
        layout = self.layout
        if layout is None or layout.version != 2 or self._inotify is None or self._loop is None:
            return
        if uid_problem(watch.uid) is not None:
            return  # never a path: read_pod answers unknown
        if self._ifd < 0:
            try:
                self._ifd = self._inotify.init()
            except OSError as exc:
                log.warning("container liveness: no inotify (%s): waiting pods are polled", exc)
                self._inotify = None
                return
            self._loop.add_reader(self._ifd, self._read_events)
        for pod_dir in layout.pod_dirs(watch.uid):
            try:
                wd = self._inotify.add_watch(self._ifd, pod_dir / "cgroup.events", IN_MODIFY)
            except FileNotFoundError:
                continue
            except OSError as exc:  # out of watches (ENOSPC): this pod is polled instead
                log.warning("container liveness: cannot watch %s (%s): polling it", pod_dir, exc)
                return
            watch.wd = wd
            self._by_wd[wd] = watch
            return

    def _unwatch_inotify(self, watch: _Watch) -> None:
        if watch.wd is not None:
            self._by_wd.pop(watch.wd, None)
            if self._inotify is not None and self._ifd >= 0:
                self._inotify.rm_watch(self._ifd, watch.wd)
            watch.wd = None

    def _drop(self, watch: _Watch) -> None:
        self._unwatch_inotify(watch)
        self._watches.pop(watch.uid, None)

    def _read_events(self) -> None:
        try:
            data = os.read(self._ifd, 64 * 1024)
        except BlockingIOError:
            return
        except OSError as exc:
            log.warning("container liveness: reading inotify events failed (%s): polling waiting pods", exc)
            return
        offset = 0
        woken: list[_Watch] = []
        while offset + _EVENT.size <= len(data):
            wd, mask, _, length = _EVENT.unpack_from(data, offset)
            offset += _EVENT.size + length
            watch = self._by_wd.get(wd)
            if watch is None:
                continue
            if mask & IN_IGNORED:  # the cgroup is gone: so is every process that was in it
                self._by_wd.pop(wd, None)
                watch.wd = None
            woken.append(watch)
        for watch in dict.fromkeys(woken):
            self._check(watch)

    def _schedule_check(self, delay: float) -> None:
        if self._loop is None or (self._poller is not None and delay > 0):
            return
        if self._poller is not None:
            self._poller.cancel()
        self._poller = self._loop.call_later(delay, self._check_all)

    def _check_all(self) -> None:
        """Look at every waiting pod that is polled (v1, no inotify) or due a re-check; then schedule the next."""
        self._poller = None
        layout = self._discover()
        now = time.monotonic()
        for watch in list(self._watches.values()):
            if watch.wd is None and layout is not None:
                self._arm(watch)  # the pod's cgroup may exist by now (v2)
            if watch.wd is None or now - watch.checked >= RECHECK_S:
                self._check(watch)
        if self._watches:
            polled = layout is None or any(w.wd is None for w in self._watches.values())
            self._schedule_check(self.poll_interval if polled and layout is not None else RECHECK_S)

    def _check(self, watch: _Watch) -> None:
        watch.checked = time.monotonic()
        answer = self.pod(watch.uid)
        if answer.state is PodState.RUNNING:
            return
        if answer.state is PodState.UNKNOWN and self.layout is None:
            return  # nothing to wait for until the layout is found; the caller's grace applies meanwhile
        callbacks, watch.callbacks = watch.callbacks, []
        self._drop(watch)
        for callback in callbacks:
            try:
                callback(answer)
            except Exception:
                log.exception("container liveness: a callback for pod %s failed", watch.uid)

    def close(self) -> None:
        """Stop watching (at shutdown)."""
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None
        if self._ifd >= 0:
            if self._loop is not None:
                self._loop.remove_reader(self._ifd)
            os.close(self._ifd)
            self._ifd = -1
        self._watches.clear()
        self._by_wd.clear()
