"""Conversions between protobuf messages and devplug's value types, and cached device encodings.

The ListAndWatch list is sent as raw bytes joined from per-device encodings
(:func:`encode_device_entry`), so a change to one device of 10,000 re-encodes
one device, not the list.
"""

from __future__ import annotations

from collections.abc import Iterable

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.types import CDIDevice, ContainerAllocation, Device, DeviceSpec, Health, Mount, Topology

__all__ = [
    "allocation_to_pb",
    "allocation_from_pb",
    "device_from_pb",
    "device_to_pb",
    "encode_device_entry",
    "encode_list_and_watch",
    "options_to_pb",
]

_LIST_FIELD_TAG = b"\x0a"  # ListAndWatchResponse.devices: field 1, wire type 2 (length-delimited)


def device_to_pb(device: Device) -> dp.Device:
    msg = dp.Device(ID=device.id, health=device.health.value)
    if device.topology.numa_nodes:
        msg.topology.nodes.extend(dp.NUMANode(ID=n) for n in device.topology.numa_nodes)
    return msg


def device_from_pb(msg: dp.Device) -> Device:
    """A device as the kubelet reads it: any health other than "Healthy" is unhealthy."""
    health = Health.HEALTHY if msg.health == Health.HEALTHY.value else Health.UNHEALTHY
    nodes = tuple(int(n.ID) for n in msg.topology.nodes) if msg.HasField("topology") else ()
    return Device(msg.ID, health, Topology(nodes))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_device_entry(device: Device) -> bytes:
    """One device as the bytes of a ``devices`` entry of ListAndWatchResponse (tag, length, message)."""
    body = device_to_pb(device).SerializeToString(deterministic=True)
    return _LIST_FIELD_TAG + _varint(len(body)) + body


def encode_list_and_watch(entries: Iterable[bytes]) -> bytes:
    """A serialized ListAndWatchResponse from entries made by :func:`encode_device_entry`."""
    return b"".join(entries)


def options_to_pb(
    pre_start: bool, preferred_allocation: bool, post_stop: bool, deallocate: bool
) -> dp.DevicePluginOptions:
    return dp.DevicePluginOptions(
        pre_start_required=pre_start,
        get_preferred_allocation_available=preferred_allocation,
        post_stop_required=post_stop,
        deallocate_available=deallocate,
    )


def allocation_to_pb(allocation: ContainerAllocation) -> dp.ContainerAllocateResponse:
    return dp.ContainerAllocateResponse(
        envs=dict(allocation.envs),
        mounts=[
            dp.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in allocation.mounts
        ],
        devices=[
            dp.DeviceSpec(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
            for d in allocation.devices
        ],
        annotations=dict(allocation.annotations),
        cdi_devices=[dp.CDIDevice(name=c.name) for c in allocation.cdi_devices],
    )


def allocation_from_pb(msg: dp.ContainerAllocateResponse) -> ContainerAllocation:
    return ContainerAllocation(
        envs=dict(msg.envs),
        mounts=tuple(Mount(m.container_path, m.host_path, m.read_only) for m in msg.mounts),
        devices=tuple(DeviceSpec(d.container_path, d.host_path, d.permissions) for d in msg.devices),
        annotations=dict(msg.annotations),
        cdi_devices=tuple(CDIDevice(c.name) for c in msg.cdi_devices),
    )
