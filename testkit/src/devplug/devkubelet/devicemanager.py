"""The kubelet's device manager, as a model: which container holds which devices, and how admission picks them.

Follows ``pkg/kubelet/cm/devicemanager/manager.go`` of Kubernetes v1.32.10
(``ManagerImpl``), function by function:

* :meth:`DeviceManager.allocate` is ``Allocate``: one container at a time;
  a plain init container's devices join the pod's reuse pool
  (``devicesToReuse``), an app container's or a sidecar's (restartable init
  container) leave it, so later app containers reuse a finished init
  container's devices (the same ID allocated twice, nothing released in
  between) but never a sidecar's. The pool belongs to one pod: the next
  pod's first Allocate discards it;
* ``allocateContainerResources``: for each resource of the container that
  is a device-plugin resource (``isDevicePluginResource``: the manager has a
  device list for it or has allocated it; other resources are skipped here
  and left to the admission predicates), ``UpdateAllocatedDevices`` first
  (once per container), then ``devicesToAllocate``, then one Allocate RPC per
  resource, with no pod identity in it. On an RPC error ``allocatedDevices``
  is rebuilt from ``podDevices`` and the error returned; on an empty reply the
  error is returned *without* that rebuild (the devices stay "allocated"
  until an ``UpdateAllocatedDevices`` drops some pod). The checkpoint is
  written at the end only when at least one resource needed an Allocate
  and every one succeeded (``needsUpdateCheckpoint``): a container that fails
  part-way leaves its first resources in ``podDevices`` but not on disk;
* ``UpdateAllocatedDevices``: once the config sources are ready, drop every
  ``podDevices`` entry whose pod is not active and rebuild
  ``allocatedDevices``; before that, nothing. It is lazy: nothing else frees
  devices, so a finished or rejected pod's devices stay attributed until the
  next allocation or PodResources List, which then hands them straight on;
* ``devicesToAllocate``: the kubelet's checks and texts, in its order; reuse
  first; then, with no topology manager hint (``filterByAffinity`` returns
  every available device as "no affinity", so the ``needed < aligned.Len()``
  branch is never taken), GetPreferredAllocation whenever devices are still
  needed after reuse and the plugin advertises it (even when exactly enough
  are available), offering the available devices plus the ones already
  chosen, which are passed as ``must_include``, with the container's whole
  request as the size; then the plugin's picks that are available, then the
  rest in the plugin's device order;
* ``GetDeviceRunContainerOptions``/``callPreStartContainerIfNeeded`` at each
  container start: PreStartContainer when the plugin asked for it (not after
  a restart until it registers again: the restored endpoint has no options),
  an error when the endpoint is stopped, and a fresh Allocate for an active
  pod's container that has no entry (lost across a restart).

Not modelled: the topology manager's NUMA hints, CPU and memory managers.
No gRPC here: the calls go through :class:`PluginCalls`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from devplug.api.convert import allocation_from_pb
from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.devkubelet.model import ContainerSpec, DeviceInfo, PluginOptions, PodDeviceEntry
from devplug.devkubelet.poddevices import DeviceAllocateInfo, PodDevices, devices_per_numa
from devplug.devkubelet.pods import ContainerRecord, PodKey, PodRecord, pod_label
from devplug.errors import KubeletError

__all__ = ["ContainerStartError", "DeviceManager", "Endpoint", "PluginCalls", "go_error"]

#: Records one event: (kind, resource, detail, device IDs).
Recorder = Callable[[str, str, str, tuple[str, ...]], None]


class ContainerStartError(KubeletError):
    """A container of an admitted pod failed to start (PreStartContainer, or a re-Allocate, failed).

    The pod stays admitted and keeps its devices, as in the kubelet, which
    retries the start: call ``start_container`` again, or remove the pod.
    """

    def __init__(self, message: str, pod: PodKey, container: str) -> None:
        super().__init__(message)
        self.pod = pod
        self.container = container


class PluginCalls(Protocol):
    """What the device manager needs from a registered plugin (``PluginClient`` implements it)."""

    async def get_preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> tuple[str, ...]:
        """GetPreferredAllocation for one container."""

    async def allocate_response(self, device_ids: Sequence[str]) -> dp.AllocateResponse:
        """Allocate for one container: the whole reply."""

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        """PreStartContainer."""

    async def post_stop(self, device_ids: Sequence[str]) -> None:
        """PostStopContainer (KEP)."""

    async def deallocate(self, device_ids: Sequence[str]) -> None:
        """Deallocate (KEP)."""


@dataclass(frozen=True)
class Endpoint:
    """The manager's ``endpointInfo`` for a resource.

    ``plugin`` is None while the endpoint is stopped (its stream ended, or it
    was restored from the checkpoint at start and the plugin has not
    registered since); ``options`` is None for an endpoint restored from the
    checkpoint (``newStoppedEndpointImpl`` with ``opts: nil``).
    """

    resource: str
    plugin: PluginCalls | None
    options: PluginOptions | None


_GO_CODE_NAMES = {"CANCELLED": "Canceled", "OK": "OK"}


def go_error(exc: KubeletError) -> str:
    """A failed plugin call as the kubelet's Go gRPC client words it (``rpc error: code = X desc = Y``)."""
    code = getattr(exc, "code", None)
    details = getattr(exc, "details", None)
    if not isinstance(code, str) or not isinstance(details, str):
        return str(exc)
    name = _GO_CODE_NAMES.get(code) or "".join(part.capitalize() for part in code.split("_"))
    return f"rpc error: code = {name} desc = {details}"


