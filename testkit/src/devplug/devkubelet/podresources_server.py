"""The kubelet's PodResources v1 service: which devices the kubelet attributes to which pod's containers.

Follows ``pkg/kubelet/apis/podresources/server_v1.go`` of Kubernetes v1.32.10:

* **List** first calls the device manager's ``UpdateAllocatedDevices`` (which
  drops inactive pods' devices once sources are ready), then lists every pod
  the pod manager has (``podsProvider.GetPods``): running, finished and
  rejected pods alike, deleted ones not. A finished or rejected pod is
  therefore listed with no devices (once sources are ready). After a kubelet
  restart the pod manager is empty until the main loop loaded the pods: List
  then succeeds with no pods while pods run. With ``active_only`` (kubelets
  >= 1.34; no such gate exists in 1.32, see the contract document: "Since
  1.34 List returns active pods only") only active pods are listed;
* each pod lists its restartable init containers (sidecars; the
  ``SidecarContainers`` gate is beta and on by default since 1.29, see
  ``pkg/features/versioned_kube_features.go``) and then its app containers;
  plain init containers are not listed. Devices come from the device
  manager's ``podDevices`` (``GetDevices``), one ContainerDevices entry per
  device and NUMA node (``containerDevicesFromResourceDeviceInstances`` in
  ``pkg/kubelet/cm/container_manager.go``), so a client must gather IDs
  across entries;
* **Get** is behind the alpha gate ``KubeletPodResourcesGet``, off by default:
  off, it fails with the plain error "PodResources API Get method disabled"
  (a Go error, so gRPC UNKNOWN); on, a pod the pod manager does not have is
  UNKNOWN "pod <name> in namespace <ns> not found", and any pod it has
  (finished included) is returned. Get does *not* call
  ``UpdateAllocatedDevices``: it shows whatever ``podDevices`` holds;
* **GetAllocatableResources**: the healthy devices of every resource;
* every call goes through the kubelet's rate limiter
  (``pkg/kubelet/apis/grpc/ratelimit.go``: 100/s, burst 10 per
  ``podresources/constants.go``; excess gets RESOURCE_EXHAUSTED "rejected by
  rate limit"). A simulated outage (a test knob, not a kubelet behaviour)
  answers UNAVAILABLE.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

import grpc
import grpc.aio

from devplug.api.gen.podresources.v1 import api_pb2 as pr
from devplug.api.gen.podresources.v1 import api_pb2_grpc as pr_grpc
from devplug.devkubelet.poddevices import DeviceAllocateInfo
from devplug.devkubelet.pods import PodRecord

__all__ = [
    "GET_DISABLED_MESSAGE",
    "RATE_LIMIT_MESSAGE",
    "PodResourcesServicer",
    "PodResourcesSource",
    "TokenBucket",
    "add_podresources_servicer",
    "container_devices",
]

#: The kubelet's text for a call over the rate limit.
RATE_LIMIT_MESSAGE = "rejected by rate limit"
#: The kubelet's text for Get while the KubeletPodResourcesGet gate is off.
GET_DISABLED_MESSAGE = "PodResources API Get method disabled"


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up; each call takes one."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"pod_resources_rate needs rate > 0 and burst >= 1, got ({rate}, {burst})")
        self._rate = rate
        self._burst = float(burst)
        self._tokens = float(burst)
        self._clock = clock
        self._last = clock()

    def take(self) -> bool:
        """Take a token if one is there."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


def container_devices(
    resource: str, ids: Iterable[str], numa: Mapping[str, tuple[int, ...]]
) -> list[pr.ContainerDevices]:
    """Devices as the kubelet lists them: one entry per device, or per device and NUMA node.

    (``containerDevicesFromResourceDeviceInstances`` in ``pkg/kubelet/cm/container_manager.go``.)
    """
    entries = []
    for device_id in ids:
        nodes = numa.get(device_id, ())
        if not nodes:
            entries.append(pr.ContainerDevices(resource_name=resource, device_ids=[device_id]))
            continue
        entries.extend(
            pr.ContainerDevices(
                resource_name=resource,
                device_ids=[device_id],
                topology=pr.TopologyInfo(nodes=[pr.NUMANode(ID=node)]),
            )
            for node in nodes
        )
    return entries


