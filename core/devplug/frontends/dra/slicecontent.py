"""What a node's pool of ResourceSlices holds: the device table's devices as ``resource.k8s.io/v1`` slice specs
(the publisher converts them at the edge for a server that serves ``v1beta2`` or ``v1beta1`` only:
:mod:`~devplug.frontends.dra.apiversions`).

Pure (no API calls): :func:`build_pool` turns a
:class:`~devplug.engine.devicetable.DeviceTable` into the pool's slices, and the
digest that says whether two pools are the same. The publisher
(:mod:`devplug.frontends.dra.slices`) writes them.

**Devices.** Every advertised device is one device of the pool, named by
:func:`~devplug.frontends.dra.devicenames.device_name` of its ID, sorted by name,
with these attributes (unqualified names are in the driver's domain, so a CEL
selector reads them as ``device.attributes["<driver>"].numaNode``):

* ``deviceID`` (string): the devplug device ID, when it fits the 64 bytes of a
  string attribute;
* ``numaNode`` (int): the device's NUMA node, when its topology names exactly one
  (a list attribute would need the alpha gate ``DRAListTypeAttributes`` of 1.36);
* the driver's own (:class:`DeviceDescription`), when the front end gives a
  describer.

No capacity is published: devplug's :class:`~devplug.types.Device` has none; a
describer may give some.

**Shared devices** (a device advertised as N replicas, ``<id>::0`` ..) take one of two forms, chosen by
discovery (:class:`~devplug.frontends.dra.apiversions.DraApiChoice`, ``consumable_capacity``):

* where the API server keeps ``allowMultipleAllocations`` and a capacity's ``requestPolicy`` (``DRAConsumableCapacity``:
  alpha in 1.34, beta and on by default in 1.36; a server without it drops both,
  ``dropDisabledDRAConsumableCapacityFields`` in ``pkg/registry/resource/resourceslice/strategy.go``, and the device
  would be handed out once): ONE
  device named after the physical ID, with the physical device's attributes (``deviceID`` the physical ID, no
  ``physicalDevice`` or ``replica``), ``allowMultipleAllocations: true`` and a consumable capacity of the replicas
  (:mod:`~devplug.frontends.dra.capacity`). Prepare maps a claim's share to free replica IDs of the device, so the
  core's lifecycle and ledger keep working on replica IDs. **Health**: the device is published with its FULL
  capacity while the physical device is healthy and some replica is not withheld; it is tainted (``unhealthy``,
  ``degraded``) with the physical device, and ``releasing`` only when EVERY replica is withheld. Not a capacity
  lowered to the free replicas: the scheduler already subtracts the shares its claims hold from the capacity
  (the allocator sums ``consumedCapacity`` of every allocated share of the device), so publishing only the free
  ones would count each held share twice, and a capacity lowered below what is allocated leaves the allocated
  shares in place but makes every new request fail until the sum fits again, with a new generation of the pool
  for every release. A replica still being cleaned after its claim went is the node's business: prepare refuses a
  share for which not enough replicas are free, and the kubelet retries the claim until they are. A capacity the
  driver's description gives such a device gets ``requestPolicy: {default: "0", validRange: {min: "0"}}``: the
  allocator makes a share consume every capacity of the device, the policy's default when the claim asks for none
  and, without a policy, the whole value (``DeviceCapacity.RequestPolicy`` in ``k8s.io/api/resource/v1/types.go``:
  "If request is also unset, default is the full capacity value"; ``fillEmptyRequest`` in
  ``structured/internal/incubating/consumable_capacity.go``), which would let one share take the device;
* else N devices, each a replica, with ``physicalDevice`` (string: the device name of the physical device's ID)
  and ``replica`` (int) attributes, so a claim can ask for replicas of distinct devices (``distinctAttribute:
  <driver>/physicalDevice``); every replica of the device table maps one to one onto a published device, the same
  IDs the core's lifecycle and ledger use.

**Parts of a parent** (:class:`~devplug.types.Partition`): where the API server keeps ``sharedCounters`` and
``consumesCounters`` (``DRAPartitionableDevices``, found by the same dry run; ``counters=True``), each distinct
parent is a counter set in slices of their own (at most 8 a slice, after the devices' slices, in the same pool and
counted in ``resourceSliceCount``) and each part says what it consumes (:mod:`~devplug.frontends.dra.counters`); a
slice with such a part holds at most 64 devices. Else parts are published as plain devices: the core refuses, at
prepare, parts whose counters do not fit and withholds (taints) parts that cannot fit.

**Health.** A device the scheduler must not hand out gets a device taint,
``devplug.io/unavailable`` with effect ``NoSchedule`` and the value
``unhealthy`` (the driver says so), ``releasing`` (the core withholds it while it
is being released), ``blocked`` (a part that does not fit its parent's counters now,
where the counters are not published) or ``degraded`` (the resource's driver is failing). Device
taints are beta and on by default in 1.36 (``DRADeviceTaints``, ``Device.Taints``
in ``k8s.io/api/resource/v1/types.go`` v0.36.3; the scheduler's allocator skips a
device with a ``NoSchedule`` taint its claim does not tolerate), they keep the
device visible (claims already holding it still resolve), and ``NoSchedule``
evicts nobody (``NoExecute`` would). A slice with a tainted device holds at most
64 devices (``ResourceSliceMaxDevicesWithAdvancedFeatures``), otherwise 128
(``ResourceSliceMaxDevices``). On an API server without the gate (1.33 to 1.35 by
default) the field is dropped on write (``dropDisabledDRADeviceTaintsFields``,
``pkg/registry/resource/resourceslice/strategy.go``), and a 1.32 server's v1beta1
has no such field at all (an apply carrying it is refused): the front end finds
out before its first write (a dry run, :mod:`~devplug.frontends.dra.apiversions`)
and builds with ``taints=False``, which leaves such devices out of the pool instead.
A retired resource publishes an empty pool.

**Slices.** Names are stable (``<pool>-<driver>-<index>``, hashed when that is no
valid name), so server-side apply updates them in place; every slice carries the
pool's name, generation and slice count, ``spec.nodeName``, the label
``app.kubernetes.io/managed-by: devplug`` and the pool's content digest as the
annotation ``devplug.io/pool-digest`` (how a restarted daemon recognises a pool it
already published).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from devplug.engine import DeviceTable
from devplug.frontends.dra.capacity import SharedCapacity, shared_capacity
from devplug.frontends.dra.counters import MAX_COUNTER_SETS, CounterSetError, consumes_entry, counter_sets
from devplug.frontends.dra.devicenames import DeviceNameMap, device_name
from devplug.types import Device

__all__ = [
    "DIGEST_ANNOTATION",
    "MANAGED_BY_LABEL",
    "MAX_ATTRIBUTES_AND_CAPACITIES",
    "MAX_DEVICES",
    "MAX_DEVICES_WITH_TAINTS",
    "RESERVED_ATTRIBUTES",
    "TAINT_KEY",
    "DeviceDescriber",
    "DeviceDescription",
    "Pool",
    "SliceContentError",
    "Version",
    "build_pool",
    "slice_name",
]

#: ``ResourceSliceMaxDevices`` and ``ResourceSliceMaxDevicesWithAdvancedFeatures`` (k8s.io/api v0.36.3).
MAX_DEVICES = 128
MAX_DEVICES_WITH_TAINTS = 64
#: ``ResourceSliceMaxAttributesAndCapacitiesPerDevice``.
MAX_ATTRIBUTES_AND_CAPACITIES = 32
#: A string attribute's limit (``DeviceAttributeMaxValueLength``), in bytes.
MAX_STRING_BYTES = 64
TAINT_KEY = "devplug.io/unavailable"
#: The request policy of a driver's own capacity on a device published with consumable capacity: a share that asks
#: for none of it takes none (``fillEmptyRequest`` gives the policy's default), one that asks gets what it asks.
UNREQUESTED_NOTHING = {"default": "0", "validRange": {"min": "0"}}
#: The attributes devplug gives (in the driver's domain); a driver's description may not give them.
RESERVED_ATTRIBUTES = frozenset({"deviceID", "numaNode", "physicalDevice", "replica"})
TAINT_EFFECT = "NoSchedule"
DIGEST_ANNOTATION = "devplug.io/pool-digest"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*)?"
    r"(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?$"
)
#: ``resource.Quantity``'s syntax (``k8s.io/apimachinery/pkg/api/resource/quantity.go``): a number, then a binary
#: suffix (Ki .. Ei), a decimal one (n u m k M G T P E) or a decimal exponent.
_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?$")
_INT64 = (-(2**63), 2**63 - 1)


class SliceContentError(ValueError):
    """The pool cannot be built (a device name collision, a bad attribute from the driver); nothing is published."""


@dataclass(frozen=True)
class Version:
    """A ``version`` attribute's value: a semantic version (semver.org 2.0.0), e.g. ``Version("1.2.3")``."""

    value: str


