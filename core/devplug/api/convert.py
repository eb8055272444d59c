"""Conversions between protobuf messages and devplug's value types, and cached device encodings.

The ListAndWatch list is sent as raw bytes joined from per-device encodings
(:func:`encode_device_entry`), so a change to one device of 10,000 re-encodes
one device, not the list. An Allocate's answer is encoded the same way
(:func:`encode_allocate_response`): a device's mounts and device nodes are the
same objects from call to call, so their encodings are cached.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.types import CDIDevice, ContainerAllocation, Device, DeviceSpec, Health, Mount, Topology

__all__ = [
    "allocation_to_pb",
    "allocation_from_pb",
    "device_from_pb",
    "device_to_pb",
    "encode_allocate_response",
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


#: The one-byte varints (0 to 127): most lengths in a message.
_SMALL_VARINTS = tuple(bytes((i,)) for i in range(0x80))


def _varint(value: int) -> bytes:
    if value < 0x80:
        return _SMALL_VARINTS[value]
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(tag: int, data: bytes) -> bytes:
    """A length-delimited field (string, bytes, message): its tag byte, the length, the data."""
    return _SMALL_VARINTS[tag] + _varint(len(data)) + data


def _string_field(tag: int, text: str) -> bytes:
    """A proto3 string field: nothing when empty (the default is not sent)."""
    return _field(tag, text.encode()) if text else b""


# The tag bytes (field number << 3 | wire type 2) of the Allocate answer's fields (api.proto).
_RESPONSES_TAG = 0x0A  # AllocateResponse.container_responses = 1
_ENVS_TAG, _MOUNTS_TAG, _DEVICES_TAG, _ANNOTATIONS_TAG, _CDI_TAG = 0x0A, 0x12, 0x1A, 0x22, 0x2A  # = 1 .. 5
_READ_ONLY_TRUE = b"\x18\x01"  # Mount.read_only = 3, varint 1


@functools.lru_cache(maxsize=16384)
def _mount_field(mount: Mount) -> bytes:
    body = _string_field(0x0A, mount.container_path) + _string_field(0x12, mount.host_path)
    return _field(_MOUNTS_TAG, body + _READ_ONLY_TRUE if mount.read_only else body)


@functools.lru_cache(maxsize=16384)
def _device_spec_field(spec: DeviceSpec) -> bytes:
    body = _string_field(0x0A, spec.container_path) + _string_field(0x12, spec.host_path)
    return _field(_DEVICES_TAG, body + _string_field(0x1A, spec.permissions))


def _map_fields(tag: int, values: Mapping[str, str]) -> list[bytes]:
    """A ``map<string, string>`` field: one entry message (key = 1, value = 2, both written even when empty, as
    protobuf writes map entries) per key, in key order."""
    return [_field(tag, _field(0x0A, k.encode()) + _field(0x12, values[k].encode())) for k in sorted(values)]


def encode_container_allocation(allocation: ContainerAllocation) -> bytes:
    """The bytes of a ``ContainerAllocateResponse`` (proto3 wire format, map keys sorted)."""
    parts = _map_fields(_ENVS_TAG, allocation.envs) if allocation.envs else []
    for mount in allocation.mounts:
        parts.append(_mount_field(mount))
    for spec in allocation.devices:
        parts.append(_device_spec_field(spec))
    if allocation.annotations:
        parts.extend(_map_fields(_ANNOTATIONS_TAG, allocation.annotations))
    for cdi in allocation.cdi_devices:
        parts.append(_field(_CDI_TAG, _string_field(0x0A, cdi.name)))
    return b"".join(parts)


def encode_allocate_response(allocations: Iterable[ContainerAllocation]) -> bytes:
    """The bytes of the ``AllocateResponse`` answering with ``allocations``, one per container, in order.

    The same message ``AllocateResponse(container_responses=[allocation_to_pb(a) ...])`` serializes to,
    without building protobuf objects for every mount and device node of every call.
    """
    return b"".join([_field(_RESPONSES_TAG, encode_container_allocation(a)) for a in allocations])


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
