"""One configured resource through its whole life: driver start, serving, registration,
re-registration after kubelet restarts, health, recovery from a failing driver, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import grpc.aio

from devplug.api.convert import options_to_pb
from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.config import KubeletConfig, ResourceConfig
from devplug.context import DriverContext
from devplug.drivers import DriverHooks, check_device_list
from devplug.engine.checkpointview import CheckpointView
from devplug.engine.devicetable import DeviceTable
from devplug.engine.hookrunner import HookRunner
from devplug.engine.ledger import Ledger
from devplug.engine.lifecycle import DeviceLifecycle
from devplug.engine.registration import API_VERSION, Backoff, register
from devplug.engine.servicer import DevicePluginService
from devplug.engine.statedir import prepare_resource_dir
from devplug.engine.supervise import supervise
from devplug.errors import DriverError, HookTimeoutError, StateError
from devplug.resource_names import resource_state_dir, socket_file_name
from devplug.types import Device

__all__ = ["Resource", "ResourceState"]

log = logging.getLogger("devplug.engine")


async def wait_any(*events: asyncio.Event, timeout: float | None = None) -> None:
    """Return when any of ``events`` is set, or after ``timeout`` seconds."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


class ResourceState(str, enum.Enum):
    """Where a resource is in its life, as ``devplug status`` shows it."""

    STARTING = "starting"
    FAILED = "failed"  # the driver's start failed; retried with backoff
    REGISTERING = "registering"
    REGISTERED = "registered"
    STOPPED = "stopped"


class _LoopSink:
    """The engine's :class:`~devplug.context.DeviceSink`: moves pushes from any thread onto the event loop."""

    def __init__(self, resource: Resource, loop: asyncio.AbstractEventLoop) -> None:
        self._resource = resource
        self._loop = loop

    def replace_devices(self, devices: list[Device]) -> None:
        checked = check_device_list(self._resource.name, devices)
        self._loop.call_soon_threadsafe(self._resource.table.replace, checked)

    def update_devices(self, changed: list[Device], removed: list[str]) -> None:
        check_device_list(self._resource.name, changed)
        self._loop.call_soon_threadsafe(self._resource.table.update, changed, removed)

    def request_relist(self) -> None:
        self._loop.call_soon_threadsafe(self._resource.schedule_relist)


