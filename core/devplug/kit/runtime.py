"""What a driver instance holds while it runs, in one object: the shape every shipped driver has.

A driver builds a :class:`DriverRuntime` in its constructor, hands it the
context in ``start`` and lets it go in ``stop``; in between the runtime gives
the driver its logger and state folder, keeps what the engine was told about
the devices (:class:`~devplug.kit.advertised.AdvertisedDevices`), and runs the
driver's ``scan`` on a :class:`~devplug.kit.rescan.RescanLoop` (every
``rescan_interval`` seconds and after :meth:`DriverRuntime.trigger`), pushing
only what changed::

    class NvmeDriver:
        def __init__(self, options):
            self.options = options
            self.runtime = DriverRuntime(self.scan, rescan_interval=options.rescan_interval, name="nvme")

        @hookimpl
        def start(self, ctx):
            self.runtime.start(ctx)
            self.erasing = self.runtime.records("nvme-state.json", "erasing", Erase, what="...", recover="...")
            self.runtime.start_rescans()            # every rescan_interval seconds from now

        @hookimpl
        def stop(self):
            self.runtime.stop()

        @hookimpl
        def list_devices(self):
            return self.runtime.refresh(push=False)  # the engine takes the answer

        def scan(self) -> list[Device]:              # every device, healthy or not, with its reason
            ...

Asking for the context (or what comes from it) before ``start`` raises
:class:`devplug.DriverError` saying so, instead of a driver carrying
``assert self.ctx is not None`` in every method.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from devplug.context import DriverContext
from devplug.errors import DriverError
from devplug.kit.advertised import AdvertisedDevices
from devplug.kit.records import RecordStore, RecordTable
from devplug.kit.rescan import RescanLoop
from devplug.types import Device

__all__ = ["DriverRuntime"]

R = TypeVar("R")


class DriverRuntime:
    """One driver instance's context, advertised devices and rescan loop, from ``start`` to ``stop``.

    ``scan`` returns every device of the resource (healthy or not, with reasons); with ``rescan_interval`` above
    0 it is called on a rescan loop after ``start`` (thread name ``"<name>-rescan <resource>"``). ``whole``: push
    the whole list when something changed (``ctx.set_devices``) rather than only the changes.
    """

    def __init__(
        self,
        scan: Callable[[], Iterable[Device]] | None = None,
        *,
        rescan_interval: float = 0.0,
        name: str = "driver",
        whole: bool = True,
    ) -> None:
        self._scan = scan
        self.rescan_interval = rescan_interval
        self.name = name
        self.whole = whole
        self._ctx: DriverContext | None = None
        self._advertised: AdvertisedDevices | None = None
        self._rescans: RescanLoop | None = None

    def __repr__(self) -> str:
        where = self._ctx.resource_name if self._ctx is not None else "not started"
        return f"<DriverRuntime {self.name} {where}>"

    # --- lifecycle ---------------------------------------------------------------------------------

    def start(self, ctx: DriverContext) -> None:
        """Keep ``ctx`` (what the engine was told starts empty); call it first thing in the ``start`` hook."""
        self.stop()
        self._ctx = ctx
        self._advertised = AdvertisedDevices(ctx)

    def start_rescans(self) -> None:
        """Start the rescan loop (when there is a ``scan`` and a ``rescan_interval``); call it last thing in the
        ``start`` hook, once what ``scan`` reads is set up: the first scan comes one period later."""
        ctx = self.ctx
        if self._scan is not None and self.rescan_interval > 0 and self._rescans is None:
            name = f"{self.name}-rescan {ctx.resource_name}"
            self._rescans = RescanLoop(self.refresh, interval=self.rescan_interval, name=name, log=ctx.log)
            self._rescans.start()

    def stop(self) -> str | None:
        """Stop the rescan loop (waiting for a scan in progress); the resource served (``None`` when never
        started), for what the driver gives back. The context stays: a hook the driver still gets (a test may
        call one after ``stop``) logs and pushes as before."""
        rescans, self._rescans = self._rescans, None
        if rescans is not None:
            rescans.stop()
        return self._ctx.resource_name if self._ctx is not None else None

    @property
    def started(self) -> bool:
        """True once :meth:`start` was called."""
        return self._ctx is not None

    # --- what start gave -------------------------------------------------------------------------------

    @property
    def ctx(self) -> DriverContext:
        """The driver's context (:class:`devplug.DriverError` before ``start``)."""
        if self._ctx is None:
            raise DriverError(f"{self.name}: the driver was not started")
        return self._ctx

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """The context's logger: its lines carry the resource name (``extra={"device": id}`` names a device)."""
        return self.ctx.log

    @property
    def state_dir(self) -> Path:
        """The resource's own folder, kept across restarts (it exists once ``start`` was called)."""
        return self.ctx.state_dir

    @property
    def advertised(self) -> AdvertisedDevices:
        """What the engine was last told about the devices."""
        if self._advertised is None:
            raise DriverError(f"{self.name}: the driver was not started")
        return self._advertised

    def records(self, file_name: str, table: str, record_type: type[R], **store: Any) -> RecordTable[R]:
        """The table ``table`` of a :class:`~devplug.kit.records.RecordStore` in ``<state_dir>/<file_name>``
        (``store``: its ``what``, ``recover``, ``version``)."""
        return RecordStore(self.state_dir / file_name, **store).table(table, record_type)

    # --- devices -----------------------------------------------------------------------------------------

    def refresh(self, push: bool = True) -> list[Device]:
        """Scan, remember the devices as the engine's view and (with ``push``) push them when they changed;
        returns them. Called by the rescan loop; a driver calls it from ``list_devices`` with ``push=False``."""
        if self._scan is None:
            raise DriverError(f"{self.name}: this runtime has no scan")
        return self.advertised.set(self._scan(), push=push, whole=self.whole)

    def trigger(self) -> None:
        """Ask the rescan loop for a scan soon (after a change the driver made, or an event); without a loop,
        scan and push now."""
        if self._rescans is not None:
            self._rescans.trigger()
        elif self._scan is not None and self._ctx is not None:
            self.refresh()
