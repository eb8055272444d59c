"""A resource once its driver has started: the started driver, the lifecycle over it and the release queue, made
together by :meth:`RunningResource.start` and whole from then on.

A :class:`~devplug.engine.resource.Resource` holds :data:`NOT_STARTED` until its
driver starts (retried with backoff), then its :class:`RunningResource`; what
needs the driver reads it from there, never from fields filled in one by one.
Both answer what the resource asks of its running part in either phase
(:class:`ResourcePhase`): a resource that never started has nothing to
configure, release or stop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from devplug.config import ReleaseConfig, ResourceConfig
from devplug.drivers import DriverHooks
from devplug.engine.cdi import AllocationAnswers, CdiSpecFile
from devplug.engine.devicetable import DeviceTable
from devplug.engine.driverhost import DriverHost, PublishedStatus
from devplug.engine.frontend import FrontEnd
from devplug.engine.hookrunner import HookRunner
from devplug.engine.ledger import Ledger
from devplug.engine.lifecycle import DeviceLifecycle
from devplug.engine.observer import ResourceObserver
from devplug.engine.releasequeue import ReleaseQueue
from devplug.engine.tenantexit import ExitEvidence

__all__ = ["NOT_STARTED", "NotStarted", "ResourceParts", "ResourcePhase", "RunningResource"]

log = logging.getLogger("devplug.engine")


@dataclass(frozen=True)
class ResourceParts:
    """What a resource owns from the start, and what its running part is made with."""

    config: ResourceConfig
    table: DeviceTable
    runner: HookRunner
    ledger: Ledger
    frontend: FrontEnd
    exits: ExitEvidence
    observer: ResourceObserver
    published: PublishedStatus
    driver_state_dir: Path
    cdi: CdiSpecFile | None
    note_error: Callable[[str | None], None]
    on_change: Callable[[], None]
    on_allocated: Callable[[], None]
    #: Whether the resource stops (no new release starts then).
    stopping: Callable[[], bool]


class ResourcePhase(Protocol):
    """What a resource asks of its running part, started or not."""

    @property
    def started(self) -> bool:
        """Whether the driver started (the lifecycle and the release queue exist)."""
        ...

    @property
    def hooks(self) -> DriverHooks | None:
        """The driver's typed facade while it runs."""
        ...

    def configure(self, release: ReleaseConfig) -> None:
        """``[release]`` changed: the previous-tenant wait and the retry schedule of failing releases."""

    def releasing(self) -> bool:
        """Whether a release runs."""
        ...

    def cut_waits_short(self, cut: bool) -> None:
        """A handover asked (``cut``) or failed: an Allocate waiting for a previous tenant gives up at once."""

    def close_releases(self) -> None:
        """Start no release any more."""

    async def stop_driver(self) -> None:
        """Stop the driver (once)."""


class NotStarted:
    """A resource whose driver has not started (yet): nothing runs, so nothing is configured, released or stopped."""

    started = False
    hooks = None

    def configure(self, release: ReleaseConfig) -> None:
        pass

    def releasing(self) -> bool:
        return False

    def cut_waits_short(self, cut: bool) -> None:
        pass

    def close_releases(self) -> None:
        pass

    async def stop_driver(self) -> None:
        pass


#: The running part of a resource whose driver has not started.
NOT_STARTED: Final = NotStarted()


class RunningResource:
    """The started driver, the lifecycle (the core's interface to front ends) and the release queue front ends
    hand tenancies that may be over: made together once the driver started (:meth:`start`)."""

    def __init__(self, host: DriverHost, lifecycle: DeviceLifecycle, releases: ReleaseQueue) -> None:
        self.host = host
        self.lifecycle = lifecycle
        self.releases = releases
        #: Set once :meth:`stop_driver` stopped the driver (a handover: the successor starts its own).
        self.driver_stopped = False

    @classmethod
    async def start(cls, parts: ResourceParts, release: ReleaseConfig) -> RunningResource:
        """Start the driver and build what depends on it, the front end told (``started``); a failure leaves
        nothing half-built (the driver stopped)."""
        config = parts.config
        host = await DriverHost.start(
            config,
            parts.table,
            parts.runner,
            parts.driver_state_dir,
            parts.note_error,
            parts.on_change,
            parts.published,
        )
        try:
            lifecycle = DeviceLifecycle(
                config.name,
                parts.table,
                host.driver,
                parts.ledger,
                parts.frontend,
                exits=parts.exits,
                answers=AllocationAnswers(config.name, parts.table, host.driver, parts.cdi),
                observer=parts.observer,
                previous_tenant_wait=release.previous_tenant_wait,
                fail_requests_greater_than_one=config.fail_requests_greater_than_one,
                on_allocated=parts.on_allocated,
                on_change=parts.on_change,
            )
            lost, parts.ledger.lost = parts.ledger.lost, False
            await parts.frontend.started(lifecycle, lost)
            for dev_id in parts.table.learn_replica_ids(parts.ledger.held_devices()):
                log.warning(
                    "[%s] %s is held but no longer advertised: released through its device", config.name, dev_id
                )
            lifecycle.withheld_changed()  # devices being released, or named by a quarantined record
        except BaseException:
            await host.stop()
            raise
        releases = ReleaseQueue(
            lifecycle,
            interval=release.interval,
            max_retry_interval=release.max_retry_interval,
            stopping=parts.stopping,
        )
        return cls(host, lifecycle, releases)

    started = True

    @property
    def hooks(self) -> DriverHooks | None:
        """The driver's typed facade (None once :meth:`stop_driver` stopped it for a handover)."""
        return None if self.driver_stopped else self.host.driver.hooks

    def configure(self, release: ReleaseConfig) -> None:
        self.lifecycle.set_previous_tenant_wait(release.previous_tenant_wait)
        self.releases.configure(release.interval, release.max_retry_interval)

    def releasing(self) -> bool:
        return self.releases.any_running()

    def cut_waits_short(self, cut: bool) -> None:
        self.lifecycle.cut_waits_short(cut)

    def close_releases(self) -> None:
        self.releases.close()

    async def stop_driver(self) -> None:
        if not self.driver_stopped:
            self.driver_stopped = True
            await self.host.stop()
