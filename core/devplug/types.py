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
    "DeviceCondition",
    "DeviceStatus",
    "Mount",
    "NetworkData",
    "Partition",
    "ShareCapacity",
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


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")


def _counter_map(where: str, values: Mapping[str, int], *, positive: bool) -> Mapping[str, int]:
    copy = dict(values)
    for name, amount in copy.items():
        if not isinstance(name, str) or not _DNS_LABEL.match(name):
            raise ValueError(f"{where}: counter {name!r} must be a DNS label (lower-case letters, digits, '-')")
        low = 1 if positive else 0
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < low or amount >= 2**63:
            raise ValueError(f"{where}[{name!r}]: must be an integer >= {low}, got {amount!r}")
    return MappingProxyType(copy)


@dataclass(frozen=True)
class Partition:
    """A device's place in a bigger device it is a part of (contract 1.1).

    ``parent`` names the parent (its device ID, or any stable name of the card: the parent need not be a device
    the resource advertises); ``counters`` is what the parent has, the same in every part of it (how many
    regions, slots, megabits per second); ``consumes`` is what this part takes of them while allocated. The
    engine never lets the parts allocated (or still being released) together take more than a counter, on both
    APIs; DRA publishes the parent as a counter set and each part's ``consumesCounters`` (KEP-4815), so the
    scheduler does the same sum. Counter names are DNS labels (``CounterSet.counters`` in
    ``k8s.io/api/resource/v1/types.go``), at most 32 per parent.

    Example: a card with four partial-reconfiguration regions, offered whole or by region::

        card = {"regions": 4}
        Device("card0-whole", partition=Partition("card0", card, {"regions": 4}))
        Device("card0-port0", partition=Partition("card0", card, {"regions": 1}))

    A device is never a part of itself: the whole card, offered as a device, is a part of the card's counters
    under an ID of its own.
    """

    parent: str
    counters: Mapping[str, int]
    consumes: Mapping[str, int]

    def __post_init__(self) -> None:
        problem = device_id_problem(self.parent) if isinstance(self.parent, str) else "it is not a string"
        if problem is not None:
            raise ValueError(f"Partition.parent {self.parent!r}: {problem}")
        counters = _counter_map(f"Partition({self.parent!r}).counters", self.counters, positive=True)
        if not counters or len(counters) > 32:
            raise ValueError(f"Partition({self.parent!r}).counters: between 1 and 32 counters, got {len(counters)}")
        consumes = _counter_map(f"Partition({self.parent!r}).consumes", self.consumes, positive=True)
        for name, amount in consumes.items():
            if name not in counters:
                raise ValueError(f"Partition({self.parent!r}).consumes: {name!r} is none of the parent's counters")
            if amount > counters[name]:
                raise ValueError(
                    f"Partition({self.parent!r}).consumes[{name!r}]: {amount} is more than the parent has "
                    f"({counters[name]})"
                )
        object.__setattr__(self, "counters", counters)
        object.__setattr__(self, "consumes", consumes)

    def __hash__(self) -> int:
        return hash((self.parent, tuple(sorted(self.counters.items())), tuple(sorted(self.consumes.items()))))


@dataclass(frozen=True)
class ShareCapacity:
    """How a shared device's replicas are offered through DRA as one device with consumable capacity
    (KEP-5075, contract 1.1): a capacity ``name`` (a C identifier in the driver's domain) of replicas times
    ``per_replica``, requested in steps of ``per_replica`` (a claim asking for 6 GiB of a device whose replicas are
    4 GiB each gets two replicas, as the scheduler rounds a request up to the step). The default, ``shares`` of 1,
    counts replicas."""

    name: str = "shares"
    per_replica: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _C_IDENTIFIER.match(self.name):
            raise ValueError(f"ShareCapacity.name must be a C identifier of at most 32 characters, got {self.name!r}")
        amount = self.per_replica
        if isinstance(amount, bool) or not isinstance(amount, int) or not 1 <= amount < 2**62:
            raise ValueError(f"ShareCapacity.per_replica must be an integer >= 1, got {amount!r}")


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
    #: The device is a part of a bigger one (an FPGA card's region, a PF's VF) and shares the parent's counters
    #: with its other parts: DRA publishes the parent's counter set and what this part consumes (KEP-4815), and
    #: the engine never hands out parts whose consumption together exceeds a counter (contract 1.1).
    partition: Partition | None = None
    #: How a shared device (more than one replica) is offered as consumable capacity through DRA (KEP-5075): one
    #: device whose capacity is the replicas times ``per_replica``; ``None``: ``shares``, one per replica
    #: (contract 1.1).
    share_capacity: ShareCapacity | None = None

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
        if self.partition is not None and not isinstance(self.partition, Partition):
            raise ValueError(f"Device {self.id!r}: partition must be a Partition, got {self.partition!r}")
        if self.partition is not None and self.partition.parent == self.id:
            raise ValueError(f"Device {self.id!r}: a device cannot be a part of itself")
        if self.share_capacity is not None and not isinstance(self.share_capacity, ShareCapacity):
            raise ValueError(f"Device {self.id!r}: share_capacity must be a ShareCapacity, got {self.share_capacity!r}")

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
_EMPTY_STATUS: Mapping[str, DeviceStatus] = MappingProxyType({})


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


