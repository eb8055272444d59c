"""The sriov driver: VFs created from config, pooled, handed to pods, and reset or restored on release.

Per resource, ``start`` finishes what a crash interrupted, sets the PFs up
(:mod:`devplug_sriov.setup`), and advertises the pooled VFs by PCI address
with their NUMA node. ``allocate`` gives ``PCIDEVICE_<RESOURCE>`` (the SR-IOV
CNI convention) and, in ``vfio-pci`` mode, binds each VF to vfio-pci
(:mod:`devplug.kit.pci`, shared with devplug-vfio) and hands out its
``/dev/vfio`` nodes; RDMA verbs devices go along when the VF has them.
``deallocate`` resets a kernel-mode VF through netlink on its PF
(:mod:`devplug_sriov.reset`: each setting on its own, then read back and
checked) or gives a vfio-bound VF back to its own driver. Every step is
recorded first (:mod:`devplug_sriov.state`, on the kit's record store). The
kit's rescan loop looks at the pool again every ``rescan_interval`` seconds
and retries failed resets, each VF with capped backoff
(:class:`devplug.kit.DeviceRetries`: one rescan period after its first
failure, doubling after each further one, whoever made the attempt, up to a
minute), so a reset the kernel keeps refusing is not sent again on every
rescan. A VF whose reset or restore failed stays out of service, unhealthy
with the reason (``devplug status`` shows it on the device and under
``reset_failures`` in the driver status) until a retry succeeds.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import ClassVar

from devplug import ContainerAllocation, Device, DeviceSpec, DriverContext, DriverError, Health, Topology, hookimpl
from devplug.host.sysfs import HostSysfs, SysfsAccess
from devplug.kit import DeviceLocks, DeviceRetries, DriverRuntime, RecordTable
from devplug.kit.pci import VFIO_PCI, PciBus
from devplug.kit.rescan import RESCAN_RETRY_MIN
from devplug_sriov.netlink import LINK_STATES, NetlinkVfLinks, VfLinks, VfSettings
from devplug_sriov.options import SriovOptions
from devplug_sriov.selection import resolve_pfs, selects_vf
from devplug_sriov.setup import apply, plan_setup
from devplug_sriov.sriov import PhysFn, SriovBus, VirtFn
from devplug_sriov.state import Phase, VfRecord, open_records
from devplug_sriov.status import vf_status

__all__ = ["SriovDriver", "env_name"]

#: PCI base class of network controllers (``include/linux/pci_ids.h``, ``PCI_BASE_CLASS_NETWORK``).
_NETWORK_CLASS = 0x02


def env_name(resource_name: str) -> str:
    """``PCIDEVICE_<RESOURCE>``: upper case, ``.``, ``/`` and ``-`` as ``_`` (the SR-IOV CNI's variable)."""
    return "PCIDEVICE_" + re.sub(r"[./-]", "_", resource_name.upper())


class _Allocated:
    """VFs held by pods, per sysfs root, across every sriov resource of this process.

    The set-up of one resource must not remove VFs another resource (sharing
    the PF) has handed to pods.
    """

    _held: ClassVar[dict[tuple[str, str], set[str]]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def publish(cls, root: str, resource: str, addresses: set[str]) -> None:
        with cls._lock:
            cls._held[(root, resource)] = set(addresses)

    @classmethod
    def withdraw(cls, root: str, resource: str) -> None:
        with cls._lock:
            cls._held.pop((root, resource), None)

    @classmethod
    def on(cls, root: str) -> set[str]:
        with cls._lock:
            return {a for (r, _), held in cls._held.items() if r == root for a in held}


class SriovDriver:
    """devplug's sriov driver (entry point ``sriov``); one instance per resource.

    ``access`` replaces the host's sysfs (tests pass
    the test kit's ``devplug.testing.pcisysfs.PciSysfsModel``), ``links`` the netlink
    side (tests pass :class:`devplug_sriov.vfmodel.VfLinkModel`), ``clock``
    the clock of the retries' backoff (``time.monotonic``; tests pass
    the test kit's ``devplug.testing.clock.ManualClock``).
    """

    #: The hook contract this driver was written against (see devplug.contract); the core refuses a mismatch.
    hook_contract: ClassVar[str] = "1.1"

    Options: ClassVar[type[SriovOptions]] = SriovOptions

    @classmethod
    def check_resources(cls, options_by_resource: Mapping[str, SriovOptions]) -> None:
        """Refuse selectors that name no PF, two resources claiming one VF, or disagreeing PF set-ups.

        Reads sysfs, changes nothing. Where there is no sysfs to read, only
        what the options show alone is checked (``start`` checks the rest).
        """
        from devplug_sriov.check import check_resources

        check_resources(options_by_resource)

    def __init__(
        self,
        options: SriovOptions,
        *,
        access: SysfsAccess | None = None,
        links: VfLinks | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.options = options
        self.access: SysfsAccess = access or HostSysfs(options.sysfs_root, options.dev_root)
        self.bus = PciBus(self.access)
        self.sriov = SriovBus(self.bus)
        self.links: VfLinks = links or NetlinkVfLinks(options.netns)
        self.settings = VfSettings(
            spoofchk=options.spoofchk, trust=options.trust, link_state=LINK_STATES[options.link_state]
        )
        self._lock = threading.RLock()
        self.runtime = DriverRuntime(self._retried, rescan_interval=options.rescan_interval, name="sriov")
        self._records: RecordTable[VfRecord] | None = None
        self._pool: dict[str, VirtFn] = {}
        self._pfs: dict[str, PhysFn] = {}
        #: The VFs being released (by a hook, or the rescan loop's retry of a failed reset).
        self._busy = DeviceLocks()
        #: When the rescan loop may retry each VF whose release failed (every failed attempt counts).
        self.retries = DeviceRetries(retry_min=max(options.rescan_interval, RESCAN_RETRY_MIN), clock=clock)
        self._published: dict[str, str] | None = None

    # --- lifecycle --------------------------------------------------------------

    @hookimpl
    def start(self, ctx: DriverContext) -> None:
        """Finish interrupted releases, set the PFs up, take the pool, load the netlink library when the pool's PFs
        are network ones, watch for VFs vanishing or appearing."""
        with self._lock:
            self.runtime.start(ctx)
            self._records = open_records(ctx.state_dir)
            self._publish_allocated()
            if self.options.vf_driver == "vfio-pci":
                self._check_vfio()
            self._finish_interrupted()
            held = _Allocated.on(os.path.realpath(self.bus.sys))
            writes = plan_setup(self.sriov, self.options, held, ctx.resource_name)
            for write in writes:
                ctx.log.info("set-up: %s", write.describe(self.bus.sys))
            apply(self.sriov, writes)
            self.runtime.advertised.set(self._scan(), push=False)
            network = any((pf := self._pfs.get(vf.pf)) is not None and pf.netdev for vf in self._pool.values())
        if network:  # resets go through netlink: its library is loaded now, not by the first release
            self.links.prepare()
        self.runtime.start_rescans()

    @hookimpl
    def stop(self) -> None:
        """Stop watching; VFs stay as they are (pods may hold them)."""
        served = self.runtime.stop()
        if served:
            _Allocated.withdraw(os.path.realpath(self.bus.sys), served)

    def _check_vfio(self) -> None:
        if not self.access.is_dir(self.bus.drivers_dir / VFIO_PCI):
            raise DriverError(
                f"vf_driver = 'vfio-pci' but vfio-pci is not available ({self.bus.drivers_dir / VFIO_PCI} is "
                "missing): modprobe vfio-pci"
            )
        if not self.bus.iommu_groups():
            raise DriverError(
                f"vf_driver = 'vfio-pci' but there are no IOMMU groups under {self.bus.groups_dir}: boot with "
                "intel_iommu=on (Intel) or amd_iommu=on (AMD)"
            )

    @property
    def records(self) -> RecordTable[VfRecord]:
        """The VFs this resource acted on (the state file's records), by address."""
        assert self._records is not None, "start was not called"
        return self._records

    def _recorded(self) -> None:
        """After a change of the records: tell the other resources which VFs are held, and the operator why any
        is out of service."""
        with self._lock:
            self._publish_allocated()
            self._publish_failures()

    def _publish_failures(self) -> None:
        """``reset_failures`` in ``devplug status``: each VF out of service and why (when that changed)."""
        failures = {a: r.reason for a, r in sorted(self.records.items()) if r.reason}
        if failures != self._published:
            self.runtime.ctx.publish_status({"reset_failures": failures})
            self._published = failures

    def _publish_allocated(self) -> None:
        _Allocated.publish(os.path.realpath(self.bus.sys), self.runtime.ctx.resource_name, set(self.records))

    def _finish_interrupted(self) -> None:
        """Releases a crash (or a failed reset) left half done are finished now; a half-done bind waits."""
        pending = [a for a, r in self.records.items() if r.phase in ("restoring", "resetting")]
        if not pending:
            return
        self.runtime.log.info("finishing the interrupted release of %s", ", ".join(pending))
        try:
            self._release(pending)
        except DriverError as exc:
            self.runtime.log.error("could not finish releasing: %s", exc)

    # --- devices ----------------------------------------------------------------

    def _scan(self) -> list[Device]:
        """Read the PFs and the pool; devices seen before that vanished stay, unhealthy."""
        present = self.sriov.physfns()
        set_up, _ = resolve_pfs(self.options, present)
        pool: dict[str, VirtFn] = {}
        for pf in present.values():
            for vf in self.sriov.virtfns(pf):
                record = self.records.get(vf.address)
                own = record.original_driver if record is not None else vf.dev.driver
                if selects_vf(self.options, vf, pf, own, set_up):
                    pool[vf.address] = vf
        self._pool, self._pfs = pool, present
        out: dict[str, Device] = {}
        for address, vf in pool.items():
            topology = Topology((vf.dev.numa_node,)) if vf.dev.numa_node >= 0 else Topology()
            health, reason = self._health_and_reason(address)
            out[address] = Device(address, health, topology, reason=reason)
        for address, old in self.runtime.advertised.devices.items():
            if address not in out:
                # vanished: a VF count changed behind our back, or its PF was removed
                out[address] = replace(old, health=Health.UNHEALTHY, reason="the VF vanished")
        return [out[a] for a in sorted(out)]

    def _health(self, address: str) -> Health:
        return self._health_and_reason(address)[0]

    def _health_and_reason(self, address: str) -> tuple[Health, str]:
        vf = self._pool.get(address)
        if vf is None or not self.bus.exists(address):
            return Health.UNHEALTHY, "the VF vanished"
        record = self.records.get(address)
        if record is not None and record.phase in ("resetting", "restoring") and record.reason:
            return Health.UNHEALTHY, record.reason  # its last reset or restore failed: out of service
        if record is not None and record.phase == "resetting":
            return Health.UNHEALTHY, "its reset has not finished"
        if record is not None and record.phase == "bound" and self.bus.driver(address) != VFIO_PCI:
            return Health.UNHEALTHY, "another driver took it from vfio-pci while a pod holds it"
        if self.options.pf_link_health:
            pf = self._pfs.get(vf.pf)
            if pf is None or pf.netdev is None:
                return Health.UNHEALTHY, f"its PF {vf.pf} has no network interface"
            try:
                if not self.links.link_up(pf.netdev):
                    return Health.UNHEALTHY, f"its PF's link ({pf.netdev}) is down"
            except DriverError as exc:
                return Health.UNHEALTHY, f"its PF's link cannot be read: {exc}"
        return Health.HEALTHY, ""

    def refresh(self, push: bool = True) -> list[Device]:
        """Retry failed resets, rescan; push the list when it changed (what the rescan loop does)."""
        return self.runtime.refresh(push)

    def _retried(self) -> list[Device]:
        """Retry the failed resets that are due (of VFs no hook is releasing now); the VFs as they are then.

        Only the VFs retried are held, and no driver-wide lock while they are reset: a hook releasing another VF
        meanwhile waits for nothing of theirs."""
        failed = [a for a, r in self.records.items() if r.phase == "resetting"]
        self.retries.forget(keep=failed)
        with self._busy.hold_free(self.retries.due(failed)) as free:
            try:
                self._release(free)
            except DriverError as exc:
                self.runtime.log.debug("reset still failing: %s", exc)
        with self._lock:
            return self._scan()

    def _rescan(self) -> None:
        """Scan; push the list when it changed (health or reason)."""
        with self._lock:
            self.runtime.advertised.set(self._scan())

    @hookimpl
    def list_devices(self) -> Sequence[Device]:
        """The pooled VFs, by PCI address, with their NUMA node (failed resets retried first)."""
        return self.runtime.refresh(push=False)

    @hookimpl
    def check_health(self, devices: Sequence[Device]) -> Mapping[str, Health] | None:
        """Unhealthy: vanished, reset failed, taken from vfio-pci while held, or (optionally) its PF's link down."""
        with self._lock:
            self._scan()
            return {d.id: health for d in devices if (health := self._health(d.id)) is not d.health}

    # --- allocation --------------------------------------------------------------

    @hookimpl
    def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation | None:
        """``PCIDEVICE_<RESOURCE>``; vfio-pci mode binds the VFs and hands out their groups; RDMA devices.

        With ``device_status``, each VF's :func:`devplug_sriov.status.vf_status` (its PCI address, PF, interface
        and MAC) for the DRA claim's status."""
        with self._lock:
            vfs = []
            for address in device_ids:
                vf = self._pool.get(address)
                if vf is None or not self.bus.exists(address):
                    raise DriverError(f"{address}: not a VF of this resource any more (it vanished)")
                vfs.append(vf)
            phase: Phase = "binding" if self.options.vf_driver == "vfio-pci" else "allocated"
            records = self.records
            fresh = {}
            for vf in vfs:
                old = records.get(vf.address)
                original = old.original_driver if old is not None else vf.dev.driver
                fresh[vf.address] = VfRecord(vf.pf, vf.index, original, phase)
            records.update(fresh)
            self._recorded()
            specs: list[DeviceSpec] = []
            if self.options.vf_driver == "vfio-pci":
                try:
                    specs = self._bind(vfs)
                except DriverError:
                    self._undo([vf.address for vf in vfs])
                    raise
            specs += self._rdma_specs(vfs)
            statuses = {}
            if self.options.device_status:  # contract 1.1: the claim's status.devices shows each VF
                statuses = {
                    vf.address: vf_status(
                        self.sriov, self.links, vf, self._pfs.get(vf.pf), self.sriov.netdev(vf.address)
                    )
                    for vf in vfs
                }
            return ContainerAllocation(
                envs={env_name(self.runtime.ctx.resource_name): ",".join(device_ids)},
                devices=tuple(specs),
                device_status=statuses,
            )

    def _bind(self, vfs: Sequence[VirtFn]) -> list[DeviceSpec]:
        groups = []
        for vf in vfs:
            self.bus.bind_vfio(vf.address)
            dev = self.bus.read(vf.address)
            if dev is None or dev.iommu_group is None or not self.access.exists(self.bus.vfio_node(dev.iommu_group)):
                raise DriverError(f"{vf.address}: bound to vfio-pci but its /dev/vfio group node did not appear")
            groups.append(dev.iommu_group)
        self.records.update({vf.address: replace(self.records[vf.address], phase="bound") for vf in vfs})
        self._recorded()
        # Host paths: dev_root is only where this daemon sees the host's /dev.
        specs = [DeviceSpec("/dev/vfio/vfio", "/dev/vfio/vfio", "rw")]
        return specs + [DeviceSpec(f"/dev/vfio/{g}", f"/dev/vfio/{g}", "rw") for g in sorted(set(groups))]

    def _rdma_specs(self, vfs: Sequence[VirtFn]) -> list[DeviceSpec]:
        names = [n for vf in vfs for n in self.sriov.verbs(vf.address)]
        if not names:
            return []
        specs = [DeviceSpec(f"/dev/infiniband/{n}", f"/dev/infiniband/{n}", "rw") for n in names]
        if self.access.exists(self.bus.access.dev_root / "infiniband" / "rdma_cm"):
            specs.append(DeviceSpec("/dev/infiniband/rdma_cm", "/dev/infiniband/rdma_cm", "rw"))
        return specs

    def _undo(self, addresses: Sequence[str]) -> None:
        try:
            self._release(addresses)
        except DriverError as exc:
            self.runtime.log.error("could not undo the failed allocation: %s", exc)

    @hookimpl
    def deallocate(self, device_ids: Sequence[str], retry: bool = False) -> None:
        """Reset each network VF through netlink, or give a vfio-bound VF back to its driver.

        At least once: with ``retry`` (after a crash) a VF already released
        has no record and is skipped; one whose reset fails stays unhealthy,
        and the failure (raised) names it and why.
        """
        with self._busy.hold(device_ids):  # the slow restore and reset hold up no other VF's hooks
            try:
                self._release([a for a in device_ids if a in self.records])
            finally:
                self._rescan()  # a VF out of service is advertised so at once, with its reason

    def _release(self, addresses: Sequence[str]) -> None:
        """Give each VF back to its own driver (vfio-pci mode), then reset its settings on a network PF; records
        of those that failed stay for a retry."""
        if not addresses:
            return
        records = self.records
        moved = ("binding", "bound", "restoring")
        records.update(
            {a: replace(records[a], phase="restoring" if records[a].phase in moved else "resetting") for a in addresses}
        )
        self._recorded()
        failures = []
        for address in addresses:
            started = time.monotonic()
            record = records[address]
            if not self.bus.exists(address):
                self.runtime.log.warning("%s vanished before it was released", address)
                records.drop(address)
                continue
            try:
                if record.phase == "restoring":
                    self.bus.restore(address, record.original_driver)
                    # a PF's settings for the VF outlive vfio-pci (a CNI may set them)
                    record = records.replace(address, phase="resetting")
                    self._recorded()
                self._reset(address, record)
            except DriverError as exc:
                wait = self.retries.failed(address)
                if str(exc) != record.reason:
                    self.runtime.log.error("%s: out of service: %s", address, exc, extra={"device": address})
                self.runtime.log.debug(
                    "%s: failed after %.2f s, %d time(s) in a row; retried by the rescan loop in %g s at the earliest",
                    address,
                    time.monotonic() - started,
                    self.retries.failures(address),
                    wait,
                    extra={"device": address},
                )
                records.replace(address, reason=str(exc))
                failures.append(str(exc))
                continue
            self.retries.succeeded(address)
            if record.reason:
                self.runtime.log.info("%s: back in service", address, extra={"device": address})
            records.drop(address)
        self._recorded()
        if failures:
            raise DriverError("; ".join(failures))

    def _reset(self, address: str, record: VfRecord) -> None:
        pf = self.sriov.physfn(record.pf)
        if pf is None:
            raise DriverError(f"{address}: its PF {record.pf} vanished; cannot reset VF {record.index}")
        if pf.netdev is None:
            if pf.dev.class_ >> 16 == _NETWORK_CLASS:
                raise DriverError(
                    f"{address}: its PF {pf.dev.describe()} is a network controller whose interface this daemon "
                    f"cannot see, so VF {record.index}'s MAC, VLAN, spoof checking, trust and link state cannot be "
                    "reset (is the interface in another network namespace? the netns option names it)"
                )
            return  # not a network function (an NVMe PF, say): there are no netlink settings to reset
        self.runtime.log.debug("%s: resetting %s VF %d", address, pf.netdev, record.index, extra={"device": address})
        started = time.monotonic()
        self.links.reset_vf(pf.netdev, record.index, self.settings)
        seconds = time.monotonic() - started
        self.runtime.log.info(
            "%s: reset (%s VF %d, %.2f s)", address, pf.netdev, record.index, seconds, extra={"device": address}
        )
