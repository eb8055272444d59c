"""One resource's plugin socket: serve, register with the kubelet, watch for a kubelet restart, and start over.

The kubelet deletes every plugin socket when it starts and never reconnects
on its own, so the loop is: serve ``v1beta1.DevicePlugin`` on a fresh socket
(mode 0600), call ``Registration/Register`` (retrying with capped backoff while
the kubelet is away), then wait for a sign of a kubelet restart — the socket
gone, ``kubelet.sock`` recreated, or the kubelet's own ListAndWatch stream
ended — and begin again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable

import grpc
import grpc.aio

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.config import KubeletConfig
from devplug.engine import Backoff, ResourceState, ResourceStatus, wait_any
from devplug.frontends.deviceplugin.registration_client import API_VERSION, register
from devplug.frontends.deviceplugin.servicer import DevicePluginService, StreamObserver

__all__ = ["PluginServer"]

log = logging.getLogger("devplug.engine")


class PluginServer:
    """Serves one resource and keeps it registered; implements the servicer's stream observer."""

    def __init__(
        self,
        name: str,
        kubelet: KubeletConfig,
        socket_name: str,
        options: dp.DevicePluginOptions,
        make_service: Callable[[StreamObserver], DevicePluginService],
        status: ResourceStatus,
        on_change: Callable[[], None],
    ) -> None:
        self.name = name
        self.kubelet = kubelet
        self.socket_name = socket_name
        self.socket_path = kubelet.device_plugin_dir / socket_name
        self.options = options
        self._make_service = make_service
        self.status = status
        self._on_change = on_change
        self.stopping = False
        #: Set once a newer instance took the node over: this one never registers again.
        self.superseded_by: str | None = None
        self._restart = asyncio.Event()
        self._restart_reason = ""
        self._kubelet_appeared = asyncio.Event()
        self._registered_kubelet_inode: int | None = None
        #: Each server not stopped yet, with the service it serves (the newest is the one registered).
        self._servers: dict[grpc.aio.Server, DevicePluginService] = {}
        self._socket_inode: int | None = None
        #: The ListAndWatch stream the kubelet opened after the latest Register (only its end is a restart sign).
        self._kubelet_stream: int | None = None
        self._awaiting_kubelet_stream = False
        self._running: asyncio.Event | None = None  # set once run() has returned

    # --- serving

    async def _serve(self) -> DevicePluginService:
        self._socket_inode = None  # folder events during the switch are about this very socket
        # The old server goes first: gRPC unlinks its socket path when it stops,
        # which would take the new server's socket with it.
        for old in self._servers.values():
            old.close()
        await asyncio.gather(*(self._stop_server(s, grace=1.0) for s in list(self._servers)))
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        service = self._make_service(self)
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((service.handler(),))
        try:
            server.add_insecure_port(f"unix:{self.socket_path}")
        except RuntimeError:  # gRPC says only that binding failed: ask the kernel why
            await server.stop(None)
            raise self._bind_error() from None
        await server.start()
        os.chmod(self.socket_path, 0o600)
        self._servers[server] = service
        self._socket_inode = self.socket_path.stat().st_ino
        return service

    def _bind_error(self) -> OSError:
        """Why the plugin socket cannot be bound (a read-only folder, a folder at its path), as the kernel says."""
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.bind(str(self.socket_path))
        except OSError as exc:
            return exc
        finally:
            probe.close()
        with contextlib.suppress(OSError):
            self.socket_path.unlink()
        return OSError(f"gRPC could not bind {self.socket_path}")

    async def _stop_server(self, server: grpc.aio.Server, grace: float) -> None:
        await server.stop(grace)
        self._servers.pop(server, None)

    def _register_request(self) -> dp.RegisterRequest:
        return dp.RegisterRequest(
            version=API_VERSION, endpoint=self.socket_name, resource_name=self.name, options=self.options
        )

    def _set(self, state: ResourceState | None = None, error: str | bool | None = False) -> None:
        if state is not None:
            self.status.state = state
        if error is not False:
            self.status.last_error = error if isinstance(error, str) else None
        self._on_change()

    # --- the loop

    async def run(self) -> None:
        """Serve and stay registered until :meth:`stop`; re-register after every kubelet restart."""
        self._running = asyncio.Event()
        try:
            while not self.stopping:
                try:
                    await self._serve_and_register()
                except Exception as exc:  # never leave the resource unregistered for good
                    self._set(error=f"serving failed: {type(exc).__name__}: {exc}")
                    log.exception("[%s] serving failed; starting over", self.name)
                    await wait_any(self._restart, timeout=1.0)
        finally:
            self._running.set()

    async def _serve_and_register(self) -> None:
        backoff = Backoff()
        while not self.stopping:
            self._restart.clear()
            try:
                await self._serve()
            except OSError as exc:
                # e.g. the kubelet, starting, deleted the fresh socket before it could be set up: serve again.
                self._set(error=f"serving on {self.socket_path} failed: {exc.strerror or exc}")
                log.warning("[%s] %s; retrying", self.name, self.status.last_error)
                await wait_any(self._restart, timeout=backoff.next())
                continue
            self._set(ResourceState.REGISTERING)
            backoff.reset()
            while not self.stopping and not self._restart.is_set():
                try:
                    inode = self._kubelet_inode()
                    self._kubelet_stream = None
                    self._awaiting_kubelet_stream = True  # the next stream opened is the kubelet's
                    # Cleared before the attempt, not after its failure: kubelet.sock appearing while a failed
                    # attempt was under way must still cut the backoff's wait short (up to 5 s otherwise).
                    self._kubelet_appeared.clear()
                    if not await self._register_unless_restarted():
                        break  # the socket went away meanwhile: serve afresh first
                except (grpc.aio.AioRpcError, OSError) as exc:
                    self._awaiting_kubelet_stream = False
                    detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
                    self._set(error=f"registration failed: {detail}")
                    delay = backoff.next()
                    log.warning(
                        "[%s] registration with %s failed (%s); retrying in %.2f s",
                        self.name,
                        self.kubelet.kubelet_socket,
                        detail,
                        delay,
                    )
                    await wait_any(self._restart, self._kubelet_appeared, timeout=delay)
                    continue
                self._registered_kubelet_inode = inode
                self.status.registrations += 1
                self.status.registered_at = time.time()
                self._set(ResourceState.REGISTERED, error=None)
                log.info("[%s] registered with the kubelet as %s", self.name, self.socket_name)
                break
            if self.stopping:
                break
            await wait_any(self._restart)  # returns at once if registration was cut short
            if not self.stopping:
                log.info("[%s] re-registering: %s", self.name, self._restart_reason)
                self._set(ResourceState.REGISTERING)

    async def _register_unless_restarted(self) -> bool:
        """Register; give up (returning False) if a restart is triggered meanwhile.

        The kubelet dials the plugin back inside Register; if the kubelet
        deleted the socket in the meantime, that dial would only time out.
        """
        call = asyncio.ensure_future(register(self.kubelet.kubelet_socket, self._register_request()))
        restarted = asyncio.ensure_future(self._restart.wait())
        try:
            await asyncio.wait((call, restarted), return_when=asyncio.FIRST_COMPLETED)
        finally:
            restarted.cancel()
        if call.done():
            call.result()
            return True
        call.cancel()
        return False

    def _kubelet_inode(self) -> int | None:
        try:
            return self.kubelet.kubelet_socket.stat().st_ino
        except OSError:
            return None

    # --- signs of a kubelet restart

    def trigger_reregister(self, reason: str) -> None:
        """Serve on a fresh socket and register again (the kubelet restarted or dropped the resource)."""
        if self.stopping:
            return
        if self.superseded_by is not None:
            log.info(
                "[%s] not registering again (%s): %s serves the resource now", self.name, reason, self.superseded_by
            )
            return
        if self.status.state is ResourceState.REGISTERED and not self._restart.is_set():
            self.status.kubelet_restarts += 1  # a registration lost: later signs of the same outage count no more
        self._restart_reason = reason
        self._restart.set()

    def on_plugin_dir_changed(self, names: frozenset[str]) -> None:
        """Entries of the device-plugin folder changed (empty: unknown which)."""
        if self.stopping:
            return
        if not names or "kubelet.sock" in names:
            inode = self._kubelet_inode()
            if inode is not None:
                self._kubelet_appeared.set()
                if self.status.state is ResourceState.REGISTERED and inode != self._registered_kubelet_inode:
                    self.trigger_reregister("kubelet.sock was recreated (kubelet restart)")
        if (not names or self.socket_name in names) and self._socket_inode is not None:
            try:
                current: int | None = self.socket_path.stat().st_ino
            except OSError:
                current = None
            if current != self._socket_inode:
                self._socket_inode = None
                self.trigger_reregister(f"socket {self.socket_path} was removed (kubelet restart)")

    # --- the stream observer protocol (ListAndWatch)

    def stream_opened(self, stream: int) -> None:
        """The first stream opened after a Register is the kubelet's (it opens one per registration)."""
        if self._awaiting_kubelet_stream:
            self._awaiting_kubelet_stream = False
            self._kubelet_stream = stream
            log.debug("[%s] ListAndWatch stream %d opened (the kubelet's)", self.name, stream)
        else:
            log.debug("[%s] ListAndWatch stream %d opened (another client's)", self.name, stream)

    def stream_closed(self, stream: int, by_peer: bool) -> None:
        """Only the end of the kubelet's own stream means the kubelet went away; other clients come and go."""
        if not by_peer or self.stopping:
            return
        if stream == self._kubelet_stream:
            self._kubelet_stream = None
            self.trigger_reregister("the kubelet ended the ListAndWatch stream")
        else:
            log.debug("[%s] ListAndWatch stream %d of another client ended; not a kubelet restart", self.name, stream)

    @property
    def kubelet_streaming(self) -> bool:
        """Registered, and the kubelet's ListAndWatch stream of that registration is open: from now on the
        kubelet ending it (say, because an older instance's stream ended, on kubelets before PR #135437) is
        seen, and answered by registering again."""
        return self._kubelet_stream is not None and self.status.state is ResourceState.REGISTERED

    # --- handover

    def supersede(self, successor: str) -> None:
        """A newer instance (serving at ``successor``) took over: never register again, whatever happens to
        this instance's registration (the kubelet ending its stream, the socket removed)."""
        self.superseded_by = successor

    # --- shutdown

    async def stop(self, grace: float) -> None:
        """Stop accepting, finish in-flight calls (``grace`` seconds), remove the socket."""
        self.stopping = True
        self._restart.set()
        if self._running is not None:  # let run() leave whatever it is doing (it may be binding a server)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._running.wait(), grace)
        for service in self._servers.values():
            service.close()
        await asyncio.gather(*(self._stop_server(s, grace) for s in list(self._servers)))
        with contextlib.suppress(FileNotFoundError):
            if self._socket_inode == self.socket_path.stat().st_ino:
                self.socket_path.unlink()
