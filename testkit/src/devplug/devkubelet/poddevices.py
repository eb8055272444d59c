"""The kubelet's ``podDevices`` store: which devices it attributes to which container of which pod UID.

Modelled on ``pkg/kubelet/cm/devicemanager/pod_devices.go`` (Kubernetes
v1.32.10): entries keyed by pod UID, container name (init containers
included) and resource, each holding the devices per NUMA node
(``checkpoint.DevicesPerNUMA``; node -1, ``nodeWithoutTopology``, for a
device without topology) and the plugin's ``ContainerAllocateResponse``.
Entries are only ever dropped a whole pod at a time, by the device manager's
``UpdateAllocatedDevices``; nothing here knows whether a pod is still alive.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["NODE_WITHOUT_TOPOLOGY", "DeviceAllocateInfo", "PodDevices", "devices_per_numa"]

#: The NUMA node the kubelet files devices without topology under (``nodeWithoutTopology`` in manager.go).
NODE_WITHOUT_TOPOLOGY = -1


def devices_per_numa(ids: Iterable[str], numa: Mapping[str, tuple[int, ...]]) -> dict[int, tuple[str, ...]]:
    """Devices filed per NUMA node as ``allocateContainerResources`` does (every node of a device; -1 for none)."""
    per_node: dict[int, list[str]] = {}
    for device_id in ids:
        nodes = numa.get(device_id, ()) or (NODE_WITHOUT_TOPOLOGY,)
        for node in nodes:
            per_node.setdefault(node, []).append(device_id)
    return {node: tuple(devs) for node, devs in per_node.items()}


@dataclass(frozen=True)
class DeviceAllocateInfo:
    """One ``deviceAllocateInfo``: devices per NUMA node and the plugin's serialized ``ContainerAllocateResponse``."""

    devices_by_numa: Mapping[int, tuple[str, ...]]
    alloc_response: bytes

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices_by_numa", MappingProxyType(dict(self.devices_by_numa)))

    @property
    def device_ids(self) -> tuple[str, ...]:
        """The distinct device IDs (``DevicesPerNUMA.Devices``)."""
        return tuple(dict.fromkeys(i for ids in self.devices_by_numa.values() for i in ids))

    def numa_nodes(self) -> dict[str, tuple[int, ...]]:
        """Each device's NUMA nodes (empty for a device without topology), as ``getContainerDevices`` rebuilds them."""
        nodes: dict[str, list[int]] = {}
        for node, ids in self.devices_by_numa.items():
            for device_id in ids:
                found = nodes.setdefault(device_id, [])
                if node != NODE_WITHOUT_TOPOLOGY:
                    found.append(node)
        return {device_id: tuple(sorted(found)) for device_id, found in nodes.items()}


class PodDevices:
    """``podDevices``: pod UID -> container -> resource -> :class:`DeviceAllocateInfo`."""

    def __init__(self) -> None:
        self._devs: dict[str, dict[str, dict[str, DeviceAllocateInfo]]] = {}

    def pods(self) -> set[str]:
        """The pod UIDs that have entries."""
        return set(self._devs)

    def insert(self, uid: str, container: str, resource: str, info: DeviceAllocateInfo) -> None:
        """Record (or replace) one container's devices of one resource."""
        self._devs.setdefault(uid, {}).setdefault(container, {})[resource] = info

    def delete(self, uids: Iterable[str]) -> None:
        """Forget every entry of these pods."""
        for uid in uids:
            self._devs.pop(uid, None)

    def clear(self) -> None:
        """Forget everything (a new kubelet process starts empty)."""
        self._devs.clear()

    def container_devices(self, uid: str, container: str, resource: str) -> tuple[str, ...] | None:
        """The container's device IDs of ``resource``, or None without an entry (``containerDevices``)."""
        info = self._devs.get(uid, {}).get(container, {}).get(resource)
        return info.device_ids if info is not None else None

    def container_resources(self, uid: str, container: str) -> dict[str, DeviceAllocateInfo]:
        """Every resource's entry of one container (``getContainerDevices``); empty without entries."""
        return dict(self._devs.get(uid, {}).get(container, {}))

    def devices(self) -> dict[str, set[str]]:
        """Every attributed device per resource, whoever holds it (``podDevices.devices``)."""
        result: dict[str, set[str]] = {}
        for containers in self._devs.values():
            for resources in containers.values():
                for resource, info in resources.items():
                    result.setdefault(resource, set()).update(info.device_ids)
        return result

    def entries(self) -> Iterator[tuple[str, str, str, DeviceAllocateInfo]]:
        """Every entry as (pod UID, container, resource, info), in insertion order."""
        for uid, containers in self._devs.items():
            for container, resources in containers.items():
                for resource, info in resources.items():
                    yield uid, container, resource, info
