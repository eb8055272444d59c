"""The devices a resource advertises, their cached wire encoding (a front end's), and change notification.

Three things decide what the kubelet sees for a device: the health the
driver reports, whether the engine withholds the device (it is being released
and the driver still holds it), and whether the whole resource is degraded (a
failing driver). A resource removed from the config by a reload is *retired*: it
advertises an empty list (capacity 0) while its allocations drain. A front end
that sends the whole list on every change (the device-plugin API's
ListAndWatch) gives the table its :class:`DeviceCodec`: each device's entry is
encoded once and cached, a change re-encodes only the devices it touched, and
the list is a join of the cached entries (with 1,000 devices, encoding them all
on each change cost milliseconds per message).

Shared devices. The driver reports physical devices; a device with more than
one replica (the resource's ``replicas``, or the device's own
:attr:`~devplug.types.Device.replicas`) is advertised as that many devices,
``<id>::0`` .. ``<id>::<n-1>``, each with the physical device's health,
topology and allocation data. Every change the driver makes to a device
(health, removal) applies to all of its replicas. A device with one replica is
advertised under its own ID, the same object, so a resource without sharing
costs nothing more. Advertised IDs are what the kubelet, the ledger and the
lifecycle use; :meth:`DeviceTable.physical_of` and
:meth:`DeviceTable.replica_ids` map between the two.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Container, Iterable, KeysView, Mapping
from dataclasses import replace
from typing import NamedTuple, Protocol

from devplug.engine.partitions import PartitionMap
from devplug.types import Device, Health, HealthReport, Partition, replica_id

__all__ = ["DeviceCodec", "DeviceTable", "Offer"]


class DeviceCodec(Protocol):
    """A front end's wire form of the advertised device list."""

    def entry(self, device: Device) -> bytes:
        """One device as the front end sends it (its health as advertised)."""
        ...

    def listing(self, entries: Iterable[bytes]) -> bytes:
        """The whole list from the entries :meth:`entry` made."""
        ...


class _NoCodec:
    """No front end encodes the list: nothing is encoded."""

    def entry(self, device: Device) -> bytes:
        return b""

    def listing(self, entries: Iterable[bytes]) -> bytes:
        raise RuntimeError("this device table has no codec: its front end does not send encoded lists")


class _OfferedIds(Container[str]):
    """Whether an ID is among an offer's devices, without a set of the 1,000 IDs a request offers."""

    __slots__ = ("_known", "_musts", "_unfit")

    def __init__(self, known: Container[str], musts: Container[str], unfit: Container[str] | None) -> None:
        self._known, self._musts, self._unfit = known, musts, unfit

    def __contains__(self, device_id: object) -> bool:
        if device_id not in self._known:
            return False
        return self._unfit is None or device_id in self._musts or device_id not in self._unfit


class Offer(NamedTuple):
    """What :meth:`DeviceTable.offer` found: the devices to choose from, the IDs the table lacks, and a
    container of the offered devices' IDs (to check a driver's choice against)."""

    devices: list[Device]
    unknown: list[str]
    ids: Container[str]


