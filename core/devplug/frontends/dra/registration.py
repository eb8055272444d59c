"""Registering a DRA driver with the kubelet's plugin watcher, and registering again when the kubelet loses it.

The kubelet watches ``plugins_registry/`` with inotify; for each new unix
socket it calls ``pluginregistration.Registration/GetInfo``, validates the
answer, registers the plugin and calls ``NotifyRegistrationStatus``
(``pkg/kubelet/pluginmanager``, Kubernetes 1.36; modelled in
:mod:`devplug.devkubelet.dra.registration`). :class:`RegistrationServer` serves
that socket for one instance of one driver:

* the socket is ``<plugins_registry>/<driver>-<instance>-reg.sock`` and the
  service endpoint it names ``<plugins>/<driver>/dra-<instance>.sock``: names
  unique per instance, as the Go helper's rolling updates use them (the kubelet
  calls the newest connected instance, PR #129832);
* ``GetInfo`` answers type ``DRAPlugin``, the driver name, the endpoint and the
  gRPC services served: ``v1.DRAPlugin``, ``v1beta1.DRAPlugin`` and, with the
  health service, ``v1alpha1.DRAResourceHealth``;
* ``NotifyRegistrationStatus`` is logged and kept in the resource's status
  (registered, how often, the kubelet's error when it refused);
* a kubelet that restarts walks the folder again and registers the socket it
  finds; one whose ``plugins_registry/`` was wiped (or whose socket someone
  removed) no longer sees it: the folder is watched and the socket made again
  whenever it is gone, so the kubelet's watcher sees a new socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from devplug.api.gen.pluginregistration.v1 import api_pb2 as reg_pb
from devplug.api.gen.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from devplug.engine import ResourceState, ResourceStatus
from devplug.host.watch import DirectoryWatcher

__all__ = [
    "HEALTH_SERVICE",
    "PLUGIN_TYPE",
    "SERVICES",
    "RegistrationServer",
    "RegistrationState",
    "listening",
    "registration_socket",
    "remove_dead_sockets",
    "service_socket",
]

log = logging.getLogger("devplug.frontends.dra")

#: ``PluginInfo.type`` of a DRA driver (``k8s.io/kubelet/pkg/apis/pluginregistration/v1`` ``DRAPlugin``).
PLUGIN_TYPE = "DRAPlugin"
#: The DRAPlugin services every instance serves, newest first (kubelets 1.34+ use v1, 1.32/1.33 v1beta1).
SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
#: The health service of KEP-4680, listed when served.
HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"
#: How often the socket's presence is checked when no inotify event comes (a missing folder, polling mode).
CHECK_INTERVAL_S = 1.0
#: How long a socket may go without the kubelet's GetInfo before the status says so (the kubelet's watcher finds
#: a new socket within its reconciler's second; dialling it may take 10 s).
NO_WORD_S = 30.0


def registration_socket(registry_dir: Path, driver: str, instance: str) -> Path:
    """``<registry_dir>/<driver>-<instance>-reg.sock``."""
    return registry_dir / f"{driver}-{instance}-reg.sock"


def service_socket(plugins_dir: Path, driver: str, instance: str) -> Path:
    """``<plugins_dir>/<driver>/dra-<instance>.sock``."""
    return plugins_dir / driver / f"dra-{instance}.sock"


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.lstat().st_mode)
    except OSError:
        return False


def listening(path: Path) -> bool:
    """Whether a process accepts connections on the unix socket ``path``."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def remove_dead_sockets(folder: Path, prefix: str, suffix: str) -> list[Path]:
    """Delete the unix sockets ``<prefix>*<suffix>`` in ``folder`` that nobody listens on (left by an instance
    killed with ``kill -9``; the kubelet would keep such a registration); another live instance's stay."""
    removed = []
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    for name in sorted(names):
        if not (name.startswith(prefix) and name.endswith(suffix)):
            continue
        path = folder / name
        try:
            if not stat.S_ISSOCK(path.lstat().st_mode):
                continue
        except FileNotFoundError:
            continue
        if listening(path):
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
            log.info("removed %s: a socket of an earlier instance nobody serves any more", path)
    return removed


@dataclass
class RegistrationState:
    """What the kubelet said about the registration, for ``devplug status``."""

    #: The last ``NotifyRegistrationStatus``: registered or not, and the kubelet's error.
    registered: bool | None = None
    error: str = ""
    #: How many times the kubelet registered the plugin (a kubelet restart registers it again).
    registrations: int = 0
    #: How many ``GetInfo`` calls came.
    get_info_calls: int = 0
    #: How many times the registration socket was made again after it vanished.
    recreated: int = 0
    #: How many times this instance registered again on purpose (:meth:`RegistrationServer.register_again`),
    #: why the last time, and how long the kubelet took to confirm it (None: not confirmed yet, or never asked).
    reregistrations: int = 0
    reregistered_because: str = ""
    reregistration_confirmed_s: float | None = None
    history: list[tuple[float, bool, str]] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "registered": self.registered,
            "error": self.error,
            "registrations": self.registrations,
            "get_info_calls": self.get_info_calls,
            "socket_recreated": self.recreated,
            "reregistrations": self.reregistrations,
        }
        if self.reregistrations:
            out["reregistered_because"] = self.reregistered_because
            out["reregistration_confirmed_s"] = self.reregistration_confirmed_s
        return out


