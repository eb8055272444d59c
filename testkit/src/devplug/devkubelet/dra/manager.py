"""The kubelet's DRA manager: prepare a pod's claims before it runs, unprepare them when no pod uses them.

Follows ``pkg/kubelet/cm/dra/manager.go`` (Kubernetes 1.36, before the
tombstones of issue #132978):

* **PrepareResources** (before the pod's sandbox is made): first a pass that
  changes nothing: every claim's drivers must be registered ("DRA driver ... is
  not registered"), so a pod whose driver is missing leaves no trace. Then each
  claim gets a cache entry (a claim of that name with another UID is an error:
  "old ResourceClaim with same name ... and different UID ... still exists"),
  the pod is added to its users and the checkpoint written; claims already
  prepared are skipped, the others are batched per driver instance and sent
  in one NodePrepareResources call per instance with ``{namespace, uid, name}``.
  A call error, an answer for a claim not asked for, a claim's error, or a
  claim missing from the answer ("NodePrepareResources skipped N
  ResourceClaims") fails the whole call (processing stops there: devices
  already recorded stay, nothing is marked prepared); only when every batch
  succeeded are the claims marked prepared and the checkpoint written. The
  kubelet tries again at the pod's next sync: the same claims are sent again.
* **UnprepareResources** (after the pod's containers stopped): a claim other
  pods still use only loses this pod (not checkpointed until a later success);
  the others are batched per driver and sent in one NodeUnprepareResources
  call per driver (to the instance ``GetPlugin`` picks), with the same error
  rules; on success their entries are deleted and the checkpoint written.
* **the reconcile loop** (every 60 s, once the kubelet's sources are ready):
  every pod that a cache entry lists but that is not active any more gets its
  claims unprepared; a failure is logged and retried at the next pass. After a
  kubelet restart this is how unprepare calls owed from before are made.
* **GetResources**: a container's CDI devices, from its claims (``cdiDevicesAsList``).
* **UpdateAllocatedResourcesStatus**: per container, one ``claim:<name>[/<request>]``
  entry per claim it uses, with the health of each of the claim's devices
  (those serving the request, when one is named and the device names
  requests), ``resourceID`` the device's first CDI ID or
  ``<driver>/<pool>/<device>``, duplicates dropped, entries without devices left out.

Errors reaching the pod are prefixed as the kubelet does: "prepare dynamic
resources: ..." and "unprepare dynamic resources: ...".

The above is 1.34 to 1.36 (the claim UID check is PR #131617, 1.34; the fix of
issue #135901, a claim already prepared no longer ending the pass, is
followed as 1.36 has it and 1.34/1.35 patch releases got it, PRs #136480 and
#136463). **1.32 and 1.33** (``ManagerImpl`` in ``manager.go``: v1.32.10 as
KubeEdge vendors it, and the 1.33 cycle's file as PR #129832 left it) differ:

* no validation pass: each claim gets its cache entry, the pod and a
  checkpoint first; a driver that is not registered fails only when its batch
  is to be sent ("failed to get gRPC client for driver ...: ..."), leaving the
  entry listing the pod, so unpreparing that pod needs the driver (the pod
  stays terminating until it registers, which then gets a
  NodeUnprepareResources for a claim it never prepared);
* no UID check: the entry of a claim of the same ``namespace/name`` is taken
  whatever its UID. A claim deleted and created again under its name, while
  a pod still uses the old one, is not prepared at all (the new pod gets the
  old claim's devices); a restored, unprepared entry is sent with the old UID;
* batches per driver name (the instance ``GetPlugin`` picks), and the 1.32
  words: "NodePrepareResources failed: ...", "NodePrepareResources failed for
  claim <ns>/<name>: ...", "NodePrepareResources left out N claims" (and
  NodeUnprepareResources alike, "get gRPC client for DRA driver ...: ..."),
  with no "prepare dynamic resources:" prefix (``PrepareResources`` returns
  the error as is; ``kuberuntime_manager.go`` writes "Failed to prepare
  dynamic resources: ..." into its event);
* no ``UpdateAllocatedResourcesStatus``: containers get no
  ``allocatedResourcesStatus`` for claims (the kubelet's DRA health is 1.34's).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence

from devplug.api.gen.dra.v1 import api_pb2 as v1
from devplug.devkubelet.dra.claiminfo import ClaimInfo, ClaimInfoCache
from devplug.devkubelet.dra.client import DRAPluginClient
from devplug.devkubelet.dra.health import HealthInfoCache
from devplug.devkubelet.dra.model import (
    ClaimState,
    ContainerClaim,
    PodClaim,
    PreparedDevice,
    ResourceHealth,
    ResourceStatus,
)
from devplug.devkubelet.dra.plugins import DRAPluginManager
from devplug.devkubelet.dra.releases import ReleaseRules
from devplug.errors import KubeletError

__all__ = ["RECONCILE_PERIOD", "DRAManager"]

_log = logging.getLogger("devplug.devkubelet")

#: ``defaultReconcilePeriod``.
RECONCILE_PERIOD = 60.0

Recorder = Callable[[str, str, str], None]


def _claim_pb(info: ClaimInfo) -> v1.Claim:
    return v1.Claim(namespace=info.namespace, uid=info.uid, name=info.name)


def _labels(claims: Sequence[v1.Claim]) -> str:
    return ", ".join(f"{c.namespace}/{c.name} ({c.uid})" for c in claims)


def _base_request(request: str) -> str:
    """``resourceclaim.BaseRequestRef``: ``request/subrequest`` -> ``request``."""
    return request.split("/", 1)[0]


class DRAManager:
    """The DRA manager over a claim cache, the plugin manager and the health cache (see the module docstring).

    ``health_messages`` is the ResourceHealthStatusMessage gate: whether a
    device's health message reaches ``allocatedResourcesStatus``. The release
    followed is the plugin manager's (:attr:`DRAPluginManager.rules`).
    """

    def __init__(
        self,
        cache: ClaimInfoCache,
        plugins: DRAPluginManager,
        health: HealthInfoCache,
        record: Recorder,
        *,
        changed: Callable[[], None] = lambda: None,
        health_messages: bool = True,
    ) -> None:
        self.rules: ReleaseRules = plugins.rules
        self._legacy = self.rules.legacy_manager
        self._cache = cache
        self._plugins = plugins
        self._health = health
        self._record = record
        self._changed = changed
        self._health_messages = health_messages

    # -- observation -----------------------------------------------------------------------------

    def claims(self) -> list[ClaimState]:
        """Every cache entry, by namespace and name."""
        return sorted((info.state() for info in self._cache), key=lambda c: (c.namespace, c.name))

    def claim(self, namespace: str, name: str) -> ClaimState | None:
        """The cache entry of claim ``namespace/name``, or None."""
        info = self._cache.get(name, namespace)
        return info.state() if info is not None else None

    def pod_might_need_to_unprepare(self, pod_uid: str) -> bool:
        """``PodMightNeedToUnprepareResources``: whether a claim still lists the pod."""
        return self._cache.has_pod_reference(pod_uid)

    # -- prepare ---------------------------------------------------------------------------------

    async def prepare_resources(self, pod_uid: str, pod_label: str, claims: Sequence[PodClaim]) -> None:
        """``PrepareResources`` for one pod; :class:`KubeletError` ("prepare dynamic resources: ...") on failure."""
        try:
            if self._legacy:
                await self._prepare_legacy(pod_uid, pod_label, claims)
            else:
                await self._prepare(pod_uid, pod_label, claims)
        except KubeletError as exc:
            if self._legacy:
                raise
            raise KubeletError(f"prepare dynamic resources: {exc}") from exc
        finally:
            self._changed()

    async def _prepare(self, pod_uid: str, pod_label: str, claims: Sequence[PodClaim]) -> None:
        # the validation pass: nothing changes when a driver is missing
        infos: list[tuple[PodClaim, ClaimInfo, dict[str, DRAPluginClient]]] = []
        for pod_claim in claims:
            plugins: dict[str, DRAPluginClient] = {}
            for driver in pod_claim.claim.drivers:
                plugins[driver] = self._plugins.get(driver)
            infos.append((pod_claim, ClaimInfo.from_claim(pod_claim.claim), plugins))
        # the cache update: no call is made before every claim lists the pod and the checkpoint says so
        batches: dict[int, tuple[DRAPluginClient, list[v1.Claim]]] = {}
        to_prepare: dict[str, ClaimInfo] = {}
        for pod_claim, fresh, plugins in infos:
            ref = pod_claim.claim
            info = self._cache.get(ref.name, ref.namespace)
            if info is None:
                info = fresh
                self._cache.add(info)
            elif info.uid != ref.uid:
                raise KubeletError(
                    f"old ResourceClaim with same name {ref.name} and different UID {info.uid} still exists "
                    "(previous pod force-deleted?!)"
                )
            info.pod_uids.add(pod_uid)
            try:
                self._cache.sync_to_checkpoint()
            except KubeletError as exc:
                raise KubeletError(f"checkpoint ResourceClaim cache: {exc}") from exc
            if info.prepared:
                continue
            to_prepare[info.uid] = info
            for driver in info.driver_state:
                plugin = plugins[driver]
                batches.setdefault(id(plugin), (plugin, []))[1].append(_claim_pb(info))
        for plugin, batch in batches.values():
            try:
                response = await plugin.node_prepare_resources(batch)
            except KubeletError as exc:
                self._record("dra-prepare", plugin.driver, f"{pod_label}: {_labels(batch)}: failed: {exc}")
                raise KubeletError(f"NodePrepareResources: {exc}") from exc
            self._take_prepared(plugin, batch, response, to_prepare, pod_label)
        for info in to_prepare.values():
            info.prepared = True
        self._cache.sync_to_checkpoint()

    async def _prepare_legacy(self, pod_uid: str, pod_label: str, claims: Sequence[PodClaim]) -> None:
        """1.32/1.33 ``prepareResources``: the cache first, the drivers looked up when their batch is sent."""
        batches: dict[str, list[v1.Claim]] = {}
        to_prepare: dict[str, ClaimInfo] = {}
        for pod_claim in claims:
            ref = pod_claim.claim
            info = self._cache.get(ref.name, ref.namespace)
            if info is None:
                info = ClaimInfo.from_claim(ref)
                self._cache.add(info)
            # no UID check: an entry of this namespace/name is this claim's, whatever its UID
            info.pod_uids.add(pod_uid)
            try:
                self._cache.sync_to_checkpoint()
            except KubeletError as exc:
                raise KubeletError(f"locked cache operation: failed to checkpoint claimInfo state: {exc}") from exc
            if info.prepared:
                continue
            to_prepare[info.uid] = info
            for driver in info.driver_state:
                batches.setdefault(driver, []).append(_claim_pb(info))
        for driver, batch in batches.items():
            try:
                plugin = self._plugins.get(driver)
            except KubeletError as exc:
                self._record("dra-prepare", driver, f"{pod_label}: {_labels(batch)}: failed: {exc}")
                raise KubeletError(f"failed to get gRPC client for driver {driver}: {exc}") from exc
            try:
                response = await plugin.node_prepare_resources(batch)
            except KubeletError as exc:
                self._record("dra-prepare", plugin.driver, f"{pod_label}: {_labels(batch)}: failed: {exc}")
                raise KubeletError(f"NodePrepareResources failed: {exc}") from exc
            self._take_prepared(plugin, batch, response, to_prepare, pod_label)
        for info in to_prepare.values():
            info.prepared = True
        try:
            self._cache.sync_to_checkpoint()
        except KubeletError as exc:
            raise KubeletError(f"locked cache operation: failed to checkpoint claimInfo state: {exc}") from exc

    def _take_prepared(
        self,
        plugin: DRAPluginClient,
        batch: list[v1.Claim],
        response: v1.NodePrepareResourcesResponse,
        to_prepare: Mapping[str, ClaimInfo],
        pod_label: str,
    ) -> None:
        by_uid = {c.uid: c for c in batch}
        outcome: list[str] = []
        try:
            for uid, result in response.claims.items():
                asked = by_uid.get(uid)
                if asked is None:
                    raise KubeletError(f"NodePrepareResources returned result for unknown claim UID {uid}")
                if result.error:
                    if self._legacy:
                        raise KubeletError(
                            f"NodePrepareResources failed for claim {asked.namespace}/{asked.name}: {result.error}"
                        )
                    raise KubeletError(f"NodePrepareResources failed for ResourceClaim {asked.name}: {result.error}")
                info = to_prepare[uid]
                for device in result.devices:
                    info.add_device(
                        plugin.driver,
                        PreparedDevice(
                            pool_name=device.pool_name,
                            device_name=device.device_name,
                            request_names=tuple(device.request_names),
                            cdi_device_ids=tuple(device.cdi_device_ids),
                            share_id=device.share_id if device.HasField("share_id") else None,
                        ),
                    )
                outcome.append(f"{asked.name}: {len(result.devices)} device(s)")
            skipped = len(batch) - len(response.claims)
            if skipped:
                if self._legacy:
                    raise KubeletError(f"NodePrepareResources left out {skipped} claims")
                raise KubeletError(f"NodePrepareResources skipped {skipped} ResourceClaims")
        except KubeletError as exc:
            self._record("dra-prepare", plugin.driver, f"{pod_label}: {_labels(batch)}: {exc}")
            raise
        self._record("dra-prepare", plugin.driver, f"{pod_label}: {_labels(batch)}: {'; '.join(outcome)}")

    # -- unprepare -------------------------------------------------------------------------------

    async def unprepare_resources(
        self, pod_uid: str, namespace: str, claim_names: Sequence[str], pod_label: str
    ) -> None:
        """``UnprepareResources`` for one pod; :class:`KubeletError` ("unprepare dynamic resources: ...") on failure."""
        try:
            await self._unprepare(pod_uid, namespace, claim_names, pod_label)
        except KubeletError as exc:
            if self._legacy:
                raise
            raise KubeletError(f"unprepare dynamic resources: {exc}") from exc
        finally:
            self._changed()

    async def _unprepare(self, pod_uid: str, namespace: str, claim_names: Sequence[str], pod_label: str) -> None:
        batches: dict[str, list[v1.Claim]] = {}
        done: dict[str, str] = {}
        for name in claim_names:
            info = self._cache.get(name, namespace)
            if info is None:
                continue
            if len(info.pod_uids) > 1:
                info.pod_uids.discard(pod_uid)  # checkpointed only by a later successful write
                continue
            done[info.uid] = info.name
            for driver in info.driver_state:
                batches.setdefault(driver, []).append(_claim_pb(info))
        for driver, batch in batches.items():
            try:
                plugin = self._plugins.get(driver)
            except KubeletError as exc:
                if not self._legacy:
                    raise
                self._record("dra-unprepare", driver, f"{pod_label}: {_labels(batch)}: failed: {exc}")
                raise KubeletError(f"get gRPC client for DRA driver {driver}: {exc}") from exc
            try:
                response = await plugin.node_unprepare_resources(batch)
            except KubeletError as exc:
                self._record("dra-unprepare", driver, f"{pod_label}: {_labels(batch)}: failed: {exc}")
                what = "NodeUnprepareResources failed" if self._legacy else "NodeUnprepareResources"
                raise KubeletError(f"{what}: {exc}") from exc
            by_uid = {c.uid: c for c in batch}
            try:
                for uid, result in response.claims.items():
                    asked = by_uid.get(uid)
                    if asked is None:
                        raise KubeletError(f"NodeUnprepareResources returned result for unknown claim UID {uid}")
                    if result.error and self._legacy:
                        raise KubeletError(
                            f"NodeUnprepareResources failed for claim {asked.namespace}/{asked.name}: {result.error}"
                        )
                    if result.error:
                        raise KubeletError(
                            f"NodeUnprepareResources failed for ResourceClaim {asked.name}: {result.error}"
                        )
                skipped = len(batch) - len(response.claims)
                if skipped and self._legacy:
                    raise KubeletError(f"NodeUnprepareResources left out {skipped} claims")
                if skipped:
                    raise KubeletError(f"NodeUnprepareResources skipped {skipped} ResourceClaims")
            except KubeletError as exc:
                self._record("dra-unprepare", driver, f"{pod_label}: {_labels(batch)}: {exc}")
                raise
            self._record("dra-unprepare", driver, f"{pod_label}: {_labels(batch)}: done")
        for name in done.values():
            self._cache.delete(name, namespace)
        try:
            self._cache.sync_to_checkpoint()
        except KubeletError as exc:
            if self._legacy:
                raise KubeletError(f"locked cache operation: failed to checkpoint claimInfo state: {exc}") from exc
            raise KubeletError(f"checkpoint ResourceClaim state: {exc}") from exc

    async def reconcile(self, active_pod_uids: Collection[str], sources_ready: bool) -> list[str]:
        """``reconcileLoop``: unprepare the claims of every listed pod that is not active; the failures."""
        if not sources_ready:
            return []
        inactive: dict[str, tuple[str, list[str]]] = {}
        for info in self._cache:
            for uid in sorted(info.pod_uids):
                if uid not in active_pod_uids:
                    inactive.setdefault(uid, (info.namespace, []))[1].append(info.name)
        failures = []
        for uid, (namespace, names) in inactive.items():
            try:
                await self._unprepare(uid, namespace, names, f"pod {uid} (inactive)")
            except KubeletError as exc:
                _log.info(
                    "dev kubelet: unpreparing pod %s's resources in the reconcile loop failed, will retry: %s", uid, exc
                )
                failures.append(f"pod {uid}: {exc}")
            finally:
                self._changed()
        return failures

    # -- containers ------------------------------------------------------------------------------

    def _resolve(self, pod_claims: Sequence[PodClaim], claim: ContainerClaim) -> ClaimInfo | None:
        for pod_claim in pod_claims:
            if pod_claim.name == claim.name:
                return self._cache.get(pod_claim.claim.name, pod_claim.claim.namespace)
        return None

    def cdi_devices(self, pod_claims: Sequence[PodClaim], container_claims: Sequence[ContainerClaim]) -> list[str]:
        """``GetResources``: the CDI device names of a container's claims; KubeletError for a claim not in the cache."""
        devices: list[str] = []
        for claim in container_claims:
            pod_claim = next((p for p in pod_claims if p.name == claim.name), None)
            if pod_claim is None:
                continue
            info = self._cache.get(pod_claim.claim.name, pod_claim.claim.namespace)
            if info is None:
                raise KubeletError(f"internal error: unable to get claim info for ResourceClaim {pod_claim.claim.name}")
            devices.extend(info.cdi_devices(claim.request))
        return devices

    def allocated_resources_status(
        self, pod_claims: Sequence[PodClaim], container_claims: Sequence[ContainerClaim]
    ) -> tuple[ResourceStatus, ...]:
        """``UpdateAllocatedResourcesStatus`` for one container (see the module docstring); none before 1.34."""
        if not self.rules.health:
            return ()
        statuses: list[ResourceStatus] = []
        for claim in container_claims:
            info = self._resolve(pod_claims, claim)
            if info is None:
                continue
            seen: set[str] = set()
            resources: list[ResourceHealth] = []
            for driver in sorted(info.driver_state):
                for device in info.driver_state[driver]:
                    if (
                        claim.request
                        and device.request_names
                        and _base_request(claim.request) not in device.request_names
                    ):
                        continue
                    health = self._health.get(driver, device.pool_name, device.device_name)
                    resource_id = (
                        device.cdi_device_ids[0]
                        if device.cdi_device_ids
                        else f"{driver}/{device.pool_name}/{device.device_name}"
                    )
                    if resource_id in seen:
                        continue
                    seen.add(resource_id)
                    message = health.message if self._health_messages and health.message else None
                    resources.append(ResourceHealth(resource_id, health.health, message))
            if resources:
                statuses.append(ResourceStatus(claim.resource_name, tuple(resources)))
        return tuple(statuses)
