"""One configured resource through its whole life: start its driver (retrying), then serve through its front end
(:class:`~devplug.engine.frontend.FrontEnd`) while the driver host keeps the device table current
(:class:`~devplug.engine.driverhost.DriverHost`), until shutdown.

What needs the driver is built only once the driver has started: until then
:attr:`Resource.lifecycle`, :attr:`Resource.releases` and :attr:`Resource.host`
are None, and afterwards they are whole.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from devplug.config import CdiConfig, ReleaseConfig, ResourceConfig
from devplug.drivers import DriverHooks
from devplug.engine.asynctools import Backoff
from devplug.engine.cdi import AllocationAnswers, CdiSpecs
from devplug.engine.devicetable import DeviceCodec, DeviceTable
from devplug.engine.driverhost import DriverHost, PublishedStatus
from devplug.engine.frontend import FrontEnd
from devplug.engine.hookrunner import HookRunner
from devplug.engine.ledger import Ledger
from devplug.engine.lifecycle import DeviceLifecycle
from devplug.engine.observer import NULL_OBSERVER, ResourceObserver
from devplug.engine.quarantine import apply_clear_request
from devplug.engine.releasequeue import ReleaseQueue
from devplug.engine.resourcestatus import ResourceState, ResourceStatus
from devplug.engine.sharing import DeviceShare
from devplug.engine.statedir import prepare_resource_dir
from devplug.engine.tenantexit import ExitEvidence
from devplug.errors import DriverError, StateError
from devplug.resource_names import resource_state_dir

__all__ = ["FrontEndFactory", "Resource", "ResourceState"]

log = logging.getLogger("devplug.engine")

#: Makes a resource's front end from its device table and status (called once, when the resource is made).
FrontEndFactory = Callable[[DeviceTable, ResourceStatus], FrontEnd]


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
        cdi: CdiConfig | None = None,
        *,
        exits: ExitEvidence,
        release: ReleaseConfig,
        codec: DeviceCodec | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self._state_root = state_dir
        self.state_dir = resource_state_dir(state_dir, self.name)
        self.driver_state_dir = self.state_dir / "driver"
        self.exits = exits
        self._release = release
        self._on_change = on_change
        self._on_allocated = on_allocated
        self.table = DeviceTable(config.replicas, codec)
        self.observer = observer
        self.runner = HookRunner(self.name, config.hook_timeout, observer)
        self.ledger = Ledger(
            self.name, self.state_dir / "ledger.json", write_file, on_saved=on_change, observer=observer
        )
        #: The resource's CDI spec file, when ``[cdi] enabled``.
        self.cdi = (
            CdiSpecs(self.name, config.cdi_kind, cdi.spec_dir, self.table, cdi.fallback)
            if cdi is not None and cdi.enabled
            else None
        )
        self.status = ResourceStatus()
        #: What the driver published with ``ctx.publish_status`` (kept across driver restarts).
        self.published = PublishedStatus(on_change)
        self.frontend = make_frontend(self.table, self.status)
        self.stopping = False
        self.host: DriverHost | None = None
        self.lifecycle: DeviceLifecycle | None = None
        self.releases: ReleaseQueue | None = None

    # --- what status.py reads

    @property
    def state(self) -> ResourceState:
        if self.table.retired is not None and self.status.state is not ResourceState.STOPPED:
            return ResourceState.DRAINING
        return self.status.state

    @property
    def last_error(self) -> str | None:
        return self.status.last_error

    @property
    def registrations(self) -> int:
        return self.status.registrations

    @property
    def registered_at(self) -> float | None:
        return self.status.registered_at

    @property
    def state_error(self) -> str | None:
        """Why the last ledger write failed (a full disk), until one succeeds."""
        return self.ledger.write_error

    @property
    def hooks(self) -> DriverHooks | None:
        """The driver's typed facade, once the driver has started."""
        return self.host.driver.hooks if self.host is not None else None

    def shared_devices(self) -> list[DeviceShare]:
        """Each shared physical device now: replicas, replicas in use, tenants, pods (empty until started, and
        for a resource without shared devices). The figures ``devplug status`` shows, for metrics too."""
        return self.lifecycle.shared_usage() if self.lifecycle is not None else []

    def _report(self, reason: str | None) -> None:
        self.status.last_error = reason
        self._on_change()

    # --- life

    async def live(self) -> None:
        """The resource's whole life: start the driver (retrying with backoff), then serve and keep devices current."""
        backoff = Backoff(initial=1.0, cap=30.0)
        while not self.stopping:
            try:
                await self._start()
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                expected = isinstance(exc, DriverError | StateError)
                self.status.state = ResourceState.FAILED
                self._report(str(exc) if expected else f"start failed: {type(exc).__name__}: {exc}")
                delay = backoff.next()
                log.error(
                    "[%s] start failed, retrying in %.0f s: %s",
                    self.name,
                    delay,
                    self.status.last_error,
                    exc_info=None if expected else exc,
                )
                await asyncio.sleep(delay)
        if self.stopping or self.host is None:
            return
        await asyncio.gather(self.frontend.serve(), self.host.run(), *([self.cdi.follow()] if self.cdi else []))

    async def _start(self) -> None:
        """Start the driver and build what depends on it; a failure leaves nothing half-built (driver stopped)."""
        prepare_resource_dir(self._state_root, self.name)
        self.ledger.load()
        host = await DriverHost.start(
            self.config, self.table, self.runner, self.driver_state_dir, self._report, self._on_change, self.published
        )
        try:
            lifecycle = DeviceLifecycle(
                self.name,
                self.table,
                host.driver,
                self.ledger,
                self.frontend,
                exits=self.exits,
                answers=AllocationAnswers(self.name, self.table, host.driver, self.cdi),
                observer=self.observer,
                previous_tenant_wait=self._release.previous_tenant_wait,
                fail_requests_greater_than_one=self.config.fail_requests_greater_than_one,
                on_allocated=self._on_allocated,
                on_change=self._on_change,
            )
            lost, self.ledger.lost = self.ledger.lost, False
            await self.frontend.started(lifecycle, lost)
            for dev_id in self.table.learn_replica_ids(self.ledger.held_devices()):
                log.warning("[%s] %s is held but no longer advertised: released through its device", self.name, dev_id)
            lifecycle.withheld_changed()  # devices being released, or named by a quarantined record
        except BaseException:
            await host.stop()
            raise
        self.host, self.lifecycle = host, lifecycle
        self.releases = ReleaseQueue(
            lifecycle,
            interval=self._release.interval,
            max_retry_interval=self._release.max_retry_interval,
            stopping=lambda: self.stopping,
        )
        log.info(
            "[%s] driver %s started with %d devices (hooks: %s)",
            self.name,
            self.config.driver,
            len(self.table),
            ", ".join(host.driver.capabilities.implemented),
        )

    # --- events from the daemon and the reconciler

    async def apply_quarantine_request(self) -> None:
        """Clear the quarantined ledger records an operator asked to clear (``devplug quarantine clear``)."""
        if self.lifecycle is None:
            return
        try:
            cleared = apply_clear_request(self.ledger, self.state_dir)
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
        self.lifecycle.withheld_changed()
        await self.ledger.save(sync=True)
        self._on_change()

    def configure_release(self, release: ReleaseConfig) -> None:
        """``[release]`` changed (a reload): the previous-tenant wait and the retry schedule of failing releases."""
        self._release = release
        if self.lifecycle is not None:
            self.lifecycle.set_previous_tenant_wait(release.previous_tenant_wait)
        if self.releases is not None:
            self.releases.configure(release.interval, release.max_retry_interval)

    def releasing(self) -> bool:
        """True while a release found by the front end runs (a reload stopping this instance waits for it)."""
        return self.releases is not None and self.releases.any_running()

    def holds_any(self) -> bool:
        """True while some allocation is held (or still owed its release)."""
        return len(self.ledger) > 0

    def retire(self, reason: str) -> None:
        """Removed from the config: advertise no devices and take no new allocation, but keep serving the
        pods that hold devices (PreStartContainer) and releasing them until :meth:`drained`."""
        self.table.retire(reason)
        self._on_change()

    def drained(self) -> bool:
        """Nothing is allocated any more (or the driver never started, so nothing can be released)."""
        return self.lifecycle is None or not self.holds_any()

    # --- shutdown

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting, finish in-flight calls, stop the driver, remove the socket."""
        self.stopping = True
        await self.frontend.stop(grace)
        if self.releases is not None:
            self.releases.close()
        if self.host is not None:
            await self.host.stop()
        if self.lifecycle is not None:  # fold the journal into the snapshot: the next start reads one file
            await self.ledger.compact()
        self.ledger.close()
        self.runner.close()
        self.status.state = ResourceState.STOPPED
        self._on_change()
