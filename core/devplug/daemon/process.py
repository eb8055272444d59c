"""The daemon: every configured resource in one process, the state lock, the plugin-folder
watch that notices kubelet restarts, release reconciliation, status, signals, and live reload.

SIGHUP re-reads the config file (:mod:`devplug.daemon.reload`): added
resources start, changed ones restart, removed ones drain (advertise nothing,
keep releasing what pods hold) and are torn down once nothing is allocated,
unchanged ones are not touched. A config that fails to load, or changes what
cannot change live, is refused and the running one stays.

Shutdown is bounded by ``[shutdown] timeout``: past it, whatever is still
running is abandoned. Driver hooks run in daemon threads, so one stuck in a
call that never returns cannot keep the process alive; :meth:`Daemon.run`
returns what it abandoned (logged, one line per hook) so the CLI can exit
non-zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devplug.atomic import write_atomic
from devplug.config import Config, ResourceConfig, load_config
from devplug.daemon.lock import StateLock
from devplug.daemon.reload import ReloadRecord, plan_reload
from devplug.daemon.status import STATUS_FILE, StatusBuilder
from devplug.engine.asynctools import BackgroundTasks, in_daemon_thread
from devplug.engine.cdi import remove_stale_specs, spec_file_name
from devplug.engine.devicetable import DeviceTable
from devplug.engine.liveness import ContainerLiveness
from devplug.engine.observer import NULL_OBSERVER
from devplug.engine.resource import Resource
from devplug.engine.resourcestatus import ResourceState, ResourceStatus
from devplug.engine.serial import SerialThread
from devplug.engine.statedir import check_replaceable, prepare_state_dir
from devplug.engine.tenantexit import ExitEvidence
from devplug.errors import ConfigError, DevplugError
from devplug.frontends.deviceplugin.checkpointview import CHECKPOINT_FILE, CheckpointView
from devplug.frontends.deviceplugin.frontend import DevicePluginCodec, DevicePluginFrontEnd
from devplug.frontends.deviceplugin.reconciler import Reconciler
from devplug.watch import DirectoryWatcher

if TYPE_CHECKING:
    from devplug.daemon.metrics import Metrics, MetricsServer, NodeFigures
    from devplug.engine.resourcereport import ResourceFigures

__all__ = ["Daemon", "run_daemon"]

log = logging.getLogger("devplug.engine")

#: Seconds after start-up when the heap's free pages are given back to the kernel (registration, then the first
#: compaction and status writes, are done by then).
TRIM_AFTER_S = (2.0, 8.0)
#: The status file is written at most once a second, after a change (it is for people and probes, not the kubelet).
STATUS_DEBOUNCE_S = 1.0
#: How soon a status write that failed (a full disk) is tried again.
STATUS_RETRY_S = 1.0
#: How long the last status write may take once the shutdown timed out.
FINAL_WRITE_S = 2.0
#: How often shutdown looks whether hooks still running returned.
HOOK_POLL_S = 0.05
#: How often a resource removed by a reload looks whether its allocations are released (or a resource being
#: restarted whether its releases in flight finished).
DRAIN_POLL_S = 0.1
#: Why a resource removed by a reload advertises nothing (shown in ``devplug status``).
REMOVED_REASON = "removed from the config by a reload: advertising no devices until its allocations are released"
#: How long a reload may take to read and check the new config before it is refused (the file itself is read
#: without blocking and bounded in size; this bounds a file system that hangs, and the drivers' option checks).
RELOAD_LOAD_TIMEOUT_S = 30.0


class Daemon:
    """Runs every resource of a :class:`Config` until :meth:`request_stop` (or SIGTERM/SIGINT)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.state_dir = config.state.dir
        self.lock = StateLock(self.state_dir)
        self._writer = SerialThread("state-writer")
        self.checkpoint = CheckpointView(config.kubelet.device_plugin_dir / CHECKPOINT_FILE)
        #: Whether pods' containers still run (their cgroups), the release evidence beside the kubelet's view.
        self.exits = ExitEvidence(ContainerLiveness(config.liveness), config.liveness)
        self._release_wake = asyncio.Event()
        #: The Prometheus metrics, when ``[metrics] enabled`` (only then is prometheus_client imported).
        self.metrics: Metrics | None = None
        if config.metrics.enabled:
            from devplug.daemon.metrics import Metrics

            self.metrics = Metrics()
        self._metrics_server: MetricsServer | None = None
        #: Each resource's device-plugin front end (told of changes in the device-plugin folder).
        self._frontends: dict[Resource, DevicePluginFrontEnd] = {}
        #: Every resource alive: those of the config, and those a reload removed that still drain.
        self.resources = [self._new_resource(rc) for rc in config.resources]
        self.reconciler = Reconciler(
            self.resources,
            config.kubelet.pod_resources_socket,
            config.release,
            self.checkpoint,
            self._release_wake,
            self.exits,
        )
        self.reload_record = ReloadRecord()
        self._lives: dict[Resource, asyncio.Future[None]] = {}
        #: Resources removed by a reload, waiting for their allocations to be released.
        self._draining: dict[str, asyncio.Future[None]] = {}
        #: Resources being stopped for good by a reload (shutdown waits for these instead of stopping them again).
        self._teardowns: dict[Resource, asyncio.Future[None]] = {}
        self._reload_lock: asyncio.Lock | None = None
        self._stop = asyncio.Event()
        self._stop_requested = False
        self._status_pending = False
        self._status_failing = False
        self._tasks = BackgroundTasks()
        self.started_at = time.time()
        self._status = StatusBuilder(self.started_at, str(config.path) if config.path else None)
        self._status_building = asyncio.Lock()
        self._status_writer = SerialThread("status-writer")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watcher: DirectoryWatcher | None = None

    def _new_resource(self, rc: ResourceConfig) -> Resource:
        made: list[DevicePluginFrontEnd] = []

        def make_frontend(table: DeviceTable, status: ResourceStatus) -> DevicePluginFrontEnd:
            made.append(
                DevicePluginFrontEnd(rc.name, self.config.kubelet, table, self.checkpoint, status, self._status_changed)
            )
            return made[0]

        resource = Resource(
            rc,
            self.state_dir,
            self.write_file,
            make_frontend,
            on_change=self._status_changed,
            on_allocated=self._release_wake.set,
            observer=self.metrics.observer(rc.name, rc.driver) if self.metrics is not None else NULL_OBSERVER,
            cdi=self.config.cdi,
            exits=self.exits,
            release=self.config.release,
            codec=DevicePluginCodec(),
        )
        self._frontends[resource] = made[0]
        return resource

    async def write_file(self, path: Path, data: bytes) -> None:
        """Write a state file atomically, in the state-writer thread (writes keep their order)."""
        await asyncio.wrap_future(self._writer.submit(functools.partial(write_atomic, path, data)))

    def request_stop(self) -> None:
        """Begin a graceful shutdown (thread-safe; before :meth:`run` started, it stops at once)."""
        self._stop_requested = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    # --- status

    def _status_changed(self) -> None:
        if self._status_pending or self._loop is None:
            return
        self._status_pending = True
        self._loop.call_later(STATUS_DEBOUNCE_S, lambda: self._tasks.spawn(self._write_status()))

    async def _write_status(self, stopped: bool = False) -> None:
        self._status_pending = False
        async with self._status_building:  # one build at a time (it lets other work run): files in build order
            status = await self._status.build(self.resources)
            status["stopped"] = stopped
            status["release"] = self.reconciler.describe()
            status["reload"] = self.reload_record.describe()
            path = self.state_dir / STATUS_FILE
            # its own thread, and no fsync: it never waits behind (or delays) a ledger snapshot. Encoded in that
            # thread too: nothing the status holds is changed once built (entries are fresh or cached read-only),
            # and a 10k-device resource's entry costs milliseconds to encode.
            written = self._status_writer.submit(functools.partial(_write_status_file, path, status))
        try:
            await asyncio.wrap_future(written)
        except OSError as exc:  # a full disk: say so, and try again in a while (the status must catch up)
            if not self._status_failing:
                log.error("cannot write %s: %s; retrying every %g s", self.state_dir / STATUS_FILE, exc, STATUS_RETRY_S)
            self._status_failing = True
            if self._loop is not None and not stopped:
                self._loop.call_later(STATUS_RETRY_S, self._status_changed)
            return
        if self._status_failing:
            log.info("%s written again", self.state_dir / STATUS_FILE)
        self._status_failing = False

    # --- metrics and probes (read on the event loop by the metrics server's thread)

    def _figures(self) -> list[ResourceFigures]:
        return [r.figures() for r in self.resources]

    def _node_figures(self) -> NodeFigures:
        from devplug.daemon.metrics import NodeFigures

        reconciler = self.reconciler
        return NodeFigures(
            pod_resources_reads=reconciler.polls,
            pod_resources_failures=reconciler.failures,
            pod_resources_last_success=reconciler.last_success,
            liveness_known=self.exits.liveness.layout is not None,
            awaiting_exit=reconciler.awaiting_exit(),
        )

    def _not_ready(self) -> list[str]:
        """Why the daemon is not ready (``/readyz``); nothing when it is."""
        reasons = []
        unregistered = [r.name for r in self.resources if r.state is not ResourceState.REGISTERED]
        if unregistered:
            reasons.append(f"not registered with the kubelet: {', '.join(unregistered)}")
        liveness = self.exits.liveness
        if self.config.liveness.required and not liveness.available():
            reasons.append(f"container liveness unknown ([liveness] required): {liveness.problem}")
        since = self.reconciler.failing_since
        bound = max(self.config.release.grace_period, 3 * self.config.release.interval)
        if since is not None and time.time() - since > bound:
            reasons.append(
                f"PodResources unreadable for {time.time() - since:.0f} s ({self.reconciler.last_error}): no release "
                "can be decided"
            )
        return reasons

    def _serve_metrics(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.metrics is None:
            return
        mc = self.config.metrics
        try:
            self._metrics_server = self.metrics.serve(
                mc.address, mc.port, loop, self._figures, self._not_ready, node=self._node_figures
            )
        except OSError as exc:
            raise ConfigError(
                f"{self.config.path or '<config>'}: metrics: cannot serve on {mc.address} port {mc.port}: "
                f"{exc.strerror or exc} (set [metrics] address and port)"
            ) from exc
        log.info("metrics on http://%s:%d/metrics (probes /healthz, /readyz)", mc.address, mc.port)

    def _prepare_cdi(self) -> None:
        """Delete the spec files of kinds no resource has any more (each resource keeps its own current)."""
        cdi = self.config.cdi
        if not cdi.enabled:
            return
        try:
            remove_stale_specs(cdi.spec_dir, {spec_file_name(rc.cdi_kind) for rc in self.config.resources})
        except OSError as exc:
            raise ConfigError(
                f"{self.config.path or '<config>'}: cdi.spec_dir: cannot use {cdi.spec_dir}: {exc.strerror or exc}"
            ) from exc

    # --- the plugin folder

    def _on_plugin_dir_change(self, names: frozenset[str]) -> None:
        for frontend in list(self._frontends.values()):
            frontend.on_plugin_dir_changed(names)

    # --- running

    def _prepare_plugin_dir(self) -> Path:
        plugin_dir = self.config.kubelet.device_plugin_dir
        where = f"{self.config.path or '<config>'}: kubelet.device_plugin_dir"
        try:
            plugin_dir.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise ConfigError(f"{where}: {plugin_dir} exists and is not a folder") from None
        except OSError as exc:
            raise ConfigError(f"{where}: cannot create {plugin_dir}: {exc.strerror or exc}") from exc
        if not plugin_dir.is_dir():
            raise ConfigError(f"{where}: {plugin_dir} is not a folder")
        return plugin_dir

    async def run(self) -> list[str]:
        """Serve until stopped; return the driver hooks abandoned at shutdown (described), empty if none.

        Raises :class:`~devplug.errors.StateError` if the state dir is taken
        or unusable, :class:`~devplug.errors.ConfigError` if the plugin folder is.
        """
        self._loop = asyncio.get_running_loop()
        if self._stop_requested:
            self._stop.set()
        prepare_state_dir(self.state_dir)
        check_replaceable(self.state_dir / STATUS_FILE, "the status file")
        self.lock.acquire()
        abandoned: list[str] = []
        try:
            plugin_dir = self._prepare_plugin_dir()
            loop = self._loop
            self.exits.liveness.start()
            self._prepare_cdi()
            self._serve_metrics(loop)

            def plugin_dir_changed(names: frozenset[str]) -> None:
                loop.call_soon_threadsafe(self._on_plugin_dir_change, names)

            self._watcher = DirectoryWatcher(plugin_dir, plugin_dir_changed)
            self._watcher.start()
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(sig, self._stop.set)
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signal.SIGHUP, self.request_reload)
            await self._write_status()  # at once: a previous daemon's status must not linger
            for resource in self.resources:
                self._start_life(resource)
            reconciling = asyncio.ensure_future(self.reconciler.run())
            if self._loop is not None:
                for delay in TRIM_AFTER_S:
                    self._loop.call_later(delay, _trim_heap)
            log.info(
                "devplug serving %d resource(s): %s",
                len(self.resources),
                ", ".join(r.name for r in self.resources),
            )
            await self._stop.wait()
            timeout = self.config.shutdown.timeout
            log.info("shutting down (at most %g s, [shutdown] timeout)", timeout)
            deadline = loop.time() + timeout
            stopping = asyncio.ensure_future(self._shut_down(reconciling))
            done, _ = await asyncio.wait((stopping,), timeout=timeout)
            if not done:
                stopping.cancel()
                await asyncio.wait((stopping,), timeout=FINAL_WRITE_S)
                abandoned.append(f"the shutdown did not finish within {timeout:g} s ([shutdown] timeout)")
            else:
                await self._hooks_return(deadline)
            abandoned.extend(self._abandoned_hooks())
            for problem in abandoned:
                log.error("abandoned at shutdown: %s", problem)
            await self._final_status()
        finally:
            if self._watcher is not None:
                self._watcher.close()
            self.exits.liveness.close()
            if self._metrics_server is not None:
                self._metrics_server.close()
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    self._loop.remove_signal_handler(sig)
            self._writer.close()  # every write was awaited, or given up on by _final_status
            self._status_writer.close()
            self.lock.release()
            log.info("stopped" if not abandoned else "stopped, abandoning what did not finish")
        return abandoned

    async def _shut_down(self, reconciling: asyncio.Future[None]) -> None:
        """Stop accepting, finish in-flight calls, stop the drivers; unbounded (the caller bounds it)."""
        reconciling.cancel()
        drains = list(self._draining.values())
        for drain in drains:  # only their waiting is cancelled: a teardown they began goes on (shielded)
            drain.cancel()
        await asyncio.gather(*drains, return_exceptions=True)
        if self._reload_lock is not None:  # a reload applying now finishes first: it may be starting resources
            await self._reload_lock.acquire()
        await asyncio.gather(
            *(asyncio.shield(self._teardowns[r]) if r in self._teardowns else r.stop() for r in self.resources),
            *self._teardowns.values(),
        )
        lives = list(self._lives.values())
        for life in lives:
            life.cancel()
        await asyncio.gather(*lives, reconciling, return_exceptions=True)

    # --- live reload

    def _start_life(self, resource: Resource) -> None:
        self._lives[resource] = asyncio.ensure_future(resource.live())

    def request_reload(self) -> None:
        """Re-read the config file (SIGHUP); reloads run one after another, never during shutdown."""
        if self._loop is None or self._stop.is_set():
            return
        self._tasks.spawn(self.reload())

    async def reload(self) -> None:
        """Load the config file again and apply it, or refuse it (logged and in the status) keeping the running one."""
        if self._reload_lock is None:
            self._reload_lock = asyncio.Lock()
        async with self._reload_lock:
            if self._stop.is_set():
                return
            path = self.config.path
            log.info("reloading %s (SIGHUP)", path)
            try:
                if path is None:
                    raise ConfigError("the daemon was not started from a config file: there is nothing to re-read")
                new = await self._load(path)
                plan = plan_reload(self.config, new)
            except Exception as exc:  # a DevplugError says what is wrong; anything else is a bug, logged with its trace
                reason = str(exc) if isinstance(exc, DevplugError) else f"{type(exc).__name__}: {exc}"
                self.reload_record.refused(reason)
                generation = self.reload_record.generation
                log.error(
                    "reload refused, the running config (generation %d) stays: %s",
                    generation,
                    reason,
                    exc_info=None if isinstance(exc, DevplugError) else exc,
                )
                await self._write_status()
                return
            self.config = new
            self.reconciler.configure(new.release)
            self.exits.reconfigure(new.liveness)
            for resource in self.resources:
                resource.configure_release(new.release)
            for name in plan.removed:
                self._drain(self._resource(name))
            await asyncio.gather(*(self._replace(rc) for rc in (*plan.changed, *plan.added)))
            self.reload_record.applied(plan)
            log.info("reload applied (config generation %d): %s", self.reload_record.generation, plan.describe())
            await self._write_status()

    async def _load(self, path: Path) -> Config:
        """Read and check the config file for a reload, in a daemon thread bounded by :data:`RELOAD_LOAD_TIMEOUT_S`
        (a hung read then refuses this reload, and neither later reloads nor the shutdown wait for it)."""
        try:
            return await in_daemon_thread("config-reload", functools.partial(load_config, path), RELOAD_LOAD_TIMEOUT_S)
        except TimeoutError:
            raise ConfigError(
                f"{path}: reading and checking the config took more than {RELOAD_LOAD_TIMEOUT_S:g} s (a hung file "
                "system?); abandoned"
            ) from None

    def _resource(self, name: str) -> Resource:
        return next(r for r in self.resources if r.name == name)

    async def _replace(self, rc: ResourceConfig) -> None:
        """Start ``rc``'s resource; first stop the instance of that name still running (changed, or draining after
        an earlier removal). The ledger is kept: what pods hold stays held, and is released by the new instance."""
        old = next((r for r in self.resources if r.name == rc.name), None)
        if old is not None:
            drain = self._draining.pop(rc.name, None)
            if drain is not None:
                drain.cancel()
            log.info("[%s] restarting on its new config", rc.name)
            await asyncio.shield(self._tear_down(old))
        resource = self._new_resource(rc)
        self.resources.append(resource)
        self.reconciler.add(resource)
        self._start_life(resource)
        self._release_wake.set()  # a pass soon: the restarted instance's ledger may hold allocations

    def _tear_down(self, resource: Resource) -> asyncio.Future[None]:
        """Stop ``resource`` for good (once); the future is done when its socket is gone and its driver stopped."""
        teardown = self._teardowns.get(resource)
        if teardown is None:
            teardown = self._teardowns[resource] = asyncio.ensure_future(self._stop_for_good(resource))
            teardown.add_done_callback(lambda _: self._teardowns.pop(resource, None))
        return teardown

    async def _stop_for_good(self, resource: Resource) -> None:
        resource.wind_down()  # the reconciler starts no new release in it
        while resource.releasing():  # one running finishes in this instance's ledger
            await asyncio.sleep(DRAIN_POLL_S)
        try:
            await resource.stop()
        finally:
            self.resources.remove(resource)
            self.reconciler.remove(resource)
            self._frontends.pop(resource, None)
            self._status.forget(resource.name)
            self._status_changed()
        life = self._lives.pop(resource, None)
        if life is not None:
            life.cancel()
            await asyncio.gather(life, return_exceptions=True)
        await self._remove_cdi_spec(resource)

    async def _remove_cdi_spec(self, gone: Resource) -> None:
        """A resource torn down by a reload: delete its CDI spec unless a resource of the config (a restarted one,
        or another with the same ``cdi_kind``) keeps using it; else it would offer devices nobody serves."""
        if any(rc.cdi_kind == gone.config.cdi_kind for rc in self.config.resources) and self.config.cdi.enabled:
            return
        await gone.remove_cdi_spec()

    def _drain(self, resource: Resource) -> None:
        resource.retire(REMOVED_REASON)
        held = resource.held_count()
        log.info(
            "[%s] removed from the config: advertising no devices; torn down once its %d allocation(s) are released",
            resource.name,
            held,
        )
        self._draining[resource.name] = asyncio.ensure_future(self._drain_then_tear_down(resource))

    async def _drain_then_tear_down(self, resource: Resource) -> None:
        while not resource.drained():
            await asyncio.sleep(DRAIN_POLL_S)
        log.info("[%s] drained: tearing it down (driver stop, socket removed)", resource.name)
        await asyncio.shield(self._tear_down(resource))
        log.info("[%s] torn down", resource.name)
        if self._draining.get(resource.name) is asyncio.current_task():
            del self._draining[resource.name]

    async def _hooks_return(self, deadline: float) -> None:
        """Give hooks still running (a release finishing in the background) until ``deadline`` to return."""
        loop = asyncio.get_running_loop()
        while any(r.hooks_running() for r in self.resources) and loop.time() < deadline:
            await asyncio.sleep(HOOK_POLL_S)

    def _abandoned_hooks(self) -> list[str]:
        """The driver hooks that have not returned (stuck, or abandoned earlier after their hook_timeout)."""
        return [hook.describe() for r in self.resources for hook in r.hooks_running()]

    async def _final_status(self) -> None:
        """Write the status as stopped after every write queued before, giving up after :data:`FINAL_WRITE_S`
        (a hung disk must not hang the exit)."""
        writing = asyncio.ensure_future(self._write_status(stopped=True))
        done, _ = await asyncio.wait((writing,), timeout=FINAL_WRITE_S)
        if not done:
            writing.cancel()
            log.error("the final status write did not finish within %g s", FINAL_WRITE_S)
        elif writing.exception() is not None:
            log.error("the final status write failed: %s", writing.exception())


def _trim_heap() -> None:
    """Give the C heap's free pages back to the kernel once start-up is over (glibc's ``malloc_trim``).

    Start-up parses the config, reads every device and imports the world;
    most of that is freed again but glibc keeps the pages. Returning them
    lowers the idle daemon's resident memory (see ``make bench``).
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def _write_status_file(path: Path, status: dict[str, Any]) -> None:
    write_atomic(path, (json.dumps(status, separators=(",", ":")) + "\n").encode(), sync=False)


def run_daemon(config: Config) -> list[str]:
    """Run the daemon in the foreground until SIGTERM/SIGINT; returns what was abandoned at shutdown."""
    return asyncio.run(Daemon(config).run())
