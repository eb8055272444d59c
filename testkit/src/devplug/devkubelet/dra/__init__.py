"""The dev kubelet's Dynamic Resource Allocation side: a faithful stand-in for the kubelet's DRA machinery.

What a DRA driver's kubelet plugin meets on a node, over real gRPC on real
unix sockets, as a chosen kubelet release does it: ``DRAConfig(release=...)``,
one of :data:`DRA_RELEASES` (1.32 to 1.36; 1.36 unless told). What differs
between releases, and the source each rule was read from, is in
:mod:`~devplug.devkubelet.dra.releases`; in short:

* **plugins per driver**: 1.32 keeps one per name (a registration replaces
  it; a deregistration, by name, drops whoever is there and wipes the
  slices at once); 1.33+ keep several, one per endpoint (PR #129832);
* **instance called**: 1.32 the one; 1.33 the newest; 1.34+ the newest
  connected (connections made and watched at registration, PR #132058;
  before, dialled at the first call and never watched);
* **services**: 1.32/1.33 the kubelet's first of ``v1beta1.DRAPlugin``,
  ``v1alpha3.NodeService`` the plugin lists, else v1alpha4; 1.34+ the
  plugin's first of ``v1.DRAPlugin``, ``v1beta1.DRAPlugin``;
* **slices wiped**: 1.32 at once on deregistration
  (``resource.k8s.io/v1beta1``); 1.33 30 s after the last instance left
  (v1beta1); 1.34+ 30 s after none is connected (``resource.k8s.io/v1``);
* **health streams**: none before 1.34; gate ResourceHealthStatus off by
  default in 1.34 and 1.35, on in 1.36;
* **a claim of a cached namespace/name with another UID**: 1.32/1.33 take the
  cached entry for it; 1.34+ refuse it (PR #131617).

The modules, each naming the kubelet source (file and release) it follows:

* :mod:`~devplug.devkubelet.dra.releases` -- the rules per release and where each was read;
* :mod:`~devplug.devkubelet.dra.registration` -- the plugin manager: the
  watcher on ``<root>/plugins_registry/`` (inotify), the registration
  reconciler and its operations (GetInfo, validation, NotifyRegistrationStatus,
  back-off), deregistration when the socket goes
  (``pkg/kubelet/pluginmanager``, the same from 1.32 to 1.36 but for the
  endpoint a deregistration passes from 1.33 on);
* :mod:`~devplug.devkubelet.dra.plugins` -- the DRA plugin manager: the
  services the kubelet accepts and picks, the plugins kept per driver name
  (one on 1.32, several from 1.33, PR #129832), connection monitoring
  (1.34+, PR #132058), the ResourceSlice wipes, the health streams
  (``pkg/kubelet/cm/dra/plugin``: ``registration.go``/``plugins_store.go`` up to
  1.33, ``dra_plugin_manager.go`` from 1.34);
* :mod:`~devplug.devkubelet.dra.client` -- one plugin instance's connection
  and calls: v1, v1beta1 or v1alpha4, 45 s per call;
* :mod:`~devplug.devkubelet.dra.manager` -- the DRA manager: prepare and
  unprepare with the kubelet's batching, error rules and retries, the reconcile
  loop, CDI devices per container, ``allocatedResourcesStatus``
  (``pkg/kubelet/cm/dra/manager.go``: ``ManagerImpl`` up to 1.33, ``Manager`` from 1.34);
* :mod:`~devplug.devkubelet.dra.claiminfo` and :mod:`~devplug.devkubelet.dra.checkpoint`
  -- the claim cache, keyed by ``namespace/name`` in every release, and
  ``dra_manager_state`` in each release's layout (``claiminfo.go``, ``state/``);
* :mod:`~devplug.devkubelet.dra.health` -- the device health cache fed by
  NodeWatchResources: complete lists, timeouts, Unknown (``healthinfo.go``, 1.34+);
* :mod:`~devplug.devkubelet.dra.podclaims` -- when a pod's claims are prepared
  (before its sandbox) and unprepared (after its containers), and retried;
* :mod:`~devplug.devkubelet.dra.node` -- :class:`DRAKubelet`, the parts of one
  kubelet process, and :class:`DRAConfig`, its release and timings
  (:attr:`DRAConfig.kubelet_version` is what the release's Node says in
  ``status.nodeInfo.kubeletVersion``).

A pod references claims by identity (:class:`ResourceClaimRef`: namespace,
name, UID, and the drivers its allocation names); what a claim allocates is
read by the drivers from the API server, never by the kubelet's DRA manager.
``DevKubelet(..., dra=DRAConfig())`` turns it on; ``DRAConfig(release="1.32")``
makes it a 1.32 kubelet.
"""

from __future__ import annotations

from devplug.devkubelet.dra.client import (
    HEALTH_SERVICE,
    SERVICE_V1,
    SERVICE_V1ALPHA4,
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
from devplug.devkubelet.dra.releases import DEFAULT_RELEASE, DRA_RELEASES, ReleaseRules, release_rules

__all__ = [
    "DEFAULT_RELEASE",
    "DRA_PLUGIN_TYPE",
    "DRA_RELEASES",
    "HEALTH_SERVICE",
    "PLUGINS_REGISTRY",
    "SERVICES_SUPPORTED_BY_KUBELET",
    "SERVICE_V1",
    "SERVICE_V1ALPHA4",
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
    "ReleaseRules",
    "ResourceClaimRef",
    "ResourceHealth",
    "ResourceStatus",
    "release_rules",
]
