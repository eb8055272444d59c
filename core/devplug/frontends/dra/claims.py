"""Reading ResourceClaims: what a claim the kubelet names gives this driver on this node, and which claims still exist.

The kubelet's ``NodePrepareResources`` names each claim by namespace, name and
UID only; the allocation is in the claim's status (``resource.k8s.io/v1``,
``k8s.io/api/resource/v1/types.go`` v0.36.3; read through the version discovery
chose, :mod:`~devplug.frontends.dra.apiversions`: ``status.allocation`` has the
same shape in v1beta1 and v1beta2. A claim read that finds the version not served
any more discovers it again and reads once more):

* ``status.allocation.nodeSelector``: the nodes the allocation is for; it must
  match this node's name and labels (:mod:`~devplug.frontends.dra.nodeselector`:
  the labels are read only for a selector that names some, kept a while, and read
  again before a claim is refused for them), or the claim is refused naming the
  node and the selector. An allocation without one (devices reachable from any
  node: network-attached) passes, and the pool check below decides;

* ``status.allocation.devices.results[]``: one entry per allocated device,
  ``{request, driver, pool, device, adminAccess, shareID, consumedCapacity, ...}``
  (``shareID`` and ``consumedCapacity`` on a device allocated more than once, KEP-5075;
  ``adminAccess`` on a KEP-5018 monitoring allocation; :mod:`~devplug.frontends.dra.shares`
  and :mod:`~devplug.frontends.dra.adminaccess` prepare them); this driver's
  are those whose ``driver`` is its name and ``pool`` its node's pool (the Go
  helper leaves that filtering to the driver; devices of this driver in another
  pool beside this node's are an error, since a pod started with part of its
  devices would run without the others); ``device`` is the device name the
  driver published (:mod:`devplug.frontends.dra.devicenames`), mapped back to the
  devplug device ID;
* ``status.allocation.devices.config[]``: opaque parameters,
  ``{source: FromClass|FromClaim, requests: [...], opaque: {driver, parameters}}``,
  in the order the scheduler wrote them (the class's first, then the claim's: a
  later one overrides an earlier one); an entry without ``requests`` applies to
  every request; this driver's are those whose ``opaque.driver`` is its name;
* ``status.reservedFor[]``: the consumers, pods by UID.

:class:`ClaimReader.read` raises a :class:`ClaimError` per claim, whose message is
the per-claim ``error`` of the kubelet's response: a UID, namespace or name not
of the form the API server gives (:meth:`ClaimRef.problem`: nothing is asked
for it, since its namespace and name would make the URL), a pod in
``reservedFor`` named by something that is not a UID (it would name cgroup
folders), not found, a claim recreated
under the same name (another UID), not allocated, no device of this driver and
pool, devices of this driver in another pool too, a device name this node does
not publish, an allocation for another node. An API server that does not
answer (or cannot give the node's labels) is a :class:`ClaimReadError` (the
kubelet retries the call).

Finding prepared claims whose unprepare will never come (the claim was deleted
while the daemon was down): :meth:`ClaimReader.presence` gets each prepared claim
by name, rather than listing every ResourceClaim. A node prepares a few claims
(at most its pods'), a cluster may hold tens of thousands, and claims have no
field selector for a node (only ``metadata.name`` and ``metadata.namespace``):
a list would cost every node a walk of the cluster's claims, a get costs one
small request per claim this node prepared.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from devplug.errors import DevplugError, KubeApiError, RequestError
from devplug.frontends.dra.apiversions import DraApi
from devplug.frontends.dra.nodeselector import NodeLabels, NodeLabelsError, NodeSelector, selector_of
from devplug.kube.client import describe_api_error, not_served
from devplug.kube.ids import dns1123_label_problem, dns1123_subdomain_problem, uid_problem
from devplug.text.logsafe import shorten

if TYPE_CHECKING:
    from lightkube import AsyncClient

__all__ = [
    "AllocatedDevice",
    "ClaimAllocation",
    "ClaimDeviceUnknownError",
    "ClaimError",
    "ClaimIdentifierError",
    "ClaimNodeMismatchError",
    "ClaimNotAllocatedError",
    "ClaimNotFoundError",
    "ClaimPoolMismatchError",
    "ClaimPresence",
    "ClaimReadError",
    "ClaimReader",
    "ClaimRef",
    "ClaimReplacedError",
    "NoDeviceOfOursError",
    "OpaqueConfig",
]

#: How many claims :meth:`ClaimReader.presence` asks about at once.
PRESENCE_CONCURRENCY = 8
#: How many claim reads of one reader (prepares and presence checks together) talk to the API server at once; the
#: others wait their turn, first come first served, so a flood of claims costs its sender time, not the node memory
#: and connections (the client's pool holds 100), and a good claim waits behind at most the reads already queued.
READS_AT_ONCE = 8


@dataclass(frozen=True, order=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"resource claim {shorten(self.namespace)}/{shorten(self.name, 253)} (uid {shorten(self.uid)})"

    def problem(self) -> str | None:
        """Why no API server could have named a claim so (``"its uid '../x' is not a Kubernetes UID (...)"``), or
        None: the UID must be a Kubernetes UID, the namespace a DNS-1123 label, the name a DNS-1123 subdomain
        (:mod:`devplug.kube.ids`). A claim with a problem names no file and no URL."""
        for field, problem in (
            ("uid", uid_problem(self.uid)),
            ("namespace", dns1123_label_problem(self.namespace)),
            ("name", dns1123_subdomain_problem(self.name)),
        ):
            if problem is not None:
                return f"its {field} {problem}"
        return None


class ClaimError(RequestError):
    """A claim that cannot be prepared; the message (naming the claim) is the kubelet's per-claim error."""

    def __init__(self, claim: ClaimRef, problem: str) -> None:
        super().__init__(f"{claim}: {problem}")
        self.claim = claim