class DeviceTable:
    """One resource's device table. Used from the event loop thread only."""

    def __init__(
        self, replicas: int = 1, codec: DeviceCodec | None = None, on_partitions: Callable[[], None] | None = None
    ) -> None:
        self._codec: DeviceCodec = codec or _NoCodec()
        #: How many replicas a device has when it does not say (the resource's ``replicas``).
        self.default_replicas = replicas
        #: The driver's devices, by their own (physical) ID.
        self._physical: dict[str, Device] = {}
        #: Shared devices now: physical ID -> advertised replica IDs.
        self._replicas: dict[str, tuple[str, ...]] = {}
        #: Every replica ID ever advertised -> its physical ID, and every physical ID -> all its replica IDs
        #: ever advertised: kept when a device goes or shrinks, since allocations may still hold its replicas.
        self._physical_of: dict[str, str] = {}
        self._ever: dict[str, tuple[str, ...]] = {}
        #: Physical devices advertised as fewer replicas than they ever were (or than allocations hold): their
        #: tenants may outnumber their replicas until the excess tenancies end (:meth:`excess_replicas`).
        self._shrunk: set[str] = set()
        self._devices: dict[str, Device] = {}
        #: The advertised IDs whose device the driver reports unhealthy (kept with ``_devices``).
        self._unhealthy: set[str] = set()
        self._entries: dict[str, bytes] = {}
        self._withheld: frozenset[str] = frozenset()
        self._partition_blocked: frozenset[str] = frozenset()
        self._degraded: str | None = None
        self._retired: str | None = None
        self.version = 0
        self._encoded: tuple[int, bytes] = (-1, b"")
        self._waiter: asyncio.Future[None] | None = None
        #: How many ListAndWatch streams are sending this table (kept by the servicer).
        self.watchers = 0
        #: Partitions (contract 1.1): physical ID -> the partition of each listed device that declares one, and the
        #: last one of devices no longer listed (an allocation may still hold them).
        self._parts: dict[str, Partition] = {}
        self._parts_gone: dict[str, Partition] = {}
        #: The parts and their parents' counters (:mod:`devplug.engine.partitions`), or None when no device ever
        #: declared a partition: the flag every hot path tests, so a table without partitions costs nothing more.
        self.partitions: PartitionMap | None = None
        #: Called when :attr:`partitions` changed, the table whole again (the resource has the lifecycle re-sync
        #: what it withholds).
        self._on_partitions = on_partitions

    # --- reading

    def __len__(self) -> int:
        return len(self._devices)

    def __contains__(self, device_id: object) -> bool:
        return device_id in self._devices

    @property
    def ids(self) -> KeysView[str]:
        """The advertised IDs, as a live view (membership tests at C speed, no method call per ID)."""
        return self._devices.keys()

    def reported(self, device_id: str) -> Device | None:
        """The device as the driver reports it, or ``None`` if unknown."""
        return self._devices.get(device_id)

    def advertised(self, device_id: str) -> Device | None:
        """The device as the kubelet sees it (withheld or degraded devices are unhealthy)."""
        dev = self._devices.get(device_id)
        return None if dev is None else self._effective(dev)

    def offer(self, available: Iterable[str], must_include: Iterable[str]) -> Offer:
        """What a GetPreferredAllocation may choose from: the advertised devices of ``must_include`` then
        ``available`` (each once; those of ``available`` only when healthy), and the IDs the table lacks.

        In set operations and C iterators, not a method call per device: a request offers 1,000 devices.
        """
        musts = dict.fromkeys(must_include)
        order = {**musts, **dict.fromkeys(available)}
        devices = self._devices
        if not order.keys() <= devices.keys():
            unknown = [i for i in order if i not in devices]
            order = {i: None for i in order if i in devices}
            musts = {i: None for i in musts if i in devices}
        else:
            unknown = []
        if self._degraded is not None:  # every device advertised unhealthy: only the must-includes stay
            return Offer([self._effective(devices[i]) for i in musts], unknown, _OfferedIds(musts, musts, None))
        unfit = self._unhealthy.union(self._withheld) if self._unhealthy or self._withheld else None
        if not unfit:
            return Offer(list(map(devices.__getitem__, order)), unknown, _OfferedIds(order, musts, None))
        head = [self._effective(devices[i]) if i in unfit else devices[i] for i in musts]
        tail = [devices[i] for i in order if i not in unfit and i not in musts]
        return Offer(head + tail, unknown, _OfferedIds(order, musts, unfit))

    def reported_devices(self) -> list[Device]:
        """Every advertised device (each replica of a shared device) as the driver reports it."""
        return list(self._devices.values())

    def physical_devices(self) -> list[Device]:
        """Every device as the driver listed it (a shared device once)."""
        return list(self._physical.values())

    def physical(self, device_id: str) -> Device | None:
        """The driver's device of this physical ID, or ``None``."""
        return self._physical.get(device_id)

    def advertised_physical(self, dev: Device) -> Device:
        """A physical device as the kubelet sees it: unhealthy while the resource is degraded."""
        if dev.healthy and self._degraded is not None:
            return dev.with_health(Health.UNHEALTHY)
        return dev

    def physical_of(self, device_id: str) -> str:
        """The physical device ID of an advertised ID (itself for a device that is not shared)."""
        return self._physical_of.get(device_id, device_id)

    def physical_id_set(self, device_ids: Iterable[str]) -> set[str]:
        """The physical device IDs of advertised IDs, as a set (the IDs themselves when no replica was ever
        advertised or learnt)."""
        if not self._physical_of:
            return set(device_ids)
        return {self._physical_of.get(i, i) for i in device_ids}

    def names_replicas(self, device_ids: Iterable[str]) -> bool:
        """True when some of ``device_ids`` is the replica ID of a shared device (advertised or learnt)."""
        return bool(self._physical_of) and not self._physical_of.keys().isdisjoint(device_ids)

    def replica_ids(self, device_id: str) -> tuple[str, ...]:
        """The advertised IDs of a physical device (its own ID alone when it is not shared)."""
        return self._replicas.get(device_id, (device_id,))

    def all_replica_ids(self, device_id: str) -> tuple[str, ...]:
        """Every ID a physical device was ever advertised under (allocations may hold any of them)."""
        ever = self._ever.get(device_id)
        return (*ever, device_id) if ever else (device_id,)

    def learn_replica_ids(self, device_ids: Iterable[str]) -> list[str]:
        """Map held IDs of replicas no longer advertised (a device's replica count lowered across a restart)
        back to their device, so their tenancies are released through it and counted as its tenants.

        An ID ``<device>::<k>`` that is not advertised, of a device the driver
        lists, is such a replica (IDs of that form are the core's own).
        Returns the IDs learnt.
        """
        learnt = []
        for dev_id in device_ids:
            if dev_id in self._physical_of or dev_id in self._devices:
                continue
            base, sep, index = dev_id.rpartition("::")
            if sep and index.isascii() and index.isdigit() and base in self._physical:
                self._physical_of[dev_id] = base
                self._ever[base] = (*self._ever.get(base, ()), dev_id)
                self._shrunk.add(base)
                learnt.append(dev_id)
        return learnt

    @property
    def shrunk(self) -> bool:
        """True when some device is advertised as fewer replicas than allocations may hold (its count lowered by a
        reload, a restart or the driver)."""
        return bool(self._shrunk)

    def held_replicas(self, physical_id: str, held: Callable[[str], bool]) -> list[str]:
        """Every ID of ``physical_id`` (advertised now or before) for which ``held`` is true."""
        return [i for i in self.all_replica_ids(physical_id) if held(i)]

    def replica_count(self, physical_id: str) -> int:
        """How many replicas the physical device is advertised as now (0 when the driver no longer lists it)."""
        dev = self._physical.get(physical_id)
        return 0 if dev is None else self.count_of(dev)

    def excess_replicas(self, held: Callable[[str], bool]) -> set[str]:
        """The free advertised replicas to withhold so that no device gets more tenants than its replica count.

        A device whose count was lowered (4 to 2) while allocations hold replicas no longer advertised keeps
        those tenancies until they end; meanwhile only ``count - held`` of its advertised free replicas are
        offered (the lowest), the rest are advertised unhealthy. ``held`` tells whether an allocation holds an ID.
        """
        excess: set[str] = set()
        for phys in self._shrunk:
            if phys not in self._physical:
                continue
            taken = len(self.held_replicas(phys, held))
            free = [i for i in self.replica_ids(phys) if not held(i)]
            excess.update(free[max(0, self.replica_count(phys) - taken) :])
        return excess

    def _note_shrunk(self, physical_id: str) -> None:
        ever = self._ever.get(physical_id)
        if ever and not set(ever) <= set(self.replica_ids(physical_id)):
            self._shrunk.add(physical_id)

    @property
    def shared(self) -> bool:
        """True when some device is advertised as several replicas."""
        return bool(self._replicas)

    def shared_devices(self) -> dict[str, tuple[str, ...]]:
        """Every shared device's physical ID -> its replica IDs."""
        return dict(self._replicas)

    def healthy_count(self) -> int:
        """How many devices are advertised healthy (from the kept sets: no pass over the devices)."""
        if self._degraded is not None:
            return 0
        withheld = self._withheld.intersection(self._devices)
        return len(self._devices) - len(self._unhealthy | withheld)

    def unhealthy_ids(self) -> set[str]:
        """The advertised IDs whose device the driver reports unhealthy (withheld ones aside)."""
        return set(self._unhealthy)

    def all_reported_healthy(self, device_ids: set[str]) -> bool:
        """True when every ID of ``device_ids`` is advertised, reported healthy by the driver, and the resource
        is neither degraded nor retired (set operations: the check of every Allocate)."""
        return (
            self._degraded is None
            and self._retired is None
            and device_ids <= self._devices.keys()
            and self._unhealthy.isdisjoint(device_ids)
        )

    @property
    def degraded(self) -> str | None:
        """Why the resource is degraded (every device advertised unhealthy), or ``None``."""
        return self._degraded

    @property
    def retired(self) -> str | None:
        """Why the resource advertises no devices at all (removed from the config), or ``None``."""
        return self._retired

    @property
    def withheld(self) -> frozenset[str]:
        return self._withheld

    @property
    def partition_blocked(self) -> frozenset[str]:
        """The withheld IDs withheld only because they are parts that do not fit their parent's counters now (no
        release, busy hook or quarantine holds them): a DRA front end that publishes the counters lets the
        scheduler count them instead of tainting them, and need not call them unhealthy."""
        return self._partition_blocked

    def overrides_health(self, device_id: str) -> bool:
        """True while the kubelet is told ``device_id`` is unhealthy whatever the driver reports (it is withheld,
        or the resource is degraded)."""
        return self._degraded is not None or device_id in self._withheld

    def encoded(self) -> bytes:
        """The current list in the codec's wire form (empty once retired)."""
        if self._encoded[0] != self.version:
            entries = () if self._retired is not None else self._entries.values()
            self._encoded = (self.version, self._codec.listing(entries))
        return self._encoded[1]

    # --- changing

    def count_of(self, dev: Device) -> int:
        """How many replicas ``dev`` is advertised as."""
        return dev.replicas if dev.replicas is not None else self.default_replicas

    def _expand(self, dev: Device) -> list[Device]:
        count = self.count_of(dev)
        if count == 1:
            return [dev]
        return [replace(dev, id=replica_id(dev.id, k)) for k in range(count)]

    def _map(self, physical: Iterable[Device]) -> dict[str, Device]:
        """Advertised devices of ``physical``, noting each shared device's replicas."""
        advertised: dict[str, Device] = {}
        for dev in physical:
            self._forget(dev.id)
            expanded = self._expand(dev)
            if len(expanded) > 1:
                ids = tuple(d.id for d in expanded)
                self._replicas[dev.id] = ids
                self._ever[dev.id] = (*self._ever.get(dev.id, ()), *(i for i in ids if i not in self._physical_of))
                for rep_id in ids:
                    self._physical_of[rep_id] = dev.id
            for rep in expanded:
                advertised[rep.id] = rep
            self._note_shrunk(dev.id)
        return advertised

    def _forget(self, device_id: str) -> tuple[str, ...]:
        """Drop a physical device's current replicas (the IDs stay known); returns its advertised IDs."""
        return self._replicas.pop(device_id, None) or (device_id,)

    def replace(self, devices: Iterable[Device]) -> None:
        """Replace every device (IDs must be unique; the driver facade checks that)."""
        physical = {d.id: d for d in devices}
        if physical == self._physical:
            return
        self._physical = physical
        self._replicas = {}
        parted = bool(self._parts or any(d.partition is not None for d in physical.values())) and self._set_parts(
            {i: d.partition for i, d in physical.items() if d.partition is not None}
        )
        new = self._map(physical.values())
        old = self._devices
        self._devices = new
        self._unhealthy = {i for i, d in new.items() if not d.healthy}
        self._entries = {
            i: (self._entries[i] if old.get(i) == d and i in self._entries else self._encode(d)) for i, d in new.items()
        }
        self._bump()
        if parted and self._on_partitions is not None:
            self._on_partitions()

    def update(self, changed: Iterable[Device] = (), removed: Iterable[str] = ()) -> None:
        """Add or replace ``changed`` devices, drop ``removed`` IDs (physical devices: all their replicas)."""
        touched = False
        parts: dict[str, Partition] | None = None
        for phys in changed:
            if self._physical.get(phys.id) == phys:
                continue
            if phys.partition is not None or phys.id in self._parts:
                parts = dict(self._parts) if parts is None else parts
                if phys.partition is None:
                    parts.pop(phys.id, None)
                else:
                    parts[phys.id] = phys.partition
            self._physical[phys.id] = phys
            before = self._forget(phys.id)
            after = self._map([phys])
            for dev_id in before:
                if dev_id not in after and self._devices.pop(dev_id, None) is not None:
                    del self._entries[dev_id]
                    self._unhealthy.discard(dev_id)
            for dev in after.values():
                if self._devices.get(dev.id) != dev:
                    self._devices[dev.id] = dev
                    self._entries[dev.id] = self._encode(dev)
                    if dev.healthy:
                        self._unhealthy.discard(dev.id)
                    else:
                        self._unhealthy.add(dev.id)
            touched = True
        for dev_id in removed:
            if self._physical.pop(dev_id, None) is None:
                continue
            if dev_id in self._parts:
                parts = dict(self._parts) if parts is None else parts
                parts.pop(dev_id, None)
            for rep in self._forget(dev_id):
                if self._devices.pop(rep, None) is not None:
                    del self._entries[rep]
                    self._unhealthy.discard(rep)
            touched = True
        parted = parts is not None and self._set_parts(parts)
        if touched:
            self._bump()
        if parted and self._on_partitions is not None:
            self._on_partitions()

    def _set_parts(self, parts: dict[str, Partition]) -> bool:
        """The listed devices' partitions now: rebuild :attr:`partitions` when they changed. True when they did (the
        caller tells ``on_partitions`` once the table is whole)."""
        if parts == self._parts and self.partitions is not None:
            return False
        for dev_id, part in self._parts.items():
            if dev_id not in parts:
                self._parts_gone[dev_id] = part  # held parts of a device no longer listed still consume
        for dev_id in parts:
            self._parts_gone.pop(dev_id, None)
        self._parts = parts
        self.partitions = PartitionMap(parts, self._parts_gone)
        return True

    def set_health(self, health: Mapping[str, Health | HealthReport]) -> list[str]:
        """Apply health by physical device ID to all its replicas (unknown IDs ignored): a :class:`Health` keeps
        the device's reason, a :class:`HealthReport` sets it too. Returns the IDs whose health or reason changed."""
        changed = []
        for dev_id, given in health.items():
            dev = self._physical.get(dev_id)
            if dev is None:
                continue
            if isinstance(given, HealthReport):
                if dev.health is not given.health or dev.reason != given.reason:
                    changed.append(dev.with_health(given.health, given.reason))
            elif dev.health is not given:
                changed.append(dev.with_health(given))
        self.update(changed)
        return [d.id for d in changed]

    def set_withheld(self, device_ids: Iterable[str], partition_blocked: Iterable[str] = ()) -> None:
        """Advertise these devices unhealthy whatever the driver says (they are being released, or busy, or parts
        that do not fit now); ``partition_blocked``: those of them withheld only for the last reason."""
        new = frozenset(device_ids)
        blocked = frozenset(partition_blocked)
        if new == self._withheld:
            if blocked != self._partition_blocked:
                self._partition_blocked = blocked
                self._bump()
            return
        flipped = new ^ self._withheld
        self._withheld = new
        self._partition_blocked = blocked
        self._reencode(flipped)

    def set_degraded(self, reason: str | None) -> None:
        """Advertise every device unhealthy (``reason``), or stop doing so (``None``)."""
        if reason == self._degraded:
            return
        was = self._degraded is not None
        self._degraded = reason
        if was != (reason is not None):
            self._reencode(self._devices)
        else:
            self._bump()

    def retire(self, reason: str) -> None:
        """Advertise an empty list from now on (capacity 0: the kubelet admits no new pod); the devices stay in
        the table, so the calls of pods holding them (PreStartContainer) and their releases still work."""
        if self._retired is not None:
            return
        self._retired = reason
        self._bump()

    def _reencode(self, device_ids: Iterable[str]) -> None:
        for dev_id in device_ids:
            dev = self._devices.get(dev_id)
            if dev is not None:
                self._entries[dev_id] = self._encode(dev)
        self._bump()

    def _effective(self, dev: Device) -> Device:
        if dev.healthy and self.overrides_health(dev.id):
            return dev.with_health(Health.UNHEALTHY)
        return dev

    def _encode(self, dev: Device) -> bytes:
        return self._codec.entry(self._effective(dev))

    def resend(self) -> bool:
        """Make every ListAndWatch stream send the list again, changed or not.

        The kubelet rewrites its checkpoint on every ListAndWatch message (see
        :mod:`devplug.frontends.deviceplugin.checkpointview`). Returns False when no stream is
        open, so nothing could be sent.
        """
        if self.watchers <= 0:
            return False
        self._bump()
        return True

    # --- waiting

    def _bump(self) -> None:
        self.version += 1
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        self._waiter = None

    def next_change(self, version: int) -> asyncio.Future[None]:
        """A future done once the table's version differs from ``version`` (shared by every waiter)."""
        if self.version != version:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        if self._waiter is None or self._waiter.done():
            self._waiter = asyncio.get_running_loop().create_future()
        return self._waiter
