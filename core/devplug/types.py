"""The value types drivers receive and return.

All are frozen dataclasses that check themselves when built, so a mistake in a
driver shows up as a ``ValueError`` naming the field, at the line that made it,
and never as a malformed message on the wire. The engine converts them to and
from protobuf; drivers never see protobuf.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from devplug.errors import AllocationConflictError

__all__ = [
    "CDIDevice",
    "Claim",
    "ClaimConfig",
    "ContainerAllocation",
    "Device",
    "DeviceSpec",
    "Health",
    "HealthReport",
    "Mount",
    "Topology",
    "MAX_DEVICE_ID_BYTES",
    "MAX_REASON_CHARS",
    "Replicas",
    "ResourceSettings",
    "device_id_problem",
    "replica_id",
]

_CDI_NAME = re.compile(
    r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+"  # vendor: a domain
    r"/[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?"  # class
    r"=[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$"  # device name
)


class Health(str, enum.Enum):
    """A device's health, with the exact strings the kubelet expects."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Topology:
    """The NUMA nodes a device is attached to (empty: no NUMA affinity)."""

    numa_nodes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        nodes = tuple(self.numa_nodes)
        for node in nodes:
            if isinstance(node, bool) or not isinstance(node, int) or node < 0:
                raise ValueError(f"Topology.numa_nodes: {node!r} is not a NUMA node number (int >= 0)")
        object.__setattr__(self, "numa_nodes", nodes)


NO_TOPOLOGY = Topology()

#: The longest device ID (in bytes of UTF-8) devplug advertises, so the longest the kubelet can send back.
#: The kubelet has no limit of its own: it keeps whatever IDs ListAndWatch brought and sends only those.
MAX_DEVICE_ID_BYTES = 256
#: The longest :attr:`Device.reason` kept (longer ones are cut, ending in ``...``).
MAX_REASON_CHARS = 500


def device_id_problem(device_id: object) -> str | None:
    """Why ``device_id`` cannot be a device ID, or ``None`` if it can.

    A device ID is a non-empty string of printable characters without
    whitespace, at most :data:`MAX_DEVICE_ID_BYTES` bytes long. The kubelet only
    ever sends IDs a plugin advertised, so a request holding anything else was
    not made by the kubelet.
    """
    if not isinstance(device_id, str) or not device_id:
        return "it must be a non-empty string"
    if device_id.isascii() and device_id.isprintable() and " " not in device_id:
        # The usual ID, checked in C: printable ASCII holds no whitespace but the space.
        return (
            None
            if len(device_id) <= MAX_DEVICE_ID_BYTES
            else f"it is {len(device_id)} bytes long, more than {MAX_DEVICE_ID_BYTES}"
        )
    if not device_id.isprintable() or any(ch.isspace() for ch in device_id):
        return "it must be printable and contain no whitespace or control characters"
    size = len(device_id.encode(errors="surrogatepass"))
    if size > MAX_DEVICE_ID_BYTES:
        return f"it is {size} bytes long, more than {MAX_DEVICE_ID_BYTES}"
    return None


