"""The DRA manager's claim cache: which claims are prepared, for which pods, with which devices.

Follows ``pkg/kubelet/cm/dra/claiminfo.go`` (the same in every release modelled,
1.32 to 1.36: v1.32.10 as KubeEdge vendors it and the later ones read alike):

* entries are keyed by ``namespace/name`` (``claimInfoCache.get``: ``namespace+"/"+claimName``),
  each with the claim's UID, the set of pod UIDs using it, the per-driver
  device lists and an in-memory ``prepared`` flag. The key never held the
  UID: a claim deleted and created again under its name meets the entry of
  the old one. What changed in 1.34 is the DRA manager's check of that entry's
  UID (PR #131617, see :mod:`~devplug.devkubelet.dra.manager`): 1.32 and 1.33
  take the old entry for the new claim;
* a new entry has one empty driver state per driver of the claim's
  allocation (``newClaimInfoFromClaim``); devices a driver answered are
  *appended* (``addDevice``), so a claim prepared again after a restart lists
  its devices twice;
* entries restored from the checkpoint are not prepared (``newClaimInfoFromState``);
* ``syncToCheckpoint`` writes every entry, each time the manager asks, in
  the release's layout (:mod:`~devplug.devkubelet.dra.checkpoint`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from devplug.devkubelet.dra.checkpoint import load_claims, store_claims
from devplug.devkubelet.dra.model import ClaimState, PreparedDevice, ResourceClaimRef
from devplug.devkubelet.dra.releases import DEFAULT_RELEASE, ReleaseRules, release_rules

__all__ = ["ClaimInfo", "ClaimInfoCache"]


@dataclass
class ClaimInfo:
    """One cache entry (``ClaimInfo``): mutable, changed only by the DRA manager."""

    uid: str
    name: str
    namespace: str
    pod_uids: set[str] = field(default_factory=set)
    driver_state: dict[str, list[PreparedDevice]] = field(default_factory=dict)
    prepared: bool = False

    @classmethod
    def from_claim(cls, claim: ResourceClaimRef) -> ClaimInfo:
        """``newClaimInfoFromClaim``: no pods, one empty device list per driver of the allocation."""
        return cls(claim.uid, claim.name, claim.namespace, driver_state={d: [] for d in claim.drivers})

    @classmethod
    def from_state(cls, state: ClaimState) -> ClaimInfo:
        """``newClaimInfoFromState``: as checkpointed, not prepared."""
        return cls(
            state.uid,
            state.name,
            state.namespace,
            set(state.pod_uids),
            {driver: list(devices) for driver, devices in state.devices.items()},
        )

    def state(self) -> ClaimState:
        """This entry as a frozen value."""
        return ClaimState(
            namespace=self.namespace,
            name=self.name,
            uid=self.uid,
            pod_uids=frozenset(self.pod_uids),
            devices={driver: tuple(devices) for driver, devices in self.driver_state.items()},
            prepared=self.prepared,
        )

    def add_device(self, driver: str, device: PreparedDevice) -> None:
        """``addDevice``: append (never replace) a device a driver answered."""
        self.driver_state.setdefault(driver, []).append(device)

    def cdi_devices(self, request: str) -> list[str]:
        """``cdiDevicesAsList``: the CDI IDs of every device serving ``request`` (all of them when it is empty).

        A device with no request names serves every request.
        """
        return [
            cdi
            for devices in self.driver_state.values()
            for device in devices
            if not request or not device.request_names or request in device.request_names
            for cdi in device.cdi_device_ids
        ]


class ClaimInfoCache:
    """``claimInfoCache``: entries by ``namespace/name``, loaded from and written to ``dra_manager_state``.

    ``rules`` is the release whose checkpoint layout is read and written (default 1.36).
    """

    def __init__(self, state_file: Path, rules: ReleaseRules | None = None) -> None:
        self.state_file = state_file
        self.rules = rules if rules is not None else release_rules(DEFAULT_RELEASE)
        self._claims: dict[str, ClaimInfo] = {}
        for state in load_claims(state_file, list_name=self.rules.checkpoint_list, share_ids=self.rules.share_ids):
            info = ClaimInfo.from_state(state)
            self._claims[f"{info.namespace}/{info.name}"] = info

    def get(self, name: str, namespace: str) -> ClaimInfo | None:
        return self._claims.get(f"{namespace}/{name}")

    def add(self, info: ClaimInfo) -> None:
        self._claims[f"{info.namespace}/{info.name}"] = info

    def delete(self, name: str, namespace: str) -> None:
        self._claims.pop(f"{namespace}/{name}", None)

    def has_pod_reference(self, uid: str) -> bool:
        """``hasPodReference``: whether any claim still lists this pod."""
        return any(uid in info.pod_uids for info in self._claims.values())

    def __iter__(self) -> Iterator[ClaimInfo]:
        return iter(list(self._claims.values()))

    def sync_to_checkpoint(self) -> None:
        """``syncToCheckpoint``: write every entry; raises :class:`~devplug.errors.KubeletError` when it fails."""
        store_claims(
            self.state_file,
            (info.state() for info in self._claims.values()),
            list_name=self.rules.checkpoint_list,
            share_ids=self.rules.share_ids,
        )
