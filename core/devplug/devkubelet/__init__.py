"""The dev kubelet: a faithful stand-in for the kubelet's device manager and PodResources server.

For devplug's tests, ``devplug demo``, ``devplug kubelet`` and driver authors
without a kubelet. It serves Registration on ``kubelet.sock`` and PodResources
v1 over real gRPC on unix sockets, dials each plugin inside Register, consumes
ListAndWatch, and runs pods the way the kubelet of Kubernetes v1.32.10 does,
never more kindly. Each module names the kubelet source it follows:

* :mod:`~devplug.devkubelet.pods` -- pod objects with UIDs, phases (running,
  finished, rejected, deleted) and *active* pods (``filterOutInactivePods``),
  and the restart window (pod manager empty, sources not ready);
* :mod:`~devplug.devkubelet.poddevices` -- the ``podDevices`` store, by pod UID and container;
* :mod:`~devplug.devkubelet.devicemanager` -- ``Allocate``,
  ``allocateContainerResources``, ``devicesToAllocate`` (reuse of init
  containers' devices, not sidecars'; GetPreferredAllocation with
  must-includes), the lazy ``UpdateAllocatedDevices`` that frees a finished or
  rejected pod's devices only at the next allocation or List, so the next pod
  gets them at once, and PreStartContainer;
* :mod:`~devplug.devkubelet.lifecycle` -- admission and rejection
  (``HandlePodAdditions``, ``rejectPod``), finishing, deletion, and the KEP's
  PostStopContainer/Deallocate in KEP mode;
* :mod:`~devplug.devkubelet.checkpointing` -- ``kubelet_internal_checkpoint``,
  written (temp file + rename) exactly when the kubelet writes it and read back at start;
* :mod:`~devplug.devkubelet.podresources_server` -- List (every pod the pod manager
  has, after ``UpdateAllocatedDevices``), Get (behind KubeletPodResourcesGet,
  off by default), GetAllocatableResources, rate limit;
* :mod:`~devplug.devkubelet.kubelet` -- start-up cleanup, checkpoint restore,
  restarts, registrations and streams.

Entry points:

* :class:`DevKubelet` -- asyncio (grpc.aio);
* :class:`DevKubeletThread` -- the same, synchronous, on its own loop thread;
* :func:`run_foreground` -- serve until cancelled, logging every event.
"""

from __future__ import annotations

from devplug.devkubelet.devicemanager import ContainerStartError
from devplug.devkubelet.kubelet import KUBELET_SOCKET, DevKubelet, run_foreground
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
from devplug.devkubelet.threaded import DevKubeletThread
from devplug.errors import KubeletError

__all__ = [
    "EVENT_KINDS",
    "KUBELET_SOCKET",
    "AdmittedContainer",
    "AdmittedPod",
    "ContainerSpec",
    "ContainerStartError",
    "DevKubelet",
    "DevKubeletThread",
    "DeviceInfo",
    "KubeletError",
    "KubeletEvent",
    "PluginCallError",
    "PluginOptions",
    "PodDeviceEntry",
    "PodPhase",
    "PodSpec",
    "ResourceView",
    "run_foreground",
]
