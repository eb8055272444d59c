"""The core's interface to front ends: one resource's device lifecycle, free of wire protocols.

A front end (the device-plugin API, DRA) turns its protocol's calls into
these; it may call nothing else of the core's lifecycle. What it is told comes
back as return values and exceptions: :class:`~devplug.errors.RequestError`
(a bad request, nothing done), :class:`~devplug.errors.DeviceBusyError` (a
device a hook may not touch now), :class:`~devplug.errors.DriverError` and
:class:`~devplug.errors.HookTimeoutError` (the driver failed; rolled back),
:class:`~devplug.errors.StateWriteError` (the ledger cannot be written; nothing
done). Device changes reach front ends through the device table
(:class:`~devplug.engine.devicetable.DeviceTable`), which they subscribe to.

* admission (:mod:`devplug.engine.admission`): :meth:`DeviceLifecycle.preferred`,
  :meth:`DeviceLifecycle.allocate`, :meth:`DeviceLifecycle.pre_start`;
* release (:mod:`devplug.engine.release`): :meth:`DeviceLifecycle.release` of a
  tenancy the front end found over (one whose containers may still run goes to
  the resource's :class:`~devplug.engine.releasequeue.ReleaseQueue`, which
  waits for their exit under the liveness rules);
* tenancies: the ledger's records, read (:meth:`DeviceLifecycle.records`) and
  annotated with what the front end learns (:meth:`DeviceLifecycle.note_seen`,
  :meth:`DeviceLifecycle.note_pod_uid`, :meth:`DeviceLifecycle.adopt`);
* the KEP's device-level release calls (:meth:`DeviceLifecycle.post_stop_devices`,
  :meth:`DeviceLifecycle.deallocate_devices`, :mod:`devplug.engine.keprelease`);
* what no hook may touch now (:meth:`DeviceLifecycle.busy_devices`), and the
  release failures and recent releases, for the status.

A front end gives the core its :class:`~devplug.engine.admission.TenancyJudge`:
whether an admission of held devices reuses their tenancy.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence

from devplug.config import ReleaseConfig
from devplug.drivers import DriverCapabilities
from devplug.engine.admission import Admission, DraClaim, TenancyJudge
from devplug.engine.cdi import AllocationAnswers
from devplug.engine.choice import DeviceChoice
from devplug.engine.devicetable import DeviceTable
from devplug.engine.driver import AsyncDriver
from devplug.engine.guard import DeviceGuard
from devplug.engine.keprelease import KepRelease
from devplug.engine.ledger import AllocationRecord, Ledger
from devplug.engine.observer import NULL_OBSERVER, ResourceObserver
from devplug.engine.partitions import ParentUsage
from devplug.engine.release import Release, ReleaseFailure, Releaser
from devplug.engine.requestcheck import RequestChecks
from devplug.engine.sharing import DeviceShare
from devplug.engine.tenantexit import ExitEvidence
from devplug.types import ContainerAllocation

__all__ = ["DeviceLifecycle", "Release", "ReleaseFailure"]


class DeviceLifecycle:
    """One resource's lifecycle, as front ends drive it."""

    def __init__(
        self,
        resource_name: str,
        table: DeviceTable,
        driver: AsyncDriver,
        ledger: Ledger,
        judge: TenancyJudge,
        *,
        exits: ExitEvidence,
        answers: AllocationAnswers | None = None,
        observer: ResourceObserver = NULL_OBSERVER,
        previous_tenant_wait: float = ReleaseConfig.previous_tenant_wait,
        fail_requests_greater_than_one: bool = False,
        on_allocated: Callable[[], None] = lambda: None,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.resource_name = resource_name
        self.table = table
        self.ledger = ledger
        #: Whether a tenancy's containers are gone (the release queue waits on it).
        self.exits = exits
        #: Where the resource's events are counted (a front end counts its own there too).
        self.observer = observer
        self._driver = driver
        self.guard = DeviceGuard(
            resource_name, table, ledger, driver.runner, on_change=on_change, on_freed=on_allocated
        )
        self.checks = RequestChecks(resource_name, table, ledger)
        self.releaser = Releaser(resource_name, table, ledger, driver, self.guard, observer, on_change)
        self.choice = DeviceChoice(
            resource_name, table, driver, self.guard.sharing, self.checks, fitting=self.guard.parts.fitting
        )
        self.admission = Admission(
            resource_name,
            table,
            ledger,
            driver,
            self.guard,
            self.releaser,
            self.checks,
            answers or AllocationAnswers(resource_name, table, driver, None),
            judge,
            exits,
            previous_tenant_wait=previous_tenant_wait,
            fail_requests_greater_than_one=fail_requests_greater_than_one,
            on_allocated=on_allocated,
            observer=observer,
        )
        self.kep = KepRelease(resource_name, ledger, driver, self.guard, self.releaser, self.checks)

    @property
    def capabilities(self) -> DriverCapabilities:
        """Which hooks the driver implements (a front end derives what it offers from them)."""
        return self._driver.capabilities

    # --- admission

    async def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        """The devices the driver prefers for one container (see :meth:`DeviceChoice.preferred`)."""
        return await self.choice.preferred(available, must_include, size)

    async def allocate(
        self, containers: Sequence[Sequence[str]], claim: DraClaim | None = None
    ) -> list[ContainerAllocation]:
        """Allocate devices to every container of one request (or to one DRA claim), all or nothing (see
        :meth:`Admission.allocate`)."""
        return await self.admission.allocate(containers, claim)

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        """The driver's ``pre_start`` for allocated, healthy devices (see :meth:`Admission.pre_start`)."""
        await self.admission.pre_start(device_ids)

    def reached_container(self, record: AllocationRecord) -> bool | None:
        """Whether a container got the record's devices, as far as the kubelet's PreStartContainer calls tell
        (see :meth:`Admission.reached_container`)."""
        return self.admission.reached_container(record)

    def cut_waits_short(self, on: bool) -> None:
        """A handover began (``on``) or failed: Allocates waiting for a previous tenant are refused at once, and new
        ones do not wait, until it is turned off (see :meth:`Admission.cut_waits_short`)."""
        self.admission.cut_waits_short(on)

    def set_previous_tenant_wait(self, seconds: float) -> None:
        """How long an admission waits for the previous tenant's containers to exit (a reload changed it)."""
        self.admission.previous_tenant_wait = seconds

    # --- tenancies

    def records(self) -> Iterator[AllocationRecord]:
        """Every allocation record now (a copy of the list: the ledger may change while it is walked)."""
        return iter(self.ledger)

    def record(self, record_id: str) -> AllocationRecord | None:
        """The record of ``record_id`` as it is now; None once released."""
        return self.ledger.get(record_id)

    def for_claim(self, claim_uid: str) -> AllocationRecord | None:
        """The record of the DRA claim ``claim_uid``'s tenancy, or None (never prepared, or released)."""
        return self.ledger.for_claim(claim_uid)

    def note_claim_pods(self, record_id: str, pod_uids: Iterable[str]) -> AllocationRecord:
        """The pods a DRA claim is reserved for now (each is waited for before its release)."""
        return self.ledger.set_claim_pods(record_id, pod_uids)

    def held_devices(self) -> set[str]:
        """Every device some record holds."""
        return self.ledger.held_devices()

    def in_admission(self, record_id: str) -> bool:
        """True while an admission fills the record (or a hook of one that timed out still runs on it)."""
        return record_id in self.guard.allocating

    def note_seen(self, record_id: str, pod: str, now: float) -> AllocationRecord:
        """The front end saw ``pod`` use the record's devices (at ``now``): see :meth:`Ledger.note_seen`."""
        return self.ledger.note_seen(record_id, pod, now)

    def note_pod_uid(self, record_id: str, pod_uid: str) -> AllocationRecord:
        """The front end learnt the UID of the pod holding the record's devices (it names the pod's cgroup)."""
        return self.ledger.set_pod_uid(record_id, pod_uid)

    def adopt(
        self, devices: Iterable[str], now: float, source: str, *, pod: str | None = None, pod_uid: str | None = None
    ) -> AllocationRecord | None:
        """Take into the ledger devices a pod holds that no record has (see :meth:`Ledger.adopt`); adopted parts
        count against their parent's counters at once."""
        record = self.ledger.adopt(devices, now, source, pod=pod, pod_uid=pod_uid)
        if record is not None and self.table.partitions is not None:
            self.guard.sync_withheld()
        return record

    async def save(self) -> None:
        """Write what the front end noted (:meth:`note_seen`, :meth:`note_pod_uid`, :meth:`adopt`) to the ledger."""
        await self.ledger.save()

    # --- release

    async def release(self, record_id: str, reason: str, evidence: str | None = None) -> None:
        """Release one tenancy: post-stop, then deallocate (see :meth:`Releaser.release`)."""
        await self.releaser.release(record_id, reason, evidence)

    async def post_stop_devices(self, device_ids: Sequence[str]) -> None:
        """The KEP's PostStopContainer for ``device_ids`` (see :meth:`KepRelease.post_stop`)."""
        await self.kep.post_stop(device_ids)

    async def deallocate_devices(self, device_ids: Sequence[str]) -> None:
        """The KEP's Deallocate of ``device_ids`` (see :meth:`KepRelease.deallocate`)."""
        await self.kep.deallocate(device_ids)

    @property
    def release_failures(self) -> dict[str, ReleaseFailure]:
        """Each failing release's last failure (by record ID), until it succeeds."""
        return self.releaser.failures

    @property
    def failures_version(self) -> int:
        """Counts changes of :attr:`release_failures`."""
        return self.releaser.failures_version

    @property
    def recent_releases(self) -> deque[Release]:
        """The last releases, newest last."""
        return self.releaser.recent

    # --- devices

    def busy_tenancies(self) -> list[tuple[AllocationRecord, str]]:
        """The tenancies the kubelet no longer attributes whose containers may still run, their devices withheld,
        with why (see :meth:`DeviceGuard.withhold_busy`)."""
        return self.guard.busy_tenancies()

    def busy_devices(self, device_ids: Iterable[str] | None = None) -> dict[str, str]:
        """Devices (of ``device_ids``, or all) that no hook may touch now, and why."""
        return self.guard.busy_devices(device_ids)

    def withheld_changed(self) -> None:
        """What is withheld changed outside the lifecycle (a load, quarantined records cleared): advertise it."""
        self.guard.sync_withheld()

    def partition_usage(self) -> list[ParentUsage]:
        """Every parent of partitioned devices: counters, amounts in use, held and blocked parts (empty: none)."""
        return self.guard.parts.usage()

    def shared_usage(self) -> list[DeviceShare]:
        """Every shared physical device: replicas, replicas in use, tenants, pods (for status and metrics)."""
        return self.guard.sharing.usage()