def _stopped(resource: str) -> str:
    return f"endpoint {resource} has been stopped"  # errEndpointStopped prints the endpoint struct


class DeviceManager:
    """``ManagerImpl``'s allocation state (``podDevices``, ``allocatedDevices``, the reuse pool) and procedures.

    ``endpoint_for(resource)`` is ``m.endpoints[resource]`` (None if absent);
    ``devices_for(resource)`` the resource's device list, health included
    (``allDevices``/``healthyDevices``; None when the manager has no device
    list entry for it); ``active_uids()`` the UIDs of ``GetActivePods``;
    ``sources_ready()`` ``sourcesReady.AllReady``; ``write_checkpoint(why)``
    writes the checkpoint (raising :class:`KubeletError` when the write
    fails); ``record`` receives every event.
    """

    def __init__(
        self,
        endpoint_for: Callable[[str], Endpoint | None],
        devices_for: Callable[[str], Sequence[DeviceInfo] | None],
        active_uids: Callable[[], set[str]],
        sources_ready: Callable[[], bool],
        write_checkpoint: Callable[[str], None],
        record: Recorder,
    ) -> None:
        self._endpoint_for = endpoint_for
        self._devices_for = devices_for
        self._active_uids = active_uids
        self._sources_ready = sources_ready
        self._write_checkpoint = write_checkpoint
        self._record = record
        #: ``podDevices``: who holds what, by pod UID, container and resource.
        self.pod_devices = PodDevices()
        #: ``allocatedDevices``: the devices the next ``devicesToAllocate`` will not hand out, per resource.
        self.allocated: dict[str, set[str]] = {}
        self._reuse_uid: str | None = None
        self._reuse: dict[str, list[str]] = {}  # devicesToReuse of the pod being allocated

    # -- state -----------------------------------------------------------------------------------

    def reset(self) -> None:
        """A new kubelet process: nothing allocated, nothing to reuse (``newManagerImpl``)."""
        self.pod_devices.clear()
        self.allocated = {}
        self._reuse_uid, self._reuse = None, {}

    def restored(self) -> None:
        """After ``fromCheckpointData``: ``allocatedDevices`` rebuilt from ``podDevices`` (``readCheckpoint``)."""
        self.allocated = self.pod_devices.devices()

    def is_device_plugin_resource(self, resource: str) -> bool:
        """``isDevicePluginResource``: the manager has a device list for it, or has allocated some of it."""
        return self._devices_for(resource) is not None or resource in self.allocated

    def update_allocated_devices(self) -> list[str]:
        """``UpdateAllocatedDevices``: once sources are ready, drop the entries of inactive pods; their UIDs."""
        active = self._active_uids()
        if not self._sources_ready():
            return []
        to_remove = sorted(self.pod_devices.pods() - active)
        if not to_remove:
            return []
        self.pod_devices.delete(to_remove)
        self.allocated = self.pod_devices.devices()
        self._record("pod-devices-dropped", "", f"entries of inactive pod(s) {', '.join(to_remove)} dropped", ())
        return to_remove

    def in_use(self, resource: str) -> set[str]:
        """``allocatedDevices[resource]`` as the next ``UpdateAllocatedDevices`` would leave it (nothing changed)."""
        if self._sources_ready():
            stale = self.pod_devices.pods() - self._active_uids()
            if stale:
                return {
                    i
                    for uid, _, res, info in self.pod_devices.entries()
                    if res == resource and uid not in stale
                    for i in info.device_ids
                }
        return set(self.allocated.get(resource, set()))

    def entries(self, label_of: Callable[[str], str]) -> list[PodDeviceEntry]:
        """Every ``podDevices`` entry, live pods or not (``label_of(uid)``: ``namespace/name`` or ``""``)."""
        return [
            PodDeviceEntry(uid, label_of(uid), container, resource, dict(info.devices_by_numa))
            for uid, container, resource, info in self.pod_devices.entries()
        ]

    # -- Allocate --------------------------------------------------------------------------------

    async def allocate(self, pod: PodRecord, container: ContainerSpec, crec: ContainerRecord) -> None:
        """``Allocate(pod, container)``: allocate the container's devices, then update the pod's reuse pool.

        Raises :class:`KubeletError` with the kubelet's error text.
        """
        if self._reuse_uid != pod.uid:  # entries of other pods are deleted from devicesToReuse
            self._reuse_uid, self._reuse = pod.uid, {}
        await self._allocate_container_resources(pod, container, crec)
        held = self.pod_devices.container_resources(pod.uid, container.name)
        for resource, info in held.items():
            pool = self._reuse.setdefault(resource, [])
            if container.init and not container.restartable:  # addContainerAllocatedResources
                pool.extend(i for i in info.device_ids if i not in pool)
            else:  # removeContainerAllocatedResources (app containers and sidecars keep theirs)
                pool[:] = [i for i in pool if i not in info.device_ids]

    async def _allocate_container_resources(
        self, pod: PodRecord, container: ContainerSpec, crec: ContainerRecord
    ) -> None:
        label = pod_label(pod.spec, container.name)
        updated = False
        needs_checkpoint = False
        for resource, needed in container.requests.items():
            if not self.is_device_plugin_resource(resource):
                continue
            if not updated:
                self.update_allocated_devices()  # garbage-collects stranded devices first
                updated = True
            ids = await self._devices_to_allocate(pod, container.name, resource, needed, self._reuse.get(resource, []))
            if not ids:
                continue
            needs_checkpoint = True
            endpoint = self._endpoint_for(resource)
            if endpoint is None:
                self.allocated = self.pod_devices.devices()
                raise KubeletError(f"unknown Device Plugin {resource}")
            try:
                if endpoint.plugin is None:
                    raise KubeletError(_stopped(resource))
                reply = await endpoint.plugin.allocate_response(ids)
            except KubeletError as exc:
                self._record("allocate", resource, f"{label}: failed: {exc}", ids)
                self.allocated = self.pod_devices.devices()  # restore allocatedDevices to podDevices' state
                raise KubeletError(go_error(exc)) from exc
            if not reply.container_responses:
                self._record("allocate", resource, f"{label}: failed: no container responses", ids)
                raise KubeletError(f"no containers return in allocation response {reply}")
            response = reply.container_responses[0]
            try:
                allocation = allocation_from_pb(response)
            except ValueError as exc:  # the kubelet would pass it on; devplug's types cannot hold it
                self._record("allocate", resource, f"{label}: failed: malformed response: {exc}", ids)
                raise KubeletError(f"malformed allocation response from {resource}: {exc}") from exc
            self._record("allocate", resource, label, ids)
            devices = self._devices_for(resource) or ()
            numa = {d.id: d.numa_nodes for d in devices}
            encoded = response.SerializeToString(deterministic=True)
            self.pod_devices.insert(
                pod.uid, container.name, resource, DeviceAllocateInfo(devices_per_numa(ids, numa), encoded)
            )
            crec.devices[resource] = ids
            crec.numa[resource] = {i: numa.get(i, ()) for i in ids}
            crec.allocations[resource] = allocation
        if needs_checkpoint:
            self._write_checkpoint(f"allocation for {label}")

    async def _devices_to_allocate(
        self, pod: PodRecord, container: str, resource: str, required: int, reusable: Sequence[str]
    ) -> tuple[str, ...]:
        needed = required
        existing = self.pod_devices.container_devices(pod.uid, container, resource)
        if existing is not None:
            needed -= len(existing)
            if needed != 0:
                raise KubeletError(
                    f'pod "{pod.uid}" container "{container}" changed request for resource "{resource}" '
                    f"from {len(existing)} to {required}"
                )
        if not self._sources_ready() and pod.active and not pod.admitting:
            return ()  # a kubelet restart: the container is running and already has its devices
        devices = self._devices_for(resource)
        if devices is None:
            raise KubeletError(f"cannot allocate unregistered device {resource}")
        healthy = [d.id for d in devices if d.healthy]
        if not healthy:
            raise KubeletError(f"no healthy devices present; cannot allocate unhealthy devices {resource}")
        if existing is not None and not set(existing) <= set(healthy):
            raise KubeletError(
                f"previously allocated devices are no longer healthy; cannot allocate unhealthy devices {resource}"
            )
        if needed == 0:
            return ()
        chosen: list[str] = []

        def take(candidates: Iterable[str]) -> bool:  # allocateRemainingFrom
            nonlocal needed
            for device_id in candidates:
                if device_id in chosen:
                    continue
                self.allocated.setdefault(resource, set()).add(device_id)
                chosen.append(device_id)
                needed -= 1
                if needed == 0:
                    return True
            return False

        if take(reusable):
            return tuple(chosen)
        in_use = self.allocated.get(resource, set())
        available = [i for i in healthy if i not in in_use]
        if len(available) < needed:
            raise KubeletError(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {needed}, Available: {len(available)}"
            )
        label = pod_label(pod.spec, container)
        preferred = await self._preferred(label, resource, [*chosen, *available], list(chosen), required)
        offered = set(available)
        if take(i for i in preferred if i in offered):
            return tuple(chosen)
        if take(available):
            return tuple(chosen)
        raise KubeletError(
            f"unexpectedly allocated less resources than required. Requested: {required}, Got: {required - needed}"
        )

    async def _preferred(
        self, label: str, resource: str, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> tuple[str, ...]:
        """``callGetPreferredAllocationIfAvailable``: the plugin's picks, or () when it offers none."""
        endpoint = self._endpoint_for(resource)
        if endpoint is None:
            raise KubeletError(f"endpoint not found in cache for a registered resource: {resource}")
        if endpoint.options is None or not endpoint.options.get_preferred_allocation_available:
            return ()
        detail = f"{label}: size {size}, {len(available)} available, must include {list(must_include)}"
        try:
            if endpoint.plugin is None:
                raise KubeletError(_stopped(resource))
            preferred = await endpoint.plugin.get_preferred_allocation(available, must_include, size)
        except KubeletError as exc:
            self._record("preferred-allocation", resource, f"{detail}: failed: {exc}", ())
            raise KubeletError(f"device plugin GetPreferredAllocation rpc failed with err: {go_error(exc)}") from exc
        self._record("preferred-allocation", resource, detail, preferred)
        return preferred

    # -- container start -------------------------------------------------------------------------

    async def run_container_options(
        self, pod: PodRecord, container: ContainerSpec, crec: ContainerRecord
    ) -> list[tuple[str, str]]:
        """``GetDeviceRunContainerOptions`` at a container's (re)start: PreStartContainer, re-Allocate if lost.

        Returns the run options' devices as ``(host path, container path)``
        (``deviceRunContainerOptions``: every resource's Allocate answer from
        ``podDevices``, the first device for a container path winning).
        Raises :class:`KubeletError` with the kubelet's text when the start must fail.
        """
        needs_reallocate = False
        for resource, count in container.requests.items():
            if not self.is_device_plugin_resource(resource) or count == 0:
                continue
            await self._pre_start_if_needed(pod, container.name, resource)
            if pod.uid not in self._active_uids():
                continue  # "pod deleted from activePods, skip to reAllocate"
            if self.pod_devices.container_devices(pod.uid, container.name, resource) is None:
                needs_reallocate = True
        if needs_reallocate:
            await self.allocate(pod, container, crec)
        return self.run_container_devices(pod.uid, container.name)

    def run_container_devices(self, uid: str, container: str) -> list[tuple[str, str]]:
        """``deviceRunContainerOptions``' devices: ``(host path, container path)``, first per container path."""
        devices: dict[str, str] = {}
        for info in self.pod_devices.container_resources(uid, container).values():
            response = dp.ContainerAllocateResponse()
            response.ParseFromString(info.alloc_response)
            for spec in response.devices:
                devices.setdefault(str(spec.container_path), str(spec.host_path))
        return [(host, path) for path, host in devices.items()]

    async def _pre_start_if_needed(self, pod: PodRecord, container: str, resource: str) -> None:
        endpoint = self._endpoint_for(resource)
        if endpoint is None:
            raise KubeletError(f"endpoint not found in cache for a registered resource: {resource}")
        if endpoint.options is None or not endpoint.options.pre_start_required:
            return
        ids = self.pod_devices.container_devices(pod.uid, container, resource)
        if ids is None:
            raise KubeletError(
                f"no devices found allocated in local cache for pod {pod.uid}, container {container}, "
                f"resource {resource}"
            )
        label = pod_label(pod.spec, container)
        try:
            if endpoint.plugin is None:
                raise KubeletError(_stopped(resource))
            await endpoint.plugin.pre_start(ids)
        except KubeletError as exc:
            self._record("pre-start", resource, f"{label}: failed: {exc}", ids)
            raise KubeletError(f"device plugin PreStartContainer rpc failed with err: {go_error(exc)}") from exc
        self._record("pre-start", resource, label, ids)