@dataclass(frozen=True)
class Device:
    """One device a resource advertises to the kubelet.

    ``id`` is the kubelet's device ID: unique within the resource, stable across
    restarts (pods hold devices by ID), printable, without whitespace, at most
    :data:`MAX_DEVICE_ID_BYTES` bytes. ``reason`` says why an unhealthy device is
    unhealthy, for ``devplug status`` (never sent to the kubelet; at most
    :data:`MAX_REASON_CHARS` characters are kept).
    """

    id: str
    health: Health = Health.HEALTHY
    topology: Topology = NO_TOPOLOGY
    reason: str = ""
    #: What a container gets for this device (device nodes, mounts, envs, annotations), described once: the
    #: engine merges the requested devices' descriptions with the driver's ``allocate`` answer (if it has that
    #: hook) and, with ``[cdi] enabled``, writes them into the resource's CDI spec and names the CDI devices.
    allocation: ContainerAllocation | None = field(default=None, compare=True, hash=False)
    #: How many replicas of this device the resource advertises (containers sharing it), overriding the
    #: resource's ``replicas`` for this device (e.g. by memory size); ``None``: the resource's count. A device
    #: with more than one replica is advertised as ``<id>::0`` .. ``<id>::<n-1>`` (see :func:`replica_id`).
    replicas: int | None = None

    def __post_init__(self) -> None:
        problem = device_id_problem(self.id)
        if problem is not None:
            shown = repr(self.id) if not isinstance(self.id, str) else repr(self.id[:80])
            raise ValueError(f"Device.id {shown}: {problem}")
        if not isinstance(self.health, Health):
            object.__setattr__(self, "health", Health(self.health))
        if not isinstance(self.topology, Topology):
            raise ValueError(f"Device {self.id!r}: topology must be a Topology, got {self.topology!r}")
        if self.allocation is not None and not isinstance(self.allocation, ContainerAllocation):
            raise ValueError(f"Device {self.id!r}: allocation must be a ContainerAllocation, got {self.allocation!r}")
        if not isinstance(self.reason, str):
            raise ValueError(f"Device {self.id!r}: reason must be a string, got {self.reason!r}")
        if len(self.reason) > MAX_REASON_CHARS:
            object.__setattr__(self, "reason", self.reason[: MAX_REASON_CHARS - 3] + "...")
        count = self.replicas
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
            raise ValueError(f"Device {self.id!r}: replicas must be an integer >= 1 (or None), got {count!r}")

    @property
    def healthy(self) -> bool:
        """True when the device may be offered and allocated."""
        return self.health is Health.HEALTHY

    def with_health(self, health: Health, reason: str | None = None) -> Device:
        """This device with another health (and ``reason``, when given; else the same reason), the same topology
        and allocation data."""
        if reason is None:
            return replace(self, health=health)
        return replace(self, health=health, reason=reason)


@dataclass(frozen=True)
class HealthReport:
    """One device's health as ``check_health`` reports it, with the reason (why it is unhealthy).

    The reason is shown in ``devplug status`` and the ``devplug_device_unhealthy`` metric, and sent to the kubelet
    where its API carries one (the DRA health service's ``message``); the device-plugin API has no field for it.
    At most :data:`MAX_REASON_CHARS` characters are kept.
    """

    health: Health
    reason: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.health, Health):
            try:
                object.__setattr__(self, "health", Health(self.health))
            except ValueError:
                raise ValueError(
                    f"HealthReport.health must be a Health ({', '.join(h.value for h in Health)}), got {self.health!r}"
                ) from None
        if not isinstance(self.reason, str):
            raise ValueError(f"HealthReport.reason must be a string, got {self.reason!r}")
        if len(self.reason) > MAX_REASON_CHARS:
            object.__setattr__(self, "reason", self.reason[: MAX_REASON_CHARS - 3] + "...")


@dataclass(frozen=True)
class ResourceSettings:
    """A resource's settings other than its driver options, as a driver class's ``check_resources`` may see them
    (to refuse, say, a cleaning timeout option longer than ``hook_timeout``)."""

    #: Seconds a hook may run before the engine abandons it (the resource's ``hook_timeout``).
    hook_timeout: float
    #: Seconds between ``check_health`` calls (0: never); the config's, or the driver's default.
    health_interval: float
    #: Replicas per device (1: no sharing).
    replicas: int


def replica_id(device_id: str, index: int) -> str:
    """The ID the kubelet gets for replica ``index`` of a shared device: ``<device_id>::<index>``.

    Stable across restarts (it depends on nothing else). Drivers never need to
    parse it: hooks get the physical IDs with :class:`Replicas` alongside.
    """
    return f"{device_id}::{index}"


#: The empty read-only ``in_use`` and ``tenants`` of every unshared :class:`Replicas`.
_EMPTY_REPLICA_MAP: Mapping[str, int] = MappingProxyType({})


