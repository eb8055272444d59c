"""The mock driver: one device per file in a folder, every hook implemented.

Operators and tests drive it by editing files (see :mod:`devplug_mock.devicefile`
for what a device file may say), and read what the engine asked of it in the
call log (:mod:`devplug_mock.calllog`, kept by the kit's
:class:`devplug.kit.hookrecord.HookRecorder`). Files added, removed or
edited reach the engine at once through the :class:`devplug.DriverContext`,
by way of a :class:`devplug.host.watch.DirectoryWatcher` on the folder.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar, get_args

from devplug import (
    Claim,
    ContainerAllocation,
    Device,
    DeviceSpec,
    DriverContext,
    DriverError,
    Health,
    Mount,
    Replicas,
    hookimpl,
)
from devplug.host.watch import DirectoryWatcher
from devplug.kit import DriverRuntime
from devplug.kit.devnodes import NULL_DEVICE, is_device_node, mknod_char_device
from devplug.kit.hookrecord import HookRecorder
from devplug.options import node_checks, refuse_kernel_trees
from devplug.types import Partition, ShareCapacity
from devplug_mock.devicefile import DeviceFile, is_device_name, natural_key, read_device_file
from devplug_mock.features import (
    StatusMode,
    parse_partitions,
    parse_share_capacity,
    status_for,
)

__all__ = ["NODE_FOLDER", "MockDriver", "MockOptions"]

T = TypeVar("T")

# Only used when no inotify is available: hot-plug must reach the engine within 100 ms.
_POLL_INTERVAL = 0.05

_module_log = logging.getLogger("devplug_mock")

_NO_PARTS: Mapping[str, Partition] = MappingProxyType({})


@dataclass(frozen=True)
class MockOptions:
    """The mock driver's options, from ``[resources."<name>".options]``.

    ``directory``: the folder whose files are the devices (created at start);
    never inside ``/proc``, ``/sys`` or ``/dev``, whose files are not device
    files to read (``/proc/kmsg`` blocks a reader forever).
    ``count``: when set, ``start`` creates the empty files ``mock0`` ..
    ``mock<count-1>`` that are missing.
    ``inline_hooks``: run the hooks on the engine's event loop instead of the
    resource's hook thread (the driver then declares ``nonblocking_hooks``):
    what ``make bench`` uses, since the mock's hooks only append a line to
    the call log and look its devices up in memory. ``delay=`` directives
    are then ignored with a warning (a sleeping hook would stall every
    resource), ``check_health`` answers from the folder watch instead of
    re-reading every file, and there is no ``hook_timeout``.
    ``device_node``: the device node every device is handed out as when the
    driver may not make its own (``mknod`` refused, no ``CAP_MKNOD``); by
    default ``/dev/null``, with a warning. It must be a character or block device.
    ``partitions``, ``share_capacity``, ``device_status`` (contract 1.1, all off by default): devices declared as
    parts of parents with counters, the share capacity of every device, and the status ``allocate`` returns for
    each device (:mod:`devplug_mock.features` says what each takes).
    """

    directory: Path
    count: int | None = None
    inline_hooks: bool = False
    device_node: Path | None = None
    partitions: tuple[dict[str, Any], ...] = ()
    share_capacity: dict[str, Any] | None = None
    device_status: StatusMode | None = None
    #: ``partitions`` checked: each device ID it names -> its Partition (set by ``__post_init__``).
    parts: Mapping[str, Partition] = field(init=False, repr=False, compare=False, default_factory=lambda: _NO_PARTS)
    #: ``share_capacity`` checked (set by ``__post_init__``).
    capacity: ShareCapacity | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if not isinstance(self.directory, Path):
            if not isinstance(self.directory, str) or not self.directory:
                raise ValueError(f"directory: expected a path, got {self.directory!r}")
            object.__setattr__(self, "directory", Path(self.directory))
        refuse_kernel_trees(self.directory, "directory")
        count = self.count
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
            raise ValueError(f"count: must be an integer >= 0, got {count!r}")
        if not isinstance(self.inline_hooks, bool):
            raise ValueError(f"inline_hooks: must be true or false, got {self.inline_hooks!r}")
        node = self.device_node
        if node is not None:
            if not isinstance(node, str | Path) or not str(node).startswith("/"):
                raise ValueError(f"device_node: expected an absolute path to a device node, got {node!r}")
            object.__setattr__(self, "device_node", Path(node))
            # on the node (not `check-config --offline`): found at check-config, not only at start
            if node_checks() and not is_device_node(Path(node)):
                raise ValueError(f"device_node: {node} is not a character or block device")
        if not isinstance(self.partitions, list | tuple):
            raise ValueError(f"partitions: expected a list of tables, got {self.partitions!r}")
        object.__setattr__(self, "partitions", tuple(self.partitions))
        object.__setattr__(self, "parts", parse_partitions(self.partitions))
        if self.share_capacity is not None:
            if not isinstance(self.share_capacity, Mapping):
                raise ValueError(f"share_capacity: expected a table (name, per_replica), got {self.share_capacity!r}")
            object.__setattr__(self, "capacity", parse_share_capacity(self.share_capacity))
        if self.device_status not in (None, *get_args(StatusMode)):
            modes = ", ".join(repr(m) for m in get_args(StatusMode))
            raise ValueError(f"device_status: expected one of {modes}, got {self.device_status!r}")


def _shared(replicas: Replicas | None) -> dict[str, Any]:
    """What a call record says about shared devices (nothing when the call's devices are not shared)."""
    if replicas is None or not replicas.shared:
        return {}
    return {
        "replicas": {dev: list(ids) for dev, ids in replicas.by_device.items()},
        "tenants": dict(replicas.tenants),
    }


def _thawed(value: Any) -> Any:
    """A claim's read-only JSON value as plain dicts and lists (for the call log)."""
    if isinstance(value, Mapping):
        return {str(k): _thawed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_thawed(v) for v in value]
    return value


def _claimed(claim: Claim | None) -> dict[str, Any]:
    """What a call record says about the DRA claim of an allocate (nothing through the device-plugin API)."""
    if claim is None:
        return {}
    return {
        "claim": {
            "name": f"{claim.namespace}/{claim.name}",
            "uid": claim.uid,
            "requests": {request: list(ids) for request, ids in claim.requests.items()},
            "config": [
                {"source": c.source, "requests": list(c.requests), "parameters": _thawed(c.parameters)}
                for c in claim.config
            ],
        }
    }


def _directs(found: DeviceFile) -> bool:
    """Whether the file tells hooks to fail, wait or crash."""
    return bool(found.fail or found.delays or found.crash)


#: The hidden folder of the device folder where the driver makes each device's node (never a device itself).
NODE_FOLDER = ".dev"


def _is_null_node(path: Path) -> bool:
    """``path`` is a character device numbered as ``/dev/null``, mode 0666: what :meth:`MockDriver.node` makes."""
    try:
        found = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISCHR(found.st_mode)
        and stat.S_IMODE(found.st_mode) == 0o666
        and (os.major(found.st_rdev), os.minor(found.st_rdev)) == NULL_DEVICE
    )


