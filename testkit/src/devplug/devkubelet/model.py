"""The dev kubelet's value types: pods as asked for, pods as admitted, resources as seen, events.

All are frozen dataclasses (or a string enum), so tests can keep them and compare them later.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from devplug.devkubelet.cgroups import QOS_CLASSES
from devplug.devkubelet.dra.model import ContainerClaim, PodClaim
from devplug.kube.ids import dns1123_label_problem, dns1123_subdomain_problem
from devplug.types import ContainerAllocation, Health

__all__ = [
    "AdmittedContainer",
    "AdmittedPod",
    "ContainerSpec",
    "DeviceInfo",
    "EVENT_KINDS",
    "KubeletEvent",
    "MAX_POD_LIST_DELAY",
    "MAX_STOP_DELAY",
    "PluginOptions",
    "PodDeviceEntry",
    "PodPhase",
    "PodSpec",
    "ResourceView",
    "check_delay",
]

#: The longest finite ``ContainerSpec.stop_delay``: longer is no different from ``math.inf`` (only the grace
#: period's SIGKILL ends the container), which says so.
MAX_STOP_DELAY = 3600.0
#: The longest ``pod_list_delay`` of a restart through the control socket or ``devplug kubelet restart``: a kubelet
#: lists its pods again within seconds of a restart, and a window of hours would only hang a test or a demo.
MAX_POD_LIST_DELAY = 3600.0


def check_delay(value: object, name: str, most: float) -> float:
    """``value`` as seconds when it is a number from 0 to ``most``; ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= most:
        raise ValueError(f"{name} must be a number of seconds from 0 to {most:g}, got {value!r}")
    return float(value)


#: Every ``KubeletEvent.kind`` the dev kubelet records.
EVENT_KINDS = frozenset(
    {
        "register",
        "register-refused",
        "list-and-watch",
        "preferred-allocation",
        "allocate",
        "pre-start",
        "post-stop",
        "deallocate",
        "pod-admitted",
        "pod-rejected",
        "pod-finished",
        "pod-terminating",
        "pod-removed",
        "pod-cleaned-up",
        "container-started",
        "container-failed",
        "container-stopping",
        "container-exited",
        "pods-loaded",
        "sync-loop-waited",
        "pod-devices-dropped",
        "checkpoint-read",
        "restart",
        "stream-ended",
        "instance-disconnected",
        "resource-dropped",
        # the DRA side (devplug.devkubelet.dra)
        "plugin-registered",
        "plugin-registration-failed",
        "plugin-deregistered",
        "dra-plugin-registered",
        "dra-plugin-deregistered",
        "dra-plugin-connected",
        "dra-plugin-disconnected",
        "resource-slices-wiped",
        "resource-slices-kept",
        "dra-prepare",
        "dra-unprepare",
        "dra-health",
        "dra-health-stream-ended",
        "dra-checkpoint-read",
        "dra-reconcile-failed",
        "pod-claims-prepared",
        "pod-prepare-failed",
        "pod-claims-unprepared",
        "pod-unprepare-failed",
    }
)


class PodPhase(StrEnum):
    """Where a pod stands, as far as the kubelet's device manager cares.

    ``running``: admitted, its containers live (an *active* pod).
    ``terminating``: the pod object is being deleted gracefully and the pod
    worker is killing its containers; it is still in the pod manager and
    still active. ``finished``: its containers ended (phase Succeeded) but the
    pod object still exists, so the kubelet's pod manager still has it.
    ``rejected``: admission failed (phase Failed, the pod object still
    exists). ``deleted``: the pod object is gone from the pod manager (its
    containers may still be being killed: see
    :meth:`~devplug.devkubelet.DevKubelet.remove_static_pod`). Only
    ``running`` and ``terminating`` pods are active (``filterOutInactivePods``
    in ``pkg/kubelet/kubelet_pods.go`` keeps a pod whose termination was
    requested until its pod worker has terminated it).
    """

    RUNNING = "running"
    TERMINATING = "terminating"
    FINISHED = "finished"
    REJECTED = "rejected"
    DELETED = "deleted"