class _EachItsOwn(Mapping[str, tuple[str, ...]]):
    """A read-only mapping of each ID to itself alone (``Replicas.by_device`` of devices that are not shared),
    without a tuple made per ID up front: a GetPreferredAllocation offers 1,000 devices."""

    __slots__ = ("_devices", "_known")

    def __init__(self, device_ids: Iterable[str] = (), devices: Sequence[Device] | None = None) -> None:
        self._known: dict[str, None] | None = None if devices is not None else dict.fromkeys(device_ids)
        #: The devices whose IDs these are, looked at only when the mapping is (most hooks only ask ``shared``).
        self._devices = devices

    @property
    def _ids(self) -> dict[str, None]:
        if self._known is None:
            self._known = dict.fromkeys(d.id for d in self._devices or ())
        return self._known

    def __getitem__(self, device_id: str) -> tuple[str, ...]:
        if device_id in self._ids:
            return (device_id,)
        raise KeyError(device_id)

    def __contains__(self, device_id: object) -> bool:
        return device_id in self._ids

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def __repr__(self) -> str:
        return repr({i: (i,) for i in self._ids})


@dataclass(frozen=True)
class Replicas:
    """What a hook's devices stand for on the kubelet's side, when devices are shared.

    A resource shares a device by advertising it as several replicas
    (``replicas = N`` in its config, or :attr:`Device.replicas`); each replica
    is a device ID of its own for the kubelet, and several containers may hold
    replicas of one device at once. Hooks always get physical device IDs (the
    IDs the driver listed, each once); this value, passed as the optional hook
    argument ``replicas``, says which replica IDs the call is about and who else
    shares each device:

    * ``by_device``: each physical device ID of the call -> the replica IDs of
      the call on it (the kubelet's IDs, in order). A device that is not shared
      maps to its own ID alone.
    * ``in_use``: each physical device ID -> how many of its replicas other
      allocations hold at the time of the call (their load).
    * ``tenants``: each physical device ID -> how many other allocations
      (tenancies) hold a replica of it at the time of the call: 0 in every
      ``deallocate``, since a shared device is deallocated only when its last
      tenant left.

    On a resource whose devices are not shared, ``by_device`` maps every ID to
    itself and the counts are 0.
    """

    by_device: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    in_use: Mapping[str, int] = field(default_factory=dict)
    tenants: Mapping[str, int] = field(default_factory=dict)

    #: Whether some replica ID differs from its device's ID (computed once; see :attr:`shared`).
    _shared: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_device = {k: tuple(v) for k, v in self.by_device.items()}
        object.__setattr__(self, "by_device", MappingProxyType(by_device))
        object.__setattr__(self, "in_use", MappingProxyType(dict(self.in_use)))
        object.__setattr__(self, "tenants", MappingProxyType(dict(self.tenants)))
        object.__setattr__(self, "_shared", any(ids != (dev,) for dev, ids in by_device.items()))

    @classmethod
    def unshared(cls, device_ids: Iterable[str]) -> Replicas:
        """Every device its own single replica (a resource whose devices are not shared).

        Built without the per-device checks of the constructor: a GetPreferredAllocation offers 1,000 devices.
        """
        return cls._each_its_own(_EachItsOwn(device_ids))

    @classmethod
    def unshared_devices(cls, devices: Sequence[Device]) -> Replicas:
        """:meth:`unshared` for the IDs of ``devices``, a sequence that does not change: its IDs are gathered only
        if a hook looks at the mapping."""
        return cls._each_its_own(_EachItsOwn(devices=devices))

    @classmethod
    def _each_its_own(cls, by_device: _EachItsOwn) -> Replicas:
        replicas = object.__new__(cls)
        object.__setattr__(replicas, "by_device", by_device)
        object.__setattr__(replicas, "in_use", _EMPTY_REPLICA_MAP)
        object.__setattr__(replicas, "tenants", _EMPTY_REPLICA_MAP)
        object.__setattr__(replicas, "_shared", False)
        return replicas

    @property
    def shared(self) -> bool:
        """True when some replica ID differs from its device's ID (the devices are shared)."""
        return self._shared

    def replica_ids(self, device_id: str) -> tuple[str, ...]:
        """The replica IDs of the call on ``device_id`` (empty when the call does not name it)."""
        return self.by_device.get(device_id, ())

    def device_of(self, replica: str) -> str | None:
        """The physical device ID of a replica ID of the call, or ``None``."""
        for dev, ids in self.by_device.items():
            if replica in ids:
                return dev
        return None