class ClaimIdentifierError(ClaimError):
    """The claim's UID, namespace or name is not of the form Kubernetes gives it (:meth:`ClaimRef.problem`), or
    its object names a pod by something that is not a UID: nothing is read, written or removed for it."""


class ClaimNotFoundError(ClaimError):
    """The API server has no claim of that namespace and name."""


class ClaimReplacedError(ClaimError):
    """A claim of that name exists with another UID: the kubelet's claim was deleted and another made."""


class ClaimNotAllocatedError(ClaimError):
    """The claim has no allocation (yet, or any more)."""


class ClaimNodeMismatchError(ClaimError):
    """The claim's allocation is for another node: its node selector does not match this node's name and labels."""


class NoDeviceOfOursError(ClaimError):
    """The allocation holds no device of this driver in this node's pool."""


class ClaimDeviceUnknownError(ClaimError):
    """The allocation names a device of this driver and pool that this node does not publish."""


class ClaimPoolMismatchError(ClaimError):
    """The allocation gives this driver's devices of this node's pool and of another pool too: this node can
    prepare only its own, and a pod started without the others would run without devices it was given."""


class ClaimReadError(DevplugError):
    """The API server did not answer, or failed (5xx, 429, 403, a network error): try again later."""


@dataclass(frozen=True)
class AllocatedDevice:
    """One device of the claim's allocation that is this driver's on this node."""

    request: str
    #: The device's name in the ResourceSlice, and the devplug device ID it stands for.
    device_name: str
    device_id: str
    #: The allocation's ``shareID`` (a device allocated more than once), or None.
    share_id: str | None = None
    #: An admin-access allocation: the device may be in use by other claims as well.
    admin_access: bool = False
    #: The allocation's ``consumedCapacity`` (a share of a device with consumable capacity, KEP-5075): each capacity
    #: name with its quantity's text, sorted by name; empty for a device allocated whole.
    consumed_capacity: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class OpaqueConfig:
    """One of this driver's opaque configurations of the claim (``FromClass`` or ``FromClaim``)."""

    source: str
    #: The requests it applies to; empty: every request of the claim.
    requests: tuple[str, ...]
    #: ``opaque.parameters``, as the JSON it is.
    parameters: Any

    def applies_to(self, request: str) -> bool:
        return not self.requests or request in self.requests