@dataclass(frozen=True)
class ContainerSpec:
    """One container of a pod: its name and how many devices of each resource it requests.

    ``init`` marks an init container: it runs to completion before the app
    containers start, and its devices can be reused by them. ``restartable``
    (only with ``init``) marks a sidecar: an init container with
    ``restartPolicy: Always`` that keeps running beside the app containers;
    its devices are not reused by later containers and PodResources lists it
    (``IsRestartableInitContainer``, SidecarContainers gate, on by default in 1.32).

    ``stop_delay`` is how the container's process answers SIGTERM when the
    dev kubelet runs containers as processes: it exits that many seconds
    later (at most :data:`MAX_STOP_DELAY`); ``math.inf`` ignores SIGTERM (as a
    container whose init has no handler for it), so only the SIGKILL at the
    end of the grace period ends it.

    ``name`` is a DNS-1123 label, as the API server requires of a container's
    name (``validateContainers``: ``IsDNS1123Label``).

    ``claims`` are its ``resources.claims``: names of the pod's
    :attr:`PodSpec.resource_claims` (a string, or a
    :class:`~devplug.devkubelet.dra.model.ContainerClaim` naming one request).
    """

    name: str
    requests: Mapping[str, int] = field(default_factory=dict)
    init: bool = False
    restartable: bool = False
    stop_delay: float = 0.0
    claims: Sequence[ContainerClaim | str] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"ContainerSpec.name must be a non-empty string, got {self.name!r}")
        if (problem := dns1123_label_problem(self.name)) is not None:
            raise ValueError(f"container name {problem}")
        if self.restartable and not self.init:
            raise ValueError(f"container {self.name!r}: only an init container can be restartable (a sidecar)")
        requests = dict(self.requests)
        for resource, count in requests.items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValueError(
                    f"container {self.name!r}: request for {resource!r} must be a device count (int >= 0), "
                    f"got {count!r}"
                )
        object.__setattr__(self, "requests", MappingProxyType(requests))
        delay = self.stop_delay
        number = not isinstance(delay, bool) and isinstance(delay, int | float)
        if not number or not (0 <= delay <= MAX_STOP_DELAY or delay == math.inf):
            raise ValueError(
                f"container {self.name!r}: stop_delay must be a number of seconds from 0 to {MAX_STOP_DELAY:g}, or "
                f"math.inf (ignore SIGTERM), got {delay!r}"
            )
        object.__setattr__(self, "stop_delay", float(delay))
        if isinstance(self.claims, str):
            raise ValueError(f"container {self.name!r}: claims must be a sequence of claim names, got {self.claims!r}")
        claims = tuple(ContainerClaim(c) if isinstance(c, str) else c for c in self.claims)
        for claim in claims:
            if not isinstance(claim, ContainerClaim):
                raise ValueError(f"container {self.name!r}: {claim!r} is not a claim name or a ContainerClaim")
        object.__setattr__(self, "claims", claims)

    def __hash__(self) -> int:
        return hash(
            (self.name, tuple(sorted(self.requests.items())), self.init, self.restartable, self.stop_delay, self.claims)
        )

    @property
    def container_claims(self) -> tuple[ContainerClaim, ...]:
        """:attr:`claims`, each as a :class:`~devplug.devkubelet.dra.model.ContainerClaim`."""
        return tuple(c for c in self.claims if isinstance(c, ContainerClaim))

    @property
    def sidecar(self) -> bool:
        """True for a restartable init container (it runs beside the app containers)."""
        return self.init and self.restartable


