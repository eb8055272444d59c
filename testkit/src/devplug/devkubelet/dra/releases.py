"""What differs between the kubelet releases the dev kubelet's DRA side models: one set of rules per minor release.

A dev kubelet runs one release's rules (``DRAConfig(release="1.32")``; the
default is 1.36). Each rule names the kubelet source it was read from:

* **1.32** -- ``vendor/k8s.io/kubernetes`` at v1.32.10 as KubeEdge vendors it
  (``pkg/kubelet/cm/dra/plugin/registration.go``, ``plugins_store.go``,
  ``plugin.go``, ``manager.go``, ``claiminfo.go``, ``state/``), and
  ``k8s.io/kubelet`` at ``kubernetes-1.32.0`` (``pkg/apis/dra``: v1alpha4 and
  v1beta1 only, no health API);
* **1.33** -- ``registration.go`` and ``plugins_store.go`` after PR #129832
  (several instances per driver name, ``DeRegisterPlugin(name, endpoint)``,
  the wiping delay), ``manager.go`` of that cycle (still ``ManagerImpl``, as
  in 1.32), ``k8s.io/kubelet`` at ``kubernetes-1.33.0`` (v1alpha4 and v1beta1);
* **1.34** -- ``dra_plugin_manager.go`` and ``dra_plugin.go`` (PR #132058,
  connection monitoring), v1 added and v1alpha4 removed (PRs #132700,
  #132574; ``k8s.io/kubelet`` at ``kubernetes-1.34.0`` has ``dra/v1``,
  ``dra/v1beta1`` and ``dra-health/v1alpha1`` with fields 1-3 only), the
  claim UID check of PR #131617, the validation pass before the cache
  changes, ResourceSlices wiped through ``resource.k8s.io/v1``, the
  ResourceHealthStatus gate alpha (off) in ``pkg/features/kube_features.go``;
* **1.35** -- ``share_id`` in ``dra/v1`` and ``health_check_timeout_seconds``
  in ``dra-health/v1alpha1`` (``k8s.io/kubelet`` at ``kubernetes-1.35.0``),
  ``ShareID`` in ``state.Device`` (``state/state.go``); the gate still alpha;
* **1.36** -- ``message`` in ``dra-health/v1alpha1`` (``kubernetes-1.36.0``),
  ResourceHealthStatus beta and on (issue #139475: "nominally in beta as of v1.36").

1.37 is not modelled: only ``kubernetes-1.37.0-beta.0`` of ``k8s.io/kubelet``
was at hand, and the v1 health service (PR #139477) came after it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DEFAULT_RELEASE",
    "DRA_RELEASES",
    "RESOURCE_API_V1",
    "RESOURCE_API_V1BETA1",
    "SERVICE_V1",
    "SERVICE_V1ALPHA4",
    "SERVICE_V1BETA1",
    "ReleaseRules",
    "release_rules",
]

#: The kubelet releases the dev kubelet's DRA side models, oldest first.
DRA_RELEASES = ("1.32", "1.33", "1.34", "1.35", "1.36")
#: The release a dev kubelet follows unless told otherwise.
DEFAULT_RELEASE = "1.36"

#: ``drapbv1.DRAPluginService`` (1.34+).
SERVICE_V1 = "v1.DRAPlugin"
#: ``drapbv1beta1.DRAPluginService`` (1.32+).
SERVICE_V1BETA1 = "v1beta1.DRAPlugin"
#: ``drapbv1alpha4.NodeService`` (1.32 and 1.33): gRPC service ``v1alpha3.Node`` ("a mismatch ... a mistake", types.go).
SERVICE_V1ALPHA4 = "v1alpha3.NodeService"

#: The group/version the kubelet's ResourceSlice ``DeleteCollection`` goes to.
RESOURCE_API_V1BETA1 = "resource.k8s.io/v1beta1"
RESOURCE_API_V1 = "resource.k8s.io/v1"

#: The newest patch release of each minor in ``k8s.io/kubelet``'s tags: what the Node's ``kubeletVersion`` says.
_PATCHES = {"1.32": 13, "1.33": 13, "1.34": 10, "1.35": 7, "1.36": 3}


@dataclass(frozen=True)
class ReleaseRules:
    """One kubelet release's DRA rules (see the module docstring for where each was read)."""

    #: ``"1.32"`` ... ``"1.36"``.
    release: str
    #: The Node's ``status.nodeInfo.kubeletVersion`` (``v<major>.<minor>.<patch>``).
    kubelet_version: str
    #: 1.32 (``plugins_store.go``: ``map[string]*Plugin``): a registration replaces the plugin under its name and
    #: ``DeRegisterPlugin(name)`` drops whoever is registered under it. Later: one instance per endpoint.
    one_plugin_per_name: bool
    #: The DRAPlugin services the kubelet knows, most recent first.
    services: tuple[str, ...]
    #: 1.34+ (``validateSupportedServices`` in ``dra_plugin_manager.go``): the first of the *plugin's* list that the
    #: kubelet knows, none is a refusal. Before: the first of the *kubelet's* list that the plugin lists, and
    #: v1alpha4 when it lists none of them ("plugins at that time didn't advertise gRPC services").
    plugin_order: bool
    #: 1.34+ (PR #132058): each instance's connection is made at registration and watched; the newest connected
    #: instance is called and a driver with no connected instance has its slices wiped. Before: the connection is
    #: made at the first call (``getOrCreateGRPCConn``, 1 s to leave Connecting) and never watched.
    connection_monitoring: bool
    #: 1.33+: a driver's slices are wiped ``wiping_delay`` after it became unusable, cancelled when it is back.
    #: 1.32: at once when its plugin is deregistered (``go h.wipeResourceSlices(pluginName)``), never cancelled.
    wiping_delay: bool
    #: What ``wipeResourceSlices``' ``DeleteCollection`` goes to.
    resource_api: str
    #: 1.34+: the health API exists (``dra-health/v1alpha1``, ``healthinfo.go``, ``UpdateAllocatedResourcesStatus``).
    health: bool
    #: Whether the ResourceHealthStatus gate is on by default (1.36: beta).
    health_gate_default: bool
    #: 1.35+: ``health_check_timeout_seconds`` is read (before, every device has ``DefaultHealthTimeout``).
    health_timeouts: bool
    #: 1.36+: ``message`` is read.
    health_messages: bool
    #: 1.35+: ``Device.share_id`` is read and checkpointed (``ShareID``).
    share_ids: bool
    #: 1.32 and 1.33 (``ManagerImpl`` in ``manager.go``): no validation pass before the claim cache changes, no
    #: UID check of a cached claim (PR #131617 came in 1.34), their error texts.
    legacy_manager: bool
    #: The name of the claim list in ``dra_manager_state``'s data (``CheckpointData``).
    checkpoint_list: str