#: Limits of ``AllocatedDeviceStatus`` (``k8s.io/api/resource/v1/types.go``): conditions, the data's JSON size,
#: IPs, interface name and hardware address lengths.
MAX_STATUS_CONDITIONS = 8
MAX_STATUS_DATA_BYTES = 10 * 1024
MAX_NETWORK_IPS = 16
MAX_INTERFACE_NAME_CHARS = 256
MAX_HARDWARE_ADDRESS_CHARS = 128


@dataclass(frozen=True)
class NetworkData:
    """A network device's data for the claim's status (``networkData`` of KEP-4817): the interface name in the
    container's network namespace, its addresses in CIDR form (``10.9.8.7/24``) and its hardware address."""

    interface_name: str = ""
    ips: tuple[str, ...] = ()
    hardware_address: str = ""

    def __post_init__(self) -> None:
        import ipaddress

        if not isinstance(self.interface_name, str) or len(self.interface_name) > MAX_INTERFACE_NAME_CHARS:
            raise ValueError(f"NetworkData.interface_name: a string of at most {MAX_INTERFACE_NAME_CHARS} characters")
        if not isinstance(self.hardware_address, str) or len(self.hardware_address) > MAX_HARDWARE_ADDRESS_CHARS:
            raise ValueError(
                f"NetworkData.hardware_address: a string of at most {MAX_HARDWARE_ADDRESS_CHARS} characters"
            )
        ips = tuple(self.ips)
        if len(ips) > MAX_NETWORK_IPS or len(set(ips)) != len(ips):
            raise ValueError(f"NetworkData.ips: at most {MAX_NETWORK_IPS} addresses, each once, got {ips!r}")
        for text in ips:
            try:
                interface = ipaddress.ip_interface(text)
            except ValueError:
                raise ValueError(f"NetworkData.ips: {text!r} is no address in CIDR form (10.9.8.7/24)") from None
            if "/" not in text or str(interface) != text:
                raise ValueError(f"NetworkData.ips: {text!r} must be in canonical CIDR form ({interface})")
        object.__setattr__(self, "ips", ips)


_CONDITION_TYPE = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_CONDITION_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")


@dataclass(frozen=True)
class DeviceCondition:
    """One condition of a device in the claim's status (a ``metav1.Condition``: ``type`` a qualified name,
    ``status`` ``"True"``, ``"False"`` or ``"Unknown"``, ``reason`` a CamelCase word)."""

    type: str
    status: str
    reason: str
    message: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or len(self.type) > 316 or not _CONDITION_TYPE.match(self.type):
            raise ValueError(f"DeviceCondition.type {self.type!r}: a qualified name such as 'Ready'")
        if self.status not in ("True", "False", "Unknown"):
            raise ValueError(f"DeviceCondition.status must be 'True', 'False' or 'Unknown', got {self.status!r}")
        if not isinstance(self.reason, str) or len(self.reason) > 1024 or not _CONDITION_REASON.match(self.reason):
            raise ValueError(f"DeviceCondition.reason {self.reason!r}: a CamelCase word such as 'Configured'")
        if not isinstance(self.message, str) or len(self.message) > 32768:
            raise ValueError("DeviceCondition.message: a string of at most 32768 characters")