@dataclass(frozen=True)
class PodSpec:
    """A pod to admit: a name, its containers (init containers run first, in the order listed).

    ``uid`` gives the pod object's UID; by default the dev kubelet draws a
    fresh uuid4 at admission, as the API server does for every new pod object.
    ``termination_grace_period`` is ``spec.terminationGracePeriodSeconds``
    (the API's default, 30). ``qos`` is the pod's QoS class, which names its
    cgroup's parent: ``besteffort`` (the default: a pod whose containers
    request only extended resources, and no CPU or memory, is BestEffort,
    ``GetPodQOS`` in ``pkg/apis/core/v1/helper/qos``), ``burstable`` or
    ``guaranteed``.

    ``resource_claims`` is its ``spec.resourceClaims``, each entry resolved to
    the ResourceClaim it stands for (in the pod's namespace); containers name
    them in their ``claims``. Only a dev kubelet with DRA admits such a pod.

    ``name`` is a DNS-1123 subdomain and ``namespace`` a DNS-1123 label, as
    the API server requires (``ValidatePodName``: ``NameIsDNSSubdomain``;
    ``ValidateNamespaceName``: ``NameIsDNSLabel``; :mod:`devplug.kube.ids`):
    no ``/``, ``..`` or control character reaches a log line or a path.
    """

    name: str
    containers: Sequence[ContainerSpec]
    namespace: str = "default"
    uid: str | None = None
    termination_grace_period: int = 30
    qos: str = "besteffort"
    resource_claims: Sequence[PodClaim] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"PodSpec.name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.namespace, str) or not self.namespace:
            raise ValueError(f"PodSpec.namespace must be a non-empty string, got {self.namespace!r}")
        if (problem := dns1123_subdomain_problem(self.name)) is not None:
            raise ValueError(f"pod name {problem}")
        if (problem := dns1123_label_problem(self.namespace)) is not None:
            raise ValueError(f"pod namespace {problem}")
        if self.uid is not None and (not isinstance(self.uid, str) or not self.uid):
            raise ValueError(f"PodSpec.uid must be None or a non-empty string, got {self.uid!r}")
        grace = self.termination_grace_period
        if isinstance(grace, bool) or not isinstance(grace, int) or grace < 0:
            raise ValueError(f"pod {self.name!r}: termination_grace_period must be whole seconds >= 0, got {grace!r}")
        if self.qos not in QOS_CLASSES:
            raise ValueError(f"pod {self.name!r}: qos must be one of {', '.join(QOS_CLASSES)}, got {self.qos!r}")
        containers = tuple(self.containers)
        seen: set[str] = set()
        for container in containers:
            if not isinstance(container, ContainerSpec):
                raise ValueError(f"pod {self.name!r}: {container!r} is not a ContainerSpec")
            if container.name in seen:
                raise ValueError(f"pod {self.name!r}: container name {container.name!r} is used twice")
            seen.add(container.name)
        object.__setattr__(self, "containers", containers)
        claims = tuple(self.resource_claims)
        names: set[str] = set()
        for claim in claims:
            if not isinstance(claim, PodClaim):
                raise ValueError(f"pod {self.name!r}: {claim!r} is not a PodClaim")
            if claim.name in names:
                raise ValueError(f"pod {self.name!r}: resource claim name {claim.name!r} is used twice")
            if claim.claim.namespace != self.namespace:
                raise ValueError(
                    f"pod {self.namespace}/{self.name}: resource claim {claim.name!r} refers to "
                    f"{claim.claim.label}, outside the pod's namespace"
                )
            names.add(claim.name)
        for container in containers:
            for used in container.container_claims:
                if used.name not in names:
                    raise ValueError(
                        f"pod {self.name!r}: container {container.name!r} uses claim {used.name!r}, "
                        "which is not in the pod's resource_claims"
                    )
        object.__setattr__(self, "resource_claims", claims)

    @property
    def key(self) -> tuple[str, str]:
        """``(namespace, name)``, how the dev kubelet's callers name the pod."""
        return (self.namespace, self.name)

    def ordered_containers(self) -> tuple[ContainerSpec, ...]:
        """The containers in the order the kubelet handles them: init containers first, each as listed.

        (``admitPolicyNone`` in ``pkg/kubelet/cm/topologymanager/scope.go`` walks
        ``append(InitContainers, Containers...)``.)
        """
        return tuple(c for c in self.containers if c.init) + tuple(c for c in self.containers if not c.init)

    def listed_containers(self) -> tuple[ContainerSpec, ...]:
        """The containers PodResources reports: sidecars (restartable init containers), then app containers."""
        return tuple(c for c in self.containers if c.sidecar) + tuple(c for c in self.containers if not c.init)


@dataclass(frozen=True)
class AdmittedContainer:
    """What one container got at admission: device IDs per resource and the plugin's Allocate answer per resource."""

    name: str
    devices: Mapping[str, tuple[str, ...]]
    allocations: Mapping[str, ContainerAllocation]
    init: bool = False
    restartable: bool = False


@dataclass(frozen=True)
class AdmittedPod:
    """A pod the dev kubelet handled, with its containers in the order they were handled.

    ``uid`` is the pod object's UID; ``phase`` where it stood when this value
    was taken. A rejected pod lists the containers whose devices were
    allocated before the rejection.
    """

    spec: PodSpec
    containers: tuple[AdmittedContainer, ...]
    uid: str = ""
    phase: PodPhase = PodPhase.RUNNING

    @property
    def label(self) -> str:
        """``namespace/name``."""
        return f"{self.spec.namespace}/{self.spec.name}"

    def container(self, name: str) -> AdmittedContainer:
        """The admitted container called ``name`` (``KeyError`` if there is none)."""
        for container in self.containers:
            if container.name == name:
                return container
        raise KeyError(f"pod {self.spec.namespace}/{self.spec.name} has no container {name!r}")


