"""The ``kubernetes`` backend: one ``coordination.k8s.io/v1`` Lease per slot, through lightkube.

::

    coordination = { backend = "kubernetes", namespace = "devplug", lease_ttl = 15.0 }
    # outside a pod: kubeconfig = "/etc/devplug/kubeconfig", or server = "https://10.0.0.1:6443"

The Lease ``devplug-shared.<resource>.<slot>`` (the resource's ``/`` as ``.``)
in ``namespace`` is the slot's claim: ``spec.holderIdentity`` is the node
name, ``acquireTime`` when it was claimed, ``renewTime`` renewed every third of
``lease_ttl`` while a pod holds the slot, ``leaseDurationSeconds = lease_ttl``.
A slot is held while ``renewTime + leaseDurationSeconds`` is in the future (by
the reader's clock, as client-go's leader election judges a Lease: keep node
clocks in sync). Every write is an update carrying the ``resourceVersion`` that
was read, so two nodes racing for one slot get one success and one ``409
Conflict`` (optimistic concurrency); a create racing a create gets ``409
AlreadyExists``. Release clears ``holderIdentity`` the same way (what client-go's
``ReleaseOnCancel`` does), so the slot is free at once. The Kubernetes API has
no transaction across objects: a request for several slots takes them one by
one and gives back the ones it took when one is held elsewhere, so it is still
all or nothing for the pod.

A claim whose Lease expired does not free the slot by itself: its holder's
daemon may only have crashed (or be crash-looping, or restarting in a rolling
update) while its pod still uses the device. Before a slot held by another
node is taken (or advertised free), the claimant asks the API server whether
that node's pods may still run:

* the node's kubelet Lease, ``kube-node-lease/<node>``, renewed by the kubelet
  every 10 s with ``leaseDurationSeconds`` 40 by default (``nodeLeaseDurationSeconds``;
  ``pkg/kubelet/kubelet.go``, ``component-helpers/apimachinery/lease``): missing,
  or not renewed within its duration, means the node is gone (dead, or cut off
  from the API server), and the slot is free;
* else the node is alive: the slot stays held while a pod bound to it
  (``spec.nodeName``) that requests the resource (a container's or init
  container's limits or requests) is not ``Succeeded`` or ``Failed``; once none
  is, its daemon cannot have a pod on the slot, and the slot is free.

So a slot moves to another node only when its holder's daemon stopped renewing
it (``lease_ttl``) and either the holder's node is gone (at most
``nodeLeaseDurationSeconds`` after the kubelet's last renewal) or no pod of it
uses the resource any more; a daemon that restarts on a live node claims its
slots again before anyone may take them. What the API server cannot tell: a pod
force-deleted (``--grace-period=0 --force``) while its containers still run, and
a node whose kubelet still reaches the API server while the device's network
does not. When the API server cannot answer these questions (no RBAC, an
error), the claim is kept and the reason says so.

Credentials: ``kubeconfig`` if given, else the pod's service account (in a
cluster) or ``~/.kube/config`` (lightkube's ``KubeConfig.from_env``); ``server``
talks to an API server without credentials (tests, ``kubectl proxy``). The
daemon's service account needs ``get, list, create, update`` on ``leases`` in
``namespace``, ``get`` on ``leases`` in ``kube-node-lease`` and ``list`` on
``pods``: ``rbac.yaml`` in this package.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from devplug_shared.backends.common import check_absolute, check_seconds
from devplug_shared.slots import Claim, SlotTakenError, StoreUnavailableError, sorted_slots

__all__ = ["KubernetesBackend", "KubernetesOptions", "lease_name"]

_log = logging.getLogger("devplug_shared")

_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_BAD = re.compile(r"[^a-z0-9.-]+")
#: How many times one slot's update is retried after a 409 Conflict.
_ATTEMPTS = 8
#: ``v1.NamespaceNodeLease``: where every kubelet keeps the Lease named after its node.
NODE_LEASE_NAMESPACE = "kube-node-lease"
#: Pod phases after which no container of the pod runs (``PodSucceeded``, ``PodFailed``).
TERMINAL_PHASES = ("Succeeded", "Failed")
MANAGED_BY = "app.kubernetes.io/managed-by"
RESOURCE_LABEL = "devplug.io/shared-resource"
RESOURCE_ANNOTATION = "devplug.io/shared-resource"


def lease_name(resource: str, slot: str) -> str:
    """The Lease of ``slot`` of ``resource``: a DNS-1123 subdomain, stable on every node."""
    return _BAD.sub("-", f"devplug-shared.{resource.lower().replace('/', '.')}.{slot}")[:253].strip("-.")


def resource_label(resource: str) -> str:
    """A label value (63 characters at most) standing for ``resource``, to list its Leases."""
    return hashlib.sha256(resource.encode()).hexdigest()[:40]


@dataclass(frozen=True)
class KubernetesOptions:
    """``namespace`` of the Leases; ``lease_ttl``, ``timeout`` (seconds); ``kubeconfig`` or ``server``."""

    namespace: str = "default"
    lease_ttl: float = 15.0
    timeout: float = 5.0
    kubeconfig: Path | None = None
    server: str | None = None

    def __post_init__(self) -> None:
        if not _NAMESPACE.match(self.namespace):
            raise ValueError(f"namespace: {self.namespace!r} is not a namespace name (DNS-1123 label)")
        check_seconds("lease_ttl", self.lease_ttl, 2.0, 3600.0)
        check_seconds("timeout", self.timeout, 0.05, 60.0)
        check_absolute("kubeconfig", self.kubeconfig)
        if self.kubeconfig is not None and self.server is not None:
            raise ValueError("kubeconfig, server: give one of them, not both")


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _seconds(value: Any) -> float | None:
    """A MicroTime (datetime or RFC 3339 text) as unix seconds."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return float(value.timestamp())
    return None


