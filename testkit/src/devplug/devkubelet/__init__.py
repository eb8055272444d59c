"""The dev kubelet: a faithful stand-in for the kubelet's device manager and PodResources server.

For devplug's tests, ``devplug demo``, ``devplug kubelet`` and driver authors
without a kubelet. It serves Registration on ``kubelet.sock`` and PodResources
v1 over real gRPC on unix sockets, dials each plugin inside Register, consumes
ListAndWatch, and runs pods the way the kubelet of Kubernetes v1.32.10 does,
never more kindly. Each module names the kubelet source it follows:

* :mod:`~devplug.devkubelet.syncloop` -- the kubelet's one sync loop
  (``syncLoopIteration`` in ``pkg/kubelet/kubelet.go``): pod additions,
  updates, removals and container restarts are handled one at a time, and
  the plugin's Allocate and GetPreferredAllocation are called inside it with
  no deadline (``context.Background()`` in
  ``pkg/kubelet/cm/devicemanager/endpoint.go``), so a plugin holding one
  delays every other pod's admission and removal, and housekeeping
  (``HandlePodCleanups``, a turn every 2 s once the sources are ready:
  :meth:`DevKubelet.housekeeping`); what pod workers do (starts,
  PreStartContainer, kills) runs outside it. Each turn's wait is kept
  (:meth:`DevKubelet.sync_loop_ops`);
* :mod:`~devplug.devkubelet.pods` -- pod objects with UIDs, phases (running,
  terminating, finished, rejected, deleted) and *active* pods
  (``filterOutInactivePods``: a terminating pod is active until its pod
  worker is done), and the restart window (pod manager empty, sources not ready);
* :mod:`~devplug.devkubelet.poddevices` -- the ``podDevices`` store, by pod UID and container;
* :mod:`~devplug.devkubelet.devicemanager` -- ``Allocate``,
  ``allocateContainerResources``, ``devicesToAllocate`` (reuse of init
  containers' devices, not sidecars'; GetPreferredAllocation with
  must-includes), the lazy ``UpdateAllocatedDevices`` that frees a finished or
  rejected pod's devices only at the next allocation or List, so the next pod
  gets them at once, and PreStartContainer;
* :mod:`~devplug.devkubelet.lifecycle` -- admission and rejection
  (``HandlePodAdditions``, ``rejectPod``), the pod cgroup and sandbox
  (``SyncPod``), container starts (``startContainer``: CreateContainerError),
  finishing, killing (``killContainer`` with the pod worker's effective grace
  period, ``calculateEffectiveGracePeriod``), graceful deletion, the removal
  window (``HandlePodRemoves``: a static pod's manifest removed or a pod
  force-deleted leaves the pod manager while its containers are still being
  killed), ``SyncTerminatedPod``'s cgroup clean-up, orphans (a static pod
  whose manifest was removed while the kubelet was stopped,
  :meth:`DevKubelet.remove_static_pod_while_stopped`) and the housekeeping
  that kills them (``HandlePodCleanups``: grace period 1 s, 2 s in
  ``killContainer``, the pod cgroup destroyed at once), and the KEP's
  PostStopContainer/Deallocate in KEP mode;
* :mod:`~devplug.devkubelet.containers` -- the runtime (containerd 1.6 with
  runc): each container and sandbox a real process in its own cgroup from
  before it runs, SIGTERM then SIGKILL (``stopContainer``), the rest of a
  container's processes dying with its init (PID namespaces), its cgroup
  removed with its task (``handleContainerExit``);
* :mod:`~devplug.devkubelet.cgroups` -- the kubelet's cgroup names (both
  drivers, cgroup v1 and v2: ``pkg/kubelet/cm``) and containerd's
  (``getCgroupsPath``), made in every hierarchy as runc makes them;
* :mod:`~devplug.devkubelet.devicespecs` -- containerd's device check
  (``WithDevices``, ``DeviceFromPath``): a DeviceSpec whose host path is not a
  device node fails the container's creation, "not a device node", where the
  check is asked for (``check_device_nodes=True`` or a ``dev_root``; the
  default from devplug 1.0), and is taken with a
  :class:`DeviceNodeDeprecationWarning` elsewhere;
* :mod:`~devplug.devkubelet.checkpointing` -- ``kubelet_internal_checkpoint``,
  written (temp file + rename) exactly when the kubelet writes it and read back at start;
* :mod:`~devplug.devkubelet.podresources_server` -- List (every pod the pod manager
  has, after ``UpdateAllocatedDevices``), Get (behind KubeletPodResourcesGet,
  off by default), GetAllocatableResources, rate limit;
* :mod:`~devplug.devkubelet.kubelet` -- start-up cleanup, checkpoint restore,
  restarts, registrations and streams;
* :mod:`~devplug.devkubelet.endpoints` -- two instances of one plugin (a
  rolling update): endpoints keyed by socket path (Kubernetes PR #135437) or
  by resource name (before it), ``DevKubelet(endpoints_by=...)``;
* :mod:`~devplug.devkubelet.dra` -- with ``dra=DRAConfig()``, the kubelet's
  Dynamic Resource Allocation side as of Kubernetes 1.36: the plugin watcher
  on ``plugins_registry/``, the DRA plugin manager (newest connected instance
  wins), the DRA manager (NodePrepareResources/NodeUnprepareResources,
  ``dra_manager_state``, the reconcile loop) and the device health streams;
  pods reference claims by identity (:class:`ResourceClaimRef`).

Containers run as processes only with a
:class:`~devplug.devkubelet.cgroups.CgroupLayout` (``DevKubelet(...,
cgroups=CgroupLayout.detect())``, as root); without one they are names with
a state, and stop at once.

Entry points:

* :class:`DevKubelet` -- asyncio (grpc.aio);
* :class:`DevKubeletThread` -- the same, synchronous, on its own loop thread;
* :func:`run_foreground` -- serve until cancelled, logging every event, with a control socket
  (:mod:`~devplug.devkubelet.control`) through which ``devplug kubelet admit|remove|restart|show``
  admit and remove pods, restart the kubelet and show devices, allocations, pods and events.
"""

