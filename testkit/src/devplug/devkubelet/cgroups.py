"""The kubelet's cgroups: how it names the cgroups of pods and containers, and the cgroup file systems they live in.

Names follow Kubernetes v1.32.10 (``pkg/kubelet/cm``) and the runtime it drives
(containerd 1.6 with runc):

* **The cgroup root** (``--cgroup-root``, in cgroupfs form, ``/`` by default)
  is parsed into a ``CgroupName`` (a list of components:
  ``ParseCgroupfsToCgroupName`` in ``cgroup_manager_linux.go``); with cgroups
  per QoS (the default) the node-allocatable cgroup ``kubepods`` is added
  under it (``NewContainerManager`` in ``container_manager_linux.go``,
  ``defaultNodeAllocatableCgroupName`` in ``node_container_manager_linux.go``).
* **QoS cgroups** (``qosContainerManagerImpl.Start`` in
  ``qos_container_manager_linux.go``): Guaranteed pods live right under
  ``kubepods``, Burstable ones under ``kubepods/burstable``, BestEffort ones
  under ``kubepods/besteffort`` (the class name lowercased).
* **A pod's cgroup** is ``pod<uid>`` under its QoS cgroup
  (``GetPodContainerName`` in ``pod_container_manager_linux.go``,
  ``GetPodCgroupNameSuffix`` in ``helpers_linux.go``).
* **Literal paths** (``cgroupCommon.Name``): the cgroupfs driver joins the
  components with ``/`` (``CgroupName.ToCgroupfs``); the systemd driver
  replaces ``-`` by ``_`` in each component (``escapeSystemdCgroupName``),
  joins them with ``-``, adds ``.slice`` and expands that slice into its
  parents (``CgroupName.ToSystemd``; runc's ``ExpandSlice`` in
  ``libcontainer/cgroups/systemd/common.go``): ``{kubepods, besteffort,
  pod12-34}`` is ``/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12_34.slice``.
* **A container's cgroup** is the runtime's choice: containerd's
  ``getCgroupsPath`` (``pkg/cri/server/helpers_linux.go``, used for sandboxes
  and containers alike) puts it at ``<pod cgroup>/<container id>``, or, when
  the pod cgroup is a systemd slice, asks runc for the scope
  ``cri-containerd-<id>.scope`` inside that slice (runc's ``getUnitName``).
* **The hierarchies**: on cgroup v1 each controller is its own mount, and the
  kubelet and runc create the same path in every one (``buildCgroupPaths``;
  runc's fs manager joins every subsystem, ``name=systemd`` included). A new
  cpuset cgroup starts with empty ``cpuset.cpus`` and ``cpuset.mems``, and no
  task can join it until they are copied from its parent (runc's
  ``cpusetEnsureParent``/``cpusetCopyIfNeeded``). On cgroup v2 there is one
  tree; ``cgroup.events`` says ``populated 0/1`` and ``cgroup.kill`` kills
  every process in a cgroup and its descendants (Linux 5.14 and later,
  ``Documentation/admin-guide/cgroup-v2.rst``).
* **Which version** a kubelet uses: v2 only when ``/sys/fs/cgroup`` itself is
  a cgroup2 mount (runc's ``IsCgroup2UnifiedMode``); a hybrid host (v1
  controllers, v2 at ``/sys/fs/cgroup/unified``) runs v1.

:class:`CgroupLayout` is the naming, :class:`CgroupFs` creates, reads, kills
and removes the cgroups on the host's cgroup file systems and remembers
what it created, so that it can leave nothing behind.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from devplug.host.cgroups import (
    QOS_CLASSES,
    SLICE,
    expand_slice,
    kubepods_name,
    literal_path,
    pod_name,
    root_name,
)

__all__ = [
    "QOS_CLASSES",
    "CgroupDriver",
    "CgroupFs",
    "CgroupLayout",
    "CgroupsUnavailableError",
    "Hierarchy",
    "cgroup_of",
    "expand_slice",
    "unique_cgroup_root",
]

_CGROUP_FS = "/sys/fs/cgroup"


class CgroupDriver(StrEnum):
    """The kubelet's ``--cgroup-driver`` (and the runtime's, which must match)."""

    CGROUPFS = "cgroupfs"
    SYSTEMD = "systemd"


class CgroupsUnavailableError(Exception):
    """The host has no cgroup hierarchy the dev kubelet can use; the message says why."""


def unique_cgroup_root(prefix: str = "devplug") -> str:
    """A fresh ``--cgroup-root`` for one test: ``/<prefix>-<12 hex digits>``."""
    return f"/{prefix}-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy: where it is, which controllers (v1) it carries."""

    path: Path
    controllers: frozenset[str] = frozenset()

    @property
    def cpuset(self) -> bool:
        """True for the v1 hierarchy carrying the cpuset controller."""
        return "cpuset" in self.controllers