class KubernetesBackend:
    """Slot claims as Lease objects."""

    def __init__(self, options: KubernetesOptions, *, node: str, resource: str) -> None:
        self.options = options
        self.node = node
        self.resource = resource
        where = options.server or (str(options.kubeconfig) if options.kubeconfig else "the cluster")
        self.description = f"Kubernetes API ({where}), Leases in namespace {options.namespace}"
        self._client: Any = None
        self._lock = threading.Lock()

    # --- the API

    def _api(self) -> Any:
        with self._lock:
            if self._client is None:
                import httpx2
                from lightkube import Client, KubeConfig

                if self.options.server is not None:
                    config = KubeConfig.from_dict(  # a server and no credentials (from_server sets no user)
                        {
                            "clusters": [{"name": "server", "cluster": {"server": self.options.server}}],
                            "users": [{"name": "anonymous", "user": {}}],
                            "contexts": [{"name": "server", "context": {"cluster": "server", "user": "anonymous"}}],
                            "current-context": "server",
                        }
                    )
                elif self.options.kubeconfig is not None:
                    config = KubeConfig.from_file(self.options.kubeconfig)
                else:
                    config = KubeConfig.from_env()
                self._client = Client(
                    config,
                    namespace=self.options.namespace,
                    timeout=httpx2.Timeout(self.options.timeout),
                    field_manager="devplug-shared",
                    trust_env=False,
                )
            return self._client

    def _unavailable(self, action: str, slots: Sequence[str], exc: Exception) -> StoreUnavailableError:
        return StoreUnavailableError.of(self.description, action, slots, exc)

    def _get(self, slot: str, action: str) -> Any | None:
        """The slot's Lease, or None when there is none (404)."""
        from lightkube import ApiError
        from lightkube.resources.coordination_v1 import Lease

        try:
            return self._api().get(Lease, lease_name(self.resource, slot), namespace=self.options.namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise self._unavailable(action, [slot], exc) from exc
        except Exception as exc:  # connection refused, timeouts: httpx's errors
            raise self._unavailable(action, [slot], exc) from exc

    def _write(self, obj: Any, slot: str, action: str, *, create: bool) -> bool:
        """Create or update (with the resourceVersion read); False on 409 (somebody else wrote first)."""
        from lightkube import ApiError

        try:
            if create:
                self._api().create(obj, namespace=self.options.namespace)
            else:
                self._api().replace(obj, namespace=self.options.namespace)
        except ApiError as exc:
            if exc.status.code == 409:
                return False
            raise self._unavailable(action, [slot], exc) from exc
        except Exception as exc:
            raise self._unavailable(action, [slot], exc) from exc
        return True

    def _claim_of(self, slot: str, lease: Any, now: float) -> Claim | None:
        """The live claim a Lease records, or None when it is free or expired."""
        spec = lease.spec
        if spec is None or not spec.holderIdentity:
            return None
        renewed = _seconds(spec.renewTime) or _seconds(spec.acquireTime) or 0.0
        duration = spec.leaseDurationSeconds or 0
        if renewed + duration <= now:
            return None
        since = _seconds(spec.acquireTime) or renewed
        return Claim(slot, spec.holderIdentity, since, renewed)

    def _standing_claim(self, slot: str, lease: Any, now: float, verdicts: dict[str, str | None]) -> Claim | None:
        """The claim a Lease records that still stands: live, or expired while its holder's pods may still run
        (:meth:`_holder_kept`, asked once per holder and ``verdicts``); None when the slot is free."""
        live = self._claim_of(slot, lease, now)
        spec = lease.spec
        if live is not None or spec is None or not spec.holderIdentity:
            return live
        holder = spec.holderIdentity
        if holder == self.node:
            return None  # this node's own expired claim: ours to take again
        if holder not in verdicts:
            verdicts[holder] = self._holder_kept(holder, now)
        kept = verdicts[holder]
        if kept is None:
            return None
        renewed = _seconds(spec.renewTime) or _seconds(spec.acquireTime) or 0.0
        return Claim(slot, holder, _seconds(spec.acquireTime) or renewed, renewed, kept)

    def _holder_kept(self, holder: str, now: float) -> str | None:
        """Why ``holder``'s expired claims still stand (its node is alive and one of its pods requests the
        resource), or None when its node is gone or none of its pods can use the slot any more."""
        from lightkube import ApiError
        from lightkube.resources.coordination_v1 import Lease
        from lightkube.resources.core_v1 import Pod

        unsure = (
            f"kept: node {holder}'s daemon stopped renewing its claim and the API server cannot tell whether its "
            "pods still run"
        )
        try:
            node_lease = self._api().get(Lease, holder, namespace=NODE_LEASE_NAMESPACE)
        except ApiError as exc:
            if exc.status.code == 404:
                return None  # no such node (deleted, or never a kubelet's name)
            return f"{unsure} (its kubelet Lease in {NODE_LEASE_NAMESPACE}: {exc.status.code} {exc.status.reason})"
        except Exception as exc:
            return f"{unsure} ({type(exc).__name__}: {exc})"
        spec = node_lease.spec
        renewed = (_seconds(spec.renewTime) if spec is not None else None) or 0.0
        duration = (spec.leaseDurationSeconds if spec is not None else None) or 0
        if renewed + duration <= now:
            return None  # the kubelet stopped renewing: the node is dead or cut off
        try:
            pods = list(self._api().list(Pod, namespace="*", fields={"spec.nodeName": holder}))
        except ApiError as exc:
            return f"{unsure} (listing its pods: {exc.status.code} {exc.status.reason})"
        except Exception as exc:
            return f"{unsure} (listing its pods: {type(exc).__name__}: {exc})"
        for pod in pods:
            phase = pod.status.phase if pod.status is not None else None
            if phase in TERMINAL_PHASES or not self._requests_resource(pod):
                continue
            meta = pod.metadata
            name = f"{meta.namespace}/{meta.name}" if meta is not None else "?"
            return (  # no clock reading in it: the status is rewritten only when what it says changes
                f"kept: node {holder}'s daemon stopped renewing its claim, but its kubelet keeps renewing the node's "
                f"Lease and pod {name} ({phase or 'no phase'}), which requests {self.resource}, is bound to it"
            )
        return None

    def _requests_resource(self, pod: Any) -> bool:
        spec = pod.spec
        if spec is None:
            return False
        for container in [*(spec.containers or []), *(spec.initContainers or [])]:
            resources = container.resources
            if resources is not None and self.resource in {**(resources.requests or {}), **(resources.limits or {})}:
                return True
        return False

    def _new_lease(self, slot: str) -> Any:
        from lightkube.models.coordination_v1 import LeaseSpec
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.coordination_v1 import Lease

        stamp = _now()
        return Lease(
            metadata=ObjectMeta(
                name=lease_name(self.resource, slot),
                namespace=self.options.namespace,
                labels={MANAGED_BY: "devplug-shared", RESOURCE_LABEL: resource_label(self.resource)},
                annotations={RESOURCE_ANNOTATION: self.resource, "devplug.io/shared-slot": slot},
            ),
            spec=LeaseSpec(
                holderIdentity=self.node,
                acquireTime=stamp,
                renewTime=stamp,
                leaseDurationSeconds=max(1, round(self.options.lease_ttl)),
                leaseTransitions=0,
            ),
        )

    # --- the backend

    def open(self) -> None:
        """Nothing to start: each slot's Lease carries its own renewal. Checks the API answers, and warns when this
        node has no kubelet Lease under its name (then a crash of this daemon cannot be told from the node's
        death by the other nodes: give ``node_name`` the node's name, or let ``$NODE_NAME`` do it)."""
        from lightkube import ApiError
        from lightkube.resources.coordination_v1 import Lease

        self.holders()
        try:
            self._api().get(Lease, self.node, namespace=NODE_LEASE_NAMESPACE)
        except ApiError as exc:
            _log.warning(
                "shared: no kubelet Lease %s/%s to be read (%s %s): other nodes cannot tell whether node %s "
                "is alive, so after a crash of this daemon its slots move once their Leases expire; is node_name "
                "the node's name, and may the service account get leases in %s?",
                NODE_LEASE_NAMESPACE,
                self.node,
                exc.status.code,
                exc.status.reason,
                self.node,
                NODE_LEASE_NAMESPACE,
            )
        except Exception as exc:
            raise self._unavailable("read the node's kubelet Lease", (), exc) from exc

    def _take(self, slot: str) -> bool:
        """Make this node the slot's holder. True if it was not ours before; SlotTakenError if another's."""
        for _ in range(_ATTEMPTS):
            lease = self._get(slot, "claim slot(s)")
            if lease is None:
                if self._write(self._new_lease(slot), slot, "claim slot(s)", create=True):
                    return True
                continue  # 409 AlreadyExists: another node created it first; read it
            now = time.time()
            claim = self._standing_claim(slot, lease, now, {})
            if claim is not None and claim.holder != self.node:
                raise SlotTakenError.of(self.resource, claim)
            mine = claim is not None
            stamp = _now()
            spec = lease.spec
            if not mine:
                spec.acquireTime = stamp
                spec.leaseTransitions = (spec.leaseTransitions or 0) + 1
            spec.holderIdentity = self.node
            spec.renewTime = stamp
            spec.leaseDurationSeconds = max(1, round(self.options.lease_ttl))
            if self._write(lease, slot, "claim slot(s)", create=False):
                return not mine
        raise StoreUnavailableError.of(self.description, "claim slot(s)", [slot], "the Lease kept changing; try again")

    def claim(self, slots: Sequence[str]) -> None:
        """Take every slot; on one held elsewhere, give back those this call took, then raise."""
        taken: list[str] = []
        try:
            for slot in sorted_slots(slots):
                if self._take(slot):
                    taken.append(slot)
        except BaseException:
            if taken:
                with contextlib.suppress(StoreUnavailableError):  # else they expire with leaseDurationSeconds
                    self.release(taken)
            raise

    def _clear(self, slot: str, action: str, *, renew: bool) -> bool:
        """Renew (``renew``) or release this node's claim on ``slot``; False when it is not ours any more."""
        for _ in range(_ATTEMPTS):
            lease = self._get(slot, action)
            if lease is None:
                return False
            claim = self._claim_of(slot, lease, time.time())
            if lease.spec is None or lease.spec.holderIdentity != self.node or (renew and claim is None):
                return False
            if renew:
                lease.spec.renewTime = _now()
            else:
                lease.spec.holderIdentity = None
                lease.spec.acquireTime = None
                lease.spec.renewTime = None
            if self._write(lease, slot, action, create=False):
                return True
        raise StoreUnavailableError.of(self.description, action, [slot], "the Lease kept changing; try again")

    def keepalive(self, held: Sequence[str]) -> bool:
        """Renew the Lease of every held slot; False when one was no longer this node's (expired or taken)."""
        ok = True
        for slot in sorted_slots(held):
            ok = self._clear(slot, "renew slot claim(s)", renew=True) and ok
        return ok

    def release(self, slots: Sequence[str]) -> None:
        """Clear ``holderIdentity`` on this node's Leases among ``slots`` (resourceVersion-guarded)."""
        for slot in sorted_slots(slots):
            self._clear(slot, "release slot(s)", renew=False)

    def holders(self) -> Mapping[str, Claim]:
        """Every standing claim, from a list of this resource's Leases (by label): live ones, and expired ones
        whose holder's pods may still run (with why, :attr:`Claim.kept`)."""
        from lightkube.resources.coordination_v1 import Lease

        try:
            leases = list(
                self._api().list(
                    Lease, namespace=self.options.namespace, labels={RESOURCE_LABEL: resource_label(self.resource)}
                )
            )
        except Exception as exc:
            raise self._unavailable("read the slots' holders", (), exc) from exc
        now = time.time()
        claims: dict[str, Claim] = {}
        verdicts: dict[str, str | None] = {}
        for lease in leases:
            annotations = (lease.metadata.annotations or {}) if lease.metadata is not None else {}
            slot = annotations.get("devplug.io/shared-slot")
            if slot is None or annotations.get(RESOURCE_ANNOTATION) != self.resource:
                continue
            claim = self._standing_claim(slot, lease, now, verdicts)
            if claim is not None:
                claims[slot] = claim
        return claims

    def watch(self, changed: Callable[[], None]) -> None:
        """No watch yet: the driver reads the Leases every ``refresh_interval``. (A watch on the resource's Leases,
        ``?watch=true`` on its label, would tell at once; the test kit's model of the API server has none to test
        it against.)"""
        return None

    def close(self) -> None:
        """Close the HTTP client; held Leases expire unless the next start renews them."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