class _Registration(reg_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, owner: RegistrationServer) -> None:
        self._owner = owner

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return self._owner.info()

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self._owner.notified(bool(request.plugin_registered), str(request.error))
        return reg_pb.RegistrationStatusResponse()


class RegistrationServer:
    """One instance's registration socket (see the module's docstring)."""

    def __init__(
        self,
        *,
        driver: str,
        registry_dir: Path,
        endpoint: Path,
        instance: str,
        services: Sequence[str],
        status: ResourceStatus,
        on_registered: Callable[[], None] = lambda: None,
        on_change: Callable[[], None] = lambda: None,
        on_other_gone: Callable[[str], None] = lambda _name: None,
        no_word_after: float = NO_WORD_S,
    ) -> None:
        self.driver = driver
        self.registry_dir = registry_dir
        self.endpoint = endpoint
        self.socket_path = registration_socket(registry_dir, driver, instance)
        self.services = tuple(services)
        self.status = status
        self.state = RegistrationState()
        self._on_registered = on_registered
        self._on_change = on_change
        self._server: grpc.aio.Server | None = None
        self._inode: tuple[int, int] | None = None
        self._check = asyncio.Event()
        self._watcher: DirectoryWatcher | None = None
        self._closing = False  # set by stop: the socket is never served again
        self._registered = asyncio.Event()  # set by the kubelet's NotifyRegistrationStatus(registered)
        self._making = asyncio.Lock()  # held while the socket is made (afresh)
        self._no_word_after = no_word_after
        self._made_at: float | None = None  # the event loop's clock when the socket was last made
        self._asked_since_made = False  # a GetInfo came on the socket as last made
        self._changed_names: set[str] = set()  # the registry folder's entries that changed (watcher's thread)
        self._others: set[str] = set()  # other instances' registration sockets of the driver seen in the folder
        #: Called with the name of another instance's registration socket of the driver that was removed.
        self._on_other_gone = on_other_gone

    # --- what the kubelet calls

    def info(self) -> Any:
        self.state.get_info_calls += 1
        self._asked_since_made = True
        return reg_pb.PluginInfo(
            type=PLUGIN_TYPE, name=self.driver, endpoint=str(self.endpoint), supported_versions=list(self.services)
        )

    def notified(self, registered: bool, error: str) -> None:
        state = self.state
        state.registered, state.error = registered, error
        state.history = [*state.history[-9:], (time.time(), registered, error)]
        if registered:
            self._registered.set()
            state.registrations += 1
            self.status.state = ResourceState.REGISTERED
            self.status.registrations = state.registrations
            self.status.registered_at = time.time()
            self.status.last_error = None
            log.info(
                "DRA driver %s registered with the kubelet (%s; registration %d)",
                self.driver,
                self.socket_path.name,
                state.registrations,
                extra={"driver": self.driver},
            )
            self._on_registered()
        else:
            self.status.state = ResourceState.REGISTERING
            self.status.last_error = f"the kubelet refused the DRA driver {self.driver}: {error or '(no reason)'}"
            log.error("%s", self.status.last_error, extra={"driver": self.driver})
        self._on_change()

    # --- serving

    @property
    def started(self) -> bool:
        """True once :meth:`start` was called."""
        return self._watcher is not None or self._server is not None

    async def start(self) -> None:
        """Serve the registration socket (made afresh) and watch that it stays there."""
        await self._serve()
        loop = asyncio.get_running_loop()

        def changed(names: frozenset[str]) -> None:
            loop.call_soon_threadsafe(self._folder_changed, names)

        self._others = set(self._other_sockets())
        self._watcher = DirectoryWatcher(self.registry_dir, changed, poll_interval=CHECK_INTERVAL_S)
        self._watcher.start()

    def _folder_changed(self, names: frozenset[str]) -> None:
        self._changed_names.update(names or self._others)  # an empty set: everything may have changed
        self._check.set()

    def _other_sockets(self) -> list[str]:
        """The names of the other registration sockets of the driver in the folder (another instance's)."""
        try:
            names = os.listdir(self.registry_dir)
        except OSError:
            return []
        return [n for n in names if self._other_name(n) and _is_socket(self.registry_dir / n)]

    def _other_name(self, name: str) -> bool:
        return name != self.socket_path.name and name.startswith(f"{self.driver}-") and name.endswith("-reg.sock")

    def _notice_others(self) -> None:
        """Tell ``on_other_gone`` of each other instance's socket removed since the last look."""
        changed, self._changed_names = self._changed_names, set()
        for name in sorted(changed):
            if not self._other_name(name):
                continue
            if _is_socket(self.registry_dir / name):
                self._others.add(name)
            elif name in self._others:
                self._others.discard(name)
                self._on_other_gone(name)

    async def register_again(self, why: str) -> None:
        """Make the socket afresh, so that the kubelet's watcher sees a new socket and registers this instance
        again (GetInfo, NotifyRegistrationStatus); :meth:`confirmed` waits for the kubelet's word."""
        if self._closing:
            return
        state = self.state
        state.reregistrations += 1
        state.reregistered_because = why
        state.reregistration_confirmed_s = None
        state.registered = None
        self._registered.clear()
        self.status.state = ResourceState.REGISTERING
        self.status.last_error = f"registering DRA driver {self.driver} again: {why}"
        log.warning(
            "DRA driver %s: registering again (%s): making %s afresh",
            self.driver,
            why,
            self.socket_path,
            extra={"driver": self.driver},
        )
        await self._serve()

    async def confirmed(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the kubelet's NotifyRegistrationStatus(registered) after
        :meth:`register_again`; True once it came (its delay is kept in the state)."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            await asyncio.wait_for(self._registered.wait(), timeout)
        except asyncio.TimeoutError:
            self.status.last_error = (
                f"DRA driver {self.driver} made its registration socket {self.socket_path} afresh "
                f"({self.state.reregistered_because}), but the kubelet has not registered it in {timeout:g} s: it "
                "registers a socket it finds when its plugin watcher sees it (is the kubelet's plugins_registry "
                "the daemon's?)"
            )
            log.error("%s", self.status.last_error, extra={"driver": self.driver})
            self._on_change()
            return False
        self.state.reregistration_confirmed_s = round(loop.time() - began, 3)
        log.info(
            "DRA driver %s: the kubelet registered this instance again in %.3f s",
            self.driver,
            self.state.reregistration_confirmed_s,
            extra={"driver": self.driver},
        )
        self._on_change()
        return True

    async def _serve(self) -> None:
        async with self._making:  # run() looks at the socket only between two makings of it
            await self._make()

    async def _make(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
            self._server = None
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = grpc.aio.server()
        reg_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix:{self.socket_path}")
        await server.start()
        self._server = server
        st = self.socket_path.stat()
        self._inode = (st.st_dev, st.st_ino)
        self._made_at, self._asked_since_made = asyncio.get_running_loop().time(), False
        if self.status.state is not ResourceState.REGISTERED:
            self.status.state = ResourceState.REGISTERING
        self._on_change()

    def _socket_there(self) -> bool:
        try:
            st = self.socket_path.lstat()
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return False
            raise
        return stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == self._inode

    async def run(self) -> None:
        """Make the socket again whenever it vanished (and after a failure to serve it), until cancelled."""
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._check.wait(), CHECK_INTERVAL_S)
            self._check.clear()
            if self._closing:  # stopping (or handed over to a newer instance): never serve the socket again
                continue
            self._notice_others()
            if self._making.locked():  # register_again makes it afresh right now: its deletion is no news
                continue
            self._say_if_unasked()
            if self._server is not None:
                if self._socket_there():
                    continue
                log.warning(
                    "DRA driver %s: the registration socket %s is gone (the kubelet's plugins_registry wiped?): "
                    "serving it again",
                    self.driver,
                    self.socket_path,
                    extra={"driver": self.driver},
                )
                self.state.recreated += 1
                self.state.registered = None
                self.status.state = ResourceState.REGISTERING
                self.status.kubelet_restarts += 1
            try:
                await self._serve()
            except (OSError, RuntimeError) as exc:
                self._server = None
                self.status.last_error = f"cannot serve the registration socket {self.socket_path}: {exc}"
                log.error("DRA driver %s: %s; trying again", self.driver, self.status.last_error)
                self._on_change()

    def _say_if_unasked(self) -> None:
        """The status says so when the kubelet has not called GetInfo on the socket ``no_word_after`` seconds
        after it was made: it never found it (another folder than the kubelet's), or never dialled it."""
        if self._asked_since_made or self._made_at is None or self.status.last_error is not None:
            return
        waited = asyncio.get_running_loop().time() - self._made_at
        if waited < self._no_word_after:
            return
        self.status.last_error = (
            f"the kubelet has not called GetInfo on {self.socket_path} in {waited:.0f} s since it was made: its "
            "plugin watcher finds the sockets of its own plugins_registry folder (is [kubelet] plugins_registry_dir "
            "that folder, mounted from the host?)"
        )
        log.error("DRA driver %s: %s", self.driver, self.status.last_error, extra={"driver": self.driver})
        self._on_change()

    async def stop(self) -> None:
        """Remove the socket first (the kubelet deregisters the instance), then stop serving it; never again."""
        self._closing = True
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        if self._server is not None and self._socket_there():
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        if self._server is not None:
            await self._server.stop(None)
            self._server = None