AttributeValue = bool | int | str | Version


@dataclass(frozen=True)
class DeviceDescription:
    """What a driver adds to a device's entry: attributes (qualified names, ``<domain>/<C identifier>`` or a bare
    C identifier in the driver's domain, up to 32 characters) and capacities (the same names; a quantity such as
    ``"16Gi"`` or an int). The extension point for drivers' own attributes: :class:`~devplug.types.Device` has none
    yet, so a front end passes a describer only once there is something to describe."""

    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)
    capacity: Mapping[str, str | int] = field(default_factory=dict)


DeviceDescriber = Callable[[Device], DeviceDescription]


@dataclass(frozen=True)
class Pool:
    """One node's pool as it is to be published: slice names and specs (``generation`` left out), the digest of
    the whole content, and the device names of the IDs published."""

    name: str
    slices: tuple[tuple[str, dict[str, Any]], ...]
    digest: str
    names: DeviceNameMap
    tainted: int
    omitted: int
    #: The shared devices published as one device with consumable capacity, by physical ID.
    shared: Mapping[str, SharedCapacity] = field(default_factory=dict)
    #: How many counter sets the pool publishes (in slices of their own, after the devices' slices).
    counter_sets: int = 0

    @property
    def device_count(self) -> int:
        return sum(len(spec.get("devices") or ()) for _, spec in self.slices)

    def shared_capacity(self, device_id: str) -> SharedCapacity | None:
        """The consumable capacity of a shared device this pool publishes as one device (by physical ID), or
        ``None`` (not shared, published one device per replica, or not published)."""
        return self.shared.get(device_id)