@dataclass(frozen=True)
class ClaimAllocation:
    """What a claim gives this driver on this node."""

    claim: ClaimRef
    devices: tuple[AllocatedDevice, ...]
    #: This driver's configurations, in the claim's order (a later one overrides an earlier one).
    configs: tuple[OpaqueConfig, ...]
    #: The UIDs of the pods the claim is reserved for.
    reserved_for: tuple[str, ...]

    @property
    def device_ids(self) -> tuple[str, ...]:
        return tuple(d.device_id for d in self.devices)

    def configs_for(self, request: str) -> list[OpaqueConfig]:
        """The configurations that apply to ``request``, in order."""
        return [c for c in self.configs if c.applies_to(request)]


class _NotServedError(Exception):
    """The claim's read answered that its path is not served (the message: how)."""


class ClaimPresence(enum.Enum):
    """Whether a claim prepared earlier is still there, as the API server has it."""

    PRESENT = "present"
    #: No claim of that namespace and name.
    DELETED = "deleted"
    #: A claim of that name with another UID: the prepared one is gone.
    REPLACED = "replaced"
    #: The same claim, no longer allocated: no pod may use what was prepared for it.
    DEALLOCATED = "deallocated"

    @property
    def gone(self) -> bool:
        """True when what was prepared for the claim is of no use any more (unprepare it)."""
        return self is not ClaimPresence.PRESENT


