"""A pod's life on the kubelet: admission, container starts, finishing, deletion, and the KEP's release calls.

Follows Kubernetes v1.32.10:

* **Admission** (``HandlePodAdditions`` in ``pkg/kubelet/kubelet.go``): the pod
  object joins the pod manager first (so it is active during its own
  admission), then the admit handlers run in order: the topology manager's
  ``admitPolicyNone`` (``pkg/kubelet/cm/topologymanager/scope.go``) calls the
  device manager's ``Allocate`` for each container, init containers first;
  then the predicate admit handler (``pkg/kubelet/lifecycle/predicate.go``),
  modelled only for extended resources no device plugin serves ("Node didn't
  have enough resource: ..."). A failing handler rejects the pod
  (``rejectPod``): phase Failed, the object stays in the pod manager (and in
  PodResources List), and whatever its earlier containers or resources were
  allocated stays in ``podDevices`` until the next ``UpdateAllocatedDevices``,
  which hands it to the next pod. A device manager error reaches the caller
  as the kubelet's ``UnexpectedAdmissionError`` text
  (``pkg/kubelet/cm/admission/errors.go``).
* **Re-creation under a name**: a finished or rejected pod's object is
  deleted by its controller, which creates a new object (new UID) under the
  same name; a running pod's name cannot be admitted again.
* **Container start**: ``GetDeviceRunContainerOptions`` for each container, in order.
* **Finishing**: the containers end, the pod turns Succeeded and stays in the
  pod manager; nothing is called on plugins (a stock kubelet never tells a
  plugin that devices were freed), and the devices stay attributed until
  the next ``UpdateAllocatedDevices``.
* **Deletion**: the pod object leaves the pod manager (a running pod finishes first).
* **The restart window**: pods loaded by the main loop after a restart; an
  admission during the window arrives with that first pod list, so it runs
  with the sources not yet ready (``UpdateAllocatedDevices`` does nothing)
  and the sources turn ready right after it.
* **KEP mode** (the unmerged "Add Deallocate and PostStopContainer to the
  Device Manager API"): when a pod finishes, PostStopContainer for each of
  its containers that holds devices, then Deallocate with the pod's devices
  no other live pod holds; a rejected pod's already-allocated devices get
  Deallocate. Only for plugins that advertise the calls.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from devplug.devkubelet.devicemanager import ContainerStartError, DeviceManager, Endpoint
from devplug.devkubelet.model import AdmittedPod, ContainerSpec, PodPhase, PodSpec
from devplug.devkubelet.pods import ContainerRecord, PodKey, PodManager, PodRecord, pod_label
from devplug.errors import KubeletError

__all__ = ["PodLifecycle", "pod_requests"]

Recorder = Callable[[str, str, str, tuple[str, ...]], None]


def pod_requests(spec: PodSpec) -> dict[str, int]:
    """The pod's effective request per resource, as the scheduler and kubelet count it.

    App containers and sidecars run together; each plain init container runs
    alone beside the sidecars started before it. The request is the larger of
    the two (``PodRequests`` in ``k8s.io/component-helpers/resource``).
    """
    total: dict[str, int] = {}
    for container in spec.containers:
        if not container.init or container.restartable:
            for resource, count in container.requests.items():
                total[resource] = total.get(resource, 0) + count
    sidecars: dict[str, int] = {}
    for container in spec.containers:
        if not container.init:
            continue
        if container.restartable:
            for resource, count in container.requests.items():
                sidecars[resource] = sidecars.get(resource, 0) + count
            continue
        for resource, count in container.requests.items():
            total[resource] = max(total.get(resource, 0), count + sidecars.get(resource, 0))
    return total


class PodLifecycle:
    """Admits, starts, finishes and deletes pods over a :class:`PodManager` and a :class:`DeviceManager`."""

    def __init__(
        self,
        pods: PodManager,
        manager: DeviceManager,
        endpoint_for: Callable[[str], Endpoint | None],
        record: Recorder,
    ) -> None:
        self._pods = pods
        self._manager = manager
        self._endpoint_for = endpoint_for
        self._record = record

    # -- the restart window ----------------------------------------------------------------------

    def load_pods(self) -> bool:
        """The main loop has handled the sources' first pod lists: the pod manager is full, sources ready.

        Returns False when there was no window to end.
        """
        if self._pods.loaded and self._pods.sources_ready:
            return False
        self._pods.loaded = True
        self._pods.sources_ready = True
        self._record("pods-loaded", "", f"{len(self._pods.known())} pod(s) in the pod manager; sources ready", ())
        return True

    # -- admission -------------------------------------------------------------------------------

    async def admit(self, spec: PodSpec, *, kep_mode: bool) -> AdmittedPod:
        """Admit a pod object (see the module docstring); raises :class:`KubeletError` when it is rejected.

        Raises :class:`ContainerStartError` when it was admitted but a
        container failed to start (the pod stays running).
        """
        label = pod_label(spec)
        current = self._pods.by_name(spec.key)
        if current is not None and current.phase is PodPhase.RUNNING:
            raise KubeletError(f"pod {label} is already admitted; remove it first")
        other = self._pods.by_uid(spec.uid) if spec.uid is not None else None
        if other is not None:
            raise KubeletError(f"pod UID {spec.uid} is already used by pod {other.label}")
        window = not (self._pods.loaded and self._pods.sources_ready)
        if window:
            self._pods.loaded = True  # the new pod arrives with the main loop's first pod list
        try:
            if current is not None:
                detail = f"{label} (uid {current.uid}, {current.phase}): replaced by a new pod"
                self._pods.delete(current)
                self._record("pod-removed", "", detail, ())
            record = PodRecord(spec, spec.uid or str(uuid.uuid4()), admitting=True)
            self._pods.add(record)
            await self._allocate(record, kep_mode=kep_mode)
        finally:
            if window:
                self.load_pods()
        record.admitting = False
        self._record("pod-admitted", "", f"{label} (uid {record.uid})", ())
        for container in record.spec.ordered_containers():
            await self.start_container(spec.key, container.name)
        return record.admitted()

    async def _allocate(self, record: PodRecord, *, kep_mode: bool) -> None:
        label = record.label
        try:
            try:
                for container in record.spec.ordered_containers():
                    crec = ContainerRecord(container.name, container.init, container.restartable)
                    record.containers.append(crec)
                    await self._manager.allocate(record, container, crec)
            except KubeletError as exc:
                raise KubeletError(
                    f"UnexpectedAdmissionError: Allocate failed due to {exc}, which is unexpected"
                ) from exc
            self._check_predicates(record)
        except KubeletError as exc:
            record.admitting = False
            record.phase = PodPhase.REJECTED
            reason = str(exc)
            held = tuple(i for r in record.resources() for i in record.resource_devices(r))
            self._record("pod-rejected", "", f"{label} (uid {record.uid}): {reason}", held)
            if kep_mode:
                await self._release(record, post_stop=False)
            raise KubeletError(f"pod {label} rejected: {reason}") from exc

    def _check_predicates(self, record: PodRecord) -> None:
        """The predicate admit handler, for extended resources the device manager does not know (capacity 0)."""
        for resource, requested in pod_requests(record.spec).items():
            if requested > 0 and not self._manager.is_device_plugin_resource(resource):
                raise KubeletError(
                    f"OutOf{resource}: Node didn't have enough resource: {resource}, "
                    f"requested: {requested}, used: 0, capacity: 0"
                )

    # -- container start -------------------------------------------------------------------------

    async def start_container(self, key: PodKey, name: str) -> None:
        """Start (or restart) one container of a running pod (``GetDeviceRunContainerOptions``)."""
        record = self._pods.by_name(key)
        if record is None:
            raise KubeletError(f"no admitted pod {key[0]}/{key[1]}")
        if record.phase is not PodPhase.RUNNING:
            raise KubeletError(f"pod {record.label} is {record.phase}, its containers cannot start")
        crec = record.container(name)
        spec = _container_spec(record.spec, name)
        if crec is None or spec is None:
            raise KubeletError(f"pod {record.label} has no container {name!r}")
        label = pod_label(record.spec, name)
        try:
            await self._manager.run_container_options(record, spec, crec)
        except KubeletError as exc:
            raise ContainerStartError(f"container {label} failed to start: {exc}", key, name) from exc

    # -- finishing and deletion ------------------------------------------------------------------

    async def finish(self, key: PodKey, *, kep_mode: bool) -> None:
        """The pod's containers end (phase Succeeded); the pod object stays. KEP mode: PostStop, Deallocate."""
        record = self._pods.by_name(key)
        if record is None or record.phase is not PodPhase.RUNNING:
            state = "no such pod" if record is None else f"it is {record.phase}"
            raise KubeletError(f"cannot finish pod {key[0]}/{key[1]}: {state}")
        failures = await self._finish(record, kep_mode=kep_mode)
        if failures:
            raise KubeletError(f"pod {record.label} finished, but: " + "; ".join(failures))

    async def remove(self, key: PodKey, *, kep_mode: bool) -> None:
        """The pod object is deleted; a running pod finishes first (KEP mode: PostStop, Deallocate)."""
        record = self._pods.by_name(key)
        if record is None:
            raise KubeletError(f"no admitted pod {key[0]}/{key[1]}")
        failures = await self._finish(record, kep_mode=kep_mode) if record.phase is PodPhase.RUNNING else []
        self.load_pods()
        self._pods.delete(record)
        self._record("pod-removed", "", f"{record.label} (uid {record.uid})", ())
        if failures:
            raise KubeletError(f"pod {record.label} removed, but: " + "; ".join(failures))

    async def _finish(self, record: PodRecord, *, kep_mode: bool) -> list[str]:
        self.load_pods()  # the pod's status reaches the kubelet through the pod manager
        record.phase = PodPhase.FINISHED
        # The containers have ended by now; a KEP kubelet tells the plugin afterwards.
        self._record("pod-finished", "", f"{record.label} (uid {record.uid})", ())
        return await self._release(record, post_stop=True) if kep_mode else []

    async def _release(self, record: PodRecord, *, post_stop: bool) -> list[str]:
        """The KEP's calls for a pod that is no longer live: PostStopContainer per container, then Deallocate."""
        failures: list[str] = []
        live = self._pods.live_uids() - {record.uid}
        for resource in record.resources():
            endpoint = self._endpoint_for(resource)
            plugin = endpoint.plugin if endpoint is not None else None
            options = endpoint.options if endpoint is not None else None
            if plugin is None or options is None:
                continue
            if post_stop and options.post_stop_required:
                for crec in record.containers:
                    ids = crec.devices.get(resource)
                    if not ids:
                        continue
                    label = pod_label(record.spec, crec.name)
                    try:
                        await plugin.post_stop(ids)
                    except KubeletError as exc:
                        self._record("post-stop", resource, f"{label}: failed: {exc}", ids)
                        failures.append(str(exc))
                    else:
                        self._record("post-stop", resource, label, ids)
            if options.deallocate_available:
                held = {
                    i
                    for uid, _, res, info in self._manager.pod_devices.entries()
                    if res == resource and uid in live
                    for i in info.device_ids
                }
                ids = tuple(i for i in record.resource_devices(resource) if i not in held)
                if not ids:
                    continue
                try:
                    await plugin.deallocate(ids)
                except KubeletError as exc:
                    self._record("deallocate", resource, f"{record.label}: failed: {exc}", ids)
                    failures.append(str(exc))
                else:
                    self._record("deallocate", resource, record.label, ids)
        return failures


def _container_spec(spec: PodSpec, name: str) -> ContainerSpec | None:
    for container in spec.containers:
        if container.name == name:
            return container
    return None