def _absolute(kind: str, name: str, path: str) -> None:
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"{kind}.{name} must be an absolute path, got {path!r}")


@dataclass(frozen=True)
class Mount:
    """A host path mounted into the container."""

    container_path: str
    host_path: str
    read_only: bool = False

    def __post_init__(self) -> None:
        _absolute("Mount", "container_path", self.container_path)
        _absolute("Mount", "host_path", self.host_path)


@dataclass(frozen=True)
class DeviceSpec:
    """A device node made available in the container.

    ``permissions`` is any combination of ``r`` (read), ``w`` (write) and
    ``m`` (mknod), as the container runtime's cgroup rules take it.
    """

    container_path: str
    host_path: str
    permissions: str = "rw"

    def __post_init__(self) -> None:
        _absolute("DeviceSpec", "container_path", self.container_path)
        _absolute("DeviceSpec", "host_path", self.host_path)
        perms = self.permissions
        if not perms or set(perms) - set("rwm") or len(set(perms)) != len(perms):
            raise ValueError(f"DeviceSpec.permissions must be a non-empty combination of 'r', 'w', 'm', got {perms!r}")


@dataclass(frozen=True)
class CDIDevice:
    """A fully qualified Container Device Interface name, ``vendor.com/class=name``."""

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _CDI_NAME.match(self.name):
            raise ValueError(
                f"CDIDevice.name must be a fully qualified CDI name like 'vendor.com/class=name', got {self.name!r}"
            )


#: The one empty read-only mapping every allocation without envs or annotations shares (drivers that describe
#: each device's allocation make thousands of them).
_EMPTY_MAP: Mapping[str, str] = MappingProxyType({})


def _frozen_str_map(kind: str, values: Mapping[str, str]) -> Mapping[str, str]:
    if isinstance(values, Mapping) and not values:
        return _EMPTY_MAP
    copy = dict(values)
    for key, value in copy.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"ContainerAllocation.{kind}: key {key!r} must be a non-empty string")
        if not isinstance(value, str):
            raise ValueError(f"ContainerAllocation.{kind}[{key!r}]: value must be a string, got {value!r}")
    return MappingProxyType(copy)


