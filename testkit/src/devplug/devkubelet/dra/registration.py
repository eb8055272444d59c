"""The kubelet's plugin manager: the plugin watcher on ``plugins_registry/`` and its registration reconciler.

Follows ``pkg/kubelet/pluginmanager`` (Kubernetes 1.34 to 1.36; the reconciler,
the operation generator and the watcher of v1.32.10, as KubeEdge vendors them,
read the same, so every release modelled runs this one):

* **the watcher** (``pluginwatcher/plugin_watcher.go``, on fsnotify, i.e.
  inotify): the folder is made (mode 0755) if missing, watched, then walked;
  every unix socket found, and every one created later (``IN_CREATE``,
  ``IN_MOVED_TO``), is put in the *desired state* with a fresh identity
  (``AddOrUpdatePlugin``: a socket created again at the same path gets a new
  one); names starting with ``.`` are ignored; a folder created in it is
  watched and walked too; a path deleted (``IN_DELETE``, ``IN_DELETE_SELF``)
  leaves the desired state (``handleDeleteEvent``). Nothing else counts: a
  socket renamed away or whose attributes change is no event for the kubelet;
* **the reconciler** (``reconciler/reconciler.go``, every second,
  ``loopSleepDuration``): first it unregisters every registered plugin whose
  socket left the desired state or was created again, then it registers every
  desired socket not registered with its current identity;
* **operations** (``operationexecutor``): one at a time per socket; an
  operation that failed is not tried again for 500 ms, doubling after each
  failure up to 2 minutes (``exponentialbackoff``, reset when the next
  operation on the socket is of the other kind);
* **registering** (``operation_generator.go`` ``GenerateRegisterPluginFunc``):
  dial the socket (blocking, 10 s), ``GetInfo`` (1 s), find the handler for the
  plugin's type, take the socket itself as endpoint when the plugin gives
  none, let the handler validate, add the plugin to the *actual state*, let
  the handler register it, then ``NotifyRegistrationStatus`` (5 s):
  ``plugin_registered`` true, or false with the error. A refusal is notified
  and the operation fails (so it is retried with back-off); a plugin the
  handler refused *after* validation stays in the actual state and is not
  retried until its socket is created again;
* **unregistering**: remove from the actual state, then the handler's
  ``DeRegisterPlugin`` with the name and endpoint registered (1.33+; a 1.32
  ``cache.PluginHandler`` takes the name only, ``DeRegisterPlugin(pluginName)``:
  the DRA handler of 1.32 ignores the endpoint it is given here, see
  :mod:`~devplug.devkubelet.dra.plugins`).

The connection monitor of the closed PR #129799 (GetInfo every 10 s, the plugin
deregistered after two failures) never merged; what a kubelet notices of a
plugin that stops answering is its *service* connection going down (see
:mod:`~devplug.devkubelet.dra.plugins`). A plugin whose process died without
removing its registration socket stays registered.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import stat
import struct
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc
import grpc.aio

from devplug.api.gen.pluginregistration.v1 import api_pb2 as reg_pb
from devplug.api.gen.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from devplug.errors import KubeletError
from devplug.host.inotify import (
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_MOVED_TO,
    IN_ONLYDIR,
    IN_Q_OVERFLOW,
    Inotify,
    inotify,
)

__all__ = [
    "DIAL_TIMEOUT",
    "GET_INFO_TIMEOUT",
    "NOTIFY_TIMEOUT",
    "RECONCILE_PERIOD",
    "PluginHandler",
    "PluginWatcher",
    "RegisteredPlugin",
]

_log = logging.getLogger("devplug.devkubelet")

#: ``loopSleepDuration`` (``plugin_manager.go``).
RECONCILE_PERIOD = 1.0
#: ``dialTimeoutDuration``, the ``GetInfo`` deadline and ``notifyTimeoutDuration`` (``operation_generator.go``).
DIAL_TIMEOUT = 10.0
GET_INFO_TIMEOUT = 1.0
NOTIFY_TIMEOUT = 5.0
#: ``initialDurationBeforeRetry`` and ``maxDurationBeforeRetry`` (``exponentialbackoff``).
_BACKOFF_INITIAL = 0.5
_BACKOFF_MAX = 120.0

Recorder = Callable[[str, str, str], None]

#: What fsnotify's Create and Remove come from (its Write, Rename and Chmod the kubelet ignores).
_MASK = IN_CREATE | IN_MOVED_TO | IN_DELETE | IN_DELETE_SELF | IN_ONLYDIR
_IN_ISDIR = 0x40000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name


class PluginHandler(Protocol):
    """``cache.PluginHandler``: what a plugin type's consumer does with a plugin (DRA: the plugin manager)."""

    def validate_plugin(self, name: str, endpoint: str, versions: Sequence[str]) -> None:
        """Raise :class:`KubeletError` to refuse the plugin."""

    async def register_plugin(self, name: str, endpoint: str, versions: Sequence[str]) -> None:
        """Take the plugin; raise :class:`KubeletError` to refuse it."""

    async def deregister_plugin(self, name: str, endpoint: str) -> None:
        """Forget the plugin registered with this name and endpoint."""