def _rules(release: str) -> ReleaseRules:
    minor = int(release.split(".")[1])
    return ReleaseRules(
        release=release,
        kubelet_version=f"v{release}.{_PATCHES[release]}",
        one_plugin_per_name=minor == 32,
        services=(SERVICE_V1, SERVICE_V1BETA1) if minor >= 34 else (SERVICE_V1BETA1, SERVICE_V1ALPHA4),
        plugin_order=minor >= 34,
        connection_monitoring=minor >= 34,
        wiping_delay=minor >= 33,
        resource_api=RESOURCE_API_V1 if minor >= 34 else RESOURCE_API_V1BETA1,
        health=minor >= 34,
        health_gate_default=minor >= 36,
        health_timeouts=minor >= 35,
        health_messages=minor >= 36,
        share_ids=minor >= 35,
        legacy_manager=minor <= 33,
        checkpoint_list="Entries" if minor >= 34 else "ClaimInfoStateList",
    )


_RULES = {release: _rules(release) for release in DRA_RELEASES}


def release_rules(release: str) -> ReleaseRules:
    """The rules of ``release`` (one of :data:`DRA_RELEASES`); ValueError naming it and the known ones otherwise."""
    try:
        return _RULES[release]
    except (KeyError, TypeError):
        known = ", ".join(DRA_RELEASES)
        raise ValueError(
            f'unknown kubelet release {release!r}: the dev kubelet models {known} (give the minor release, e.g. "1.32")'
        ) from None
