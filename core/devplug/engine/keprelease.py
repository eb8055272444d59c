"""Releases driven device by device: the KEP "Add Deallocate and PostStopContainer to the Device Manager API".

A kubelet with the KEP says when one container stopped (``PostStopContainer``)
and when its devices are free (``Deallocate``), naming devices rather than
tenancies. These calls work on whatever records hold the devices: post-stop is
tracked per device, deallocate drops the devices from their records, and a
record left empty is released. Like every release, each hook's intent is
written before the call and its completion after. The wire side of these calls
is the device-plugin front end's; their effect on the ledger is the core's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from devplug.engine.driver import AsyncDriver
from devplug.engine.guard import DeviceGuard
from devplug.engine.ledger import AllocationRecord, Ledger
from devplug.engine.release import Releaser
from devplug.engine.requestcheck import RequestChecks
from devplug.errors import DriverError
from devplug.text.logsafe import id_list

__all__ = ["KepRelease"]

log = logging.getLogger("devplug.engine")


class KepRelease:
    """The KEP's PostStopContainer and Deallocate on one resource's devices."""

    def __init__(
        self,
        resource_name: str,
        ledger: Ledger,
        driver: AsyncDriver,
        guard: DeviceGuard,
        releaser: Releaser,
        checks: RequestChecks,
    ) -> None:
        self.resource_name = resource_name
        self.ledger = ledger
        self.driver = driver
        self.guard = guard
        self.releaser = releaser
        self.checks = checks

    def _holders_of(self, device_ids: Sequence[str]) -> list[AllocationRecord]:
        return list({r.id: r for i in device_ids for r in self.ledger.holders(i)}.values())

    async def post_stop(self, device_ids: Sequence[str]) -> None:
        """PostStopContainer: clean up after one container.

        Devices already post-stopped in their allocation, or already released
        (reconciliation got there first), are skipped and logged.
        """
        self.checks.known([device_ids], "PostStopContainer")
        async with self.guard.hold(device_ids, "post_stop"):
            records = self._holders_of(device_ids)
            owed = [i for i in device_ids if any(i in r.devices and i not in r.post_stopped for r in records)]
            now = time.time()
            for record in records:
                self.ledger.kep_touched(record.id, now)
            if owed and self.driver.capabilities.post_stop:
                retry = any(i in r.post_stop_begun or r.adopted is not None for r in records for i in owed)
                for record in records:
                    self.ledger.post_stop_begun(record.id, [i for i in owed if i in record.devices])
                await self.ledger.save(sync=True)
                try:
                    await self.releaser.post_stop(owed, retry, [r.id for r in records])
                except DriverError as exc:
                    self.guard.keep_if_hung(exc, owed)
                    raise
            for record in records:
                self.ledger.post_stopped(record.id, [i for i in owed if i in record.devices])
            if records:
                await self.ledger.save()
            skipped = [i for i in device_ids if i not in owed]
            if skipped:
                log.info(
                    "[%s] PostStopContainer: %s already cleaned up or released", self.resource_name, id_list(skipped)
                )

    async def deallocate(self, device_ids: Sequence[str]) -> None:
        """Deallocate: the devices are free once the driver is done (those already released skipped)."""
        self.checks.known([device_ids], "Deallocate")
        async with self.guard.hold(device_ids, "deallocate"):
            start = time.monotonic()
            records = self._holders_of(device_ids)
            holding = {d for r in records for d in r.all_devices()}
            held = [i for i in device_ids if i in holding]
            skipped = [i for i in device_ids if i not in holding]
            if skipped:
                log.info("[%s] Deallocate: %s already released", self.resource_name, id_list(skipped))
            if not held:
                return
            retry = any(r.deallocate_begun or r.adopted is not None for r in records)
            now = time.time()
            for record in records:
                self.ledger.deallocate_begun(record.id, kep_at=now)
            self.guard.sync_withheld()
            await self.ledger.save()
            try:
                if self.driver.capabilities.deallocate:
                    await self.releaser.deallocate(held, retry)
            except DriverError as exc:
                self.guard.keep_if_hung(exc, held)
                for record in records:
                    self.ledger.release_abandoned(record.id)
                self.guard.sync_withheld()
                await self.ledger.save()
                raise
            emptied = self.ledger.drop_devices(held)
            for record in records:
                if self.ledger.get(record.id) is not None:
                    self.ledger.release_abandoned(record.id, deallocate_done=True)
            self.guard.sync_withheld()
            await self.ledger.save()
            for record in emptied:
                self.releaser.finished(record, tuple(held), "KEP Deallocate", start, retry)