class MockDriver:
    """A devplug driver whose devices are the regular files of a folder.

    Subclass it freely: every hook argument added to the contract after 1.0 (``retry``, ``replicas``) has a
    default, so a subclass written against contract 1.0 may call ``super().allocate(device_ids)``.

    Implements every hook. ``preferred_allocation`` defers to the core's NUMA
    packing. Each device describes what a container gets for it
    (``Device.allocation``): a character device as ``/dev/mock/<id>`` (rw),
    and its file mounted read-only at ``/var/run/mock/<id>``; the engine
    merges that into the answer, or writes it into a CDI spec (``[cdi]
    enabled``). The character device is ``<directory>/.dev/<id>``, which the
    driver makes (numbered as ``/dev/null``, 1:3) when it may: container
    runtimes refuse a device that is not a device node (containerd: "not a
    device node"). Where it may not, every device is handed out as the
    ``device_node`` option's node, ``/dev/null`` by default.
    ``allocate`` adds ``MOCK_DEVICES`` (the IDs, comma-separated). ``fail=``
    and ``delay=`` lines in a device file make the hooks that see the device
    fail or wait; ``replicas=N`` shares it among N containers. On shared
    devices the records of ``allocate``, ``pre_start`` and ``post_stop`` carry
    ``replicas`` (each physical device's replica IDs in the call) and
    ``tenants`` (the other allocations holding replicas of it).
    """

    #: The hook contract this driver was written against (see devplug.contract); the core refuses a mismatch.
    hook_contract: ClassVar[str] = "1.0"

    Options: ClassVar[type[MockOptions]] = MockOptions

    def __init__(self, options: MockOptions) -> None:
        self.options = options
        #: Read by the engine when the resource starts: hooks on the event loop (``inline_hooks``).
        self.nonblocking_hooks = options.inline_hooks
        self.directory = Path(options.directory).absolute()
        self.calls = HookRecorder(self.directory, logger=_module_log)
        self.runtime = DriverRuntime(name="mock")
        self._watcher: DirectoryWatcher | None = None
        self._lock = threading.Lock()
        self._known: dict[str, DeviceFile] = {}  # what the engine was last told, by device ID
        self._directed: set[str] = set()  # the IDs in _known whose files hold fail=, delay= or crash= lines
        self._stopping = threading.Event()
        self._nodes = self.directory / NODE_FOLDER
        self._node_lock = threading.Lock()
        self._with_node: set[str] = set()  # the IDs whose node exists in .dev
        self._shared_node: str | None = None  # the node every device gets once mknod was refused

    def __repr__(self) -> str:
        return f"<MockDriver {str(self.directory)!r}>"

    @property
    def _log(self) -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
        return self.runtime.log if self.runtime.started else _module_log

    # --- lifecycle

    @hookimpl
    def start(self, ctx: DriverContext) -> None:
        """Create the folder (and the ``count`` files), then watch it for hot-plug."""
        self.stop()
        self._stopping.clear()
        self.runtime.start(ctx)
        node = self.options.device_node
        if node is not None and not is_device_node(node):
            raise DriverError(f"mock: device_node {node} is not a character or block device")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            for i in range(self.options.count or 0):
                self._create_empty(self.directory / f"mock{i}")
            for device_id in self.options.parts:
                self._create_empty(self.directory / device_id)
        except OSError as exc:
            raise DriverError(f"mock: cannot set up the device folder {self.directory}: {exc}") from exc
        watcher = DirectoryWatcher(
            self.directory,
            self._on_change,
            poll_interval=_POLL_INTERVAL,
            each_write=False,  # the call log's appends are no device change
            on_problem=ctx.report_problem,  # a file in the folder's place: devplug status and /readyz say so
        )
        try:
            watcher.start()
        except OSError as exc:
            raise DriverError(f"mock: cannot watch {self.directory}: {exc}") from exc
        self._watcher = watcher
        self._scan()  # what the watcher's first changes are compared with

    @hookimpl
    def stop(self) -> None:
        """Stop watching the folder and cut short any ``delay=`` a hook is sleeping."""
        self._stopping.set()
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.close()

    # --- devices and health

    @hookimpl
    def list_devices(self) -> list[Device]:
        """Every device file in the folder, in natural order (``mock2`` before ``mock10``)."""
        return [self._device(f) for f in self._scan()]

    @hookimpl
    def check_health(self, devices: Sequence[Device]) -> dict[str, Health]:
        """Re-read the devices' files; the IDs whose health differs from ``devices``.

        With ``inline_hooks`` the files are not read on the event loop: the
        answer comes from the folder watch (:meth:`_device_files`), so an edit
        the watch cannot see (through a hard link elsewhere) goes unnoticed.

        A device whose file is gone is reported unhealthy (hot-plug removes it
        from the table soon after).
        """
        changed: dict[str, Health] = {}
        ids = [d.id for d in devices]
        if self.nonblocking_hooks:
            files = {f.id: f for f in self._device_files(ids)}
        else:
            files = {i: f for i in ids if (f := read_device_file(self.directory, i)) is not None}
        for device in devices:
            found = files.get(device.id)
            health = found.device.health if found is not None else Health.UNHEALTHY
            if health is not device.health:
                changed[device.id] = health
        return changed

    # --- allocation

    @hookimpl
    def preferred_allocation(
        self, available: Sequence[Device], must_include: Sequence[str], size: int
    ) -> list[str] | None:
        """Defer to the core's default (``None``), unless an available device says ``fail=``."""
        return self._hook(
            "preferred_allocation",
            [d.id for d in available],
            lambda: None,
            extra={"must_include": list(must_include), "size": size},
        )

    @hookimpl
    def allocate(
        self, device_ids: Sequence[str], replicas: Replicas | None = None, claim: Claim | None = None
    ) -> ContainerAllocation:
        """``MOCK_DEVICES``; the device nodes and mounts come from the devices' own descriptions. A DRA claim's
        allocate is logged with the claim (name, UID, devices by request, opaque parameters).

        With the ``device_status`` option, the answer carries a :class:`devplug.DeviceStatus` per device ID it was
        given (:func:`devplug_mock.features.status_for`), and the call's record has them as ``device_status``
        (each in the API's field names)."""
        mode = self.options.device_status
        statuses = {} if mode is None else {i: status_for(i, claim, mode) for i in dict.fromkeys(device_ids)}
        extra: dict[str, Any] = {**_shared(replicas), **_claimed(claim)}
        if statuses:
            extra["device_status"] = {i: s.to_json() for i, s in statuses.items()}

        def allocation() -> ContainerAllocation:
            return ContainerAllocation(envs={"MOCK_DEVICES": ",".join(device_ids)}, device_status=statuses)

        return self._hook("allocate", device_ids, allocation, extra=extra)

    @hookimpl
    def pre_start(self, device_ids: Sequence[str], replicas: Replicas | None = None) -> None:
        """Record the call (and obey ``fail=``/``delay=``)."""
        self._hook("pre_start", device_ids, lambda: None, extra=_shared(replicas))

    @hookimpl
    def post_stop(self, device_ids: Sequence[str], retry: bool = False, replicas: Replicas | None = None) -> None:
        """Record the call, with ``retry`` when true (and obey ``fail=``/``delay=``)."""
        self._hook("post_stop", device_ids, lambda: None, retry=retry, extra=_shared(replicas))

    @hookimpl
    def deallocate(self, device_ids: Sequence[str], retry: bool = False) -> None:
        """Record the call, with ``retry`` when true (and obey ``fail=``/``delay=``).

        Without ``replicas``, as drivers written before sharing (and subclasses calling it) have it: a shared
        device's deallocate needs nothing but the physical IDs.
        """
        self._hook("deallocate", device_ids, lambda: None, retry=retry)

    # --- internals

    def describe(self, device_id: str) -> ContainerAllocation:
        """What a container gets for one device: its node as ``/dev/mock/<id>`` (rw), its file at
        ``/var/run/mock/<id>`` (ro). Makes the node when it is missing (see the class docstring)."""
        return ContainerAllocation(
            devices=(
                DeviceSpec(container_path=f"/dev/mock/{device_id}", host_path=self.node(device_id), permissions="rw"),
            ),
            mounts=(
                Mount(
                    container_path=f"/var/run/mock/{device_id}",
                    host_path=str(self.directory / device_id),
                    read_only=True,
                ),
            ),
        )

    def node(self, device_id: str) -> str:
        """The host path of the device node a container gets for ``device_id`` (made if missing)."""
        with self._node_lock:
            if self._shared_node is not None:
                return self._shared_node
            path = self._nodes / device_id
            if device_id not in self._with_node and _is_null_node(path):
                # A node an earlier start made (a restart, the new instance of a handover) is what mknod would make
                # again: kept. Measured (issue 42): re-making 1,000 nodes (unlink, mknod, chmod) was half of
                # list_devices at a handover's start, ~100 ms of every held call's wait on the bench's node.
                self._with_node.add(device_id)
            if device_id not in self._with_node or not os.path.lexists(path):
                try:
                    self._nodes.mkdir(exist_ok=True)
                    mknod_char_device(path)
                except PermissionError as exc:
                    return self._share_one_node(exc)
                self._with_node.add(device_id)
            return str(path)

    def _share_one_node(self, exc: OSError) -> str:
        """mknod was refused: from now on every device is the ``device_node`` option's node (or /dev/null)."""
        configured = self.options.device_node
        self._shared_node = str(configured) if configured is not None else "/dev/null"
        if configured is None:
            self._log.warning(
                "mock: cannot make device nodes in %s (%s); every device is handed out as /dev/null "
                "(set the device_node option to choose another)",
                self._nodes,
                exc.strerror or exc,
            )
        return self._shared_node

    def _forget_node(self, device_id: str) -> None:
        """The device is gone: so is its node."""
        with self._node_lock:
            if device_id in self._with_node:
                self._with_node.discard(device_id)
                with contextlib.suppress(FileNotFoundError, NotADirectoryError):  # its folder may be a file now
                    (self._nodes / device_id).unlink()

    def _device(self, found: DeviceFile) -> Device:
        """The device to advertise, with what a container gets for it (and its ``partition`` and
        ``share_capacity`` when the options give them)."""
        options = self.options
        if options.capacity is None and not options.parts:
            return replace(found.device, allocation=self.describe(found.id))
        return replace(
            found.device,
            allocation=self.describe(found.id),
            partition=options.parts.get(found.id),
            share_capacity=options.capacity,
        )

    def _hook(
        self,
        hook: str,
        device_ids: Sequence[str],
        body: Callable[[], T],
        extra: Mapping[str, Any] | None = None,
        retry: bool = False,
    ) -> T:
        """Note the call's start; run its devices' ``delay=`` (the longest), their ``fail=``, ``body``; log the call.

        Directives are those of the files as they are at the call, so a test
        can edit a file and call the hook at once (:meth:`_device_files`).
        """
        ids = list(device_ids)
        self.calls.begin(hook, ids, retry=retry, extra=extra)
        try:
            files = self._directing_files(ids)  # usually none: then no directive to look for
            delay = max([f.delays.get(hook, 0.0) for f in files], default=0.0)
            if delay > 0 and self.nonblocking_hooks:
                self._log.warning(
                    "delay=%s:%g ignored: the hooks run on the event loop (inline_hooks = true)", hook, delay
                )
            elif delay > 0:
                self._stopping.wait(delay)
            failing = [f.id for f in files if hook in f.fail]
            if failing:
                raise DriverError(
                    f"mock: {hook} failed for device {', '.join(failing)} "
                    f"(fail={hook} in {self.directory / failing[0]})"
                )
            result = body()
        except Exception as exc:
            self.calls.record(hook, ids, retry=retry, error=str(exc), extra=extra)
            raise
        self.calls.record(hook, ids, retry=retry, extra=extra)
        crashing = [f.id for f in files if hook in f.crash]
        if crashing:
            self._log.warning("crash=%s in %s: killing the daemon (SIGKILL)", hook, self.directory / crashing[0])
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    def _device_files(self, ids: Sequence[str]) -> list[DeviceFile]:
        """The files of ``ids`` (those that are device files) as they are now.

        The watcher first delivers every change made before the call (one
        read of its queue), so what it keeps is current: no file is read or
        stat'ed per device, which matters for a GetPreferredAllocation
        offering 1,000 devices. Before ``start``, the files are read.
        """
        watcher = self._watcher
        if watcher is None:
            return [f for f in (read_device_file(self.directory, i) for i in ids) if f is not None]
        watcher.sync()
        with self._lock:
            known = self._known
            return [f for i in ids if (f := known.get(i)) is not None]

    def _directing_files(self, ids: Sequence[str]) -> list[DeviceFile]:
        """The files of ``ids`` with ``fail=``, ``delay=`` or ``crash=`` lines, as they are now
        (as :meth:`_device_files`, but without a lookup per device when no file directs anything)."""
        watcher = self._watcher
        if watcher is None:
            return [f for f in self._device_files(ids) if _directs(f)]
        watcher.sync()
        with self._lock:
            directed = self._directed
            if not directed:
                return []
            return [self._known[i] for i in dict.fromkeys(ids) if i in directed]

    @staticmethod
    def _create_empty(path: Path) -> None:
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))

    def _report(self, found: DeviceFile) -> None:
        for problem in found.problems:
            self._log.warning("device file %s: %s", self.directory / found.id, problem)

    def _scan(self) -> list[DeviceFile]:
        """Read every device file, remember them as what the engine knows, in natural order."""
        try:
            names = os.listdir(self.directory)
        except (FileNotFoundError, NotADirectoryError):  # no folder (the watch says so when a file is in its place)
            names = []
        files = [f for f in (read_device_file(self.directory, n) for n in names) if f is not None]
        files.sort(key=lambda f: natural_key(f.id))
        with self._lock:
            fresh = [f for f in files if self._known.get(f.id) != f]
            gone = set(self._known) - {f.id for f in files}
            self._known = {f.id: f for f in files}
            self._directed = {f.id for f in files if _directs(f)}
        for found in fresh:
            self._report(found)
        for device_id in gone:
            self._forget_node(device_id)
        return files

    def _reread(self, names: Iterable[str]) -> tuple[list[Device], list[str]]:
        """Re-read ``names``: the devices that changed for the engine and the IDs removed."""
        changed: list[DeviceFile] = []
        removed: list[str] = []
        for name in sorted([n for n in names if is_device_name(n)], key=natural_key):  # not the call record
            found = read_device_file(self.directory, name)
            with self._lock:
                old = self._known.pop(name, None)
                self._directed.discard(name)
                if found is not None:
                    self._known[name] = found
                    if _directs(found):
                        self._directed.add(name)
            if found is None:
                if old is not None:
                    removed.append(name)
                    self._forget_node(name)
            elif found != old:
                self._report(found)
                if old is None or old.device != found.device:
                    changed.append(found)
        return [self._device(f) for f in changed], removed

    def _on_change(self, names: frozenset[str]) -> None:
        """The watcher's callback: push what changed to the engine."""
        if not self.runtime.started or self._stopping.is_set():
            return
        ctx = self.runtime.ctx
        if not names:
            ctx.set_devices(self._device(f) for f in self._scan())
            return
        changed, removed = self._reread(names)
        if changed or removed:
            ctx.update_devices(changed, removed)