def slice_name(pool: str, driver: str, index: int) -> str:
    """The ResourceSlice holding slice ``index`` of ``pool``: ``<pool>-<driver>-<index>`` when that is a valid
    object name (a DNS subdomain of at most 253 characters), else a shortened form with a hash of both."""
    plain = f"{pool}-{driver}-{index}"
    if len(plain) <= 253 and _SUBDOMAIN.match(plain):
        return plain
    stem = re.sub(r"[^a-z0-9.]+", "-", f"{pool}-{driver}".lower())[:200].strip("-.")
    digest = hashlib.sha256(f"{pool}\0{driver}".encode()).hexdigest()[:16]
    return f"{stem}-{digest}-{index}" if stem else f"{digest}-{index}"


def _check_name(name: str, where: str) -> None:
    domain, slash, ident = name.rpartition("/")
    if slash and (not domain or len(domain) > 63 or not _SUBDOMAIN.match(domain)):
        raise SliceContentError(f"{where}: {name!r}: the domain must be a DNS subdomain of at most 63 characters")
    if not _C_IDENTIFIER.match(ident):
        raise SliceContentError(f"{where}: {name!r} must end in a C identifier of at most 32 characters")


def _attribute(value: AttributeValue, where: str) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        if not _INT64[0] <= value <= _INT64[1]:
            raise SliceContentError(f"{where}: {value} does not fit a 64-bit integer")
        return {"int": value}
    if isinstance(value, str):
        if len(value.encode(errors="surrogatepass")) > MAX_STRING_BYTES:
            raise SliceContentError(f"{where}: the string is longer than {MAX_STRING_BYTES} bytes")
        return {"string": value}
    if isinstance(value, Version):
        if not _SEMVER.match(value.value):
            raise SliceContentError(f"{where}: {value.value!r} is no semantic version (semver.org 2.0.0)")
        if len(value.value.encode()) > MAX_STRING_BYTES:
            raise SliceContentError(f"{where}: the version is longer than {MAX_STRING_BYTES} bytes")
        return {"version": value.value}
    raise SliceContentError(f"{where}: {value!r} is not a bool, int, str or Version")