@dataclass(frozen=True)
class RegisteredPlugin:
    """One entry of the actual state: a registered plugin by its registration socket."""

    socket: Path
    type: str
    name: str
    endpoint: str


@dataclass
class _Actual:
    identity: str
    type: str
    name: str
    endpoint: str
    handler: PluginHandler


@dataclass
class _Operation:
    kind: str
    pending: bool = True
    failed_at: float = 0.0
    backoff: float = 0.0


class _OperationError(Exception):
    """An operation failed; the message is the kubelet's."""


class PluginWatcher:
    """The plugin manager on one folder, with one handler per plugin type (see the module docstring).

    ``record(kind, plugin_name, detail)`` records an event; ``changed`` is
    called on every change of the actual state.
    """

    def __init__(
        self,
        directory: Path,
        handlers: Mapping[str, PluginHandler],
        record: Recorder,
        *,
        changed: Callable[[], None] = lambda: None,
        reconcile_period: float = RECONCILE_PERIOD,
        dial_timeout: float = DIAL_TIMEOUT,
        get_info_timeout: float = GET_INFO_TIMEOUT,
        notify_timeout: float = NOTIFY_TIMEOUT,
    ) -> None:
        self.directory = Path(directory).absolute()
        self._handlers = dict(handlers)
        self._record = record
        self._changed = changed
        self._period = reconcile_period
        self._dial_timeout = dial_timeout
        self._get_info_timeout = get_info_timeout
        self._notify_timeout = notify_timeout
        self._desired: dict[Path, str] = {}  # socket -> identity (``AddOrUpdatePlugin``'s UUID)
        self._actual: dict[Path, _Actual] = {}
        self._ops: dict[Path, _Operation] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._inotify: Inotify | None = inotify
        self._fd = -1
        self._watches: dict[int, Path] = {}  # watch descriptor -> folder
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reconciler: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Make the folder, watch it, walk it, and start the reconciler (KubeletError without inotify)."""
        if self._reconciler is not None:
            raise KubeletError("the plugin watcher is already running")
        if self._inotify is None:
            raise KubeletError("the kubelet's plugin watcher needs inotify (Linux)")
        self._loop = asyncio.get_running_loop()
        try:
            self.directory.mkdir(mode=0o755, parents=True, exist_ok=True)
            self._fd = self._inotify.init()
        except OSError as exc:
            raise KubeletError(f"failed to start plugin fsWatcher on {self.directory}: {exc}") from exc
        self._loop.add_reader(self._fd, self._read_events)
        try:
            self._traverse(self.directory)
        except KubeletError:
            self._close_watch()
            raise
        self._reconciler = self._loop.create_task(self._reconcile_loop())

    def _close_watch(self) -> None:
        if self._fd >= 0:
            if self._loop is not None:
                self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
        self._watches.clear()

    async def stop(self) -> None:
        """Stop watching and reconciling; registered plugins stay registered with their handlers (a kubelet exit)."""
        self._close_watch()
        tasks = [t for t in (self._reconciler, *self._tasks) if t is not None]
        self._reconciler = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._ops.clear()
        self._desired.clear()
        self._actual.clear()

    # -- observation -----------------------------------------------------------------------------

    def registered(self) -> list[RegisteredPlugin]:
        """The actual state: every registered plugin, by socket path."""
        return [RegisteredPlugin(p, a.type, a.name, a.endpoint) for p, a in sorted(self._actual.items())]

    def desired(self) -> list[Path]:
        """The desired state: every socket the watcher found and has not seen removed."""
        return sorted(self._desired)

    # -- the watcher (desired state of world populator) ------------------------------------------

    def _traverse(self, folder: Path) -> None:
        """``traversePluginDir``: watch ``folder``, then handle every entry below it as if just created."""
        assert self._inotify is not None
        try:
            self._watches[self._inotify.add_watch(self._fd, folder, _MASK)] = folder
        except OSError as exc:
            if folder == self.directory:
                raise KubeletError(f"failed to watch {folder}, err: {exc}") from exc
            _log.error("dev kubelet: failed to watch %s: %s", folder, exc)
            return
        for root, dirs, files in os.walk(folder):
            here = Path(root)
            for name in dirs:
                try:
                    self._watches[self._inotify.add_watch(self._fd, here / name, _MASK)] = here / name
                except OSError as exc:
                    _log.error("dev kubelet: failed to watch %s: %s", here / name, exc)
            for name in files:
                self._created(here / name)

    def _read_events(self) -> None:
        """The watch's queued events, as fsnotify hands them to the watcher's loop."""
        chunks = []
        while True:
            try:
                chunk = os.read(self._fd, 64 * 1024)
            except (BlockingIOError, OSError):
                break
            if not chunk:
                break
            chunks.append(chunk)
        data = b"".join(chunks)
        offset = 0
        while offset + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            offset += _EVENT.size
            name = os.fsdecode(data[offset : offset + length].split(b"\0", 1)[0])
            offset += length
            if mask & IN_Q_OVERFLOW:
                _log.error("dev kubelet: the plugin watcher's inotify queue overflowed")  # fsnotify's Errors
                continue
            folder = self._watches.get(wd)
            if folder is None:
                continue
            if mask & IN_IGNORED:
                self._watches.pop(wd, None)
                continue
            if mask & IN_DELETE_SELF:
                self._deleted(folder)
            elif mask & (IN_CREATE | IN_MOVED_TO) and name:
                self._created(folder / name, is_dir=bool(mask & _IN_ISDIR))
            elif mask & IN_DELETE and name:
                self._deleted(folder / name)

    def _created(self, path: Path, *, is_dir: bool = False) -> None:
        """``handleCreateEvent``: ignore names starting with '.', watch folders, add sockets to the desired state."""
        if path.name.startswith("."):
            return
        if is_dir:
            self._traverse(path)
            return
        try:
            st = path.lstat()
        except OSError:
            return  # gone again: its deletion follows
        if stat.S_ISSOCK(st.st_mode):
            self._desired[path] = str(uuid.uuid4())  # AddOrUpdatePlugin: a new identity

    def _deleted(self, path: Path) -> None:
        """``handleDeleteEvent``: the path leaves the desired state."""
        self._desired.pop(path, None)

    # -- the reconciler ----------------------------------------------------------------------------

    async def _reconcile_loop(self) -> None:
        while True:
            try:
                self.reconcile()
            except Exception:
                _log.exception("dev kubelet: the plugin reconciler failed")
            await asyncio.sleep(self._period)  # the kubelet's loopSleepDuration

    def reconcile(self) -> None:
        """One pass: unregistrations first, then registrations (each as an operation, see the module docstring)."""
        for path, registered in list(self._actual.items()):
            if self._desired.get(path) != registered.identity:
                self._run(path, "unregister", functools.partial(self._unregister, path, registered))
        for path, identity in list(self._desired.items()):
            actual = self._actual.get(path)
            if actual is None or actual.identity != identity:
                self._run(path, "register", functools.partial(self._register, path, identity))

    def _run(self, path: Path, kind: str, operation: Callable[[], Awaitable[None]]) -> None:
        """``nestedPendingOperations.Run``: one operation per socket, exponential back-off after a failure."""
        assert self._loop is not None
        op = self._ops.get(path)
        if op is not None:
            if op.pending:
                return
            if self._loop.time() < op.failed_at + op.backoff:
                if op.kind == kind:
                    return
                op.backoff = 0.0  # another kind of operation: the back-off starts anew
            op.kind, op.pending = kind, True
        else:
            op = self._ops[path] = _Operation(kind)
        task = self._loop.create_task(self._complete(path, op, operation))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _complete(self, path: Path, op: _Operation, operation: Callable[[], Awaitable[None]]) -> None:
        assert self._loop is not None
        try:
            await operation()
        except _OperationError as exc:
            op.pending = False
            op.failed_at = self._loop.time()
            op.backoff = _BACKOFF_INITIAL if op.backoff == 0 else min(op.backoff * 2, _BACKOFF_MAX)
            _log.info("dev kubelet: operation for %s failed (no retries for %gs): %s", path, op.backoff, exc)
            return
        except Exception as exc:
            op.pending = False
            op.failed_at = self._loop.time()
            op.backoff = _BACKOFF_INITIAL if op.backoff == 0 else min(op.backoff * 2, _BACKOFF_MAX)
            _log.exception("dev kubelet: operation for %s failed unexpectedly", path)
            self._record("plugin-registration-failed", "", f"{path}: unexpected {type(exc).__name__}: {exc}")
            return
        self._ops.pop(path, None)

    async def _register(self, path: Path, identity: str) -> None:
        """``GenerateRegisterPluginFunc``."""
        channel = grpc.aio.insecure_channel(f"unix:{path}")
        try:
            try:
                await asyncio.wait_for(channel.channel_ready(), self._dial_timeout)
            except asyncio.TimeoutError:
                raise self._fail(
                    "",
                    f"RegisterPlugin error -- dial failed at socket {path}, err: failed to dial socket {path}, "
                    "err: context deadline exceeded",
                ) from None
            stub = reg_grpc.RegistrationStub(channel)
            try:
                info = await stub.GetInfo(reg_pb.InfoRequest(), timeout=self._get_info_timeout)
            except grpc.aio.AioRpcError as exc:
                raise self._fail(
                    "",
                    f"RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {path}, "
                    f"err: {_rpc_text(exc)}",
                ) from None
            name, versions = str(info.name), [str(v) for v in info.supported_versions]
            handler = self._handlers.get(info.type)
            if handler is None:
                message = f"RegisterPlugin error -- no handler registered for plugin type: {info.type} at socket {path}"
                await self._notify(stub, path, name, False, message)
                raise self._fail(name, message)
            endpoint = str(info.endpoint) or str(path)
            try:
                handler.validate_plugin(name, endpoint, versions)
            except KubeletError as exc:
                await self._notify(
                    stub, path, name, False, f"RegisterPlugin error -- plugin validation failed with err: {exc}"
                )
                raise self._fail(name, f"plugin validation failed with err: {exc}") from None
            # added before the handler's Register, so that a removal meanwhile is handled as a deregistration
            self._actual[path] = _Actual(identity, str(info.type), name, endpoint, handler)
            self._changed()
            try:
                await handler.register_plugin(name, endpoint, versions)
            except KubeletError as exc:
                message = f"RegisterPlugin error -- plugin registration failed with err: {exc}"
                await self._notify(stub, path, name, False, message)
                raise self._fail(name, message) from None
            await self._notify(stub, path, name, True, "")
            self._record("plugin-registered", name, f"{info.type} at socket {path}, endpoint {endpoint}")
        finally:
            await channel.close(None)

    async def _notify(self, stub: reg_grpc.RegistrationStub, path: Path, name: str, ok: bool, error: str) -> None:
        """``notifyPlugin``: NotifyRegistrationStatus; a failed call fails the operation."""
        try:
            await stub.NotifyRegistrationStatus(
                reg_pb.RegistrationStatus(plugin_registered=ok, error=error), timeout=self._notify_timeout
            )
        except grpc.aio.AioRpcError as exc:
            what = error or f"RegisterPlugin error -- failed to send registration status at socket {path}"
            raise self._fail(name, f"{what}: {_rpc_text(exc)}") from None

    def _fail(self, name: str, message: str) -> _OperationError:
        self._record("plugin-registration-failed", name, message)
        return _OperationError(message)

    async def _unregister(self, path: Path, actual: _Actual) -> None:
        """``GenerateUnregisterPluginFunc``: out of the actual state, then the handler's DeRegisterPlugin."""
        if self._actual.get(path) is actual:
            del self._actual[path]
        self._changed()
        await actual.handler.deregister_plugin(actual.name, actual.endpoint)
        self._record("plugin-deregistered", actual.name, f"{actual.type} at socket {path}")


def _rpc_text(exc: grpc.aio.AioRpcError) -> str:
    return f"rpc error: code = {exc.code().name} desc = {exc.details()}"
