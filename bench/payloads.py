"""The messages both sides exchange, built once: what the kubelet sends and what the mock answers."""

from __future__ import annotations

from collections.abc import Sequence

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp

__all__ = [
    "allocate_request",
    "device_ids",
    "list_and_watch_bytes",
    "mock_allocate_response",
    "preferred_request",
    "preferred_response",
]


def device_ids(count: int, start: int = 0) -> list[str]:
    """The mock's device IDs ``mock<start>`` .. ``mock<start+count-1>``."""
    return [f"mock{i}" for i in range(start, start + count)]


def replica_ids(devices: int, replicas: int) -> list[str]:
    """Every replica ID of ``devices`` mock devices shared ``replicas`` ways, replica by replica
    (``mock0::0``, ``mock1::0``, ...), so consecutive IDs are on distinct devices, as the core's spread picks them."""
    return [f"mock{d}::{k}" for k in range(replicas) for d in range(devices)]


def allocate_request(ids: Sequence[str]) -> dp.AllocateRequest:
    """One container asking for ``ids``, as the kubelet sends it."""
    return dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=list(ids))])


def mock_allocate_response(ids: Sequence[str], host_dir: str) -> dp.AllocateResponse:
    """What the mock driver answers for ``ids`` (same fields, same sizes): the floor's precomputed answer."""
    return dp.AllocateResponse(
        container_responses=[
            dp.ContainerAllocateResponse(
                envs={"MOCK_DEVICES": ",".join(ids)},
                devices=[
                    dp.DeviceSpec(container_path=f"/dev/mock/{i}", host_path=f"{host_dir}/{i}", permissions="rw")
                    for i in ids
                ],
                mounts=[
                    dp.Mount(container_path=f"/var/run/mock/{i}", host_path=f"{host_dir}/{i}", read_only=True)
                    for i in ids
                ],
            )
        ]
    )


def preferred_request(available: Sequence[str], size: int) -> dp.PreferredAllocationRequest:
    """One container's GetPreferredAllocation, nothing must be included."""
    return dp.PreferredAllocationRequest(
        container_requests=[
            dp.ContainerPreferredAllocationRequest(available_deviceIDs=list(available), allocation_size=size)
        ]
    )


def preferred_response(ids: Sequence[str]) -> dp.PreferredAllocationResponse:
    return dp.PreferredAllocationResponse(container_responses=[dp.ContainerPreferredAllocationResponse(deviceIDs=ids)])


def list_and_watch_bytes(count: int, numa_nodes: int = 0) -> bytes:
    """A serialized ListAndWatchResponse of ``count`` healthy mock devices (the floor's precomputed push)."""
    devices = []
    for i in range(count):
        dev = dp.Device(ID=f"mock{i}", health="Healthy")
        if numa_nodes:
            dev.topology.nodes.add(ID=i % numa_nodes)
        devices.append(dev)
    return dp.ListAndWatchResponse(devices=devices).SerializeToString()