@dataclass(frozen=True)
class ContainerAllocation:
    """What one container gets for its devices: the answer to Allocate for that container.

    Several hook implementations may each return one; the engine merges them
    with :meth:`merge`.
    """

    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    devices: tuple[DeviceSpec, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[CDIDevice, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "envs", _frozen_str_map("envs", self.envs))
        object.__setattr__(self, "annotations", _frozen_str_map("annotations", self.annotations))
        for name, kind in (("mounts", Mount), ("devices", DeviceSpec), ("cdi_devices", CDIDevice)):
            items = getattr(self, name)
            if not items:
                object.__setattr__(self, name, ())
                continue
            items = tuple(items)
            for item in items:
                if not isinstance(item, kind):
                    raise ValueError(f"ContainerAllocation.{name}: {item!r} is not a {kind.__name__}")
            object.__setattr__(self, name, items)
        if self.mounts or self.devices:
            _entries_by_path((self,))

    @classmethod
    def _checked_parts(
        cls,
        envs: Mapping[str, str],
        mounts: tuple[Mount, ...],
        devices: tuple[DeviceSpec, ...],
        annotations: Mapping[str, str],
        cdi_devices: tuple[CDIDevice, ...],
    ) -> ContainerAllocation:
        """An allocation from parts taken from checked allocations (a merge): not checked again."""
        allocation = object.__new__(cls)
        object.__setattr__(allocation, "envs", MappingProxyType(envs) if envs else _EMPTY_MAP)
        object.__setattr__(allocation, "mounts", mounts)
        object.__setattr__(allocation, "devices", devices)
        object.__setattr__(allocation, "annotations", MappingProxyType(annotations) if annotations else _EMPTY_MAP)
        object.__setattr__(allocation, "cdi_devices", cdi_devices)
        return allocation

    def merge(self, other: ContainerAllocation) -> ContainerAllocation:
        """Both allocations in one.

        Raises :class:`AllocationConflictError` when both set the same env key
        or annotation to different values, or use the same container path for
        different mounts or device nodes. Identical entries are kept once.
        """
        return merge_allocations((self, other))

    def __hash__(self) -> int:
        return hash((tuple(sorted(self.envs.items())), self.mounts, self.devices, self.cdi_devices))


def _entries_by_path(parts: Iterable[ContainerAllocation]) -> dict[str, Mount | DeviceSpec]:
    """Every mount and device node of ``parts`` by container path, identical entries once; raises
    :class:`AllocationConflictError` when two different entries use the same container path."""
    seen: dict[str, Mount | DeviceSpec] = {}
    for part in parts:
        for entries in (part.mounts, part.devices):
            for entry in entries:
                prior = seen.setdefault(entry.container_path, entry)
                if prior is not entry and prior != entry:
                    raise AllocationConflictError(
                        f"container path {entry.container_path!r} is used twice: {prior!r} and {entry!r}"
                    )
    return seen


def _merge_map(kind: str, parts: Iterable[Mapping[str, str]]) -> dict[str, str]:
    merged: dict[str, str] = {}
    for part in parts:
        for key, value in part.items():
            if merged.setdefault(key, value) != value:
                raise AllocationConflictError(
                    f"{kind} {key!r} is set twice with different values: {merged[key]!r} and {value!r}"
                )
    return merged


def merge_allocations(parts: Iterable[ContainerAllocation]) -> ContainerAllocation:
    """Merge several contributions to one container's allocation (see :meth:`ContainerAllocation.merge`).

    The parts were checked when they were made, so the result is not checked again: a merge runs for every
    container of every Allocate.
    """
    parts = tuple(parts)
    if len(parts) == 1:
        return parts[0]
    envs = _merge_map("env", [p.envs for p in parts if p.envs])
    annotations = _merge_map("annotation", [p.annotations for p in parts if p.annotations])
    entries = _entries_by_path(parts).values()
    cdi = tuple(dict.fromkeys([c for p in parts for c in p.cdi_devices]))
    return ContainerAllocation._checked_parts(
        envs,
        tuple([e for e in entries if isinstance(e, Mount)]),
        tuple([e for e in entries if isinstance(e, DeviceSpec)]),
        annotations,
        cdi,
    )


@dataclass(frozen=True)
class ClaimConfig:
    """One opaque configuration entry of a DRA claim's allocation for this driver
    (``status.allocation.devices.config[].opaque.parameters``)."""

    #: The driver's parameters, as the DeviceClass or the claim gave them (JSON values; read-only).
    parameters: Mapping[str, Any]
    #: The requests it applies to (empty: every request of the claim).
    requests: tuple[str, ...] = ()
    #: ``"class"`` (from the DeviceClass) or ``"claim"`` (from the claim itself, which takes precedence).
    source: str = "claim"


@dataclass(frozen=True)
class Claim:
    """The DRA ResourceClaim an ``allocate`` is for; ``None`` through the device-plugin API.

    ``requests`` maps each of the claim's request names to the device IDs allocated for it;
    ``config`` holds this driver's opaque configuration entries, class entries first, as the claim's allocation
    lists them.
    """

    namespace: str
    name: str
    uid: str
    requests: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    config: tuple[ClaimConfig, ...] = ()

    def describe(self) -> str:
        """``namespace/name (uid ...)``, for messages."""
        return f"{self.namespace}/{self.name} (uid {self.uid})"

    def parameters_for(self, request: str) -> list[Mapping[str, Any]]:
        """The parameters that apply to ``request``, in precedence order (class entries, then the claim's)."""
        return [c.parameters for c in self.config if not c.requests or request in c.requests]
