"""The kubelet's device manager, as a model: which pod holds which devices, and how admission picks them.

Admission follows the kubelet's ``devicesToAllocate``: containers in order,
init containers first; devices of finished init containers are reused by later
containers of the same pod before anything new is taken (so one device ID can
be allocated twice in one pod with nothing released in between); then the
plugin's preferred allocation when it offers one (must-includes passed, IDs it
should not have named ignored, any shortfall filled here); then one Allocate
per container and resource. No gRPC here: the calls go through
:class:`PluginCalls`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from devplug.devkubelet.model import (
    AdmittedContainer,
    AdmittedPod,
    ContainerSpec,
    DeviceInfo,
    PluginOptions,
    PodSpec,
)
from devplug.errors import KubeletError
from devplug.types import ContainerAllocation

__all__ = ["ContainerRecord", "ContainerStartError", "DeviceManager", "PluginCalls", "PodRecord"]

PodKey = tuple[str, str]
#: Records one event: (kind, resource, detail, device IDs).
Recorder = Callable[[str, str, str, tuple[str, ...]], None]


class ContainerStartError(KubeletError):
    """A container of an admitted pod failed to start (PreStartContainer failed).

    The pod stays admitted and keeps its devices, as in the kubelet, which
    retries the start: call ``start_container`` again, or remove the pod.
    """

    def __init__(self, message: str, pod: PodKey, container: str) -> None:
        super().__init__(message)
        self.pod = pod
        self.container = container


class PluginCalls(Protocol):
    """What the device manager needs from a registered plugin (``PluginClient`` implements it)."""

    @property
    def options(self) -> PluginOptions:
        """The plugin's answer to GetDevicePluginOptions."""

    async def get_preferred_allocation(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> tuple[str, ...]:
        """GetPreferredAllocation for one container."""

    async def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation:
        """Allocate for one container."""

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        """PreStartContainer."""

    async def post_stop(self, device_ids: Sequence[str]) -> None:
        """PostStopContainer (KEP)."""

    async def deallocate(self, device_ids: Sequence[str]) -> None:
        """Deallocate (KEP)."""


@dataclass
class ContainerRecord:
    """One container's assignment: device IDs, their NUMA nodes at allocation time, Allocate's answers."""

    name: str
    init: bool
    devices: dict[str, tuple[str, ...]] = field(default_factory=dict)
    numa: dict[str, dict[str, tuple[int, ...]]] = field(default_factory=dict)
    allocations: dict[str, ContainerAllocation] = field(default_factory=dict)

    def admitted(self) -> AdmittedContainer:
        """This record as the public, frozen value."""
        return AdmittedContainer(
            name=self.name, devices=dict(self.devices), allocations=dict(self.allocations), init=self.init
        )


@dataclass
class PodRecord:
    """One admitted pod and its containers' assignments (the kubelet's checkpoint keeps these)."""

    spec: PodSpec
    containers: list[ContainerRecord] = field(default_factory=list)

    def admitted(self) -> AdmittedPod:
        """This record as the public, frozen value."""
        return AdmittedPod(spec=self.spec, containers=tuple(c.admitted() for c in self.containers))

    def container(self, name: str) -> ContainerRecord | None:
        """The container called ``name``, or None."""
        for container in self.containers:
            if container.name == name:
                return container
        return None

    def resource_devices(self, resource: str) -> list[str]:
        """The pod's distinct device IDs of ``resource``, in assignment order."""
        return list(dict.fromkeys(i for c in self.containers for i in c.devices.get(resource, ())))

    def resources(self) -> list[str]:
        """Every resource any container of the pod holds, in first-use order."""
        return list(dict.fromkeys(r for c in self.containers for r in c.devices))


def _label(spec: PodSpec, container: str | None = None) -> str:
    pod = f"{spec.namespace}/{spec.name}"
    return f"{pod}/{container}" if container else pod


class DeviceManager:
    """The pods and their device assignments, and the admission, start and removal procedures.

    ``plugin_for(resource)`` gives the currently registered plugin (or None);
    ``devices_for(resource)`` the resource's latest device list (or None if
    the resource is unknown); ``record`` receives every event.
    """

    def __init__(
        self,
        plugin_for: Callable[[str], PluginCalls | None],
        devices_for: Callable[[str], Sequence[DeviceInfo] | None],
        record: Recorder,
    ) -> None:
        self._plugin_for = plugin_for
        self._devices_for = devices_for
        self._record = record
        self._pods: dict[PodKey, PodRecord] = {}
        self._pending: PodRecord | None = None

    # -- queries ---------------------------------------------------------------------------------

    def records(self) -> list[PodRecord]:
        """The admitted pods, in admission order."""
        return list(self._pods.values())

    def get(self, key: PodKey) -> PodRecord | None:
        """The admitted pod with this (namespace, name), or None."""
        return self._pods.get(key)

    def in_use(self, resource: str) -> set[str]:
        """Device IDs of ``resource`` held by admitted pods (and by the pod being admitted)."""
        pods: Iterable[PodRecord] = self._pods.values()
        if self._pending is not None:
            pods = [*pods, self._pending]
        return {i for pod in pods for c in pod.containers for i in c.devices.get(resource, ())}

    # -- admission -------------------------------------------------------------------------------

    async def admit(self, spec: PodSpec, *, kep_mode: bool) -> AdmittedPod:
        """Allocate devices for every container of ``spec``, then start its containers.

        Raises :class:`KubeletError` when the pod is rejected (nothing is kept),
        :class:`ContainerStartError` when it was admitted but a container
        failed to start (the pod is kept).
        """
        if spec.key in self._pods:
            raise KubeletError(f"pod {_label(spec)} is already admitted; remove it first")
        record = PodRecord(spec)
        self._pending = record
        try:
            await self._allocate_pod(record)
        except KubeletError as exc:
            self._pending = None
            reason = str(exc)
            self._record("pod-rejected", "", f"{_label(spec)}: {reason}", ())
            if kep_mode:
                await self._release(record, post_stop=False)
            raise KubeletError(f"pod {_label(spec)} rejected: {reason}") from exc
        finally:
            self._pending = None
        self._pods[spec.key] = record
        self._record("pod-admitted", "", _label(spec), ())
        for container in record.containers:
            await self.start_container(spec.key, container.name)
        return record.admitted()

    async def _allocate_pod(self, record: PodRecord) -> None:
        reusable: dict[str, list[str]] = {}  # the kubelet's devicesToReuse, per resource
        for container in record.spec.ordered_containers():
            crec = ContainerRecord(container.name, container.init)
            record.containers.append(crec)
            for resource, count in container.requests.items():
                if count:
                    await self._allocate_container(record, container, crec, resource, count, reusable)
            for resource, ids in crec.devices.items():
                pool = reusable.setdefault(resource, [])
                if container.init:
                    pool.extend(i for i in ids if i not in pool)
                else:
                    pool[:] = [i for i in pool if i not in ids]

    async def _allocate_container(
        self,
        record: PodRecord,
        container: ContainerSpec,
        crec: ContainerRecord,
        resource: str,
        count: int,
        reusable: dict[str, list[str]],
    ) -> None:
        label = _label(record.spec, container.name)
        devices = self._devices_for(resource)
        plugin = self._plugin_for(resource)
        if devices is None:
            raise KubeletError(f"container {container.name}: the node has no resource {resource}")
        chosen = list(reusable.get(resource, ())[:count])
        needed = count - len(chosen)
        if needed:
            in_use = self.in_use(resource)
            available = [d.id for d in devices if d.healthy and d.id not in in_use and d.id not in chosen]
            if len(available) < needed:
                raise KubeletError(
                    f"container {container.name}: requested number of devices unavailable for {resource}. "
                    f"Requested: {needed}, Available: {len(available)}"
                )
            if plugin is not None and plugin.options.get_preferred_allocation_available:
                preferred = await self._preferred(plugin, label, resource, available, chosen, count)
                offered = set(available)
                for device_id in preferred:
                    if len(chosen) < count and device_id in offered and device_id not in chosen:
                        chosen.append(device_id)
            for device_id in available:
                if len(chosen) == count:
                    break
                if device_id not in chosen:
                    chosen.append(device_id)
        if plugin is None:
            raise KubeletError(f"container {container.name}: cannot allocate unregistered device {resource}")
        ids = tuple(chosen)
        try:
            allocation = await plugin.allocate(ids)
        except KubeletError as exc:
            self._record("allocate", resource, f"{label}: failed: {exc}", ids)
            raise KubeletError(f"container {container.name}: Allocate failed: {exc}") from exc
        self._record("allocate", resource, label, ids)
        numa = {d.id: d.numa_nodes for d in devices}
        crec.devices[resource] = ids
        crec.numa[resource] = {i: numa.get(i, ()) for i in ids}
        crec.allocations[resource] = allocation

    async def _preferred(
        self,
        plugin: PluginCalls,
        label: str,
        resource: str,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
    ) -> tuple[str, ...]:
        offered = [*must_include, *available]
        detail = f"{label}: size {size}, {len(offered)} available, must include {list(must_include)}"
        try:
            preferred = await plugin.get_preferred_allocation(offered, must_include, size)
        except KubeletError as exc:
            self._record("preferred-allocation", resource, f"{detail}: failed: {exc}", ())
            raise KubeletError(f"GetPreferredAllocation failed: {exc}") from exc
        self._record("preferred-allocation", resource, detail, preferred)
        return preferred

    # -- container start -------------------------------------------------------------------------

    async def start_container(self, key: PodKey, name: str) -> None:
        """Start (or restart) one container: PreStartContainer for each resource whose plugin asks for it."""
        record = self._pods.get(key)
        if record is None:
            raise KubeletError(f"no admitted pod {key[0]}/{key[1]}")
        crec = record.container(name)
        if crec is None:
            raise KubeletError(f"pod {_label(record.spec)} has no container {name!r}")
        label = _label(record.spec, name)
        for resource, ids in crec.devices.items():
            plugin = self._plugin_for(resource)
            if plugin is None:
                self._record("pre-start", resource, f"{label}: skipped, no plugin registered", ids)
                continue
            if not plugin.options.pre_start_required:
                continue
            try:
                await plugin.pre_start(ids)
            except KubeletError as exc:
                self._record("pre-start", resource, f"{label}: failed: {exc}", ids)
                raise ContainerStartError(
                    f"container {label} failed to start: PreStartContainer: {exc}", key, name
                ) from exc
            self._record("pre-start", resource, label, ids)

    # -- removal ---------------------------------------------------------------------------------

    async def remove(self, key: PodKey, *, kep_mode: bool) -> None:
        """Forget the pod; in KEP mode tell the plugins first (PostStopContainer, Deallocate).

        The pod is removed even when a KEP call fails; the failures are raised
        afterwards as one :class:`KubeletError`.
        """
        record = self._pods.pop(key, None)
        if record is None:
            raise KubeletError(f"no admitted pod {key[0]}/{key[1]}")
        failures = await self._release(record, post_stop=True) if kep_mode else []
        self._record("pod-removed", "", _label(record.spec), ())
        if failures:
            raise KubeletError(f"pod {_label(record.spec)} removed, but: " + "; ".join(failures))

    async def _release(self, record: PodRecord, *, post_stop: bool) -> list[str]:
        """The KEP calls for a pod that is gone (it must no longer be in ``_pods``)."""
        failures: list[str] = []
        for resource in record.resources():
            plugin = self._plugin_for(resource)
            if plugin is None:
                continue
            if post_stop and plugin.options.post_stop_required:
                for crec in record.containers:
                    ids = crec.devices.get(resource)
                    if not ids:
                        continue
                    label = _label(record.spec, crec.name)
                    try:
                        await plugin.post_stop(ids)
                    except KubeletError as exc:
                        self._record("post-stop", resource, f"{label}: failed: {exc}", ids)
                        failures.append(str(exc))
                    else:
                        self._record("post-stop", resource, label, ids)
            if plugin.options.deallocate_available:
                still_used = self.in_use(resource)
                ids = tuple(i for i in record.resource_devices(resource) if i not in still_used)
                if not ids:
                    continue
                try:
                    await plugin.deallocate(ids)
                except KubeletError as exc:
                    self._record("deallocate", resource, f"{_label(record.spec)}: failed: {exc}", ids)
                    failures.append(str(exc))
                else:
                    self._record("deallocate", resource, _label(record.spec), ids)
        return failures
