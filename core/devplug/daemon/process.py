"""The daemon process: every configured resource in one process, each served through its front end (the
device-plugin API, or DRA for a resource with ``api = "dra"``), under the state lock, until SIGTERM or SIGINT.

:class:`Daemon` assembles the parts and runs them: the lifecycle core's
resources (:class:`~devplug.engine.resource.Resource`), each given its CDI spec
file (:mod:`devplug.daemon.cdispecs`) and the container liveness of the node
(:mod:`devplug.daemon.podliveness`); their front ends, each kubelet API's made
the same way by its assembly (:mod:`devplug.daemon.assembly`), and only for an
API some resource uses: the device-plugin API's (:mod:`devplug.daemon.dpassembly`,
with what its resources share: the kubelet's checkpoint, release reconciliation
through PodResources, the plugin-folder watch) and DRA's
(:mod:`devplug.daemon.draassembly`; lightkube, its Kubernetes client, is imported
only then, and a config that asks for DRA without lightkube installed is refused
with a :class:`~devplug.errors.ConfigError` naming the resources and the
package); the status file (:mod:`devplug.daemon.status`), live reload on SIGHUP
(:mod:`devplug.daemon.reload`), and the optional metrics endpoint
(:mod:`devplug.daemon.metricsendpoint`) and CDI spec clean-up
(:mod:`devplug.daemon.cdicleanup`).

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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devplug.atomic import write_atomic
from devplug.config import Config, ResourceConfig
from devplug.config.dra import API_DEVICE_PLUGIN
from devplug.daemon.assembly import AssemblyContext, FrontEndAssembly, assemble
from devplug.daemon.cdicleanup import remove_stale_cdi_specs
from devplug.daemon.cdispecs import CdiSpecs
from devplug.daemon.handover import Predecessor
from devplug.daemon.handoverfiles import HandoverFiles, Instance
from devplug.daemon.lock import StateLock
from devplug.daemon.podliveness import ContainerLiveness
from devplug.daemon.reload import Reloader
from devplug.daemon.status import FINAL_WRITE_S, STATUS_FILE, StatusBuilder, StatusFile, status_fingerprint
from devplug.daemon.takeover import Takeover
from devplug.engine import (
    NULL_OBSERVER,
    DeviceTable,
    ExitEvidence,
    FrontEnd,
    Resource,
    ResourceStatus,
    SerialThread,
    check_replaceable,
    prepare_state_dir,
)
from devplug.errors import ConfigError, DevplugError

if TYPE_CHECKING:
    from devplug.daemon.metrics import Metrics
    from devplug.daemon.metricsendpoint import MetricsEndpoint
    from devplug.frontends.deviceplugin.reconciler import Reconciler
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
            lambda: status_fingerprint(self.resources, self._release_detection(), self.exits),
        )
        self._stop = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._context = AssemblyContext(
            config=lambda: self.config,
            state_dir=self.state_dir,
            instance=self.instance.id,
            exits=self.exits,
            release_wake=self._release_wake,
            stopping=self._stop.is_set,
            on_change=self.status_file.changed,
        )
        #: Each kubelet API's front ends, assembled once a resource is served through it (a reload may add one).
        self._assemblies: dict[str, FrontEndAssembly] = {}
        #: What the assemblies run for their resources (the device-plugin folder's watch, the release reconciler).
        self._shared_loops: list[asyncio.Future[None]] = []
        #: Every resource alive: those of the config, and those a reload removed that still drain.
        self.resources = [self._new_resource(rc) for rc in config.resources]
        self._metrics_endpoint: MetricsEndpoint | None = None
        if self.metrics is not None:
            from devplug.daemon.metricsendpoint import MetricsEndpoint

            self._metrics_endpoint = MetricsEndpoint(
                self.metrics,
                lambda: self.config,
                lambda: self.resources,
                self._release_detection,
                self.exits,
                profiles=self._profiles_status,
            )
        self.reloads = Reloader(self)
        self._lives: dict[Resource, asyncio.Future[None]] = {}
        self._stop_requested = False

    # --- assembly

    def _assembly(self, api: str) -> FrontEndAssembly:
        """The assembly of ``api``'s front ends, made the first time a resource is served through it (once the
        daemon runs, what it shares is prepared and started at once: a reload added the first such resource)."""
        assembly = self._assemblies.get(api)
        if assembly is not None:
            return assembly
        assembly = self._assemblies[api] = assemble(api, self._context)
        if self._loop is not None and not self._stop.is_set():
            try:
                assembly.prepare()
            except ConfigError as exc:  # its front ends fail to serve and say why; the others go on
                log.error("%s", exc)
            self._shared_loops += assembly.start(self._loop)
        return assembly

    def _new_resource(self, rc: ResourceConfig) -> Resource:
        assembly = self._assembly(rc.api)
        made: list[FrontEnd] = []
        resources: list[Resource] = []

        def make_frontend(table: DeviceTable, status: ResourceStatus) -> FrontEnd:
            made.append(assembly.frontend(rc, table, status, lambda: resources[0].releases if resources else None))
            return made[0]

        cdi = self.config.cdi
        resource = Resource(
            rc,
            self.state_dir,
            self.write_file,
            make_frontend,
            on_change=self.status_file.changed,
            on_allocated=self._release_wake.set,
            observer=self.metrics.observer(rc.name, rc.driver) if self.metrics is not None else NULL_OBSERVER,
            cdi=(
                (lambda table: CdiSpecs(rc.name, rc.cdi_kind, cdi.spec_dir, table, cdi.fallback))
                if cdi.enabled
                else None
            ),
            exits=self.exits,
            release=self.config.release,
            codec=assembly.codec(),
        )
        resources.append(resource)
        assembly.added(resource, made[0])
        return resource

    @property
    def apis(self) -> frozenset[str]:
        """The kubelet APIs whose front ends this daemon assembled (``"device-plugin"``, ``"dra"``)."""
        return frozenset(self._assemblies)

    def _release_detection(self) -> Reconciler | None:
        """The device-plugin API's release reconciler, when some resource is served through that API."""
        assembly = self._assemblies.get(API_DEVICE_PLUGIN)
        if assembly is None:
            return None
        from devplug.daemon.dpassembly import DevicePluginAssembly

        return assembly.reconciler if isinstance(assembly, DevicePluginAssembly) else None

    @property
    def reconciler(self) -> Reconciler:
        """The device-plugin API's release reconciler; :class:`~devplug.errors.DevplugError` when no resource is
        served through that API (none runs then)."""
        reconciler = self._release_detection()
        if reconciler is None:
            raise DevplugError("no resource is served through the device-plugin API: no release reconciler runs")
        return reconciler

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
        sections: dict[str, Any] = {}
        for assembly in self._assemblies.values():
            sections.update(assembly.status_sections())
        return {
            **sections,
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
        for assembly in self._assemblies.values():
            assembly.configure(config)
        self.exits.reconfigure(config.liveness)
        for resource in self.resources:
            resource.configure_release(config.release)

    def start_resource(self, rc: ResourceConfig) -> Resource:
        resource = self._new_resource(rc)
        self.resources.append(resource)
        self._start_life(resource)
        self._release_wake.set()  # a pass soon: the restarted instance's ledger may hold allocations
        return resource

    def forget(self, resource: Resource) -> None:
        self.resources.remove(resource)
        self._assembly(resource.config.api).removed(resource)
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
            for assembly in self._assemblies.values():
                assembly.prepare()
            self.exits.liveness.start()
            remove_stale_cdi_specs(self.config)
            if self._metrics_endpoint is not None and self.takeover.took_over is None:  # else once the old one left
                self._metrics_endpoint.start(loop)
            for assembly in self._assemblies.values():
                self._shared_loops += assembly.start(loop)
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(sig, self._stop.set)
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signal.SIGHUP, self.request_reload)
            await self.status_file.write()  # at once: a previous daemon's status must not linger
            # Taken over from a running instance: what precedes starts while its drivers stop, ours only after them.
            await self.takeover.old_drivers_stopped()
            for resource in self.resources:
                self._start_life(resource)
            if self.profiles is not None:
                self.profiles.begin(lambda: self.config, self.reloads.request)
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
            abandoned = await self._bounded_shutdown()
            for problem in abandoned:
                log.error("abandoned at shutdown: %s", problem)
            await self.status_file.write_final()
        finally:
            self.takeover.close()
            for assembly in self._assemblies.values():
                assembly.close()
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

    async def _bounded_shutdown(self) -> list[str]:
        """Shut down within ``[shutdown] timeout``; what did not finish in time (described)."""
        loop = asyncio.get_running_loop()
        timeout = self.config.shutdown.timeout
        log.info("shutting down (at most %g s, [shutdown] timeout)", timeout)
        deadline = loop.time() + timeout
        abandoned = []
        stopping = asyncio.ensure_future(self._shut_down())
        done, _ = await asyncio.wait((stopping,), timeout=timeout)
        if not done:
            stopping.cancel()
            await asyncio.wait((stopping,), timeout=FINAL_WRITE_S)
            abandoned.append(f"the shutdown did not finish within {timeout:g} s ([shutdown] timeout)")
        else:
            await self._hooks_return(deadline)
        abandoned.extend(self._abandoned_hooks())
        return abandoned

    async def _shut_down(self) -> None:
        """Stop accepting, finish in-flight calls, stop the drivers; unbounded (the caller bounds it)."""
        shared = list(self._shared_loops)
        for loop in shared:
            loop.cancel()
        if self.profiles is not None:
            await self.profiles.close()  # no label change asks for a reload any more
        await self.reloads.shut_down()
        lives = list(self._lives.values())
        for life in lives:
            life.cancel()
        await asyncio.gather(*lives, *shared, return_exceptions=True)

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
