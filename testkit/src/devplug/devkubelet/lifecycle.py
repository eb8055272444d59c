"""A pod's life on the kubelet: admission, container starts, finishing, deletion, and the KEP's release calls.

Follows Kubernetes v1.32.10:

* **The sync loop and the pod workers** (``syncLoopIteration`` in
  ``pkg/kubelet/kubelet.go``; ``podWorkers`` in ``pkg/kubelet/pod_workers.go``):
  :meth:`PodLifecycle.admit` and the removals are what the kubelet's one
  sync loop does for a pod ``ADD``, ``UPDATE`` or ``REMOVE``; the
  :class:`~devplug.devkubelet.kubelet.DevKubelet` runs them as turns of its
  :class:`~devplug.devkubelet.syncloop.SyncLoop`, one at a time, so a plugin
  holding Allocate holds them all. What the loop hands on runs in the pod's
  worker (:meth:`PodLifecycle.pod_worker`, one per pod, its work one piece at
  a time, outside the loop): the claims, sandbox and container starts of an
  admitted pod (:meth:`PodLifecycle.start_admitted`), a restart, the kill of
  its containers (after the start under way returned; the starts stop once
  the pod is being killed) and what follows the kill.
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
* **The pod's cgroup and sandbox** (``SyncPod``): once admitted, the pod
  cgroup is made (``podContainerManager.EnsureExists``) and the sandbox runs
  in it (``createPodSandbox``), then the containers start.
* **Container start** (``startContainer`` in
  ``pkg/kubelet/kuberuntime/kuberuntime_container.go``), init containers
  first, each to completion: ``GetDeviceRunContainerOptions`` (a failure is
  ``CreateContainerConfigError``), then ``CreateContainer`` with the run
  options' devices (a failure is ``CreateContainerError``: the runtime
  refuses a DeviceSpec whose host path is not a device node, see
  :mod:`~devplug.devkubelet.devicespecs`), then the start. A failed
  container does not run and the pod stays admitted. Starting a container
  again replaces the running one (as after a crash: it is killed first).
* **Finishing**: the containers end on their own, the pod turns Succeeded and
  stays in the pod manager; its sandbox is stopped and its cgroup removed
  (``SyncTerminatingPod``, ``SyncTerminatedPod``); nothing is called on
  plugins (a stock kubelet never tells a plugin that devices were freed),
  and the devices stay attributed until the next ``UpdateAllocatedDevices``.
* **Killing a pod's containers** (``killPodWithSyncResult`` and
  ``killContainer`` in ``pkg/kubelet/kuberuntime``): every container at once
  with the pod worker's effective grace period
  (``calculateEffectiveGracePeriod`` in ``pkg/kubelet/pod_workers.go``: the
  pod object's ``deletionGracePeriodSeconds`` when set and smaller, else the
  pod's ``terminationGracePeriodSeconds``, never below 1; it only ever
  shrinks), raised to ``minimumGracePeriodInSeconds`` (2); then the
  sandbox is stopped (``StopPodSandbox``) and, once the pod is terminated,
  its cgroup destroyed: every process left in it SIGKILLed, then removed
  (``SyncTerminatedPod`` calls ``podContainerManager.Destroy``).
* **Graceful deletion** (``kubectl delete``): the API server sets the pod's
  deletion grace period to its ``terminationGracePeriodSeconds``; the pod
  stays in the pod manager, active, while its containers are killed; once
  the pod is terminated and its cgroup gone the status manager deletes the
  object (``canBeDeleted`` in ``pkg/kubelet/status/status_manager.go``) and
  it leaves the pod manager. A grace period of 0 deletes the object at once,
  as a force deletion does.
* **The removal window**: a static pod whose manifest is removed, and a pod
  deleted with ``--grace-period=0 --force`` (the API server deletes the
  object at once: ``updateForGracefulDeletionAndFinalizers`` in the generic
  registry store), leave the pod manager at once (``HandlePodRemoves``
  calls ``podManager.RemovePod``, then ``deletePod`` asks the pod worker to
  kill the pod): PodResources and the next ``UpdateAllocatedDevices`` no
  longer see them, while their containers are killed in the background with
  the effective grace period (static pod: its own; force deletion: the
  object's 0, so 1, so 2 s in ``killContainer``).
* **The restart window**: pods loaded by the main loop after a restart; an
  admission during the window arrives with that first pod list, so it runs
  with the sources not yet ready (``UpdateAllocatedDevices`` does nothing)
  and the sources turn ready right after it.
* **Orphans and housekeeping** (``HandlePodCleanups`` in
  ``pkg/kubelet/kubelet_pods.go``, run by ``syncLoopIteration`` on the
  housekeeping ticker once ``sourcesReady.AllReady()``): a static pod whose
  manifest was removed while the kubelet was down
  (:meth:`PodLifecycle.orphan_static_pod`) is in no pod list of the
  restarted kubelet, so the pod manager never loads it and no pod worker
  knows it, while the runtime still runs it; its devices, restored from the
  checkpoint (``readCheckpoint``), stay in ``podDevices`` until the next
  ``UpdateAllocatedDevices`` prunes them (it is not an active pod), which
  hands them to the next pod while its containers still run. Housekeeping
  (:meth:`PodLifecycle.housekeeping`) finds it among the runtime's pods
  (``runningRuntimePods``) that ``workingPods`` lacks and, in the same call:
  asks a pod worker to kill it (``podWorkers.UpdatePod`` with
  ``SyncPodKill``, ``RunningPod`` and ``KillPodOptions{
  PodTerminationGracePeriodSecondsOverride: 1}``;
  ``SyncTerminatingRuntimePod`` in ``pkg/kubelet/kubelet.go`` kills with a
  grace period of 1, which ``killContainer`` raises to
  ``minimumGracePeriodInSeconds``, 2 s: SIGTERM, SIGKILL after 2 s, then
  the sandbox), and destroys its pod cgroup (``cleanupOrphanedPodCgroups``:
  the orphan is not in ``possiblyRunningPods``, which was taken from the pod
  workers before it joined them, and a dev kubelet pod has no volumes, so
  ``go pcm.Destroy``: every process of the pod SIGKILLed, then the cgroup
  removed, as ``SyncTerminatedPod`` destroys a known pod's). So the orphan's
  containers die at once, SIGTERM or not. The pod worker then forgets the
  pod (``completeTerminatingRuntimePod``): no ``SyncTerminatedPod``, no
  status, and, without its pod spec, no KEP calls.
* **Resource claims** (DRA, see :mod:`~devplug.devkubelet.dra.podclaims`):
  a pod's claims are prepared after its admission and before its sandbox
  (a failure leaves the pod admitted with nothing running, until a later sync
  prepares them), and unprepared after its containers stopped, before it
  finishes or leaves (a failure keeps it terminating, tried again after the
  pod worker's back-off).
* **KEP mode** (the unmerged "Add Deallocate and PostStopContainer to the
  Device Manager API"): when a pod finishes, PostStopContainer for each of
  its containers that holds devices, then Deallocate with the pod's devices
  no other live pod holds; a rejected pod's already-allocated devices get
  Deallocate. Only for plugins that advertise the calls.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from devplug.devkubelet.containers import ContainerCreateError, ContainerRuntime
from devplug.devkubelet.devicemanager import ContainerStartError, DeviceManager, Endpoint
from devplug.devkubelet.dra.podclaims import ClaimUnprepareError, PodClaims
from devplug.devkubelet.model import AdmittedPod, ContainerSpec, PodPhase, PodSpec
from devplug.devkubelet.pods import ContainerRecord, PodKey, PodManager, PodRecord, pod_label
from devplug.errors import KubeletError

__all__ = ["MINIMUM_GRACE_PERIOD", "ORPHAN_GRACE_PERIOD", "PodLifecycle", "effective_grace_period", "pod_requests"]

_log = logging.getLogger("devplug.devkubelet")

#: ``minimumGracePeriodInSeconds`` (``pkg/kubelet/kuberuntime/kuberuntime_manager.go``): killContainer's floor.
MINIMUM_GRACE_PERIOD = 2
#: The grace period housekeeping kills an orphan with: ``PodTerminationGracePeriodSecondsOverride`` in
#: ``HandlePodCleanups`` and ``gracePeriod := int64(1)`` in ``SyncTerminatingRuntimePod`` (``killContainer`` raises
#: it to :data:`MINIMUM_GRACE_PERIOD`).
ORPHAN_GRACE_PERIOD = 1


def effective_grace_period(spec: PodSpec, deletion_grace: int | None, current: int = 0) -> int:
    """``calculateEffectiveGracePeriod``: the grace period the pod worker kills with.

    ``deletion_grace`` is the pod object's ``deletionGracePeriodSeconds`` (None
    when not set, as for a static pod whose manifest was removed);
    ``current`` the pod worker's grace period so far (0 before termination).
    """
    grace, overridden = current, False
    if deletion_grace is not None and (grace == 0 or deletion_grace < grace):
        grace, overridden = deletion_grace, True
    if not overridden and grace == 0:
        grace = spec.termination_grace_period
    return max(grace, 1)


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
        runtime: ContainerRuntime,
        claims: PodClaims | None = None,
    ) -> None:
        self._pods = pods
        self._manager = manager
        self._endpoint_for = endpoint_for
        self._record = record
        self._runtime = runtime
        self._claims = claims if claims is not None else PodClaims(None, lambda *_: None, backoff=None)
        self._terminations: set[asyncio.Task[list[str]]] = set()
        self._kills: set[asyncio.Task[None]] = set()
        self._workers: dict[str, asyncio.Lock] = {}

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

    # -- orphans and housekeeping ----------------------------------------------------------------

    def orphan_static_pod(self, key: PodKey) -> PodRecord:
        """The pod's static manifest is removed while the kubelet is stopped: an orphan after the restart.

        It leaves the pod manager now (phase ``deleted``), nothing is killed:
        its containers and sandbox run on (see the module docstring). Raises
        :class:`KubeletError` unless the pod runs.
        """
        record = self._pods.by_name(key)
        if record is None or record.phase is not PodPhase.RUNNING or record.admitting:
            state = "no such pod" if record is None else f"it is {record.phase}"
            raise KubeletError(f"cannot remove the static pod manifest of {key[0]}/{key[1]}: {state}")
        self._pods.orphan(record)
        detail = (
            f"{record.label} (uid {record.uid}): its static pod manifest was removed while the kubelet was stopped; "
            "its containers run on"
        )
        self._record("pod-removed", "", detail, ())
        return record

    def housekeeping(self) -> list[PodRecord]:
        """``HandlePodCleanups``, as far as pods are concerned: kill every orphan (see the module docstring).

        The sync loop's part of a housekeeping tick, after the caller checked
        ``sourcesReady``: hands each orphan that still runs to a pod worker
        (grace period :data:`ORPHAN_GRACE_PERIOD`, so SIGKILL after
        :data:`MINIMUM_GRACE_PERIOD` s) and destroys its pod cgroup in the
        background; returns the orphans found. Never waits.
        """
        found = self._pods.orphans()
        for record in found:
            self._pods.adopt_orphan(record)
            sandbox = record.sandbox is not None and record.sandbox.running
            if record.containers_running or sandbox:
                seconds = self._begin_kill(record, ORPHAN_GRACE_PERIOD)
                detail = (
                    f"{record.label} (uid {record.uid}): an orphan (no pod object, no pod worker) housekeeping kills: "
                    f"its containers get SIGTERM, SIGKILL after {seconds}s; its pod cgroup is destroyed"
                )
                self._record("pod-terminating", "", detail, ())
                record.termination = self._spawn(self._terminate_runtime_pod(record))
            if record.cgroup is not None:
                self._spawn(self._destroy_orphan_cgroup(record))
        return found

    async def _terminate_runtime_pod(self, record: PodRecord) -> list[str]:
        """The pod worker's ``SyncTerminatingRuntimePod``: the containers' kill, then the sandbox; then forgotten."""
        try:
            assert record.kill is not None
            await record.kill
            if record.sandbox is not None:
                await self._runtime.kill(record.sandbox)  # killPodWithSyncResult: StopPodSandbox after the containers
        except Exception as exc:
            _log.exception("dev kubelet: killing orphaned pod %s failed", record.label)
            return [f"killing orphaned pod {record.label} failed: {exc}"]
        return []

    async def _destroy_orphan_cgroup(self, record: PodRecord) -> list[str]:
        """``cleanupOrphanedPodCgroups``' ``go pcm.Destroy``: SIGKILL every process in the pod cgroup, remove it."""
        try:
            await self._runtime.destroy_cgroup(record.cgroup)
        except (KubeletError, OSError) as exc:  # the next housekeeping would try again; logged, as the kubelet does
            _log.warning("dev kubelet: destroying the cgroup of orphaned pod %s: %s", record.label, exc)
            return [f"destroying the cgroup of orphaned pod {record.label} failed: {exc}"]
        detail = (
            f"{record.label} (uid {record.uid}): orphaned pod cgroup {record.cgroup} removed, every process in it "
            "SIGKILLed (cleanupOrphanedPodCgroups)"
        )
        self._record("pod-cleaned-up", "", detail, ())
        return []

    # -- admission -------------------------------------------------------------------------------

    async def admit(self, spec: PodSpec, *, kep_mode: bool) -> PodRecord:
        """``HandlePodAdditions`` for one pod (see the module docstring): the sync loop's part of a pod ``ADD``.

        Raises :class:`KubeletError` when the pod is rejected. The admitted
        pod's claims, sandbox and containers are its pod worker's:
        :meth:`start_admitted`, which raises :class:`ContainerStartError` when
        a container failed to start (the pod stays running), and
        :class:`~devplug.devkubelet.dra.podclaims.ClaimPrepareError` when its
        claims could not be prepared (nothing runs until :meth:`sync` prepares them).
        """
        label = pod_label(spec)
        self._claims.check(tuple(spec.resource_claims), label)
        current = self._pods.by_name(spec.key)
        if current is not None and current.active:
            raise KubeletError(f"pod {label} is already admitted ({current.phase}); remove it first")
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
        return record

    async def start_admitted(self, record: PodRecord) -> AdmittedPod:
        """The pod worker's first sync of an admitted pod: its claims, sandbox and containers.

        Runs outside the sync loop, in the pod's worker (:meth:`pod_worker`).
        Stops early, quietly, when the pod was removed meanwhile. Raises as
        :meth:`admit` says.
        """
        async with self.pod_worker(record.uid):
            await self._claims.prepare(record)  # before the sandbox (kuberuntime SyncPod)
            await self._start_pod(record)
        return record.admitted()

    def pod_worker(self, uid: str) -> asyncio.Lock:
        """The pod's worker (``podWorkerLoop``, one goroutine per pod): its syncs, starts and kill, one at a time.

        Outside the sync loop: a held Allocate never waits for it, nor it for one.
        """
        lock = self._workers.get(uid)
        if lock is None:
            lock = self._workers[uid] = asyncio.Lock()
        return lock

    async def _start_pod(self, record: PodRecord) -> None:
        """``SyncPod`` for a new pod: the sandbox, then each container; stops once the pod is being killed."""
        if record.phase is not PodPhase.RUNNING:
            return
        await self._run_sandbox(record)
        for container in record.spec.ordered_containers():
            if record.phase is not PodPhase.RUNNING:
                return  # the pod worker got the kill while it started the containers before
            await self._start_container(record, container.name)

    async def sync(self, key: PodKey) -> bool:
        """A sync of the pod now, for its claims: returns whether there was something to do.

        An admitted pod whose claims are not prepared gets them prepared, then
        its sandbox and containers (raises
        :class:`~devplug.devkubelet.dra.podclaims.ClaimPrepareError` when they
        still cannot be prepared); a terminating pod whose claims could not be
        unprepared is tried again at once (its termination goes on in the background).
        """
        record = self._pods.latest(key)
        if record is None:
            raise KubeletError(f"no pod {key[0]}/{key[1]} was ever admitted")
        if record.phase is PodPhase.RUNNING and not record.admitting and not record.claims_prepared:
            async with self.pod_worker(record.uid):
                await self._claims.prepare(record)
                await self._start_pod(record)
            return True
        if record.claims_error is not None and record.phase in (PodPhase.TERMINATING, PodPhase.DELETED):
            self._claims.nudge(record.uid)
            return True
        return False

    def pods_to_resync(self) -> list[PodKey]:
        """The admitted pods whose claims still wait to be prepared (the periodic resync's work)."""
        return [
            r.spec.key
            for r in self._pods.known()
            if r.phase is PodPhase.RUNNING and not r.admitting and not r.claims_prepared
        ]

    async def _run_sandbox(self, record: PodRecord) -> None:
        """``SyncPod``: the pod cgroup (``EnsureExists``), then the sandbox in it (``createPodSandbox``)."""
        layout = self._runtime.layout
        if layout is not None:
            record.cgroup = layout.pod_cgroup(record.spec.qos, record.uid)
            self._runtime.ensure_cgroup(record.cgroup)
        record.sandbox = await self._runtime.create_and_start(f"{record.label} (sandbox)", record.cgroup, role="pause")

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
        """Start (or restart) one container of a running pod: run options, creation, start (see the module doc).

        In the pod's worker (:meth:`pod_worker`), after anything it is doing for the pod.
        """
        record = self._pods.by_name(key)
        if record is None:
            raise KubeletError(f"no admitted pod {key[0]}/{key[1]}")
        async with self.pod_worker(record.uid):
            await self._start_container(record, name)

    async def _start_container(self, record: PodRecord, name: str) -> None:
        key = record.spec.key
        if record.phase is not PodPhase.RUNNING:
            raise KubeletError(f"pod {record.label} is {record.phase}, its containers cannot start")
        crec = record.container(name)
        spec = _container_spec(record.spec, name)
        if crec is None or spec is None:
            raise KubeletError(f"pod {record.label} has no container {name!r}")
        label = pod_label(record.spec, name)
        if crec.runtime is not None and crec.runtime.running:
            await self._runtime.kill(crec.runtime)  # it crashed: the kubelet starts a new one
        try:
            devices = await self._manager.run_container_options(record, spec, crec)
        except KubeletError as exc:
            raise ContainerStartError(f"container {label} failed to start: {exc}", key, name) from exc
        init = spec.init and not spec.restartable
        try:
            crec.runtime = await self._runtime.create_and_start(
                label, record.cgroup, role="init" if init else "app", stop_delay=spec.stop_delay, devices=devices
            )
        except ContainerCreateError as exc:
            crec.runtime, crec.failure = None, f"CreateContainerError: {exc}"
            self._record("container-failed", "", f"{label}: {crec.failure}", ())
            raise ContainerStartError(f"container {label} failed to start: {crec.failure}", key, name) from exc
        except KubeletError as exc:
            crec.runtime, crec.failure = None, str(exc)
            self._record("container-failed", "", f"{label}: {exc}", ())
            raise ContainerStartError(f"container {label} failed to start: {exc}", key, name) from exc
        crec.failure = None
        started = crec.runtime
        pid = f", pid {started.pid}" if started.pid is not None else ""
        self._record("container-started", "", f"{label} (id {started.id[:12]}{pid})", ())
        if init:
            await started.gone.wait()  # an init container runs to completion before the next container starts

    # -- finishing and deletion ------------------------------------------------------------------

    async def end_containers(self, key: PodKey) -> PodRecord:
        """The pod's containers end on their own (exit 0); returns once their processes are gone.

        Nothing of the kubelet's runs here: it learns of the exits from the
        PLEG, in its sync loop, and then :meth:`finish` is the pod worker's part.
        """
        record = self._pods.by_name(key)
        if record is None or record.phase is not PodPhase.RUNNING:
            state = "no such pod" if record is None else f"it is {record.phase}"
            raise KubeletError(f"cannot finish pod {key[0]}/{key[1]}: {state}")
        async with self.pod_worker(record.uid):  # after a start under way
            await asyncio.gather(*(self._runtime.finish(c.runtime) for c in record.containers if c.runtime is not None))
        return record

    async def finish(self, record: PodRecord, *, kep_mode: bool) -> None:
        """The pod worker after its containers ended (phase Succeeded); the pod object stays. KEP: PostStop, Deallocate.

        Nothing to do when the pod was removed or killed meanwhile (its termination does the rest).
        """
        async with self.pod_worker(record.uid):
            await self._finish_ended(record, kep_mode=kep_mode)

    async def _finish_ended(self, record: PodRecord, *, kep_mode: bool) -> None:
        if record.phase is not PodPhase.RUNNING:
            return
        if record.spec.resource_claims and self._claims.enabled:
            record.phase = PodPhase.TERMINATING  # the pod worker is not done before the claims are unprepared
            error = await self._claims.unprepare_once(record)
            if error is not None:
                record.termination = self._spawn(self._finish_after_unprepare(record, kep_mode=kep_mode))
                raise ClaimUnprepareError(
                    f"pod {record.label}: its containers ended, but {error}; the pod stays terminating and the "
                    "kubelet tries again"
                )
        failures = await self._finish(record, kep_mode=kep_mode)
        await self._clean_up(record)
        if failures:
            raise KubeletError(f"pod {record.label} finished, but: " + "; ".join(failures))

    async def _finish_after_unprepare(self, record: PodRecord, *, kep_mode: bool) -> list[str]:
        """The pod worker after a failed unprepare of a finished pod: retry until done, then finish (or release)."""
        try:
            await self._claims.wait_for_sync(record.uid)
            await self._claims.unprepare_until_done(record)
            if record.phase is PodPhase.DELETED:  # removed meanwhile (the removal window)
                failures = await self._release(record, post_stop=True) if kep_mode else []
            else:
                failures = await self._finish(record, kep_mode=kep_mode)
            await self._clean_up(record)
            if record.delete_when_done and record.phase is not PodPhase.DELETED:
                self._pods.delete(record)
                self._record("pod-removed", "", f"{record.label} (uid {record.uid})", ())
        except Exception as exc:
            _log.exception("dev kubelet: finishing pod %s failed", record.label)
            return [f"finishing pod {record.label} failed: {exc}"]
        return failures

    def remove(self, key: PodKey, *, kep_mode: bool) -> asyncio.Task[list[str]] | None:
        """Delete the pod object gracefully (see the module docstring); returns the termination, if one began.

        A pod that is not running leaves the pod manager at once; a running
        one becomes ``terminating`` and its containers are killed with its
        grace period by the returned task, which then deletes the object
        (its result: the KEP calls that failed). A grace period of 0 is a
        force deletion (:meth:`remove_now`).
        """
        record = self._pods.by_name(key)
        if record is None:
            raise KubeletError(f"no admitted pod {key[0]}/{key[1]}")
        self.load_pods()
        if record.phase is PodPhase.TERMINATING:
            record.delete_when_done = True  # a finished pod still unpreparing its claims: deleted once done
            return record.termination
        if record.phase is not PodPhase.RUNNING:
            self._pods.delete(record)
            self._record("pod-removed", "", f"{record.label} (uid {record.uid})", ())
            return None
        grace = record.spec.termination_grace_period
        if grace == 0:
            return self.remove_now(key, kep_mode=kep_mode, deletion_grace=0, how="deleted with a grace period of 0")
        record.phase = PodPhase.TERMINATING
        kill = self._begin_kill(record, grace)
        detail = f"{record.label} (uid {record.uid}): deleted; its containers get SIGTERM, SIGKILL after {kill}s"
        self._record("pod-terminating", "", detail, ())
        record.termination = self._spawn(self._terminate(record, kep_mode=kep_mode))
        return record.termination

    def remove_now(
        self, key: PodKey, *, kep_mode: bool, deletion_grace: int | None, how: str
    ) -> asyncio.Task[list[str]] | None:
        """``HandlePodRemoves``: the pod leaves the pod manager now; its containers are killed in the background.

        ``deletion_grace`` is the object's ``deletionGracePeriodSeconds``
        (None for a static pod whose manifest was removed, 0 for a force
        deletion). Returns the termination when containers were still to be
        killed.
        """
        record = self._pods.by_name(key)
        if record is None:
            raise KubeletError(f"no admitted pod {key[0]}/{key[1]}")
        self.load_pods()
        terminating = record.phase in (PodPhase.RUNNING, PodPhase.TERMINATING)
        self._pods.delete(record)
        detail = f"{record.label} (uid {record.uid}): {how}"
        if not terminating:
            self._record("pod-removed", "", detail, ())
            return None
        kill = self._begin_kill(record, deletion_grace)
        self._record("pod-removed", "", f"{detail}; its containers get SIGTERM, SIGKILL after {kill}s", ())
        if record.termination is None:
            record.termination = self._spawn(self._terminate(record, kep_mode=kep_mode))
        return record.termination

    def _begin_kill(self, record: PodRecord, deletion_grace: int | None) -> int:
        """Start (or, when the grace period shrank, restart) the kill of the pod's containers; its grace period."""
        grace = effective_grace_period(record.spec, deletion_grace, record.grace_period)
        if record.kill is not None and grace >= record.grace_period:
            return max(record.grace_period, MINIMUM_GRACE_PERIOD)
        if record.kill is not None:
            record.kill.cancel()  # the pod worker cancels the sync and kills again with the shorter period
        record.grace_period = grace
        seconds = max(grace, MINIMUM_GRACE_PERIOD)
        record.kill = kill = asyncio.get_running_loop().create_task(self._kill_containers(record, seconds))
        self._kills.add(kill)
        kill.add_done_callback(self._kills.discard)
        return seconds

    async def _kill_containers(self, record: PodRecord, seconds: int) -> None:
        """``killContainersWithSyncResult``: every running container at once, ``seconds`` of grace each.

        In the pod's worker, once its sync under way returned (a start of its
        containers): never behind the sync loop.
        """
        async with self.pod_worker(record.uid):
            running = [c for c in record.containers if c.runtime is not None and c.runtime.running]
            for crec in running:
                label = pod_label(record.spec, crec.name)
                self._record("container-stopping", "", f"{label}: SIGTERM, SIGKILL after {seconds}s", ())
            await asyncio.gather(*(self._runtime.stop(c.runtime, seconds) for c in running if c.runtime is not None))

    async def _terminate(self, record: PodRecord, *, kep_mode: bool) -> list[str]:
        """The pod worker: kill the containers (again, when the period shrinks), clean up, delete; KEP failures.

        A pod still in the pod manager finishes (KEP: PostStop, Deallocate),
        is cleaned up, then leaves it; a pod already gone (the removal
        window) is cleaned up (KEP: PostStop, Deallocate).
        """
        while True:
            kill = record.kill
            assert kill is not None
            try:
                await kill
                break
            except asyncio.CancelledError:
                if record.kill is kill:  # we were cancelled ourselves, not replaced
                    raise
        try:
            if record.spec.resource_claims and self._claims.enabled:
                await self._claims.unprepare_until_done(record)  # SyncTerminatingPod, retried after its back-off
            if record.phase is PodPhase.DELETED:
                failures = await self._release(record, post_stop=True) if kep_mode else []
            else:
                failures = await self._finish(record, kep_mode=kep_mode)
            await self._clean_up(record)
            if record.phase is not PodPhase.DELETED:
                self._pods.delete(record)
                self._record("pod-removed", "", f"{record.label} (uid {record.uid})", ())
        except Exception as exc:
            _log.exception("dev kubelet: terminating pod %s failed", record.label)
            return [f"terminating pod {record.label} failed: {exc}"]
        for failure in failures:
            _log.warning("dev kubelet: pod %s: %s", record.label, failure)
        return failures

    async def _clean_up(self, record: PodRecord) -> None:
        """``StopPodSandbox`` (SIGKILL), then ``podContainerManager.Destroy`` of the pod cgroup."""
        if record.sandbox is not None:
            await self._runtime.kill(record.sandbox)
        await self._runtime.destroy_cgroup(record.cgroup)
        where = f", pod cgroup {record.cgroup} removed" if record.cgroup is not None else ""
        self._record("pod-cleaned-up", "", f"{record.label} (uid {record.uid}): sandbox stopped{where}", ())

    def _spawn(self, coro: Coroutine[Any, Any, list[str]]) -> asyncio.Task[list[str]]:
        task = asyncio.get_running_loop().create_task(coro)
        self._terminations.add(task)
        task.add_done_callback(self._terminations.discard)
        return task

    async def close(self) -> None:
        """Cancel every termination still running (the runtime kills what is left)."""
        tasks = [*self._terminations, *self._kills]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

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