@dataclass(frozen=True)
class DeviceStatus:
    """What a workload or an operator should see of one prepared device, written into the DRA claim's
    ``status.devices`` (KEP-4817) with the driver's name and removed at unprepare (contract 1.1): conditions,
    free-form ``data`` (a JSON object, at most 10 KiB) and ``network_data``. Ignored through the device-plugin API,
    which has no place for it."""

    conditions: tuple[DeviceCondition, ...] = ()
    data: Mapping[str, Any] | None = None
    network_data: NetworkData | None = None

    def __post_init__(self) -> None:
        import json

        conditions = tuple(self.conditions)
        if len(conditions) > MAX_STATUS_CONDITIONS:
            raise ValueError(f"DeviceStatus.conditions: at most {MAX_STATUS_CONDITIONS}, got {len(conditions)}")
        for condition in conditions:
            if not isinstance(condition, DeviceCondition):
                raise ValueError(f"DeviceStatus.conditions: {condition!r} is not a DeviceCondition")
        if len({c.type for c in conditions}) != len(conditions):
            raise ValueError("DeviceStatus.conditions: each type at most once")
        object.__setattr__(self, "conditions", conditions)
        if self.data is not None:
            if not isinstance(self.data, Mapping):
                raise ValueError(f"DeviceStatus.data must be a JSON object (a mapping), got {type(self.data).__name__}")
            try:
                text = json.dumps(dict(self.data), sort_keys=True, separators=(",", ":"), allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"DeviceStatus.data is not JSON: {exc}") from None
            if len(text.encode()) > MAX_STATUS_DATA_BYTES:
                raise ValueError(f"DeviceStatus.data: {len(text.encode())} bytes of JSON, more than 10 KiB")
            object.__setattr__(self, "data", MappingProxyType(json.loads(text)))
        if self.network_data is not None and not isinstance(self.network_data, NetworkData):
            raise ValueError(f"DeviceStatus.network_data must be a NetworkData, got {self.network_data!r}")

    def __hash__(self) -> int:
        import json

        data = None if self.data is None else json.dumps(dict(self.data), sort_keys=True)
        return hash((self.conditions, data, self.network_data))

    def to_json(self) -> dict[str, Any]:
        """This status as JSON, in the API's field names (``conditions``, ``data``, ``networkData``), for a record
        kept on disk; :meth:`from_json` reads it back."""
        out: dict[str, Any] = {}
        if self.conditions:
            out["conditions"] = [
                {"type": c.type, "status": c.status, "reason": c.reason, "message": c.message} for c in self.conditions
            ]
        if self.data is not None:
            out["data"] = dict(self.data)
        network = self.network_data
        if network is not None:
            out["networkData"] = {
                "interfaceName": network.interface_name,
                "ips": list(network.ips),
                "hardwareAddress": network.hardware_address,
            }
        return out

    @classmethod
    def from_json(cls, value: Any) -> DeviceStatus:
        """The status :meth:`to_json` wrote; ``ValueError`` naming what is wrong for anything else."""
        if not isinstance(value, Mapping):
            raise ValueError(f"a device status must be a JSON object, got {value!r}")
        try:
            conditions = tuple(
                DeviceCondition(c["type"], c["status"], c["reason"], c.get("message", ""))
                for c in value.get("conditions") or ()
            )
            network = value.get("networkData")
            return cls(
                conditions,
                value.get("data"),
                None
                if network is None
                else NetworkData(network["interfaceName"], tuple(network["ips"]), network["hardwareAddress"]),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"a device status lacks or misspells {exc}: {value!r}") from None


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
    #: What each device (by the ID ``allocate`` was given) should show in the DRA claim's ``status.devices``
    #: (contract 1.1); ignored through the device-plugin API.
    device_status: Mapping[str, DeviceStatus] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "envs", _frozen_str_map("envs", self.envs))
        if self.device_status:
            statuses = dict(self.device_status)
            for key, value in statuses.items():
                if not isinstance(key, str) or not isinstance(value, DeviceStatus):
                    raise ValueError(
                        f"ContainerAllocation.device_status: {key!r}: {value!r} is not a device ID and a DeviceStatus"
                    )
            object.__setattr__(self, "device_status", MappingProxyType(statuses))
        else:
            object.__setattr__(self, "device_status", _EMPTY_STATUS)
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
        device_status: Mapping[str, DeviceStatus] | None = None,
    ) -> ContainerAllocation:
        """An allocation from parts taken from checked allocations (a merge): not checked again."""
        allocation = object.__new__(cls)
        object.__setattr__(allocation, "envs", MappingProxyType(envs) if envs else _EMPTY_MAP)
        object.__setattr__(allocation, "mounts", mounts)
        object.__setattr__(allocation, "devices", devices)
        object.__setattr__(allocation, "annotations", MappingProxyType(annotations) if annotations else _EMPTY_MAP)
        object.__setattr__(allocation, "cdi_devices", cdi_devices)
        object.__setattr__(
            allocation, "device_status", MappingProxyType(device_status) if device_status else _EMPTY_STATUS
        )
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
    statuses: dict[str, DeviceStatus] = {}
    for part in parts:
        for device_id, status in part.device_status.items():
            if statuses.setdefault(device_id, status) != status:
                raise AllocationConflictError(
                    f"device {device_id!r}: two different device statuses: {statuses[device_id]!r} and {status!r}"
                )
    return ContainerAllocation._checked_parts(
        envs,
        tuple([e for e in entries if isinstance(e, Mount)]),
        tuple([e for e in entries if isinstance(e, DeviceSpec)]),
        annotations,
        cdi,
        statuses,
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