class ClaimReader:
    """Reads claims for one driver and pool; ``device_id`` maps a published device name back to its device ID.

    ``api``: the ``resource.k8s.io`` version to read through (none: v1); ``node``: this node's labels, to check an
    allocation's node selector against (none: no node check, the pool alone decides; the front end always gives one).
    """

    def __init__(
        self,
        client: AsyncClient,
        *,
        driver: str,
        pool: str,
        device_id: Callable[[str], str | None],
        api: DraApi | None = None,
        node: NodeLabels | None = None,
    ) -> None:
        self._client = client
        self._reads = asyncio.Semaphore(READS_AT_ONCE)
        self.driver = driver
        self.pool = pool
        self._device_id = device_id
        self._api = api or DraApi.fixed(client)
        self._node = node

    async def _get(self, claim: ClaimRef) -> dict[str, Any] | None:
        """The claim as stored, or None when there is none (404); :class:`ClaimReadError` on any other failure."""
        problem = claim.problem()
        if problem is not None:  # its namespace and name would make the URL
            raise ClaimIdentifierError(claim, problem)
        choice = self._api.choice
        try:
            return await self._get_once(claim)
        except _NotServedError as gone:
            try:  # the version in use is gone (the API server changed): find it again, and read once more
                await self._api.refresh(f"reading {claim} answered {gone}", seen=choice)
            except Exception as exc:
                raise ClaimReadError(
                    f"{claim}: the API server does not serve {choice.api_version} ({gone}), and finding the version "
                    f"to use failed: {describe_api_error(exc)[0]}"
                ) from exc
            try:
                return await self._get_once(claim)
            except _NotServedError as again:
                raise ClaimReadError(
                    f"{claim}: the API server does not serve {self._api.choice.api_version}: {again}"
                ) from again

    async def _get_once(self, claim: ClaimRef) -> dict[str, Any] | None:
        from lightkube import ApiError

        try:
            async with self._reads:
                found = await self._client.get(self._api.claim_resource(), claim.name, namespace=claim.namespace)
        except Exception as exc:
            if not_served(exc):
                raise _NotServedError(describe_api_error(exc)[0]) from exc
            if isinstance(exc, ApiError):
                if exc.status.code == 404:
                    return None
                raise ClaimReadError(
                    f"{claim}: the API server failed to give it: {describe_api_error(exc)[0]}"
                ) from exc
            if isinstance(exc, KubeApiError):  # too late, too large, a redirect: the message names the request
                raise ClaimReadError(f"{claim}: the API server's answer cannot be used: {exc}") from exc
            # the network's: refused, reset, timed out
            raise ClaimReadError(f"{claim}: the API server did not answer: {describe_api_error(exc)[0]}") from exc
        stored: dict[str, Any] = found.to_dict()
        return stored

    async def read(self, claim: ClaimRef) -> ClaimAllocation:
        """The claim's devices and configurations of this driver and pool (see the module's docstring)."""
        stored = await self._get(claim)
        if stored is None:
            raise ClaimNotFoundError(claim, "not found in the API server (deleted?)")
        allocation = self._allocation(claim, stored)
        await self._check_node(claim, allocation)
        return self.allocation_of(claim, stored)

    async def _check_node(self, claim: ClaimRef, allocation: Mapping[str, Any]) -> None:
        """:class:`ClaimNodeMismatchError` unless the allocation's node selector matches this node (none: passes)."""
        if self._node is None:
            return
        selector = selector_of(allocation)
        if selector is None:
            return
        name = self._node.name
        labels = await self._labels(claim, selector, fresh=False)
        if selector.matches(name, labels):
            return
        if selector.needs_labels:  # a label set since they were read: read them again before refusing
            labels = await self._labels(claim, selector, fresh=True)
            if selector.matches(name, labels):
                return
        keys = sorted({r.key for term in selector.terms for r in term if not r.field})
        shown = ", ".join(f"{k}={labels[k]}" if k in labels else f"no {k}" for k in keys)
        problems = selector.problems()
        raise ClaimNodeMismatchError(
            claim,
            f"allocated for another node: its allocation's node selector {shorten(str(selector), 512)} does not "
            f"match node {name}"
            + (f" (labels: {shorten(shown, 256)})" if keys else "")
            + (f"; it does not parse: {shorten('; '.join(problems), 256)}" if problems else ""),
        )

    async def _labels(self, claim: ClaimRef, selector: NodeSelector, *, fresh: bool) -> Mapping[str, str]:
        if self._node is None or not selector.needs_labels:
            return {}
        try:
            return await self._node.get(fresh=fresh)
        except NodeLabelsError as exc:
            raise ClaimReadError(f"{claim}: its allocation's node selector needs this node's labels: {exc}") from exc

    def _allocation(self, claim: ClaimRef, stored: Mapping[str, Any]) -> Mapping[str, Any]:
        """The claim's ``status.allocation``, once its UID says it is the kubelet's claim and it has one."""
        uid = (stored.get("metadata") or {}).get("uid")
        if not isinstance(uid, str) or not uid:
            raise ClaimReadError(
                f"{claim}: the API server's answer is no ResourceClaim (it has no metadata.uid; kind "
                f"{shorten(str(stored.get('kind')))}, {len(stored)} top-level field(s))"
            )
        if uid != claim.uid:
            raise ClaimReplacedError(
                claim, f"the API server's claim of that name has uid {uid}: the claim was deleted and made again"
            )
        status = stored.get("status") or {}
        if not status.get("allocation"):
            raise ClaimNotAllocatedError(claim, "not allocated (it has no status.allocation)")
        found: Mapping[str, Any] = status["allocation"]
        return found

    def allocation_of(self, claim: ClaimRef, stored: Mapping[str, Any]) -> ClaimAllocation:
        """:meth:`read`'s answer from a claim already fetched (a dict as the API server sends it), without the node
        check (which needs the node's labels: :meth:`read` makes it)."""
        status = stored.get("status") or {}
        allocation = self._allocation(claim, stored).get("devices") or {}
        results = allocation.get("results") or []
        ours = [r for r in results if r.get("driver") == self.driver]
        here = [r for r in ours if r.get("pool") == self.pool]
        elsewhere = [r for r in ours if r.get("pool") != self.pool]
        if here and elsewhere:
            shown = ", ".join(f"{r.get('device')} of pool {r.get('pool')}" for r in elsewhere)
            raise ClaimPoolMismatchError(
                claim, f"it was given devices of driver {self.driver} outside this node's pool {self.pool}: {shown}"
            )
        if not here:
            seen = sorted({f"{r.get('driver')}/{r.get('pool')}" for r in results}) or ["none"]
            raise NoDeviceOfOursError(
                claim,
                f"no device of driver {self.driver} in pool {self.pool} is allocated to it "
                f"(its devices are of {', '.join(seen)})",
            )
        devices = []
        for result in here:
            name = str(result.get("device"))
            device_id = self._device_id(name)
            if device_id is None:
                raise ClaimDeviceUnknownError(
                    claim,
                    f"request {result.get('request')!r} was given device {name!r} of pool {self.pool}, which this "
                    f"node does not publish (gone since the allocation?)",
                )
            share = result.get("shareID")
            admin = bool(result.get("adminAccess"))
            consumed = result.get("consumedCapacity") or {}
            if not isinstance(consumed, Mapping):
                raise ClaimError(
                    claim,
                    f"request {result.get('request')!r}, device {name!r}: its consumedCapacity is no map of quantities",
                )
            devices.append(
                AllocatedDevice(
                    str(result.get("request")),
                    name,
                    device_id,
                    share and str(share),
                    admin,
                    tuple(sorted((str(k), str(v)) for k, v in consumed.items())),
                )
            )
        configs = tuple(
            OpaqueConfig(
                str(entry.get("source", "")),
                tuple(str(r) for r in entry.get("requests") or ()),
                (entry.get("opaque") or {}).get("parameters"),
            )
            for entry in allocation.get("config") or ()
            if (entry.get("opaque") or {}).get("driver") == self.driver
        )
        reserved = tuple(
            str(consumer["uid"])
            for consumer in status.get("reservedFor") or ()
            if consumer.get("resource") == "pods" and not consumer.get("apiGroup") and consumer.get("uid")
        )
        for pod_uid in reserved:  # recorded with the claim; a pod's UID names its cgroup folders
            problem = uid_problem(pod_uid)
            if problem is not None:
                raise ClaimIdentifierError(claim, f"status.reservedFor names a pod by {problem}")
        return ClaimAllocation(claim, tuple(devices), configs, reserved)

    async def presence(self, claims: Iterable[ClaimRef]) -> dict[ClaimRef, ClaimPresence]:
        """Whether each claim is still there (a get each, at most :data:`PRESENCE_CONCURRENCY` at once).

        Raises :class:`ClaimReadError` when the API server cannot tell about one of them: nothing is concluded then.
        """
        wanted: Sequence[ClaimRef] = sorted(set(claims))
        limit = asyncio.Semaphore(PRESENCE_CONCURRENCY)

        async def one(claim: ClaimRef) -> ClaimPresence:
            async with limit:
                stored = await self._get(claim)
            if stored is None:
                return ClaimPresence.DELETED
            uid = (stored.get("metadata") or {}).get("uid")
            if not isinstance(uid, str) or not uid:  # junk is no evidence that the claim is gone
                raise ClaimReadError(f"{claim}: the API server's answer is no ResourceClaim (it has no metadata.uid)")
            if uid != claim.uid:
                return ClaimPresence.REPLACED
            if not (stored.get("status") or {}).get("allocation"):
                return ClaimPresence.DEALLOCATED
            return ClaimPresence.PRESENT

        answers = await asyncio.gather(*(one(c) for c in wanted), return_exceptions=True)
        for answer in answers:  # every get has ended: none is left running behind the error
            if isinstance(answer, BaseException):
                raise answer
        return {c: a for c, a in zip(wanted, answers, strict=True) if isinstance(a, ClaimPresence)}
