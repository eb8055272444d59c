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
  a terminal phase. The pod being admitted is in the pod manager and not
  terminal, so it is active during its own admission; finished (Succeeded)
  and rejected (Failed) pods are inactive;
* after a kubelet restart the pod manager is empty until the main loop has
  handled the config sources' first pod lists, and the sources are "ready"
  only after that (``syncLoopIteration`` calls ``sourcesReady.AddSource``
  after the handler; ``SourcesReady`` in ``pkg/kubelet/config/sources.go``).
  :attr:`PodManager.loaded` and :attr:`PodManager.sources_ready` model that window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
    """What admission gave one container: device IDs, their NUMA nodes at allocation time, Allocate's answers."""

    name: str
    init: bool
    restartable: bool = False
    devices: dict[str, tuple[str, ...]] = field(default_factory=dict)
    numa: dict[str, dict[str, tuple[int, ...]]] = field(default_factory=dict)
    allocations: dict[str, ContainerAllocation] = field(default_factory=dict)

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
    the pod manager and active, but not yet running).
    """

    spec: PodSpec
    uid: str
    phase: PodPhase = PodPhase.RUNNING
    admitting: bool = False
    containers: list[ContainerRecord] = field(default_factory=list)

    @property
    def label(self) -> str:
        """``namespace/name``."""
        return pod_label(self.spec)

    @property
    def active(self) -> bool:
        """Not in a terminal phase and not deleted (``filterOutInactivePods``)."""
        return self.phase is PodPhase.RUNNING

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
