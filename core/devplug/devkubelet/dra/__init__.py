"""The dev kubelet's Dynamic Resource Allocation side: a faithful stand-in for the kubelet's DRA machinery.

What a DRA driver's kubelet plugin meets on a node, over real gRPC on real
unix sockets, modelled on Kubernetes 1.36 (each module names the kubelet
source it follows):

* :mod:`~devplug.devkubelet.dra.registration` -- the plugin manager: the
  watcher on ``<root>/plugins_registry/`` (inotify), the registration
  reconciler and its operations (GetInfo, validation, NotifyRegistrationStatus,
  back-off), deregistration when the socket goes
  (``pkg/kubelet/pluginmanager``);
* :mod:`~devplug.devkubelet.dra.plugins` -- the DRA plugin manager: the
  services the kubelet accepts and picks, several instances per driver with
  the newest connected one called (PR #129832), connection monitoring
  (PR #132058), the ResourceSlice wipes, the health streams
  (``pkg/kubelet/cm/dra/plugin``);
* :mod:`~devplug.devkubelet.dra.client` -- one plugin instance's connection
  and calls: v1 or v1beta1, 45 s per call;
* :mod:`~devplug.devkubelet.dra.manager` -- the DRA manager: prepare and
  unprepare with the kubelet's batching, error rules and retries, the reconcile
  loop, CDI devices per container, ``allocatedResourcesStatus``
  (``pkg/kubelet/cm/dra/manager.go``);
* :mod:`~devplug.devkubelet.dra.claiminfo` and :mod:`~devplug.devkubelet.dra.checkpoint`
  -- the claim cache and ``dra_manager_state`` (``claiminfo.go``, ``checkpoint/``, ``state/``);
* :mod:`~devplug.devkubelet.dra.health` -- the device health cache fed by
  NodeWatchResources: complete lists, timeouts, Unknown (``healthinfo.go``);
* :mod:`~devplug.devkubelet.dra.podclaims` -- when a pod's claims are prepared
  (before its sandbox) and unprepared (after its containers), and retried;
* :mod:`~devplug.devkubelet.dra.node` -- :class:`DRAKubelet`, the parts of one
  kubelet process, and :class:`DRAConfig`, its timings.

A pod references claims by identity (:class:`ResourceClaimRef`: namespace,
name, UID, and the drivers its allocation names); what a claim allocates is
read by the drivers from the API server, never by the kubelet's DRA manager.
``DevKubelet(..., dra=DRAConfig())`` turns it on.
"""

from __future__ import annotations

from devplug.devkubelet.dra.client import (
    HEALTH_SERVICE,
    SERVICE_V1,
    SERVICE_V1BETA1,
    SERVICES_SUPPORTED_BY_KUBELET,
    DRACallError,
)
from devplug.devkubelet.dra.model import (
    ClaimState,
    ContainerClaim,
    DeviceHealth,
    DRAPluginView,
    HealthStatus,
    PodClaim,
    PreparedDevice,
    ResourceClaimRef,
    ResourceHealth,
    ResourceStatus,
)
from devplug.devkubelet.dra.node import DRA_PLUGIN_TYPE, PLUGINS_REGISTRY, DRAConfig, DRAKubelet
from devplug.devkubelet.dra.podclaims import ClaimPrepareError, ClaimUnprepareError
from devplug.devkubelet.dra.registration import RegisteredPlugin

__all__ = [
    "DRA_PLUGIN_TYPE",
    "HEALTH_SERVICE",
    "PLUGINS_REGISTRY",
    "SERVICES_SUPPORTED_BY_KUBELET",
    "SERVICE_V1",
    "SERVICE_V1BETA1",
    "ClaimPrepareError",
    "ClaimState",
    "ClaimUnprepareError",
    "ContainerClaim",
    "DRACallError",
    "DRAConfig",
    "DRAKubelet",
    "DRAPluginView",
    "DeviceHealth",
    "HealthStatus",
    "PodClaim",
    "PreparedDevice",
    "RegisteredPlugin",
    "ResourceClaimRef",
    "ResourceHealth",
    "ResourceStatus",
]