class Resource:
    """A configured resource: its driver, device table, ledger, gRPC server and registration."""

    def __init__(
        self,
        config: ResourceConfig,
        kubelet: KubeletConfig,
        state_dir: Path,
        write_file: Callable[[Path, bytes], Awaitable[None]],
        checkpoint: CheckpointView,
        on_change: Callable[[], None] = lambda: None,
        on_allocated: Callable[[], None] = lambda: None,
    ) -> None:
        self.config = config
        self.name = config.name
        self.kubelet = kubelet
        self.socket_name = socket_file_name(self.name, len(str(kubelet.device_plugin_dir)))
        self.socket_path = kubelet.device_plugin_dir / self.socket_name
        self._state_root = state_dir
        self.state_dir = resource_state_dir(state_dir, self.name)
        self.driver_state_dir = self.state_dir / "driver"
        self._write_file = write_file
        self._on_change = on_change
        self.table = DeviceTable()
        self.runner = HookRunner(self.name, config.hook_timeout)
        self.ledger = Ledger(self.name, self.state_dir / "ledger.json")
        self.hooks: DriverHooks | None = None
        self.lifecycle: DeviceLifecycle | None = None
        self.state = ResourceState.STARTING
        self.last_error: str | None = None
        self.registrations = 0
        self.registered_at: float | None = None
        self.stopping = False
        self._restart = asyncio.Event()
        self._restart_reason = ""
        self._kubelet_appeared = asyncio.Event()
        self._registered_kubelet_inode: int | None = None
        self._service: DevicePluginService | None = None
        self._servers: set[grpc.aio.Server] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._relist_pending = False
        self._recovering = False
        self._started_driver = False
        self._socket_inode: int | None = None
        #: The ListAndWatch stream the kubelet opened after the latest Register (only its end is a restart sign).
        self._kubelet_stream: int | None = None
        self._awaiting_kubelet_stream = False
        self._running: asyncio.Event | None = None  # set once run() has returned
        self.checkpoint = checkpoint
        self._on_allocated = on_allocated
        #: Why the last ledger write failed (a full disk), until one succeeds; shown in ``devplug status``.
        self.state_error: str | None = None

    # --- driver start

    async def start_driver(self) -> None:
        """Create the driver instance, call its ``start`` and ``list_devices``, load the ledger."""
        prepare_resource_dir(self._state_root, self.name)
        self.ledger.load()
        cls = self.config.driver_class
        try:
            driver = cls() if getattr(cls, "Options", None) is None else cls(self.config.options)
        except Exception as exc:
            raise DriverError(f"{self.name}: creating driver {self.config.driver!r} failed: {exc}") from exc
        hooks = DriverHooks(self.name, driver)
        ctx = DriverContext(self.name, self.driver_state_dir, _LoopSink(self, asyncio.get_running_loop()))
        await self.runner.call("start", hooks.start, ctx)
        self.hooks = hooks
        self._started_driver = True
        self.lifecycle = DeviceLifecycle(
            self.name,
            self.table,
            hooks,
            self.runner,
            self.ledger,
            self.save_ledger,
            self.checkpoint,
            self._on_allocated,
        )
        if self.ledger.lost:
            await self._adopt_from_checkpoint()
        self.table.set_withheld(self.ledger.releasing_devices())
        try:
            devices = await self.runner.call("list_devices", hooks.list_devices)
        except DriverError as exc:
            devices = []
            self.degrade(str(exc))
        self.table.replace(devices)
        log.info(
            "[%s] driver %s started with %d devices (hooks: %s)",
            self.name,
            self.config.driver,
            len(devices),
            ", ".join(hooks.implemented()),
        )

    async def _adopt_from_checkpoint(self) -> None:
        """The ledger was lost: take in what the kubelet's checkpoint says pods held, before registering.

        Read before this resource registers (a ListAndWatch message makes the
        kubelet rewrite the file, dropping pods that ended meanwhile), so the
        devices of pods that ended while the daemon was down are adopted too
        and then released by the reconciler; those of running pods stay held.
        """
        self.ledger.lost = False
        checkpoint = self.checkpoint.current()
        if checkpoint is None:
            return
        by_pod: dict[str, set[str]] = {}
        for entry in checkpoint.entries_for(self.name):
            by_pod.setdefault(entry.pod_uid, set()).update(entry.device_ids)
        now = time.time()
        adopted = []
        for uid, devices in sorted(by_pod.items()):
            record = self.ledger.adopt(devices, now, "the kubelet's checkpoint", pod_uid=uid)
            if record is not None:
                adopted.append(record)
                log.warning(
                    "[%s] allocation ledger lost: adopted %s, which the kubelet's checkpoint gives to pod %s",
                    self.name,
                    ", ".join(record.devices),
                    uid,
                    extra={"device": ", ".join(record.devices)},
                )
        if adopted:
            await self.save_ledger()

    async def save_ledger(self) -> None:
        """Write the ledger; a failure (a full disk) is kept as :attr:`state_error` until a write succeeds."""
        try:
            await self._write_file(self.ledger.path, self.ledger.serialize())
        except OSError as exc:
            self.state_error = f"cannot write {self.ledger.path}: {exc.strerror or exc} (at {time.time():.0f})"
            self._on_change()
            raise
        self.state_error = None
        self._on_change()

    def options(self) -> dp.DevicePluginOptions:
        """The options advertised to the kubelet, derived from the hooks the driver implements."""
        assert self.hooks is not None
        return options_to_pb(
            pre_start=self.hooks.implements("pre_start"),
            preferred_allocation=self.hooks.implements("preferred_allocation"),
            post_stop=self.hooks.implements("post_stop"),
            deallocate=self.hooks.implements("deallocate"),
        )

    async def live(self) -> None:
        """The resource's whole life: start the driver (retrying with backoff), then serve and watch health."""
        backoff = Backoff(initial=1.0, cap=30.0)
        while not self.stopping:
            try:
                await self.start_driver()
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                expected = isinstance(exc, DriverError | StateError)
                self.state = ResourceState.FAILED
                self.last_error = str(exc) if expected else f"start failed: {type(exc).__name__}: {exc}"
                self._on_change()
                delay = backoff.next()
                log.error(
                    "[%s] start failed, retrying in %.0f s: %s",
                    self.name,
                    delay,
                    self.last_error,
                    exc_info=None if expected else exc,
                )
                await self._reset_after_failed_start()
                await asyncio.sleep(delay)
        if self.stopping:
            return
        await asyncio.gather(
            self.run(),
            supervise(
                f"[{self.name}] the health loop", self.health_loop, report=self._report, stopping=lambda: self.stopping
            ),
        )

    def _report(self, reason: str | None) -> None:
        self.last_error = reason
        self._on_change()

    async def _reset_after_failed_start(self) -> None:
        """Forget a half-done start, so the next attempt begins afresh (the driver's start is called again)."""
        if self._started_driver and self.hooks is not None:
            with contextlib.suppress(DriverError):
                await self.runner.call("stop", self.hooks.stop)
        self.hooks = None
        self.lifecycle = None
        self._started_driver = False

    # --- serving and registration

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self) -> DevicePluginService:
        assert self.lifecycle is not None
        self._socket_inode = None  # folder events during the switch are about this very socket
        # The old server goes first: gRPC unlinks its socket path when it stops,
        # which would take the new server's socket with it.
        if self._service is not None:
            self._service.close()
        await asyncio.gather(*(self._stop_server(s, grace=1.0) for s in list(self._servers)))
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        service = DevicePluginService(self.lifecycle, self.table, self.options(), self)
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((service.handler(),))
        try:
            server.add_insecure_port(f"unix:{self.socket_path}")
        except RuntimeError:  # gRPC says only that binding failed: ask the kernel why
            await server.stop(None)
            raise self._bind_error() from None
        await server.start()
        os.chmod(self.socket_path, 0o600)
        self._servers.add(server)
        self._service = service
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
        self._servers.discard(server)

    def _register_request(self) -> dp.RegisterRequest:
        return dp.RegisterRequest(
            version=API_VERSION, endpoint=self.socket_name, resource_name=self.name, options=self.options()
        )

    async def run(self) -> None:
        """Serve and stay registered until :meth:`stop`; re-register after every kubelet restart."""
        self._running = asyncio.Event()
        try:
            while not self.stopping:
                try:
                    await self._serve_and_register()
                except Exception as exc:  # never leave the resource unregistered for good
                    self.last_error = f"serving failed: {type(exc).__name__}: {exc}"
                    self._on_change()
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
                self.last_error = f"serving on {self.socket_path} failed: {exc.strerror or exc}"
                self._on_change()
                log.warning("[%s] %s; retrying", self.name, self.last_error)
                await wait_any(self._restart, timeout=backoff.next())
                continue
            self.state = ResourceState.REGISTERING
            self._on_change()
            backoff.reset()
            while not self.stopping and not self._restart.is_set():
                try:
                    inode = self._kubelet_inode()
                    self._kubelet_stream = None
                    self._awaiting_kubelet_stream = True  # the next stream opened is the kubelet's
                    if not await self._register_unless_restarted():
                        break  # the socket went away meanwhile: serve afresh first
                except (grpc.aio.AioRpcError, OSError) as exc:
                    self._awaiting_kubelet_stream = False
                    detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
                    self.last_error = f"registration failed: {detail}"
                    self._on_change()
                    delay = backoff.next()
                    log.warning(
                        "[%s] registration with %s failed (%s); retrying in %.2f s",
                        self.name,
                        self.kubelet.kubelet_socket,
                        detail,
                        delay,
                    )
                    self._kubelet_appeared.clear()
                    await wait_any(self._restart, self._kubelet_appeared, timeout=delay)
                    continue
                self._registered_kubelet_inode = inode
                self.registrations += 1
                self.registered_at = time.time()
                self.last_error = None
                self.state = ResourceState.REGISTERED
                self._on_change()
                log.info("[%s] registered with the kubelet as %s", self.name, self.socket_name)
                break
            if self.stopping:
                break
            await wait_any(self._restart)  # returns at once if registration was cut short
            if not self.stopping:
                log.info("[%s] re-registering: %s", self.name, self._restart_reason)
                self.state = ResourceState.REGISTERING
                self._on_change()

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

    def trigger_reregister(self, reason: str) -> None:
        """Serve on a fresh socket and register again (the kubelet restarted or dropped the resource)."""
        if self.stopping or self.lifecycle is None:
            return
        self._restart_reason = reason
        self._restart.set()

    def on_plugin_dir_changed(self, names: frozenset[str]) -> None:
        """Called by the daemon when entries of the device-plugin folder changed (empty: unknown which)."""
        if self.stopping or self.lifecycle is None:
            return
        if not names or "kubelet.sock" in names:
            inode = self._kubelet_inode()
            if inode is not None:
                self._kubelet_appeared.set()
                if self.state is ResourceState.REGISTERED and inode != self._registered_kubelet_inode:
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

    # --- device list refresh, health, recovery

    def schedule_relist(self) -> None:
        """Call ``list_devices`` soon (coalesces repeated requests)."""
        if self._relist_pending or self.hooks is None:
            return
        self._relist_pending = True
        self._spawn(self._relist())

    async def _relist(self) -> None:
        self._relist_pending = False
        assert self.hooks is not None
        try:
            devices = await self.runner.call("list_devices", self.hooks.list_devices)
        except DriverError as exc:
            self.degrade(str(exc))
            return
        self.table.replace(devices)

    def degrade(self, reason: str) -> None:
        """Advertise every device unhealthy until the driver answers ``list_devices`` again."""
        if self.table.degraded is None:
            log.error("[%s] driver failing, all devices reported unhealthy: %s", self.name, reason)
        self.table.set_degraded(reason)
        self._on_change()
        if not self._recovering:
            self._recovering = True
            self._spawn(self._recover())

    async def _recover(self) -> None:
        assert self.hooks is not None
        backoff = Backoff(initial=0.5, cap=30.0)
        try:
            while not self.stopping:
                await asyncio.sleep(backoff.next())
                try:
                    devices = await self.runner.call("list_devices", self.hooks.list_devices)
                except DriverError as exc:
                    log.warning("[%s] driver still failing: %s", self.name, exc)
                    self.table.set_degraded(str(exc))
                    continue
                self.table.replace(devices)
                self.table.set_degraded(None)
                self._on_change()
                log.info("[%s] driver recovered; devices reported as the driver sees them", self.name)
                return
        finally:
            self._recovering = False

    async def health_loop(self) -> None:
        """Call ``check_health`` every ``health_interval`` seconds (when the driver implements it)."""
        assert self.hooks is not None
        interval = self.config.health_interval
        if interval <= 0 or not self.hooks.implements("check_health"):
            return
        while not self.stopping:
            await asyncio.sleep(interval)
            if self.stopping or self._recovering:
                continue
            try:
                health = await self.runner.call("check_health", self.hooks.check_health, self.table.reported_devices())
            except DriverError as exc:
                self.degrade(str(exc))
                continue
            for dev_id in self.table.set_health(health):
                log.info(
                    "[%s %s] health is now %s",
                    self.name,
                    dev_id,
                    health[dev_id].value,
                    extra={"device": dev_id},
                )

    def note_hook_failure(self, exc: DriverError) -> None:
        """A hang is a sick driver: degrade until it answers again. Plain failures only fail the request."""
        if isinstance(exc, HookTimeoutError):
            self.degrade(str(exc))

    # --- shutdown

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting, finish in-flight calls, stop the driver, remove the socket."""
        self.stopping = True
        self._restart.set()
        if self._running is not None:  # let run() leave whatever it is doing (it may be binding a server)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._running.wait(), grace)
        if self._service is not None:
            self._service.close()
        await asyncio.gather(*(self._stop_server(s, grace) for s in list(self._servers)))
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(FileNotFoundError):
            if self._socket_inode == self.socket_path.stat().st_ino:
                self.socket_path.unlink()
        if self._started_driver and self.hooks is not None:
            try:
                await self.runner.call("stop", self.hooks.stop)
            except DriverError as exc:
                log.error("[%s] driver stop failed: %s", self.name, exc)
        self.runner.close()
        self.state = ResourceState.STOPPED
        self._on_change()
