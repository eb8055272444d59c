"""The kubelet's PodResources v1 service: which devices the admitted pods hold, and which are allocatable.

Devices are reported the kubelet's way: one ContainerDevices entry per device
(per NUMA node of the device when it has any), so a client must gather IDs
across entries. List and Get show app containers only (init containers have
finished). Calls share a token bucket (the kubelet's is 100/s, burst 10);
excess calls get RESOURCE_EXHAUSTED. A simulated outage answers UNAVAILABLE.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

import grpc
import grpc.aio

from devplug.api.gen.podresources.v1 import api_pb2 as pr
from devplug.api.gen.podresources.v1 import api_pb2_grpc as pr_grpc
from devplug.devkubelet.devicemanager import PodRecord

__all__ = ["PodResourcesServicer", "TokenBucket", "add_podresources_servicer", "container_devices"]

#: The kubelet's text for a call over the rate limit.
RATE_LIMIT_MESSAGE = "rejected by rate limit"


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
    """Devices as the kubelet lists them: one entry per device, or per device and NUMA node."""
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


def _pod_to_pb(record: PodRecord) -> pr.PodResources:
    containers = []
    for crec in record.containers:
        if crec.init:
            continue
        devices = []
        for resource, ids in crec.devices.items():
            devices.extend(container_devices(resource, ids, crec.numa.get(resource, {})))
        containers.append(pr.ContainerResources(name=crec.name, devices=devices))
    return pr.PodResources(name=record.spec.name, namespace=record.spec.namespace, containers=containers)


#: The healthy devices of every registered resource: resource -> [(device ID, NUMA nodes)].
AllocatableSource = Callable[[], Mapping[str, list[tuple[str, tuple[int, ...]]]]]


class PodResourcesServicer:
    """``/v1.PodResourcesLister``: List, GetAllocatableResources, Get over the dev kubelet's state."""

    def __init__(
        self,
        pods: Callable[[], list[PodRecord]],
        allocatable: AllocatableSource,
        available: Callable[[], bool],
        rate: tuple[float, int] | None,
    ) -> None:
        self._pods = pods
        self._allocatable = allocatable
        self._available = available
        self._bucket = TokenBucket(*rate) if rate is not None else None

    async def _admit_call(self, context: grpc.aio.ServicerContext[object, object]) -> None:
        if not self._available():
            await context.abort(grpc.StatusCode.UNAVAILABLE, "pod resources API unavailable (simulated outage)")
        if self._bucket is not None and not self._bucket.take():
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, RATE_LIMIT_MESSAGE)

    async def List(
        self, request: pr.ListPodResourcesRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pr.ListPodResourcesResponse:
        """Every admitted pod with its app containers' devices."""
        await self._admit_call(context)
        return pr.ListPodResourcesResponse(pod_resources=[_pod_to_pb(p) for p in self._pods()])

    async def GetAllocatableResources(
        self, request: pr.AllocatableResourcesRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pr.AllocatableResourcesResponse:
        """The healthy devices of every registered resource."""
        await self._admit_call(context)
        devices = []
        for resource, entries in self._allocatable().items():
            devices.extend(container_devices(resource, (i for i, _ in entries), dict(entries)))
        return pr.AllocatableResourcesResponse(devices=devices)

    async def Get(
        self, request: pr.GetPodResourcesRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pr.GetPodResourcesResponse:
        """One pod by name and namespace; NOT_FOUND when there is no such pod."""
        await self._admit_call(context)
        for record in self._pods():
            if record.spec.name == request.pod_name and record.spec.namespace == request.pod_namespace:
                return pr.GetPodResourcesResponse(pod_resources=_pod_to_pb(record))
        await context.abort(
            grpc.StatusCode.NOT_FOUND,
            f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
        )
        raise AssertionError("unreachable: abort raises")


def add_podresources_servicer(server: grpc.aio.Server, servicer: PodResourcesServicer) -> None:
    """Serve ``servicer`` as ``v1.PodResourcesLister`` on ``server``."""
    pr_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