def _mounts(mountinfo: Path) -> list[tuple[Path, str, frozenset[str]]]:
    """``(mount point, fstype, super options)`` of every cgroup and cgroup2 mount (``proc(5)``, mountinfo)."""
    found = []
    for line in mountinfo.read_text().splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        point = fields[4].replace("\\040", " ")
        found.append((Path(point), tail[0], frozenset(tail[2].split(","))))
    return found


_V1_OPTIONS = frozenset({"rw", "ro", "relatime", "noatime", "nosuid", "nodev", "noexec", "clone_children", "xattr"})


@dataclass(frozen=True)
class CgroupLayout:
    """Where the dev kubelet's pods and containers get their cgroups, named as the kubelet names them.

    ``version`` is 1 or 2; ``root`` the kubelet's ``--cgroup-root`` in
    cgroupfs form (a test's own, from :func:`unique_cgroup_root`);
    ``driver`` the cgroup driver; ``mount`` the cgroup file system: for v1
    the folder holding one mount per controller (``/sys/fs/cgroup``), for v2
    the cgroup2 mount; ``hierarchies`` every hierarchy a cgroup is made in
    (v1: each controller mount under ``mount``; v2: ``mount`` alone).
    :meth:`detect` fills ``mount`` and ``hierarchies`` from the host's mounts.
    """

    version: int
    root: str
    driver: CgroupDriver = CgroupDriver.CGROUPFS
    mount: Path = Path(_CGROUP_FS)
    hierarchies: tuple[Hierarchy, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.version not in (1, 2):
            raise ValueError(f"cgroup version must be 1 or 2, got {self.version!r}")
        if not isinstance(self.root, str) or not self.root.startswith("/") or "//" in self.root:
            raise ValueError(f"the cgroup root must be an absolute cgroupfs path like /devplug-1, got {self.root!r}")
        if any(part in (".", "..") for part in self.root.split("/")):
            raise ValueError(f"the cgroup root must not contain . or .., got {self.root!r}")
        object.__setattr__(self, "driver", CgroupDriver(self.driver))
        object.__setattr__(self, "mount", Path(self.mount))
        if not self.hierarchies:
            object.__setattr__(self, "hierarchies", (Hierarchy(self.mount),) if self.version == 2 else ())
        if self.version == 1 and not self.hierarchies:
            raise ValueError("a cgroup v1 layout needs its hierarchies (use CgroupLayout.detect)")

    @classmethod
    def detect(
        cls,
        version: int | None = None,
        *,
        root: str | None = None,
        driver: CgroupDriver | str = CgroupDriver.CGROUPFS,
        mountinfo: Path = Path("/proc/self/mountinfo"),
    ) -> CgroupLayout:
        """The host's cgroups of ``version`` (by default the one a kubelet would use here).

        v1: the cgroup mounts right under ``/sys/fs/cgroup``; v2: ``/sys/fs/cgroup``
        when it is a cgroup2 mount, else another cgroup2 mount (``/sys/fs/cgroup/unified``
        on a hybrid host). ``root`` defaults to a fresh :func:`unique_cgroup_root`.
        Raises :class:`CgroupsUnavailableError` naming what is missing.
        """
        try:
            mounts = _mounts(mountinfo)
        except OSError as exc:
            raise CgroupsUnavailableError(f"cannot read {mountinfo}: {exc}") from exc
        top = Path(_CGROUP_FS)
        unified = [point for point, kind, _ in mounts if kind == "cgroup2"]
        v1 = [
            Hierarchy(point, frozenset(o for o in options if o not in _V1_OPTIONS))
            for point, kind, options in mounts
            if kind == "cgroup" and point.parent == top
        ]
        if version is None:
            version = 2 if top in unified else 1
        root = root if root is not None else unique_cgroup_root()
        if version == 2:
            if not unified:
                raise CgroupsUnavailableError("no cgroup2 file system is mounted")
            point = top if top in unified else sorted(unified, key=lambda p: (top not in p.parents, str(p)))[0]
            return cls(2, root, CgroupDriver(driver), point)
        if version != 1:
            raise ValueError(f"cgroup version must be 1 or 2, got {version!r}")
        if not v1:
            raise CgroupsUnavailableError(f"no cgroup v1 hierarchy is mounted under {top}")
        return cls(1, root, CgroupDriver(driver), top, tuple(sorted(v1, key=lambda h: str(h.path))))

    # -- the kubelet's names -------------------------------------------------------------------

    def root_name(self) -> tuple[str, ...]:
        """``ParseCgroupfsToCgroupName(--cgroup-root)``."""
        return root_name(self.root)

    def node_allocatable_name(self) -> tuple[str, ...]:
        """The node-allocatable cgroup: the root plus ``kubepods``."""
        return kubepods_name(self.root)

    def qos_name(self, qos: str) -> tuple[str, ...]:
        """The QoS cgroup's ``CgroupName`` (Guaranteed: ``kubepods`` itself)."""
        return pod_name(self.root, qos, "")[:-1]

    def pod_name(self, qos: str, uid: str) -> tuple[str, ...]:
        """The pod cgroup's ``CgroupName``: ``pod<uid>`` under the QoS cgroup."""
        return pod_name(self.root, qos, uid)

    def literal(self, name: Iterable[str]) -> str:
        """``cgroupCommon.Name``: the cgroupfs path of a ``CgroupName`` for this driver."""
        return literal_path(name, self.driver.value)

    def pod_cgroup(self, qos: str, uid: str) -> str:
        """The literal path of a pod's cgroup (``GetPodContainerName``'s second value)."""
        return self.literal(self.pod_name(qos, uid))

    def container_cgroup(self, pod_cgroup: str, container_id: str) -> str:
        """The literal path containerd and runc give a container (or sandbox) of that pod."""
        if Path(pod_cgroup).name.endswith(SLICE):
            return f"{pod_cgroup}/cri-containerd-{container_id}.scope"
        return f"{pod_cgroup}/{container_id}"

    def kubelet_cgroups(self) -> tuple[str, ...]:
        """The cgroups the kubelet makes at start, parents first: the root's own, ``kubepods``, the QoS ones."""
        names = [self.root_name()[:i] for i in range(1, len(self.root_name()) + 1)]
        names += [self.node_allocatable_name(), self.qos_name("burstable"), self.qos_name("besteffort")]
        return tuple(dict.fromkeys(self.literal(n) for n in names))

    # -- paths -----------------------------------------------------------------------------------

    def paths(self, literal: str) -> tuple[Path, ...]:
        """The folders of a cgroup, one per hierarchy."""
        relative = literal.lstrip("/")
        return tuple(h.path / relative if relative else h.path for h in self.hierarchies)

    def liveness_config(self) -> dict[str, str]:
        """What a devplug daemon is told to find these cgroups: ``cgroup_mount``, ``cgroup_root``, ``cgroup_driver``."""
        return {"cgroup_mount": str(self.mount), "cgroup_root": self.root, "cgroup_driver": self.driver.value}

    def describe(self) -> str:
        """One line for logs and warnings."""
        return f"cgroup v{self.version}, {self.driver.value} driver, root {self.root} in {self.mount}"


def _parents(literal: str) -> list[str]:
    """``/a/b/c`` -> ``['/a', '/a/b', '/a/b/c']``."""
    parts = [p for p in literal.split("/") if p]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


class CgroupFs:
    """Cgroups of one :class:`CgroupLayout` on the host: made, read, killed and removed.

    Every folder it makes is remembered; :meth:`remove_created` removes them
    all, deepest first, killing whatever still runs in them.
    """

    def __init__(self, layout: CgroupLayout) -> None:
        self.layout = layout
        self._created: dict[str, None] = {}  # literal paths, in creation order

    @property
    def created(self) -> tuple[str, ...]:
        """The cgroups this object made and has not removed, in the order they were made."""
        return tuple(self._created)

    def ensure(self, literal: str) -> None:
        """Make the cgroup (and its missing parents) in every hierarchy, as runc's ``Apply`` does.

        On v1 a new cpuset cgroup gets its parent's ``cpuset.cpus`` and ``cpuset.mems``.
        """
        for level in _parents(literal):
            made = False
            for hierarchy, path in zip(self.layout.hierarchies, self.layout.paths(level), strict=True):
                try:
                    path.mkdir()
                except FileExistsError:
                    continue
                made = True
                if hierarchy.cpuset:
                    for name in ("cpuset.cpus", "cpuset.mems"):
                        if not (path / name).read_text().strip():
                            (path / name).write_text((path.parent / name).read_text())
            if made:
                self._created[level] = None

    def procs_files(self, literal: str) -> tuple[Path, ...]:
        """``cgroup.procs`` of the cgroup in every hierarchy (what a process writes its PID to, to join)."""
        return tuple(path / "cgroup.procs" for path in self.layout.paths(literal))

    def pids(self, literal: str, *, recursive: bool = True) -> set[int]:
        """Every process in the cgroup (and its descendants), in any hierarchy; empty when it is gone."""
        found: set[int] = set()
        for path in self.layout.paths(literal):
            folders = [path]
            if recursive:
                folders += [Path(d) for d, _, _ in os.walk(path) if Path(d) != path]
            for folder in folders:
                try:
                    text = (folder / "cgroup.procs").read_text()
                except (FileNotFoundError, NotADirectoryError, ProcessLookupError):
                    continue
                found.update(int(line) for line in text.split())
        return found

    def exists(self, literal: str) -> bool:
        """True while the cgroup's folder exists in some hierarchy."""
        return any(path.is_dir() for path in self.layout.paths(literal))

    def populated(self, literal: str) -> bool:
        """v2: ``cgroup.events`` says ``populated 1``; v1: a process is in it or a descendant."""
        if self.layout.version == 2:
            try:
                events = (self.layout.paths(literal)[0] / "cgroup.events").read_text()
            except FileNotFoundError:
                return False
            return "populated 1" in events.splitlines()
        return bool(self.pids(literal))

    def kill(self, literal: str) -> None:
        """SIGKILL every process in the cgroup and its descendants (v2: ``cgroup.kill``; v1: each PID)."""
        if self.layout.version == 2:
            kill_file = self.layout.paths(literal)[0] / "cgroup.kill"
            try:
                kill_file.write_text("1")
                return
            except FileNotFoundError:
                if not self.exists(literal):
                    return
                # a kernel before 5.14 has no cgroup.kill: fall through to signalling each process
        for pid in self.pids(literal):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def remove(self, literal: str) -> None:
        """rmdir the cgroup (descendants first) in every hierarchy; ``EBUSY`` while a process is in it."""
        for path in self.layout.paths(literal):
            if not path.is_dir():
                continue
            for folder, _, _ in sorted(os.walk(path), key=lambda entry: -len(Path(entry[0]).parts)):
                with contextlib.suppress(FileNotFoundError):
                    os.rmdir(folder)
        for created in [c for c in self._created if c == literal or c.startswith(literal + "/")]:
            del self._created[created]

    def kill_and_remove(self, literal: str, timeout: float = 10.0) -> None:
        """Kill what runs in the cgroup, wait (polling its procs) until it is empty, then remove it.

        Blocking: for clean-up at exit; the dev kubelet's own path waits on its loop.
        """
        deadline = time.monotonic() + timeout
        while True:
            self.kill(literal)
            try:
                self.remove(literal)
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise
            time.sleep(0.01)

    def remove_created(self, timeout: float = 10.0) -> list[str]:
        """Remove every cgroup this object made, deepest first, killing what runs in them.

        Returns the problems met (a cgroup that would not go), never raises.
        """
        problems = []
        for literal in sorted(self._created, key=lambda c: -c.count("/")):
            if literal not in self._created:
                continue
            try:
                self.kill_and_remove(literal, timeout)
            except OSError as exc:
                problems.append(f"{literal}: {exc}")
        return problems


def cgroup_of(pid: int) -> dict[str, str]:
    """``/proc/<pid>/cgroup`` as ``{controllers: path}`` (controllers ``""`` for the v2 hierarchy)."""
    result: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        result[controllers] = path
    return result
