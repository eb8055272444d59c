"""The vfio driver: PCI devices handed to containers through vfio-pci, and given back.

Per resource, the driver selects PCI devices (:mod:`devplug_vfio.options`),
groups them by IOMMU group (:mod:`devplug_vfio.selection`) and advertises the
members of every usable group, by PCI address. In ``on-allocate`` mode a free
device stays on its own driver; ``allocate`` moves its whole group to
vfio-pci and ``deallocate`` gives each device back to the driver it had
(:mod:`devplug.kit.pci`). In ``at-start`` mode the groups move at ``start``
and stay. Each move is recorded before sysfs is touched
(:mod:`devplug_vfio.state`, on the kit's record store), so a crash part-way is
finished on restart. The kit's rescan loop looks for hot-plugged and removed
devices every ``rescan_interval`` seconds.

A container gets ``/dev/vfio/vfio`` and ``/dev/vfio/<group>`` (rw), and
``PCI_RESOURCE_<RESOURCE>`` with its comma-separated addresses, the variable
KubeVirt reads. A request must hold whole IOMMU groups (a group opens for one
user only); ``preferred_allocation`` offers whole groups.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import ClassVar

from devplug import ContainerAllocation, Device, DeviceSpec, DriverContext, DriverError, Health, Topology, hookimpl
from devplug.host.sysfs import HostSysfs, SysfsAccess
from devplug.kit import DeviceOwners, DriverRuntime, RecordTable
from devplug.kit.pci import VFIO_PCI, PciBus, PciDevice
from devplug_vfio.claims import Claims
from devplug_vfio.options import VfioOptions
from devplug_vfio.selection import GroupPlan, plan_groups, selects
from devplug_vfio.state import STATE, STATE_FILE, DeviceRecord

__all__ = ["VfioDriver", "env_name"]


def env_name(resource_name: str) -> str:
    """``PCI_RESOURCE_<RESOURCE>``: upper case, with ``.``, ``/`` and ``-`` as ``_``."""
    return "PCI_RESOURCE_" + re.sub(r"[./-]", "_", resource_name.upper())


class VfioDriver:
    """devplug's vfio driver (entry point ``vfio``); one instance per resource.

    ``access`` replaces the host's sysfs (tests pass a kernel model such as
    the test kit's ``devplug.testing.pcisysfs.PciSysfsModel``); by default it is
    :class:`devplug.host.sysfs.HostSysfs` on the ``sysfs_root`` and ``dev_root`` options.
    """

    #: The hook contract this driver was written against (see devplug.contract); the core refuses a mismatch.
    hook_contract: ClassVar[str] = "1.1"

    Options: ClassVar[type[VfioOptions]] = VfioOptions

    @classmethod
    def check_resources(cls, options_by_resource: Mapping[str, VfioOptions]) -> None:
        """Refuse two resources that select the same device (called when the config is checked).

        Reads each resource's sysfs as it is now; where there is no sysfs to
        read (checking a config on another machine), ``start`` catches the
        overlap instead.
        """
        owners = DeviceOwners(verb="selected", hint="; narrow one resource's options (exclude_addresses)")
        for resource, options in options_by_resource.items():
            try:
                present = PciBus(HostSysfs(options.sysfs_root, options.dev_root)).scan()
            except OSError:
                continue
            root = os.path.realpath(options.sysfs_root)
            for address, dev in present.items():
                if not selects(options, dev, dev.driver):
                    continue
                owners.take((root, address), resource, dev.describe())

    def __init__(self, options: VfioOptions, *, access: SysfsAccess | None = None) -> None:
        self.options = options
        self.access: SysfsAccess = access or HostSysfs(options.sysfs_root, options.dev_root)
        self.bus = PciBus(self.access)
        self._lock = threading.RLock()
        self.runtime = DriverRuntime(self._current, rescan_interval=options.rescan_interval, name="vfio")
        self._records: RecordTable[DeviceRecord] | None = None
        self._plan = GroupPlan({}, ())
        self._reported: set[str] = set()

    # --- lifecycle --------------------------------------------------------------

    @hookimpl
    def start(self, ctx: DriverContext) -> None:
        """Check the kernel, finish what a crash interrupted, take the devices, watch for hot-plug."""
        with self._lock:
            self.runtime.start(ctx)
            self._check_kernel()
            self._records = self.runtime.records(STATE_FILE, "devices", DeviceRecord, **STATE)
            self._finish_interrupted_releases()
            present, plan = self._view()
            if plan.errors:
                raise DriverError(f"{ctx.resource_name}: " + "; ".join(plan.errors))
            Claims.claim(self.bus.sys, ctx.resource_name, plan.device_group())
            self._plan = plan
            if self.options.bind == "at-start":
                self._bind_at_start(present, plan, strict=True)
            self.runtime.advertised.set(self._devices(self.bus.scan(), plan), push=False)
        self.runtime.start_rescans()

    @hookimpl
    def stop(self) -> None:
        """Stop watching; devices stay where they are (pods may hold them)."""
        resource = self.runtime.stop()
        if resource is not None:  # other resources may take its devices now
            Claims.release(self.bus.sys, resource)

    def _check_kernel(self) -> None:
        sys_root = self.bus.sys
        if not self.bus.iommu_groups():
            raise DriverError(
                f"no IOMMU groups under {self.bus.groups_dir}: the IOMMU is off; boot with intel_iommu=on "
                "(Intel) or amd_iommu=on (AMD) and enable VT-d/AMD-Vi in the firmware"
            )
        if not self.access.is_dir(self.bus.drivers_dir / VFIO_PCI):
            raise DriverError(
                f"vfio-pci is not available ({self.bus.drivers_dir / VFIO_PCI} is missing): modprobe vfio-pci"
            )
        if not self.access.exists(self.bus.vfio_dir / "vfio"):
            raise DriverError(f"{self.bus.vfio_dir / 'vfio'} is missing: is vfio loaded, and /dev mounted there?")
        if not self.access.writable(self.bus.probe_file):
            raise DriverError(
                f"{self.bus.probe_file} is not writable: sysfs under {sys_root} is read-only here "
                "(run privileged, with the host's /sys mounted read-write)"
            )

    def _finish_interrupted_releases(self) -> None:
        """A release that a crash interrupted is completed now; a half-done bind waits for ``deallocate``."""
        pending = [a for a, r in self.records.items() if r.phase == "restoring"]
        if pending:
            self.runtime.log.info("finishing the interrupted release of %s", ", ".join(pending))
            try:
                self._release(pending)
            except DriverError as exc:
                self.runtime.log.error("could not finish releasing: %s", exc)

    # --- devices ----------------------------------------------------------------

    @property
    def records(self) -> RecordTable[DeviceRecord]:
        """The devices this resource moved (the state file's records), by address."""
        assert self._records is not None, "start was not called"
        return self._records

    def _view(self) -> tuple[dict[str, PciDevice], GroupPlan]:
        present = self.bus.scan()
        selected = {}
        for address, dev in present.items():
            record = self.records.get(address)
            own = record.original_driver if record is not None else dev.driver
            if selects(self.options, dev, own):
                selected[address] = dev
        plan = plan_groups(selected, present, self.bus.group_members, self.options.allow_partial_groups)
        return present, plan

    def _health(self, address: str, present: Mapping[str, PciDevice]) -> Health:
        dev = present.get(address)
        if dev is None:
            return Health.UNHEALTHY  # vanished
        record = self.records.get(address)
        held = record is not None and record.phase == "bound" and (record.allocated or self.options.bind == "at-start")
        if held:
            if dev.driver != VFIO_PCI:
                return Health.UNHEALTHY  # another driver took it
            if dev.iommu_group is None or not self.access.exists(self.bus.vfio_node(dev.iommu_group)):
                return Health.UNHEALTHY  # its group's device node is gone
        return Health.HEALTHY

    def _devices(self, present: Mapping[str, PciDevice], plan: GroupPlan) -> list[Device]:
        """Members of usable groups, plus devices seen before that vanished (unhealthy)."""
        out: dict[str, Device] = {}
        for address in sorted(plan.device_group()):
            node = present[address].numa_node
            topology = Topology((node,)) if node >= 0 else Topology()
            out[address] = Device(address, self._health(address, present), topology)
        for address, old in self.runtime.advertised.devices.items():
            if address not in out and (address not in present or address in self.records):
                out[address] = old.with_health(Health.UNHEALTHY)
        return [out[a] for a in sorted(out)]

    def _bind_at_start(self, present: Mapping[str, PciDevice], plan: GroupPlan, strict: bool) -> None:
        for group in plan.groups.values():
            records = self.records
            done = all(
                present[m].driver == VFIO_PCI and m in records and records[m].phase == "bound" for m in group.members
            )
            if done:
                continue
            self._begin_bind(group.number, group.members, present, allocated=False)
            try:
                self._bind(group.number, group.members)
            except DriverError as exc:
                if strict:
                    raise
                self.runtime.log.error("%s", exc)

    def refresh(self, push: bool = True) -> list[Device]:
        """Scan sysfs for hot-plugged and removed devices; push the list when it changed."""
        return self.runtime.refresh(push)

    def _current(self) -> list[Device]:
        """The devices as sysfs shows them now (groups claimed, and in ``at-start`` mode bound, as they come)."""
        with self._lock:
            present, plan = self._view()
            for error in plan.errors:
                if error not in self._reported:
                    self._reported.add(error)
                    self.runtime.log.error("%s", error)
            resource = self.runtime.ctx.resource_name
            usable = {}
            for number, group in plan.groups.items():
                try:
                    Claims.claim(self.bus.sys, resource, group.members)
                except DriverError as exc:
                    if str(exc) not in self._reported:
                        self._reported.add(str(exc))
                        self.runtime.log.error("%s", exc)
                    continue
                usable[number] = group
            plan = GroupPlan(usable, plan.errors)
            self._plan = plan
            if self.options.bind == "at-start":
                self._bind_at_start(present, plan, strict=False)
                present = self.bus.scan()
            return self._devices(present, plan)

    @hookimpl
    def list_devices(self) -> Sequence[Device]:
        """The members of every usable IOMMU group, by PCI address, with NUMA topology."""
        return self.refresh(push=False)

    @hookimpl
    def check_health(self, devices: Sequence[Device]) -> Mapping[str, Health] | None:
        """Unhealthy: vanished, taken by another driver while held, or its /dev/vfio/<group> missing."""
        with self._lock:
            present = self.bus.scan()
            return {dev.id: self._health(dev.id, present) for dev in devices}  # the engine keeps the changes

    # --- allocation --------------------------------------------------------------

    @hookimpl
    def preferred_allocation(
        self, available: Sequence[Device], must_include: Sequence[str], size: int
    ) -> Sequence[str] | None:
        """Whole IOMMU groups: the must-include devices' groups first, then groups on their NUMA nodes."""
        with self._lock:
            groups = self._plan.groups
            device_group = self._plan.device_group()
        offered = {d.id for d in available}
        complete = [g for g in groups.values() if all(m in offered for m in g.members)]
        numa = {d.id: d.topology.numa_nodes for d in available}
        must_groups = {device_group[a] for a in must_include if a in device_group}
        chosen: list[str] = [m for g in sorted(must_groups) for m in groups[g].members]
        used = {n for a in chosen for n in numa.get(a, ())}

        def rank(group_members: tuple[str, ...]) -> tuple[int, int, str]:
            nodes = {n for a in group_members for n in numa.get(a, ())}
            return (0 if nodes & used or not used else 1, len(group_members), group_members[0])

        for group in sorted((g.members for g in complete if g.number not in must_groups), key=rank):
            if len(chosen) + len(group) <= size:
                chosen.extend(group)
        return chosen

    def _groups_of(self, device_ids: Sequence[str]) -> list[int]:
        device_group = self._plan.device_group()
        unknown = [a for a in device_ids if a not in device_group]
        if unknown:
            raise DriverError(f"{', '.join(unknown)}: not a device of this resource (gone, or its group refused)")
        numbers = sorted({device_group[a] for a in device_ids})
        for number in numbers:
            missing = [m for m in self._plan.groups[number].members if m not in device_ids]
            if missing:
                raise DriverError(
                    f"{', '.join(missing)} share IOMMU group {number} with the requested devices; a group goes "
                    "to one container as a whole: request all of " + ", ".join(self._plan.groups[number].members)
                )
        return numbers

    def _begin_bind(
        self, group: int, members: Sequence[str], present: Mapping[str, PciDevice], allocated: bool
    ) -> None:
        """Record the move of ``members`` to vfio-pci before making it."""
        changes: dict[str, DeviceRecord | None] = {}
        for address in members:
            record = self.records.get(address)
            if record is None:
                changes[address] = DeviceRecord(present[address].driver, group, "binding", allocated)
                continue
            moving = record.phase != "bound" or present[address].driver != VFIO_PCI
            changes[address] = replace(
                record, allocated=record.allocated or allocated, phase="binding" if moving else record.phase
            )
        self.records.update(changes)

    def _bind(self, group: int, members: Sequence[str]) -> None:
        for address in members:
            self.bus.bind_vfio(address)
        node = self.bus.vfio_node(group)
        if not self.access.exists(node):
            raise DriverError(f"IOMMU group {group}: {node} did not appear after binding {', '.join(members)}")
        self.records.update({address: replace(self.records[address], phase="bound") for address in members})

    @hookimpl
    def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation | None:
        """Move the devices' groups to vfio-pci (``on-allocate``) and hand out their vfio nodes."""
        with self._lock:
            numbers = self._groups_of(device_ids)
            present = self.bus.scan()
            for number in numbers:
                members = self._plan.groups[number].members
                gone = [m for m in members if m not in present]
                if gone:
                    raise DriverError(f"{', '.join(gone)}: the device is gone")
                self._begin_bind(number, members, present, allocated=True)
                try:
                    self._bind(number, members)
                except DriverError:
                    self._undo_allocation(numbers)
                    raise
            # Host paths as the container runtime sees them on the host: ``dev_root`` is only where
            # this daemon (perhaps in a container of its own) finds the host's /dev.
            specs = [DeviceSpec("/dev/vfio/vfio", "/dev/vfio/vfio", "rw")]
            specs += [DeviceSpec(f"/dev/vfio/{n}", f"/dev/vfio/{n}", "rw") for n in numbers]
            return ContainerAllocation(
                envs={env_name(self.runtime.ctx.resource_name): ",".join(device_ids)}, devices=tuple(specs)
            )

    def _undo_allocation(self, numbers: Sequence[int]) -> None:
        members = [a for a, r in self.records.items() if r.group in numbers]
        try:
            self._free(members)
        except DriverError as exc:
            self.runtime.log.error("could not undo the failed allocation: %s", exc)

    @hookimpl
    def deallocate(self, device_ids: Sequence[str]) -> None:
        """Give the devices' groups back to their own drivers (``on-allocate``), or just free them.

        The kernel's unbind can take long (it waits for user space to close the device): it runs outside the
        driver's lock, so one slow group never holds up the others' hooks. The engine runs no two hooks on one
        device at once.
        """
        with self._lock:
            records = self.records.snapshot()
            numbers = {records[a].group for a in device_ids if a in records}
            members = [a for a, r in records.items() if r.group in numbers]
            if self.options.bind == "at-start":
                self._free(members)
                return
            originals = self._mark_restoring(members)
        self._restore(originals)

    def _free(self, members: Sequence[str]) -> None:
        if self.options.bind == "at-start":
            self.records.update({address: replace(self.records[address], allocated=False) for address in members})
            return
        self._release(members)

    def _release(self, members: Sequence[str]) -> None:
        """Restore each device's own driver; records of those that failed stay ``restoring``."""
        with self._lock:
            originals = self._mark_restoring(members)
        self._restore(originals)

    def _mark_restoring(self, members: Sequence[str]) -> dict[str, str | None]:
        """Record (with the lock held) that ``members`` are being given back; their original drivers."""
        records = self.records
        records.update({address: replace(records[address], phase="restoring", allocated=False) for address in members})
        return {address: records[address].original_driver for address in members}

    def _restore(self, originals: Mapping[str, str | None]) -> None:
        """Give each device back to its original driver (sysfs writes, without the lock), then drop the records
        of those given back; the failures' records stay ``restoring``."""
        failures = []
        done = []
        for address, original in originals.items():
            if not self.bus.exists(address):
                self.runtime.log.warning("%s vanished before it was given back to its driver", address)
                done.append(address)
                continue
            try:
                self.bus.restore(address, original)
            except DriverError as exc:
                failures.append(str(exc))
                continue
            done.append(address)
        if originals:
            with self._lock:
                self.records.drop(*done)
        if failures:
            raise DriverError("; ".join(failures))
