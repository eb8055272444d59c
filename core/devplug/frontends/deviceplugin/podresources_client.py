"""The engine's client of the kubelet's PodResources v1 API: which devices pods hold right now (the dev
kubelet serves it in :mod:`devplug.devkubelet.podresources_server`)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import grpc
import grpc.aio

from devplug.api.gen.podresources.v1 import api_pb2 as pr

__all__ = ["DeviceUse", "PodResourcesClient"]

#: resource name -> device ID -> the pods ("namespace/name") using it
DeviceUse = dict[str, dict[str, set[str]]]


class PodResourcesClient:
    """Calls List on the kubelet's PodResources socket; errors are ``grpc.aio.AioRpcError``."""

    def __init__(self, socket: Path, timeout: float = 5.0) -> None:
        self.socket = socket
        self.timeout = timeout
        self._channel: grpc.aio.Channel | None = None

    def _chan(self) -> grpc.aio.Channel:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(f"unix:{self.socket}")
        return self._channel

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(None)
            self._channel = None

    async def list_device_use(self) -> DeviceUse:
        """Every device of every resource that a listed pod's containers hold."""
        call = self._chan().unary_unary(
            "/v1.PodResourcesLister/List",
            request_serializer=pr.ListPodResourcesRequest.SerializeToString,
            response_deserializer=pr.ListPodResourcesResponse.FromString,
        )
        response: pr.ListPodResourcesResponse = await call(pr.ListPodResourcesRequest(), timeout=self.timeout)
        use: DeviceUse = defaultdict(lambda: defaultdict(set))
        for pod in response.pod_resources:
            key = f"{pod.namespace}/{pod.name}"
            for container in pod.containers:
                for devices in container.devices:
                    for dev_id in devices.device_ids:
                        use[devices.resource_name][dev_id].add(key)
        return use