@dataclass(frozen=True)
class PodDeviceEntry:
    """One entry of the kubelet's ``podDevices`` store: a container's devices of one resource.

    ``pod`` is ``namespace/name`` when the dev kubelet knows the pod's UID,
    ``""`` otherwise (an entry restored from a checkpoint of unknown pods).
    ``devices_by_numa`` is the kubelet's ``DevicesPerNUMA`` (node -1: no topology).
    """

    pod_uid: str
    pod: str
    container: str
    resource: str
    devices_by_numa: Mapping[int, tuple[str, ...]]

    @property
    def device_ids(self) -> tuple[str, ...]:
        """The distinct device IDs, in the order they appear."""
        return tuple(dict.fromkeys(i for ids in self.devices_by_numa.values() for i in ids))


@dataclass(frozen=True)
class KubeletEvent:
    """One call the dev kubelet made or received (``kind`` is one of :data:`EVENT_KINDS`)."""

    time: float
    kind: str
    resource: str
    detail: str
    device_ids: tuple[str, ...] = ()

    def __str__(self) -> str:
        ids = f" [{', '.join(self.device_ids)}]" if self.device_ids else ""
        resource = self.resource or "-"
        return f"{self.kind:<20} {resource:<28} {self.detail}{ids}"


@dataclass(frozen=True)
class PluginOptions:
    """The options a plugin answered to GetDevicePluginOptions, the four flags as bools."""

    pre_start_required: bool = False
    get_preferred_allocation_available: bool = False
    post_stop_required: bool = False
    deallocate_available: bool = False


@dataclass(frozen=True)
class DeviceInfo:
    """One device as the kubelet last heard of it: ID, health string as sent, NUMA nodes."""

    id: str
    health: str
    numa_nodes: tuple[int, ...] = ()

    @property
    def healthy(self) -> bool:
        """True only for the exact health string ``"Healthy"`` (anything else is unhealthy)."""
        return self.health == Health.HEALTHY.value


@dataclass(frozen=True)
class ResourceView:
    """A snapshot of one extended resource as the dev kubelet sees it.

    ``capacity`` counts every device, ``allocatable`` the healthy ones (held by
    a pod or not, as in the node's status), ``free`` the healthy ones the next
    admission could take. ``registered`` is False while no live registration
    exists: after a stream ended (every device then shows as unhealthy) and
    after a restart, until the plugin registers again (the kubelet restores
    the resource from its checkpoint with no devices, so capacity is 0);
    ``endpoint`` is the socket file name of the latest registration.
    ``in_use`` holds the device IDs the next admission could not take: the
    kubelet's ``allocatedDevices`` as its next ``UpdateAllocatedDevices``
    leaves it (devices of finished, rejected and deleted pods are not in use
    once sources are ready; see :meth:`DevKubelet.attributed` for who holds what).
    """

    name: str
    endpoint: str
    options: PluginOptions
    devices: tuple[DeviceInfo, ...]
    stream_open: bool
    registered: bool
    registrations: int
    in_use: frozenset[str] = frozenset()

    @property
    def capacity(self) -> int:
        """How many devices the node has for this resource, healthy or not."""
        return len(self.devices)

    @property
    def allocatable(self) -> int:
        """How many devices are healthy (free or in use)."""
        return sum(1 for d in self.devices if d.healthy)

    @property
    def free(self) -> int:
        """How many healthy devices are not in use (what the next pod can get).

        Note that ``allocatable`` is the kubelet's figure: it counts healthy
        devices whether or not a pod holds them.
        """
        return sum(1 for d in self.devices if d.healthy and d.id not in self.in_use)

    @property
    def healthy_ids(self) -> tuple[str, ...]:
        """The IDs of the healthy devices, in the plugin's order."""
        return tuple(d.id for d in self.devices if d.healthy)

    def device(self, device_id: str) -> DeviceInfo | None:
        """The device with this ID, or None."""
        for device in self.devices:
            if device.id == device_id:
                return device
        return None