from __future__ import annotations

from devplug.devkubelet.cgroups import CgroupDriver, CgroupLayout, CgroupsUnavailableError
from devplug.devkubelet.containers import ContainerCreateError
from devplug.devkubelet.devicemanager import ContainerStartError
from devplug.devkubelet.devicespecs import DeviceNodeDeprecationWarning
from devplug.devkubelet.dra import (
    ClaimPrepareError,
    ClaimUnprepareError,
    ContainerClaim,
    DRAConfig,
    PodClaim,
    ResourceClaimRef,
)
from devplug.devkubelet.foreground import run_foreground
from devplug.devkubelet.kubelet import KUBELET_SOCKET, DevKubelet
from devplug.devkubelet.model import (
    EVENT_KINDS,
    AdmittedContainer,
    AdmittedPod,
    ContainerSpec,
    DeviceInfo,
    KubeletEvent,
    PluginOptions,
    PodDeviceEntry,
    PodPhase,
    PodSpec,
    ResourceView,
)
from devplug.devkubelet.plugin_client import PluginCallError
from devplug.devkubelet.syncloop import SyncLoopOp
from devplug.devkubelet.threaded import DevKubeletThread
from devplug.errors import KubeletError

__all__ = [
    "EVENT_KINDS",
    "KUBELET_SOCKET",
    "AdmittedContainer",
    "AdmittedPod",
    "CgroupDriver",
    "CgroupLayout",
    "CgroupsUnavailableError",
    "ClaimPrepareError",
    "ClaimUnprepareError",
    "ContainerClaim",
    "ContainerCreateError",
    "ContainerSpec",
    "ContainerStartError",
    "DevKubelet",
    "DRAConfig",
    "DevKubeletThread",
    "DeviceInfo",
    "DeviceNodeDeprecationWarning",
    "KubeletError",
    "KubeletEvent",
    "PluginCallError",
    "PluginOptions",
    "PodClaim",
    "PodDeviceEntry",
    "PodPhase",
    "PodSpec",
    "ResourceClaimRef",
    "ResourceView",
    "SyncLoopOp",
    "run_foreground",
]
