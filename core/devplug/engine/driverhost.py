"""A started driver and what depends on it: its device list, relists it asks for, degrading when it fails and
recovering when it answers again, and the health loop.

A :class:`DriverHost` exists only once the driver's ``start`` returned
(:meth:`DriverHost.start` builds it whole), so nothing in it waits on a driver
that might not be there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devplug.config import ResourceConfig
from devplug.context import DriverContext
from devplug.drivers.construction import construct_driver
from devplug.drivers.facade import check_device_list
from devplug.engine.asynctools import BackgroundTasks, Backoff
from devplug.engine.devicetable import DeviceTable
from devplug.engine.driver import AsyncDriver
from devplug.engine.hookrunner import HookRunner
from devplug.engine.supervise import supervise
from devplug.errors import DriverError
from devplug.types import Device

__all__ = ["DriverHost", "PublishedStatus"]

log = logging.getLogger("devplug.engine")


class _LoopSink:
    """The engine's :class:`~devplug.context.DeviceSink`: moves a driver's pushes from any thread onto the loop."""

    def __init__(
        self,
        name: str,
        table: DeviceTable,
        loop: asyncio.AbstractEventLoop,
        relist: asyncio.Event,
        published: PublishedStatus,
    ) -> None:
        self._name = name
        self._table = table
        self._loop = loop
        self._relist = relist
        self._published = published

    def replace_devices(self, devices: list[Device]) -> None:
        checked = check_device_list(self._name, devices, self._table.default_replicas)
        self._loop.call_soon_threadsafe(self._table.replace, checked)

    def update_devices(self, changed: list[Device], removed: list[str]) -> None:
        check_device_list(self._name, changed, self._table.default_replicas)
        self._loop.call_soon_threadsafe(self._table.update, changed, removed)

    def request_relist(self) -> None:
        self._loop.call_soon_threadsafe(self._relist.set)

    def publish_status(self, data: dict[str, Any]) -> None:
        self._loop.call_soon_threadsafe(self._published.set, data)

    def report_problem(self, problem: str | None) -> None:
        self._loop.call_soon_threadsafe(self._published.set_problem, problem)


class PublishedStatus:
    """What the driver published with ``ctx.publish_status`` and ``ctx.report_problem``, for ``devplug status`` and
    ``/readyz``. Event loop thread only."""

    def __init__(self, on_change: Callable[[], None]) -> None:
        self.data: dict[str, Any] | None = None
        #: Why the driver cannot follow its devices now (``ctx.report_problem``), or None.
        self.problem: str | None = None
        self.version = 0
        self._on_change = on_change

    def set(self, data: dict[str, Any]) -> None:
        if data != self.data:
            self.data = data
            self.version += 1
            self._on_change()

    def set_problem(self, problem: str | None) -> None:
        if problem != self.problem:
            self.problem = problem
            self.version += 1
            self._on_change()


class DriverHost:
    """One resource's started driver, keeping the device table in step with it."""

    def __init__(
        self,
        name: str,
        driver: AsyncDriver,
        table: DeviceTable,
        health_interval: float,
        relist: asyncio.Event,
        report: Callable[[str | None], None],
        on_change: Callable[[], None],
        published: PublishedStatus,
    ) -> None:
        self.name = name
        self.driver = driver
        self.table = table
        self.health_interval = health_interval
        self._relist = relist
        self._report = report
        self._on_change = on_change
        self._published = published
        self._tasks = BackgroundTasks()
        self._recovering = False
        self.stopping = False

    @classmethod
    async def start(
        cls,
        config: ResourceConfig,
        table: DeviceTable,
        runner: HookRunner,
        state_dir: Path,
        report: Callable[[str | None], None],
        on_change: Callable[[], None],
        published: PublishedStatus,
    ) -> DriverHost:
        """Create the driver instance, call its ``start``, then ``list_devices``; the host, whole.

        Raises :class:`DriverError` when the driver cannot be created or its
        ``start`` fails (the caller retries); a failing ``list_devices``
        instead degrades the resource (every device unhealthy until it answers).
        """
        instance = construct_driver(config.name, config.driver, config.driver_class, config.options)
        driver = AsyncDriver(config.name, instance, runner, replicas=config.replicas)
        relist = asyncio.Event()
        sink = _LoopSink(config.name, table, asyncio.get_running_loop(), relist, published)
        await driver.start(DriverContext(config.name, state_dir, sink))
        host = cls(config.name, driver, table, config.health_interval, relist, report, on_change, published)
        try:
            devices = await driver.list_devices()
        except DriverError as exc:
            devices = []
            host.degrade(str(exc))
        table.replace(devices)
        return host

    async def run(self) -> None:
        """Relist when the driver asks, and watch health, until :meth:`stop` (each loop supervised)."""
        await asyncio.gather(
            supervise(f"[{self.name}] relisting", self._relist_loop, report=self._report, stopping=self._stopped),
            supervise(f"[{self.name}] the health loop", self._health_loop, report=self._report, stopping=self._stopped),
        )

    def _stopped(self) -> bool:
        return self.stopping

    async def _relist_loop(self) -> None:
        while not self.stopping:
            await self._relist.wait()
            self._relist.clear()
            if self.stopping:  # woken by stop: a list now would only delay the shutdown (10k files: ~1 s)
                return
            try:
                devices = await self.driver.list_devices()
            except DriverError as exc:
                self.degrade(str(exc))
                continue
            self.table.replace(devices)

    async def _health_loop(self) -> None:
        """Call ``check_health`` every ``health_interval`` seconds (when the driver implements it).

        The driver may return every device's health or only the changes: the
        table keeps only what changed, and the log says so per device.
        """
        if self.health_interval <= 0 or not self.driver.capabilities.check_health:
            return
        while not self.stopping:
            await asyncio.sleep(self.health_interval)
            if self.stopping or self._recovering:
                continue
            try:
                health = await self.driver.check_health(self.table.physical_devices())
            except DriverError as exc:
                self.degrade(str(exc))
                continue
            for dev_id in self.table.set_health(health):
                dev = self.table.physical(dev_id)
                if dev is None:
                    continue
                why = f" ({dev.reason})" if dev.reason and not dev.healthy else ""
                log.info(
                    "[%s %s] health is now %s%s", self.name, dev_id, dev.health.value, why, extra={"device": dev_id}
                )

    def degrade(self, reason: str) -> None:
        """Advertise every device unhealthy until the driver answers ``list_devices`` again."""
        if self.table.degraded is None:
            log.error("[%s] driver failing, all devices reported unhealthy: %s", self.name, reason)
        self.table.set_degraded(reason)
        self._on_change()
        if not self._recovering:
            self._recovering = True
            self._tasks.spawn(self._recover())

    async def _recover(self) -> None:
        backoff = Backoff(initial=0.5, cap=30.0)
        try:
            while not self.stopping:
                await asyncio.sleep(backoff.next())
                try:
                    devices = await self.driver.list_devices()
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

    async def stop(self) -> None:
        """Stop the loops and call the driver's ``stop``."""
        self.stopping = True
        self._relist.set()
        self._tasks.cancel_all()
        try:
            await self.driver.stop()
        except DriverError as exc:
            log.error("[%s] driver stop failed: %s", self.name, exc)
        self._published.set_problem(None)  # the stopped driver's; a restarted one reports its own
