"""The kubelet's pod manager, as a model: which pod objects it knows, their phases, and which are active.

Modelled on Kubernetes v1.32.10:

* every pod object has a UID; a pod re-created under the same name (by its
  controller) is a new object with a new UID;
* the pod manager holds every pod object the config sources gave it, whatever
  its phase, until the object is deleted (``HandlePodAdditions`` in
  ``pkg/kubelet/kubelet.go`` adds a pod *before* admitting it; ``rejectPod``
  only sets phase Failed, the object stays);
* *active* pods are those ``filterOutInactivePods``
  (``pkg/kubelet/kubelet_pods.go``) keeps from the pod manager's list: not in
  a terminal phase, or terminating (``IsPodTerminationRequested``) and not
  yet known terminated by their pod worker. The pod being admitted is in the
  pod manager and not terminal, so it is active during its own admission; a
  pod being deleted gracefully stays active until its containers are gone;
  finished (Succeeded) and rejected (Failed) pods are inactive;
* a pod removed from the pod manager (``HandlePodRemoves``: a static pod's
  manifest removed, a pod force-deleted) is not in its list at all, whatever
  its containers still do;
* after a kubelet restart the pod manager is empty until the main loop has
  handled the config sources' first pod lists, and the sources are "ready"
  only after that (``syncLoopIteration`` calls ``sourcesReady.AddSource``
  after the handler; ``SourcesReady`` in ``pkg/kubelet/config/sources.go``).
  :attr:`PodManager.loaded` and :attr:`PodManager.sources_ready` model that window;
* a static pod whose manifest is removed while the kubelet is down is in none
  of the restarted kubelet's pod lists: the pod manager never has it again,
  and no pod worker knows it (the new process starts with none), while the
  runtime still runs its sandbox and containers. Only housekeeping finds it
  (``HandlePodCleanups`` in ``pkg/kubelet/kubelet_pods.go``: a pod the
  runtime lists that ``workingPods`` lacks is an orphan);
  :meth:`PodManager.orphan` and :meth:`PodManager.orphans` keep those pods
  until housekeeping hands them to a pod worker.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from devplug.devkubelet.containers import RuntimeContainer
from devplug.devkubelet.model import AdmittedContainer, AdmittedPod, PodPhase, PodSpec
from devplug.types import ContainerAllocation

__all__ = ["ContainerRecord", "PodKey", "PodManager", "PodRecord", "pod_label"]

PodKey = tuple[str, str]


def pod_label(spec: PodSpec, container: str | None = None) -> str:
    """``namespace/name`` (and ``/container``), for messages and events."""
    pod = f"{spec.namespace}/{spec.name}"
    return f"{pod}/{container}" if container else pod


@dataclass
class ContainerRecord:
    """What admission gave one container: device IDs, their NUMA nodes at allocation time, Allocate's answers.

    ``runtime`` is the container the runtime created for it last (None
    before its first start, or when its creation failed: ``failure`` then
    holds the runtime's error).
    """

    name: str
    init: bool
    restartable: bool = False
    devices: dict[str, tuple[str, ...]] = field(default_factory=dict)
    numa: dict[str, dict[str, tuple[int, ...]]] = field(default_factory=dict)
    allocations: dict[str, ContainerAllocation] = field(default_factory=dict)
    runtime: RuntimeContainer | None = None
    failure: str | None = None

    @property
    def running(self) -> bool:
        """True while a process (or, without cgroups, the container) of it is alive."""
        return self.runtime is not None and self.runtime.running

    def admitted(self) -> AdmittedContainer:
        """This record as the public, frozen value."""
        return AdmittedContainer(
            name=self.name,
            devices=dict(self.devices),
            allocations=dict(self.allocations),
            init=self.init,
            restartable=self.restartable,
        )


@dataclass
class PodRecord:
    """One pod object: its spec, UID, phase and what admission gave its containers.

    ``admitting`` is True while the kubelet is admitting it (it is then in
    the pod manager and active, but not yet running). ``cgroup`` is its pod
    cgroup's literal path once the kubelet made it, ``sandbox`` its sandbox
    container; ``termination`` is the pod worker's termination once one was
    requested (``kill`` its current kill of the containers, replaced when the
    grace period shrinks).
    """

    spec: PodSpec
    uid: str
    phase: PodPhase = PodPhase.RUNNING
    admitting: bool = False
    containers: list[ContainerRecord] = field(default_factory=list)
    cgroup: str | None = None
    sandbox: RuntimeContainer | None = None
    termination: asyncio.Task[list[str]] | None = None
    kill: asyncio.Task[None] | None = None
    #: The pod worker's grace period once termination was requested (``podSyncStatus.gracePeriod``), else 0.
    grace_period: int = 0
    #: Whether the DRA manager prepared the pod's resource claims (True for a pod without claims once admitted).
    claims_prepared: bool = False
    #: Why the last prepare or unprepare of the pod's claims failed, None after a success.
    claims_error: str | None = None
    #: The pod object was deleted while it finished: it leaves the pod manager once its termination is done.
    delete_when_done: bool = False

    @property
    def label(self) -> str:
        """``namespace/name``."""
        return pod_label(self.spec)

    @property
    def active(self) -> bool:
        """Running or terminating, and not deleted (``filterOutInactivePods``)."""
        return self.phase in (PodPhase.RUNNING, PodPhase.TERMINATING)

    @property
    def containers_running(self) -> bool:
        """True while a container of the pod (not its sandbox) is alive."""
        return any(c.running for c in self.containers)

    def admitted(self) -> AdmittedPod:
        """This record as the public, frozen value."""
        return AdmittedPod(
            spec=self.spec, containers=tuple(c.admitted() for c in self.containers), uid=self.uid, phase=self.phase
        )

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
        """Every resource any container of the pod got, in first-use order."""
        return list(dict.fromkeys(r for c in self.containers for r in c.devices))


class PodManager:
    """Pod objects by UID, with the restart window.

    :meth:`get_pods` is the kubelet's ``podManager.GetPods()`` (empty while
    :attr:`loaded` is False); :meth:`active_pods` is ``GetActivePods``.
    :meth:`known` is every pod object that exists, whether or not the
    kubelet has loaded it yet.
    """

    def __init__(self) -> None:
        self._pods: dict[str, PodRecord] = {}  # by UID, in admission order; deleted pods leave
        self._latest: dict[PodKey, PodRecord] = {}  # the newest object per name, deleted ones included
        #: False from a kubelet restart until the main loop loaded the pods (``GetPods`` is empty meanwhile).
        self.loaded = True
        #: False from a kubelet restart until the config sources are all seen (``sourcesReady.AllReady``).
        self.sources_ready = True
        self._orphans: dict[str, PodRecord] = {}  # by UID: running, unknown to the pod manager and pod workers

    def add(self, record: PodRecord) -> None:
        """A new pod object (``podManager.AddPod``)."""
        if record.uid in self._pods:
            raise ValueError(f"pod UID {record.uid} is already used by {self._pods[record.uid].label}")
        self._pods[record.uid] = record
        self._latest[record.spec.key] = record

    def delete(self, record: PodRecord) -> None:
        """The pod object is deleted: it leaves the pod manager."""
        self._pods.pop(record.uid, None)
        record.phase = PodPhase.DELETED

    def orphan(self, record: PodRecord) -> None:
        """The pod's config source dropped it while the kubelet was down: the restarted kubelet never loads it.

        It leaves the pod manager (phase ``deleted``) without a termination:
        its containers run on, an orphan of the runtime until housekeeping
        finds it (:meth:`orphans`).
        """
        self.delete(record)
        self._orphans[record.uid] = record

    def orphans(self) -> list[PodRecord]:
        """The pods the runtime still has that neither the pod manager nor a pod worker knows, oldest first."""
        return list(self._orphans.values())

    def adopt_orphan(self, record: PodRecord) -> None:
        """Housekeeping handed the orphan to a pod worker (or found nothing of it left): no longer an orphan."""
        self._orphans.pop(record.uid, None)

    def by_name(self, key: PodKey) -> PodRecord | None:
        """The existing (not deleted) pod object called ``key``, or None."""
        record = self._latest.get(key)
        return record if record is not None and record.phase is not PodPhase.DELETED else None

    def latest(self, key: PodKey) -> PodRecord | None:
        """The newest pod object ever called ``key``, deleted or not, or None."""
        return self._latest.get(key)

    def by_uid(self, uid: str) -> PodRecord | None:
        """The existing pod object with this UID, or None."""
        return self._pods.get(uid)

    def known(self) -> list[PodRecord]:
        """Every existing pod object, in admission order, loaded by the kubelet or not."""
        return list(self._pods.values())

    def get_pods(self) -> list[PodRecord]:
        """``podManager.GetPods()``: every pod object the kubelet has loaded (none during the restart window)."""
        return self.known() if self.loaded else []

    def active_pods(self) -> list[PodRecord]:
        """``GetActivePods``: the loaded pods that are not in a terminal phase (the one being admitted included)."""
        return [p for p in self.get_pods() if p.active]

    def running(self) -> list[PodRecord]:
        """The pods whose containers live (admitted, not finished), whether or not the kubelet has loaded them."""
        return [p for p in self._pods.values() if p.active and not p.admitting]

    def live_uids(self) -> set[str]:
        """UIDs of pods whose containers live or are being admitted, ignoring the restart window."""
        return {uid for uid, p in self._pods.items() if p.active}
