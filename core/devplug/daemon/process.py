"""The daemon process: every configured resource in one process, each served through its front end (the
device-plugin API, or DRA for a resource with ``api = "dra"``), under the state lock, until SIGTERM or SIGINT.

:class:`Daemon` assembles the parts and runs them: the lifecycle core's
resources (:class:`~devplug.engine.resource.Resource`), their front ends and
what the device-plugin front end shares between resources (the kubelet's
checkpoint, release reconciliation through PodResources, the plugin-folder
watch), the status file (:mod:`devplug.daemon.status`), live reload on SIGHUP
(:mod:`devplug.daemon.reload`), and the optional metrics endpoint
(:mod:`devplug.daemon.metricsendpoint`) and CDI spec clean-up
(:mod:`devplug.daemon.cdicleanup`). The DRA front end
(:mod:`devplug.frontends.dra`) and lightkube, its Kubernetes client, are
imported only when a resource is served through DRA; a config that asks for DRA
without lightkube installed is refused with a :class:`~devplug.errors.ConfigError`
naming the resources and the package.

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
import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devplug.atomic import write_atomic
from devplug.config import Config, ResourceConfig
from devplug.config.dra import API_DRA
from devplug.daemon.cdicleanup import remove_stale_cdi_specs
from devplug.daemon.draassembly import check_dra_client, dra_frontend
from devplug.daemon.handover import Predecessor
from devplug.daemon.handoverfiles import HandoverFiles, Instance
from devplug.daemon.lock import StateLock
from devplug.daemon.reload import Reloader
from devplug.daemon.status import FINAL_WRITE_S, STATUS_FILE, StatusBuilder, StatusFile, status_fingerprint
from devplug.daemon.takeover import Takeover
from devplug.engine import (
    NULL_OBSERVER,
    ContainerLiveness,
    DeviceTable,
    ExitEvidence,
    FrontEnd,
    Resource,
    ResourceStatus,
    SerialThread,
    check_replaceable,
    prepare_state_dir,
)
from devplug.frontends.deviceplugin.checkpointview import CHECKPOINT_FILE, CheckpointView
from devplug.frontends.deviceplugin.frontend import DevicePluginCodec, DevicePluginFrontEnd
from devplug.frontends.deviceplugin.pluginfolder import PluginFolder
from devplug.frontends.deviceplugin.reconciler import Reconciler
from devplug.frontends.deviceplugin.sightings import KubeletSightings
from devplug.kube.names import instance_tag, resource_state_dir

if TYPE_CHECKING:
    from devplug.daemon.metrics import Metrics
    from devplug.daemon.metricsendpoint import MetricsEndpoint
    from devplug.profiles.nodeprofiles import NodeProfiles

__all__ = ["Daemon", "run_daemon"]

log = logging.getLogger("devplug.engine")

#: Seconds after start-up when the heap's free pages are given back to the kernel (registration, then the first
#: compaction and status writes, are done by then).
TRIM_AFTER_S = (2.0, 8.0)
#: How often shutdown looks whether hooks still running returned.
HOOK_POLL_S = 0.05


class Daemon:
    """Runs every resource of a :class:`Config` until :meth:`request_stop` (or SIGTERM/SIGINT).

    ``profiles`` chooses the node's profiles from its labels (:mod:`devplug.profiles`), started already
    (:meth:`~devplug.profiles.nodeprofiles.NodeProfiles.start`: ``config`` is what it chose); None when the config
    has no profiles (a reload adding some starts it).
    """

    def __init__(self, config: Config, profiles: NodeProfiles | None = None) -> None:
        check_dra_client(config)
        self.config = config
        self.profiles = profiles
        self.state_dir = config.state.dir
        self.lock = StateLock(self.state_dir)
        #: This daemon instance (``DEVPLUG_INSTANCE``, the pod UID in a DaemonSet), for handovers.
        self.instance = Instance.current()
        self.handover_files = HandoverFiles(self.state_dir)
        #: Taking the state lock (through its gate), from another instance when ``[handover] enabled``.
        self.takeover = Takeover(self.instance, self.handover_files, self.lock, config.handover)
        #: The handover this instance answers or answered as the old instance, once started.
        self.predecessor: Predecessor | None = None
        self._handed_over = False
        self._writer = SerialThread("state-writer")
        self.checkpoint = CheckpointView(config.kubelet.device_plugin_dir / CHECKPOINT_FILE)
        #: What the kubelet was seen doing (its runs, its checkpoint's rewrites): how a forgotten tenancy ends.
        self.sightings = KubeletSightings(config.kubelet.device_plugin_dir, self.checkpoint)
        #: Whether pods' containers still run (their cgroups), the release evidence beside the kubelet's view.
        self.exits = ExitEvidence(ContainerLiveness(config.liveness), config.liveness)
        self._release_wake = asyncio.Event()
        #: The Prometheus metrics, when ``[metrics] enabled`` (only then is prometheus_client imported).
        self.metrics: Metrics | None = None
        if config.metrics.enabled:
            from devplug.daemon.metrics import Metrics

            self.metrics = Metrics()
        self.started_at = time.time()
        self._status = StatusBuilder(self.started_at, str(config.path) if config.path else None)
        self.status_file = StatusFile(
            self.state_dir,
            self._status,
            lambda: self.resources,
            self._status_sections,
            lambda: status_fingerprint(self.resources, self.reconciler, self.exits),
        )
        #: Each resource's device-plugin front end (told of changes in the device-plugin folder).
        self._frontends: dict[Resource, DevicePluginFrontEnd] = {}
        self.plugin_folder = PluginFolder(
            config.kubelet.device_plugin_dir, str(config.path or "<config>"), self._frontends.values, self.sightings
        )
        #: Every resource alive: those of the config, and those a reload removed that still drain.
        self.resources = [self._new_resource(rc) for rc in config.resources]
        self.reconciler = Reconciler(
            [r for r in self.resources if r.config.api != API_DRA],
            config.kubelet.pod_resources_socket,
            config.release,
            self.checkpoint,
            self._release_wake,
            self.exits,
            self.sightings,
        )
        self._metrics_endpoint: MetricsEndpoint | None = None
        if self.metrics is not None:
            from devplug.daemon.metricsendpoint import MetricsEndpoint

            self._metrics_endpoint = MetricsEndpoint(
                self.metrics,
                lambda: self.config,
                lambda: self.resources,
                self.reconciler,
                self.exits,
                profiles=self._profiles_status,
            )
        self.reloads = Reloader(self)
        self._lives: dict[Resource, asyncio.Future[None]] = {}
        self._stop = asyncio.Event()
        self._stop_requested = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def _new_resource(self, rc: ResourceConfig) -> Resource:
        made: list[FrontEnd] = []
        resources: list[Resource] = []

        def make_frontend(table: DeviceTable, status: ResourceStatus) -> FrontEnd:
            kubelet, changed = self.config.kubelet, self.status_file.changed
            if rc.api == API_DRA:
                made.append(self._dra_frontend(rc, table, status, lambda: resources[0].releases if resources else None))
            else:
                tag = instance_tag(self.instance.id) if self.config.handover.enabled else None
                made.append(
                    DevicePluginFrontEnd(rc.name, kubelet, table, self.checkpoint, self.sightings, status, changed, tag)
                )
            return made[0]

        resource = Resource(
            rc,
            self.state_dir,
            self.write_file,
            make_frontend,
            on_change=self.status_file.changed,
            on_allocated=self._release_wake.set,
            observer=self.metrics.observer(rc.name, rc.driver) if self.metrics is not None else NULL_OBSERVER,
            cdi=self.config.cdi,
            exits=self.exits,
            release=self.config.release,
            codec=DevicePluginCodec() if rc.api != API_DRA else None,
        )
        resources.append(resource)
        if isinstance(made[0], DevicePluginFrontEnd):
            self._frontends[resource] = made[0]
        return resource

    def _dra_frontend(
        self, rc: ResourceConfig, table: DeviceTable, status: ResourceStatus, releases: Callable[[], Any]
    ) -> FrontEnd:
        return dra_frontend(
            self.config,
            rc,
            table,
            status,
            releases,
            keep_dir=resource_state_dir(self.state_dir, rc.name) / "dra-claims",
            successor=lambda: self._successor_of(rc.dra.driver_name if rc.dra is not None else ""),
            on_change=self.status_file.changed,
        )

    def _successor_of(self, driver: str) -> bool:
        """Whether a DRA resource of ``driver`` stopping now is followed by another in this daemon: not at shutdown,
        and the config (a reload applies it before restarting a resource) still serves the driver through DRA."""
        return not self._stop.is_set() and any(
            rc.api == API_DRA and rc.dra is not None and rc.dra.driver_name == driver for rc in self.config.resources
        )

    async def write_file(self, path: Path, data: bytes) -> None:
        """Write a state file atomically, in the state-writer thread (writes keep their order)."""
        await asyncio.wrap_future(self._writer.submit(functools.partial(write_atomic, path, data)))

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop :meth:`run` runs on, once it runs."""
        return self._loop

    def request_stop(self) -> None:
        """Begin a graceful shutdown (thread-safe; before :meth:`run` started, it stops at once)."""
        self._stop_requested = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    def request_reload(self) -> None:
        """Re-read the config file (SIGHUP); reloads run one after another, never during shutdown."""
        if self._loop is None or self._stop.is_set():
            return
        if self.predecessor is not None and self.predecessor.busy:
            log.warning("reload ignored: the node is being handed over to a newer instance")
            return
        self.reloads.request()

    # --- status

    def _status_sections(self) -> dict[str, Any]:
        return {
            "release": self.reconciler.describe(),
            "reload": self.reloads.record.describe(),
            "profiles": self._profiles_status(),
            "handover": self._describe_handover(),
        }

    def _profiles_status(self) -> dict[str, Any] | None:
        return self.profiles.describe(self.config) if self.profiles is not None else None

    def _describe_handover(self) -> dict[str, Any]:
        """The instance, and the handovers it took part in (the last one from the state dir after a restart)."""
        section: dict[str, Any] = {"instance": self.instance.id, "enabled": self.config.handover.enabled}
        if self.takeover.took_over is not None:
            section["took_over"] = self.takeover.took_over.describe()
        if self.predecessor is not None and self.predecessor.record is not None:
            section["handing_over"] = self.predecessor.record.describe()
        if "took_over" not in section and self.config.handover.enabled:
            last = self.handover_files.read_last()
            if last is not None:
                section["last"] = last
        return section

    # --- what a reload changes (see devplug.daemon.reload.ReloadTarget)

    def stopping(self) -> bool:
        return self._stop.is_set()

    async def compose(self, loaded: Config) -> Config:
        if self.profiles is not None:
            return self.profiles.compose(loaded)
        if not loaded.profiles.profiles:
            return loaded
        from devplug.profiles.nodeprofiles import NodeProfiles  # profiles added by a reload: watch the node now

        self.profiles = NodeProfiles(loaded)
        composed = await self.profiles.start(loaded)
        self.profiles.begin(lambda: self.config, self.reloads.request)
        return composed

    def apply_settings(self, config: Config) -> None:
        self.config = config
        if self.profiles is not None:
            self.profiles.applied(config)
        self.reconciler.configure(config.release)
        self.exits.reconfigure(config.liveness)
        for resource in self.resources:
            resource.configure_release(config.release)

    def start_resource(self, rc: ResourceConfig) -> Resource:
        resource = self._new_resource(rc)
        self.resources.append(resource)
        if rc.api != API_DRA:
            self.reconciler.add(resource)
        self._start_life(resource)
        self._release_wake.set()  # a pass soon: the restarted instance's ledger may hold allocations
        return resource

    def forget(self, resource: Resource) -> None:
        self.resources.remove(resource)
        self.reconciler.remove(resource)
        self._frontends.pop(resource, None)
        self.status_file.forget(resource.name)

    async def end_life(self, resource: Resource) -> None:
        life = self._lives.pop(resource, None)
        if life is not None:
            life.cancel()
            await asyncio.gather(life, return_exceptions=True)

    async def write_status(self) -> None:
        await self.status_file.write()

    # --- running

    def _start_life(self, resource: Resource) -> None:
        self._lives[resource] = asyncio.ensure_future(resource.live())

    async def run(self) -> list[str]:
        """Serve until stopped; return the driver hooks abandoned at shutdown (described), empty if none.

        Raises :class:`~devplug.errors.StateError` if the state dir is taken
        or unusable, :class:`~devplug.errors.ConfigError` if the plugin folder is.
        """
        self._loop = loop = asyncio.get_running_loop()
        self.status_file.start(loop)
        if self._stop_requested:
            self._stop.set()
        prepare_state_dir(self.state_dir)
        check_replaceable(self.state_dir / STATUS_FILE, "the status file")
        await self.takeover.take_lock(loop, self.metrics)
        abandoned: list[str] = []
        try:
            self.plugin_folder.prepare()
            self.exits.liveness.start()
            remove_stale_cdi_specs(self.config)
            if self._metrics_endpoint is not None and self.takeover.took_over is None:  # else once the old one left
                self._metrics_endpoint.start(loop)
            self.plugin_folder.watch(loop)
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(sig, self._stop.set)
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signal.SIGHUP, self.request_reload)
            await self.status_file.write()  # at once: a previous daemon's status must not linger
            for resource in self.resources:
                self._start_life(resource)
            if self.profiles is not None:
                self.profiles.begin(lambda: self.config, self.reloads.request)
            reconciling = asyncio.ensure_future(self.reconciler.run())
            handover_tasks = self._start_handover_tasks()
            for delay in TRIM_AFTER_S:
                loop.call_later(delay, _trim_heap)
            log.info(
                "devplug serving %d resource(s): %s",
                len(self.resources),
                ", ".join(r.name for r in self.resources),
            )
            await self._stop.wait()
            for task in handover_tasks:
                task.cancel()
            if not self.lock.held:  # stopped amid a handover, the lock let go: the state is not ours to write
                for resource in self.resources:
                    resource.disown()
                self.status_file.suspended = True
            abandoned = await self._bounded_shutdown(reconciling)
            for problem in abandoned:
                log.error("abandoned at shutdown: %s", problem)
            await self.status_file.write_final()
        finally:
            self.takeover.close()
            self.plugin_folder.close()
            self.exits.liveness.close()
            if self._metrics_endpoint is not None:
                self._metrics_endpoint.close()
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.remove_signal_handler(sig)
            self._writer.close()  # every write was awaited, or given up on by write_final
            self.status_file.close()
            self.lock.release()
            if self._handed_over:
                log.info(
                    "stopped: the node is %s's now",
                    self.predecessor.record.to_instance if self.predecessor and self.predecessor.record else "?",
                )
            else:
                log.info("stopped" if not abandoned else "stopped, abandoning what did not finish")
        return abandoned

    # --- handover (devplug.daemon.handover)

    def _start_handover_tasks(self) -> list[asyncio.Future[None]]:
        events = self.takeover.events
        if events is None:
            return []
        self.predecessor = Predecessor(
            self.instance,
            self.handover_files,
            events,
            self.lock,
            self.config.handover.timeout,
            lambda: list(self.resources),
            self.status_file.write,
            self._suspend_status,
            self.status_file.changed,
            grace=min(5.0, self.config.shutdown.timeout),
            refuse=self.reloads.busy,
            on_outcome=self._count_handover,
        )
        tasks: list[asyncio.Future[None]] = [asyncio.ensure_future(self._answer_handovers(self.predecessor))]
        if self.takeover.took_over is not None:
            endpoint, loop = self._metrics_endpoint, asyncio.get_running_loop()
            serve = functools.partial(endpoint.start, loop) if endpoint is not None else None
            finish = self.takeover.finish(lambda: self.resources, self.status_file.changed, serve, self.metrics)
            tasks.append(asyncio.ensure_future(finish))
        return tasks

    def _suspend_status(self, suspended: bool) -> None:
        self.status_file.suspended = suspended

    async def _answer_handovers(self, predecessor: Predecessor) -> None:
        """Answer a newer instance's request; once handed over, this instance leaves (as after SIGTERM)."""
        try:
            await predecessor.serve()
        except asyncio.CancelledError:
            raise
        except Exception:  # it failed after the new instance took the lock: the node is no longer this one's
            log.exception("the handover failed after the new instance took the state lock; leaving")
        self._handed_over = True
        self._stop.set()

    def _count_handover(self, outcome: str, took_s: float | None) -> None:
        if self.metrics is not None:
            self.metrics.handover("from", outcome, took_s)

    async def _bounded_shutdown(self, reconciling: asyncio.Future[None]) -> list[str]:
        """Shut down within ``[shutdown] timeout``; what did not finish in time (described)."""
        loop = asyncio.get_running_loop()
        timeout = self.config.shutdown.timeout
        log.info("shutting down (at most %g s, [shutdown] timeout)", timeout)
        deadline = loop.time() + timeout
        abandoned = []
        stopping = asyncio.ensure_future(self._shut_down(reconciling))
        done, _ = await asyncio.wait((stopping,), timeout=timeout)
        if not done:
            stopping.cancel()
            await asyncio.wait((stopping,), timeout=FINAL_WRITE_S)
            abandoned.append(f"the shutdown did not finish within {timeout:g} s ([shutdown] timeout)")
        else:
            await self._hooks_return(deadline)
        abandoned.extend(self._abandoned_hooks())
        return abandoned

    async def _shut_down(self, reconciling: asyncio.Future[None]) -> None:
        """Stop accepting, finish in-flight calls, stop the drivers; unbounded (the caller bounds it)."""
        reconciling.cancel()
        if self.profiles is not None:
            await self.profiles.close()  # no label change asks for a reload any more
        await self.reloads.shut_down()
        lives = list(self._lives.values())
        for life in lives:
            life.cancel()
        await asyncio.gather(*lives, reconciling, return_exceptions=True)

    async def _hooks_return(self, deadline: float) -> None:
        """Give hooks still running (a release finishing in the background) until ``deadline`` to return."""
        loop = asyncio.get_running_loop()
        while any(r.hooks_running() for r in self.resources) and loop.time() < deadline:
            await asyncio.sleep(HOOK_POLL_S)

    def _abandoned_hooks(self) -> list[str]:
        """The driver hooks that have not returned (stuck, or abandoned earlier after their hook_timeout)."""
        return [hook.describe() for r in self.resources for hook in r.hooks_running()]


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


def run_daemon(config: Config) -> list[str]:
    """Run the daemon in the foreground until SIGTERM/SIGINT; returns what was abandoned at shutdown.

    A config with profiles first reads the node's labels (briefly: see :mod:`devplug.profiles.nodeprofiles`) and
    starts on the config they choose."""
    return asyncio.run(_serve(config))


async def _serve(config: Config) -> list[str]:
    profiles = None
    if config.profiles.profiles:
        from devplug.profiles.nodeprofiles import NodeProfiles

        profiles = NodeProfiles(config)
        config = await profiles.start(config)
    return await Daemon(config, profiles).run()