def _device_entry(
    driver: str,
    table: DeviceTable,
    dev: Device,
    name: str,
    taint: str | None,
    describe: DeviceDescriber | None,
    taint_times: Mapping[tuple[str, str], str],
    shared: SharedCapacity | None = None,
    consumes: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    attributes: dict[str, dict[str, Any]] = {}
    if len(dev.id.encode(errors="surrogatepass")) <= MAX_STRING_BYTES:
        attributes["deviceID"] = {"string": dev.id}
    if len(dev.topology.numa_nodes) == 1:
        attributes["numaNode"] = {"int": dev.topology.numa_nodes[0]}
    physical = table.physical_of(dev.id)
    if physical != dev.id:
        attributes["physicalDevice"] = {"string": device_name(physical)}
        attributes["replica"] = {"int": table.replica_ids(physical).index(dev.id)}
    capacity: dict[str, dict[str, Any]] = shared.capacity_entry() if shared is not None else {}
    if describe is not None:
        where = f"device {dev.id!r}"
        try:
            described = describe(dev)
        except Exception as exc:
            raise SliceContentError(f"{where}: the driver's description failed: {type(exc).__name__}: {exc}") from exc
        for given, value in described.attributes.items():
            _check_name(given, f"{where}: attribute")
            key = given.removeprefix(f"{driver}/")  # the driver's domain is the default one: one name, one key
            if key in RESERVED_ATTRIBUTES:
                raise SliceContentError(f"{where}: attribute {given!r} is devplug's own")
            if key in attributes:
                raise SliceContentError(f"{where}: attribute {given!r} is given twice (bare and in {driver}/)")
            attributes[key] = _attribute(value, f"{where}: attribute {given!r}")
        for given, quantity in described.capacity.items():
            _check_name(given, f"{where}: capacity")
            key = given.removeprefix(f"{driver}/")
            if shared is not None and key == shared.name:
                raise SliceContentError(
                    f"{where}: capacity {given!r} is the shared device's consumable capacity (its share_capacity)"
                )
            if key in capacity:
                raise SliceContentError(f"{where}: capacity {given!r} is given twice (bare and in {driver}/)")
            text = str(quantity) if isinstance(quantity, int) and not isinstance(quantity, bool) else quantity
            if not isinstance(text, str) or not _QUANTITY.match(text):
                raise SliceContentError(f"{where}: capacity {given!r}: {quantity!r} is no quantity (e.g. 16Gi, 4)")
            capacity[key] = {"value": text}
            if shared is not None:  # else every share would take all of it (see the module's docstring)
                capacity[key]["requestPolicy"] = UNREQUESTED_NOTHING
        if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
            raise SliceContentError(
                f"{where}: {len(attributes)} attributes and {len(capacity)} capacities, more than the API's "
                f"{MAX_ATTRIBUTES_AND_CAPACITIES} (devplug's own count too)"
            )
    entry: dict[str, Any] = {"name": name}
    if attributes:
        entry["attributes"] = attributes
    if capacity:
        entry["capacity"] = capacity
    if shared is not None:
        entry["allowMultipleAllocations"] = True
    if consumes is not None:
        entry["consumesCounters"] = consumes
    if taint is not None:
        entry["taints"] = [{"key": TAINT_KEY, "value": taint, "effect": TAINT_EFFECT}]
        added = taint_times.get((name, taint))
        if added is not None:
            entry["taints"][0]["timeAdded"] = added
    return entry


def _unavailable(
    table: DeviceTable, dev: Device, shared: SharedCapacity | None = None, counters: bool = False
) -> str | None:
    """Why the scheduler must not hand the device out (a taint value), or ``None``. A shared device published with
    consumable capacity is withheld only when every replica is. A part withheld only because it does not fit its
    parent's counters now (``table.partition_blocked``) is ``blocked``, and not tainted at all where the counters
    are published (the scheduler counts them itself: every holder of a DRA resource's parts is a claim it knows)."""
    if table.degraded is not None:
        return "degraded"
    ids = shared.replica_ids if shared is not None else (dev.id,)
    if table.withheld.issuperset(ids):
        if not table.partition_blocked.issuperset(ids):
            return "releasing"
        if not counters:
            return "blocked"
    if not dev.healthy:
        return "unhealthy"
    return None


def _digest(where: tuple[str, str, str], slices: list[list[dict[str, Any]]], sets: list[list[dict[str, Any]]]) -> str:
    """The pool's content, without the taints' ``timeAdded`` (when a taint came is no change of the pool); the
    counter sets count only when there are some (a pool without them keeps the digest it always had)."""
    plain: list[Any] = [
        [{k: v if k != "taints" else [{**t, "timeAdded": None} for t in v] for k, v in d.items()} for d in devices]
        for devices in slices
    ]
    text = json.dumps([*where, plain, *([sets] if sets else [])], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def _published(table: DeviceTable, consumable: bool) -> list[tuple[Device, SharedCapacity | None]]:
    """The devices to publish, each with its consumable capacity when it is published as one (``consumable``: a
    shared device once, by its physical ID; else each replica, as the table advertises them)."""
    if table.retired is not None:
        return []
    if not consumable:
        return [(dev, None) for dev in table.reported_devices()]
    out: list[tuple[Device, SharedCapacity | None]] = []
    for dev in table.physical_devices():
        shared = shared_capacity(table, dev.id)
        if shared is not None:
            out.append((dev, shared))
        else:
            out.extend((rep, None) for rep in (table.reported(i) for i in table.replica_ids(dev.id)) if rep)
    return out


def build_pool(
    table: DeviceTable,
    *,
    driver: str,
    pool: str,
    node: str,
    taints: bool = True,
    describe: DeviceDescriber | None = None,
    taint_times: Mapping[tuple[str, str], str] | None = None,
    consumable: bool = False,
    counters: bool = False,
) -> Pool:
    """The pool of ``table``'s devices: see the module's docstring. ``taints``: taint unavailable devices (else
    leave them out); ``taint_times``: when each (device name, taint value) was first published, kept as the taint's
    ``timeAdded``; ``consumable``: publish each shared device as one device with consumable capacity (else one
    device per replica); ``counters``: publish the parts' parents as counter sets and what each part consumes (else
    parts without counters). Raises :class:`SliceContentError` naming the device and what is wrong."""
    devices = _published(table, consumable)
    try:
        names = DeviceNameMap(d.id for d, _ in devices)
    except ValueError as exc:
        raise SliceContentError(str(exc)) from exc
    try:
        sets = counter_sets(d for d, _ in devices) if counters else {}
    except CounterSetError as exc:
        raise SliceContentError(str(exc)) from exc
    entries: list[dict[str, Any]] = []
    shared_published: dict[str, SharedCapacity] = {}
    tainted = omitted = 0
    for dev, shared in sorted(devices, key=lambda d: names[d[0].id]):
        taint = _unavailable(table, dev, shared, counters)
        if taint is not None and not taints:
            omitted += 1
            continue
        tainted += taint is not None
        consumes = consumes_entry(dev, sets) if counters else None
        entries.append(
            _device_entry(
                driver, table, dev, names[dev.id], taint, describe, taint_times or {}, shared=shared, consumes=consumes
            )
        )
        if shared is not None:
            shared_published[dev.id] = shared
    limit = MAX_DEVICES_WITH_TAINTS if tainted or any("consumesCounters" in e for e in entries) else MAX_DEVICES
    chunks = [entries[i : i + limit] for i in range(0, len(entries), limit)] or [[]]
    set_entries = [s.entry() for s in sorted(sets.values(), key=lambda s: s.name)]
    set_chunks = [set_entries[i : i + MAX_COUNTER_SETS] for i in range(0, len(set_entries), MAX_COUNTER_SETS)]
    digest = _digest((driver, node, pool), chunks, set_chunks)
    slices = []
    for index, chunk in enumerate(chunks):
        spec: dict[str, Any] = {"driver": driver, "nodeName": node, "pool": {"name": pool}, "devices": chunk}
        slices.append((slice_name(pool, driver, index), spec))
    for index, set_chunk in enumerate(set_chunks, start=len(chunks)):
        # no ``devices`` key at all: a slice with sharedCounters may have no devices (1.35+, validateResourceSliceSpec)
        spec = {"driver": driver, "nodeName": node, "pool": {"name": pool}, "sharedCounters": set_chunk}
        slices.append((slice_name(pool, driver, index), spec))
    published = DeviceNameMap(names.device_id(e["name"]) or "" for chunk in chunks for e in chunk)
    return Pool(pool, tuple(slices), digest, published, tainted, omitted, shared_published, len(set_entries))