class PodResourcesSource(Protocol):
    """What the PodResources server reads: the kubelet's pod manager and device manager."""

    def get_pods(self) -> Sequence[PodRecord]:
        """``podsProvider.GetPods()``: every pod the pod manager has."""

    def get_pod_by_name(self, namespace: str, name: str) -> PodRecord | None:
        """``podsProvider.GetPodByName``."""

    def update_allocated_devices(self) -> None:
        """``devicesProvider.UpdateAllocatedDevices``."""

    def get_devices(self, uid: str, container: str) -> Mapping[str, DeviceAllocateInfo]:
        """``devicesProvider.GetDevices``: the container's ``podDevices`` entries by resource."""

    def allocatable(self) -> Mapping[str, list[tuple[str, tuple[int, ...]]]]:
        """The healthy devices of every resource: resource -> [(device ID, NUMA nodes)]."""


#: Options read at every call: (outage simulated, Get gate on, List active pods only).
Flags = Callable[[], tuple[bool, bool, bool]]


class PodResourcesServicer:
    """``/v1.PodResourcesLister``: List, GetAllocatableResources, Get over the dev kubelet's state.

    ``flags()`` gives ``(available, get_enabled, active_only)``: False
    ``available`` simulates an outage, ``get_enabled`` is the
    KubeletPodResourcesGet gate, ``active_only`` the >= 1.34 List.
    """

    def __init__(self, source: PodResourcesSource, flags: Flags, rate: tuple[float, int] | None) -> None:
        self._source = source
        self._flags = flags
        self._bucket = TokenBucket(*rate) if rate is not None else None

    async def _admit_call(self, context: grpc.aio.ServicerContext[object, object]) -> None:
        if not self._flags()[0]:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "pod resources API unavailable (simulated outage)")
        if self._bucket is not None and not self._bucket.take():
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, RATE_LIMIT_MESSAGE)

    def _pod_to_pb(self, record: PodRecord) -> pr.PodResources:
        containers = []
        for container in record.spec.listed_containers():
            devices = []
            for resource, info in self._source.get_devices(record.uid, container.name).items():
                devices.extend(container_devices(resource, info.device_ids, info.numa_nodes()))
            containers.append(pr.ContainerResources(name=container.name, devices=devices))
        return pr.PodResources(name=record.spec.name, namespace=record.spec.namespace, containers=containers)

    async def List(
        self, request: pr.ListPodResourcesRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pr.ListPodResourcesResponse:
        """Every pod the pod manager has (active ones only in >= 1.34 mode), after ``UpdateAllocatedDevices``."""
        await self._admit_call(context)
        pods = list(self._source.get_pods())
        self._source.update_allocated_devices()
        if self._flags()[2]:
            pods = [p for p in pods if p.active]
        return pr.ListPodResourcesResponse(pod_resources=[self._pod_to_pb(p) for p in pods])

    async def GetAllocatableResources(
        self, request: pr.AllocatableResourcesRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pr.AllocatableResourcesResponse:
        """The healthy devices of every resource."""
        await self._admit_call(context)
        devices = []
        for resource, entries in self._source.allocatable().items():
            devices.extend(container_devices(resource, (i for i, _ in entries), dict(entries)))
        return pr.AllocatableResourcesResponse(devices=devices)

    async def Get(
        self, request: pr.GetPodResourcesRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pr.GetPodResourcesResponse:
        """One pod by name and namespace; UNKNOWN when the gate is off or the pod manager has no such pod."""
        await self._admit_call(context)
        if not self._flags()[1]:
            await context.abort(grpc.StatusCode.UNKNOWN, GET_DISABLED_MESSAGE)
        record = self._source.get_pod_by_name(request.pod_namespace, request.pod_name)
        if record is None:
            await context.abort(
                grpc.StatusCode.UNKNOWN, f"pod {request.pod_name} in namespace {request.pod_namespace} not found"
            )
            raise AssertionError("unreachable: abort raises")
        return pr.GetPodResourcesResponse(pod_resources=self._pod_to_pb(record))


def add_podresources_servicer(server: grpc.aio.Server, servicer: PodResourcesServicer) -> None:
    """Serve ``servicer`` as ``v1.PodResourcesLister`` on ``server``."""
    pr_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
