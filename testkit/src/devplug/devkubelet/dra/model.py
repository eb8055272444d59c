"""The dev kubelet's DRA value types: claims as pods reference them, prepared devices, health, plugin views.

All frozen, so tests can keep them and compare them later. The dev kubelet
needs only a claim's identity (namespace, name, UID) and the drivers its
allocation names (``status.allocation.devices.results[].driver``, from which
the kubelet's ``newClaimInfoFromClaim`` builds its per-driver state): what
the claim allocates is the drivers' business, read from the API server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

__all__ = [
    "ClaimState",
    "ContainerClaim",
    "DRAPluginView",
    "DeviceHealth",
    "HealthStatus",
    "PodClaim",
    "PreparedDevice",
    "ResourceClaimRef",
    "ResourceHealth",
    "ResourceStatus",
]


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    return value


@dataclass(frozen=True)
class ResourceClaimRef:
    """A ResourceClaim as the kubelet identifies it, and the drivers its allocation names.

    ``drivers`` are the distinct ``driver`` values of the claim's
    ``status.allocation.devices.results`` (the kubelet calls each of them,
    with the same claim); an allocation with no results names none, and the
    claim is prepared without a call.
    """

    namespace: str
    name: str
    uid: str
    drivers: Sequence[str] = ()

    def __post_init__(self) -> None:
        _text(self.namespace, "ResourceClaimRef.namespace")
        _text(self.name, "ResourceClaimRef.name")
        _text(self.uid, f"claim {self.namespace}/{self.name}: uid")
        drivers = tuple(self.drivers) if not isinstance(self.drivers, str) else (self.drivers,)
        for driver in drivers:
            _text(driver, f"claim {self.namespace}/{self.name}: driver name")
        object.__setattr__(self, "drivers", tuple(dict.fromkeys(drivers)))

    @property
    def label(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PodClaim:
    """One entry of a pod's ``spec.resourceClaims``: the name containers use, and the claim it resolves to.

    ``claim`` is the ResourceClaim the entry resolves to (``resourceclaim.Name``:
    ``resourceClaimName``, or the claim made from ``resourceClaimTemplateName``
    and recorded in the pod's status); it must be in the pod's namespace.
    """

    name: str
    claim: ResourceClaimRef

    def __post_init__(self) -> None:
        _text(self.name, "PodClaim.name")
        if not isinstance(self.claim, ResourceClaimRef):
            raise ValueError(f"pod claim {self.name!r}: claim must be a ResourceClaimRef, got {self.claim!r}")


@dataclass(frozen=True)
class ContainerClaim:
    """One entry of a container's ``resources.claims``: a pod claim's name and, optionally, one of its requests."""

    name: str
    request: str = ""

    def __post_init__(self) -> None:
        _text(self.name, "ContainerClaim.name")
        if not isinstance(self.request, str):
            raise ValueError(f"container claim {self.name!r}: request must be a string, got {self.request!r}")

    @property
    def resource_name(self) -> str:
        """The name of its ``allocatedResourcesStatus`` entry: ``claim:<name>`` or ``claim:<name>/<request>``."""
        return f"claim:{self.name}/{self.request}" if self.request else f"claim:{self.name}"


@dataclass(frozen=True)
class PreparedDevice:
    """One device a driver's NodePrepareResources answered for a claim (the kubelet's ``state.Device``)."""

    pool_name: str
    device_name: str
    request_names: tuple[str, ...] = ()
    cdi_device_ids: tuple[str, ...] = ()
    share_id: str | None = None


class HealthStatus(StrEnum):
    """A device's health as the kubelet keeps it (``state.DeviceHealthStatus``) and shows it in a pod's status."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class DeviceHealth:
    """What the kubelet's health cache answers for one device now (``getHealthInfo``).

    ``health`` is Unknown for a device never reported, no longer reported
    since its timeout, or whose driver's stream ended; ``message`` is then empty.
    """

    driver: str
    pool_name: str
    device_name: str
    health: HealthStatus
    message: str = ""


@dataclass(frozen=True)
class ResourceHealth:
    """One entry of ``allocatedResourcesStatus[].resources``: a device's ID for the pod and its health."""

    resource_id: str
    health: HealthStatus
    message: str | None = None


@dataclass(frozen=True)
class ResourceStatus:
    """One entry of a container status's ``allocatedResourcesStatus`` (name ``claim:<name>[/<request>]``)."""

    name: str
    resources: tuple[ResourceHealth, ...]


@dataclass(frozen=True)
class ClaimState:
    """One entry of the DRA manager's claim cache (and of ``dra_manager_state``), as it is now.

    ``prepared`` is the kubelet's in-memory flag: True once NodePrepareResources
    succeeded since this kubelet process started (a claim restored from the
    checkpoint is not prepared until the next prepare call).
    """

    namespace: str
    name: str
    uid: str
    pod_uids: frozenset[str]
    devices: Mapping[str, tuple[PreparedDevice, ...]] = field(default_factory=dict)
    prepared: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", MappingProxyType(dict(self.devices)))

    def __hash__(self) -> int:
        return hash((self.namespace, self.name, self.uid, self.pod_uids, tuple(self.devices.items()), self.prepared))

    @property
    def drivers(self) -> tuple[str, ...]:
        """The drivers of the claim's allocation, sorted."""
        return tuple(sorted(self.devices))


@dataclass(frozen=True)
class DRAPluginView:
    """One registered instance of a DRA driver's plugin, as the kubelet's DRA plugin manager holds it.

    ``service`` is the gRPC service the kubelet chose for prepare/unprepare
    (``v1.DRAPlugin`` or ``v1beta1.DRAPlugin``; on 1.32 and 1.33
    ``v1beta1.DRAPlugin`` or ``v1alpha3.NodeService``); ``connected`` whether its
    gRPC connection to ``endpoint`` is up now (1.32 and 1.33 dial at the first
    call: not before); ``order`` its place among the driver's instances, oldest first.
    """

    driver: str
    endpoint: str
    service: str
    connected: bool
    order: int
