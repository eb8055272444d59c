"""One configured resource through its whole life: start its driver (retrying), then serve through its front end
(:class:`~devplug.engine.frontend.FrontEnd`) while the driver host keeps the device table current
(:class:`~devplug.engine.driverhost.DriverHost`), until shutdown.

What needs the driver is built only once the driver has started, together and
whole: its :class:`~devplug.engine.running.RunningResource` (the started driver,
the lifecycle, the release queue). Until then :attr:`Resource.running` is None.

Its parts (device table, ledger, hook runner, driver host, CDI spec file: the
file's writer is given, :class:`~devplug.engine.cdi.CdiSpecFile`) are its own:
the daemon, the status file, the metrics and the front ends ask it through
narrow methods (:meth:`Resource.report`, :meth:`Resource.figures`,
:meth:`Resource.held_count`, :meth:`Resource.hooks_running`, ...), the report
itself built by :mod:`devplug.engine.resourcereport`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from devplug.config import ReleaseConfig, ResourceConfig
from devplug.drivers import DriverHooks
from devplug.engine.asynctools import Backoff
from devplug.engine.cdi import CdiNameCollisionError, CdiSpecFile
from devplug.engine.devicetable import DeviceCodec, DeviceTable
from devplug.engine.driverhost import PublishedStatus
from devplug.engine.frontend import FrontEnd, HandoverFrontEnd
from devplug.engine.hookrunner import HookRunner, RunningHook
from devplug.engine.ledger import Ledger
from devplug.engine.lifecycle import DeviceLifecycle
from devplug.engine.observer import NULL_OBSERVER, ResourceObserver
from devplug.engine.quarantine import apply_clear_request
from devplug.engine.releasequeue import ReleaseQueue
from devplug.engine.resourcereport import (
    DeviceEntries,
    ReportSources,
    ResourceFigures,
    build_report,
    figures,
    report_version,
)
from devplug.engine.resourcestatus import ResourceState, ResourceStatus
from devplug.engine.running import NOT_STARTED, ResourceParts, ResourcePhase, RunningResource
from devplug.engine.statedir import prepare_resource_dir
from devplug.engine.tenantexit import ExitEvidence
from devplug.errors import DevplugError, DriverError, KubeApiError, StateError
from devplug.kube.names import resource_state_dir

__all__ = ["CdiSpecFileFactory", "FrontEndFactory", "Resource", "ResourceState"]

log = logging.getLogger("devplug.engine")

#: Makes a resource's front end from its device table and status (called once, when the resource is made).
FrontEndFactory = Callable[[DeviceTable, ResourceStatus], FrontEnd]
#: Makes a resource's CDI spec file (the writer, host I/O) from its device table (called once, when it is made).
CdiSpecFileFactory = Callable[[DeviceTable], CdiSpecFile]


class Resource:
    """A configured resource: its ledger and device table from the start; driver, lifecycle and server once started."""

    def __init__(
        self,
        config: ResourceConfig,
        state_dir: Path,
        write_file: Callable[[Path, bytes], Awaitable[None]],
        make_frontend: FrontEndFactory,
        on_change: Callable[[], None] = lambda: None,
        on_allocated: Callable[[], None] = lambda: None,
        observer: ResourceObserver = NULL_OBSERVER,
        cdi: CdiSpecFileFactory | None = None,
        *,
        exits: ExitEvidence,
        release: ReleaseConfig,
        codec: DeviceCodec | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self._state_root = state_dir
        self._state_dir = resource_state_dir(state_dir, self.name)
        self._driver_state_dir = self._state_dir / "driver"
        self._exits = exits
        self._release = release
        self._on_change = on_change
        self._on_allocated = on_allocated
        self._table = DeviceTable(config.replicas, codec, on_partitions=self._partitions_changed)
        self._observer = observer
        self._runner = HookRunner(self.name, config.hook_timeout, observer)
        self._ledger = Ledger(
            self.name, self._state_dir / "ledger.json", write_file, on_saved=on_change, observer=observer
        )
        #: The resource's CDI spec file, when ``[cdi] enabled`` (``cdi`` makes it).
        self._cdi = cdi(self._table) if cdi is not None else None
        self._status = ResourceStatus()
        #: What the driver published with ``ctx.publish_status`` (kept across driver restarts).
        self._published = PublishedStatus(on_change)
        self._frontend = make_frontend(self._table, self._status)
        self._stopping = False
        self._paused = False  # a handover asked: no new work starts (see pause)
        self._handed_over = False  # a newer instance owns this resource's state: write nothing more
        self._cdi_resync: asyncio.Future[None] | None = None  # the CDI spec rewritten after a failed handover
        #: What needs the driver, made whole once it started (:meth:`_start`).
        self._running: ResourcePhase = NOT_STARTED

    def _partitions_changed(self) -> None:
        """The driver's parts or their parents' counters changed (the table calls it): the lifecycle withholds what
        cannot be allocated now (before the driver started, the lifecycle's first sync does)."""
        lifecycle = self.lifecycle
        if lifecycle is not None:
            lifecycle.withheld_changed()
            self._on_change()

    @property
    def running(self) -> RunningResource | None:
        """The started driver, its lifecycle and release queue; None until the driver started."""
        return self._running if isinstance(self._running, RunningResource) else None

    @property
    def lifecycle(self) -> DeviceLifecycle | None:
        """The core's interface to front ends, once the driver has started."""
        return self._running.lifecycle if isinstance(self._running, RunningResource) else None

    @property
    def releases(self) -> ReleaseQueue | None:
        """The release queue front ends hand tenancies that may be over, once the driver has started."""
        return self._running.releases if isinstance(self._running, RunningResource) else None

    # --- what the daemon, the status file and the metrics read

    @property
    def state(self) -> ResourceState:
        if self._table.retired is not None and self._status.state is not ResourceState.STOPPED:
            return ResourceState.DRAINING
        return self._status.state

    @property
    def last_error(self) -> str | None:
        return self._status.last_error

    @property
    def driver_problem(self) -> str | None:
        """Why the driver cannot follow its devices now (``ctx.report_problem``), or None."""
        return self._published.problem

    @property
    def endpoint(self) -> str:
        """Where the front end serves (a socket path)."""
        return self._frontend.endpoint

    @property
    def serving(self) -> bool:
        """Whether the front end serves the kubelet now (:attr:`~devplug.engine.frontend.HandoverFrontEnd.serving`):
        a handover's new instance tells the old one where it serves only once every resource does."""
        return isinstance(self._frontend, HandoverFrontEnd) and self._frontend.serving

    @property
    def stopping(self) -> bool:
        """True once :meth:`wind_down` or :meth:`stop` was called, or while :meth:`pause` holds: no new release
        starts in this instance."""
        return self._stopping or self._paused

    @property
    def hooks(self) -> DriverHooks | None:
        """The driver's typed facade, once the driver has started (and until a handover stopped it)."""
        return self._running.hooks

    def _sources(self) -> ReportSources:
        return ReportSources(
            name=self.name,
            config=self.config,
            state=self.state,
            endpoint=self._frontend.endpoint,
            status=self._status,
            table=self._table,
            ledger=self._ledger,
            published=self._published,
            lifecycle=self.lifecycle,
            hooks=self.hooks,
            frontend=self._frontend.describe(),
        )

    def report_version(self) -> tuple[object, ...]:
        """Cheap counters and scalars that change whenever :meth:`report` would say something new."""
        return report_version(self._sources())

    async def report(self, cache: DeviceEntries) -> dict[str, Any]:
        """The resource's entry in the status file; ``cache`` keeps device entries from one report to the next
        (one per resource). Lets other work run while it walks records and devices."""
        return await build_report(self._sources(), cache)

    def figures(self) -> ResourceFigures:
        """The resource's figures for the metrics, as they are now."""
        return figures(self._sources())

    def held_count(self) -> int:
        """How many allocations are held (or still owed their release)."""
        return len(self._ledger)

    def hooks_running(self) -> list[RunningHook]:
        """The driver's hook calls that have not returned (abandoned ones included), oldest first."""
        return self._runner.running()

    def _note_error(self, reason: str | None) -> None:
        self._status.last_error = reason
        self._on_change()

    # --- life

    async def live(self) -> None:
        """The resource's whole life: start the driver (retrying with backoff), then serve and keep devices current."""
        backoff = Backoff(initial=1.0, cap=30.0)
        while not self._stopping:
            try:
                await self._start()
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # the driver's, the state dir's, the API server's (DRA: no resource.k8s.io version it serves):
                # each message says what and where; a traceback would only hide it
                expected = isinstance(exc, DriverError | StateError | KubeApiError)
                self._status.state = ResourceState.FAILED
                self._note_error(str(exc) if expected else f"start failed: {type(exc).__name__}: {exc}")
                delay = backoff.next()
                log.error(
                    "[%s] start failed, retrying in %.0f s: %s",
                    self.name,
                    delay,
                    self._status.last_error,
                    exc_info=None if expected else exc,
                )
                await asyncio.sleep(delay)
                while self._paused and not self._stopping:  # a handover: no driver starts in this instance now
                    await asyncio.sleep(delay)
        running = self.running
        if self._stopping or running is None:
            return
        following = [self._cdi.follow()] if self._cdi is not None else []
        await asyncio.gather(self._frontend.serve(), running.host.run(), *following)

    async def _start(self) -> None:
        """Start the driver and build what depends on it, whole; a failure leaves nothing half-built (driver
        stopped)."""
        prepare_resource_dir(self._state_root, self.name)
        self._ledger.load()
        parts = ResourceParts(
            config=self.config,
            table=self._table,
            runner=self._runner,
            ledger=self._ledger,
            frontend=self._frontend,
            exits=self._exits,
            observer=self._observer,
            published=self._published,
            driver_state_dir=self._driver_state_dir,
            cdi=self._cdi,
            note_error=self._note_error,
            on_change=self._on_change,
            on_allocated=self._on_allocated,
            stopping=lambda: self.stopping,
        )
        running = self._running = await RunningResource.start(parts, self._release)
        log.info(
            "[%s] driver %s started with %d devices (hooks: %s)",
            self.name,
            self.config.driver,
            len(self._table),
            ", ".join(running.host.driver.capabilities.implemented),
        )

    # --- events from the daemon and the front ends

    async def apply_quarantine_request(self) -> None:
        """Clear the quarantined ledger records an operator asked to clear (``devplug quarantine clear``)."""
        running = self.running
        if running is None:
            return
        try:
            cleared = apply_clear_request(self._ledger, self._state_dir)
        except ValueError as exc:
            log.error("[%s] quarantine clear request %s", self.name, exc)
            return
        if cleared is None:
            return
        for bad in cleared:
            log.warning(
                "[%s] %s cleared by the operator: %s back in service without a release through the driver",
                self.name,
                bad.describe(),
                ", ".join(bad.devices()) or "no devices",
            )
        if not cleared:
            log.warning("[%s] quarantine clear request: no such quarantined record", self.name)
        running.lifecycle.withheld_changed()
        await self._ledger.save(sync=True)
        self._on_change()

    def resend(self) -> bool:
        """Make every watcher of the device list (a ListAndWatch stream) hear it again, changed or not; False
        when none is open. The kubelet rewrites its checkpoint on every ListAndWatch message."""
        return self._table.resend()

    def configure_release(self, release: ReleaseConfig) -> None:
        """``[release]`` changed (a reload): the previous-tenant wait and the retry schedule of failing releases."""
        self._release = release
        self._running.configure(release)

    def releasing(self) -> bool:
        """True while a release found by the front end runs (a reload stopping this instance waits for it)."""
        return self._running.releasing()

    def holds_any(self) -> bool:
        """True while some allocation is held (or still owed its release)."""
        return len(self._ledger) > 0

    def retire(self, reason: str) -> None:
        """Removed from the config: advertise no devices and take no new allocation, but keep serving the
        pods that hold devices (PreStartContainer) and releasing them until :meth:`drained`."""
        self._table.retire(reason)
        self._on_change()

    def drained(self) -> bool:
        """Nothing is allocated any more (or the driver never started, so nothing can be released)."""
        return not self._running.started or not self.holds_any()

    # --- handover (devplug.daemon.handover): the old instance's side

    def _handover_frontend(self) -> HandoverFrontEnd:
        """The front end, which must be able to hand over (both shipped front ends can)."""
        if not isinstance(self._frontend, HandoverFrontEnd):
            raise DevplugError(f"[{self.name}] its front end cannot be handed over to another instance")
        return self._frontend

    def pause(self) -> None:
        """A newer instance asked to take over: calls that start new work wait at the front end, and no new
        release starts; what runs goes on (:meth:`quiet` waits for it)."""
        self._paused = True
        self._handover_frontend().hold_calls()
        self._running.cut_waits_short(True)  # an Allocate waiting for a previous tenant would outlast the handover
        if self._cdi is not None:  # from the lock's release on, the spec file is the successor's
            self._cdi.held = True
        self._on_change()

    def resume(self) -> None:
        """The handover failed: serve the held calls here and release again."""
        self._paused = False
        self._handover_frontend().release_calls()
        self._running.cut_waits_short(False)
        if self._cdi is not None:
            self._cdi.held = False
            self._cdi_resync = asyncio.ensure_future(self._resync_cdi(self._cdi))
        self._on_change()

    async def _resync_cdi(self, cdi: CdiSpecFile) -> None:
        """Write the CDI spec as the devices are now (changes during a failed handover were held back)."""
        try:
            await cdi.sync()
        except (OSError, CdiNameCollisionError) as exc:
            log.error("[%s] cannot write the CDI spec %s: %s", self.name, cdi.path, exc)

    def quiet(self) -> bool:
        """No driver hook and no release runs (calls held at the front end do not count)."""
        return not self.hooks_running() and not self.releasing()

    async def calls_idle(self) -> None:
        """Return once no front-end call runs here."""
        await self._handover_frontend().calls_idle()

    async def flush(self) -> None:
        """Fold the ledger's journal into its snapshot, synced: the successor reads one whole file."""
        if self._running.started:
            await self._ledger.compact()

    def handover_facts(self) -> dict[str, Any]:
        """What this resource hands over: allocations held, its CDI spec, and the front end's facts."""
        facts: dict[str, Any] = {"held_allocations": len(self._ledger), **self._handover_frontend().handover_facts()}
        if self._cdi is not None:
            facts["cdi_spec"] = str(self._cdi.path)
        return facts

    async def stop_driver(self) -> None:
        """Stop the driver (the successor starts its own next); the front end keeps its sockets."""
        await self._running.stop_driver()

    async def hand_over(self, successor: str, grace: float) -> None:
        """The successor serves at ``successor``: the front end answers through it and stops; nothing of the
        state dir is written any more (the successor owns the ledger, the CDI spec and the status)."""
        self._stopping = True
        self._handed_over = True
        await self._handover_frontend().hand_over(successor, grace)
        self._running.close_releases()
        await self.stop_driver()
        self._ledger.close()
        self._runner.close()
        self._status.state = ResourceState.STOPPED

    def disown(self) -> None:
        """This instance let the state lock go (a handover under way when it was told to stop): write nothing of
        the state dir from now on; :meth:`stop` does nothing (the process ends, its sockets with it)."""
        self._handed_over = True

    # --- shutdown

    def wind_down(self) -> None:
        """Start no new release (the reconciler passes this instance by) and give up starting the driver;
        :meth:`stop` follows once the releases running finished (:meth:`releasing`)."""
        self._stopping = True

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting, finish in-flight calls, stop the driver, remove the socket (nothing after a handover:
        :meth:`hand_over` stopped it, and the state is the successor's)."""
        if self._handed_over:
            return
        self._stopping = True
        await self._frontend.stop(grace)
        self._running.close_releases()
        await self._running.stop_driver()
        if self._running.started:  # fold the journal into the snapshot: the next start reads one file
            await self._ledger.compact()
        self._ledger.close()
        self._runner.close()
        self._status.state = ResourceState.STOPPED
        self._on_change()

    async def remove_cdi_spec(self) -> None:
        """Delete this resource's CDI spec file (torn down by a reload, and no resource of the config uses its
        kind); a failure is logged."""
        if self._cdi is None:
            return
        try:
            await self._cdi.remove()
        except OSError as exc:
            log.error("[%s] cannot remove the CDI spec %s: %s", self.name, self._cdi.path, exc)
