"""Which ``resource.k8s.io`` version the DRA front end talks, found by discovery, and the shape of each version.

A kubelet of 1.32 or 1.33 may run under a control plane of 1.34 or later (the supported skew), and a control plane
of 1.32 or 1.33 serves no ``resource.k8s.io/v1`` at all: its DRA API is ``v1beta1`` (1.32; ``--runtime-config=
resource.k8s.io/v1beta1=true``) or ``v1beta1`` and ``v1beta2`` (1.33). :class:`DraApi` is the version in use, shared by
the slice publisher, its watch and the claim reader:

* **discovery** (:meth:`DraApi.discover`, at start): ``GET /apis/resource.k8s.io`` lists the versions served; the
  newest of :data:`SUPPORTED` (``v1``, ``v1beta2``, ``v1beta1``) wins. Not the ``preferredVersion``: a 1.33 server
  prefers ``v1beta1`` (its ``install.go`` lists it first). None served: :class:`DraApiVersionError`, naming the
  versions found, the server's version and the ones devplug needs; the resource's start fails with that message
  (and is retried: an upgraded control plane is found);
* **device taints, consumable capacity, counters** (the publisher marks unavailable devices with a taint, publishes
  a shared device as one device with ``allowMultipleAllocations`` and a capacity's ``requestPolicy``, and parts
  with ``consumesCounters`` and their parent's counter set): whether the server keeps each is known before the first
  write, by a server-side dry run (``dryRun=All``) of an apply of a slice with one device carrying each, named
  ``devplug-probe-<hash>``, which stores nothing. Three answers per feature: the fields come back (used); they are
  gone (the version has the fields, the feature gate is off: ``dropDisabledDRADeviceTaintsFields``,
  ``dropDisabledDRAConsumableCapacityFields``, ``dropDisabledDRAPartitionableDevicesFields`` in
  ``pkg/registry/resource/resourceslice/strategy.go``; ``DRADeviceTaints`` off 1.33 to 1.35, ``DRAConsumableCapacity``
  1.34 and 1.35, ``DRAPartitionableDevices`` 1.33 to 1.35 by default); the apply is refused because the version has
  no such field (``field not declared in schema``, each field named: 1.32's v1beta1 has none of them, 1.33's no
  consumable capacity), and then, if some feature is still unanswered, a second dry run without the refused fields
  asks. One request on 1.32 and from 1.34, two on 1.33. ``sharedCounters`` is not sent (1.35+ refuses it beside
  devices): the partitionable gate drops it and ``consumesCounters`` together, so the device's answer stands for
  both. Discovery cannot tell a gate, and OpenAPI would show the fields whatever the gate says; the dry run answers
  both. Without a feature the publisher uses the older form (unavailable devices left out, one device per replica,
  parts without counters), chosen up front; an apply's answer without fields it carried stays a second line
  (:meth:`DraApi.taints_dropped`, :meth:`DraApi.consumable_capacity_dropped`, :meth:`DraApi.partitionable_dropped`);
* **found again** (:meth:`DraApi.refresh`) when the version in use is not served any more (a request of it answers
  ``404`` for the path, :func:`~devplug.kube.client.not_served`) and after the slices' watch had to be started again
  (an API server that restarted, for an upgrade among others, cut it): both discovery and the dry run, once for all
  users however many ask at once;
* **shapes**: the front end builds and reads ``v1`` (:mod:`~devplug.frontends.dra.slicecontent`); at the edge a
  ``v1beta1`` slice wraps each device's fields but its name in ``basic`` (``pkg/apis/resource/v1beta1/
  conversion.go``, ``Convert_resource_Device_To_v1beta1_Device``) and its ``nodeName`` ``""`` means unset;
  ``v1beta2`` has v1's shape for everything devplug writes and reads. A claim's ``status.allocation`` (all the
  front end reads of a claim) has one shape in the three.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import importlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from devplug.errors import KubeApiError
from devplug.frontends.dra.slicecontent import TAINT_EFFECT, TAINT_KEY
from devplug.kube.client import describe_api_error, get_json, not_served

if TYPE_CHECKING:
    from lightkube import AsyncClient

__all__ = [
    "GROUP",
    "SUPPORTED",
    "DraApi",
    "DraApiChoice",
    "DraApiVersionError",
    "discover_or_close",
    "probe_name",
    "slice_from_wire",
    "slice_to_wire",
]

log = logging.getLogger("devplug.frontends.dra")

GROUP = "resource.k8s.io"
#: The versions devplug speaks, newest first: the first the server serves is used.
SUPPORTED = ("v1", "v1beta2", "v1beta1")
#: The field manager of the dry run (it writes nothing, but apply needs one).
_PROBE_MANAGER = "devplug-probe"


class DraApiVersionError(KubeApiError):
    """The API server serves no ``resource.k8s.io`` version devplug speaks; the message names those it serves, the
    server's version and the ones devplug needs."""


@dataclass(frozen=True)
class DraApiChoice:
    """The version in use and what the server said of it."""

    #: ``v1``, ``v1beta2`` or ``v1beta1``.
    version: str
    #: Every ``resource.k8s.io`` version the server serves, in its discovery order.
    served: tuple[str, ...]
    #: Whether the server keeps device taints (else unavailable devices are left out of the slices), and why.
    taints: bool
    taints_reason: str
    #: Whether the server keeps ``allowMultipleAllocations`` and a capacity's ``requestPolicy`` (``DRAConsumable
    #: Capacity``): shared devices are published as one device with consumable capacity (else one per replica).
    consumable_capacity: bool = False
    consumable_capacity_reason: str = "not probed"
    #: Whether the server keeps ``consumesCounters`` (and so ``sharedCounters``: ``DRAPartitionableDevices`` drops
    #: both): parts are published with their parent's counter set (else as plain devices).
    partitionable: bool = False
    partitionable_reason: str = "not probed"

    @property
    def api_version(self) -> str:
        return f"{GROUP}/{self.version}"

    def describe(self) -> dict[str, Any]:
        """For ``devplug status``."""
        return {
            "version": self.api_version,
            "served": list(self.served),
            "taints": self.taints,
            "taints_reason": self.taints_reason,
            "consumable_capacity": self.consumable_capacity,
            "consumable_capacity_reason": self.consumable_capacity_reason,
            "partitionable": self.partitionable,
            "partitionable_reason": self.partitionable_reason,
        }


def probe_name(pool: str, driver: str) -> str:
    """The name of the dry run's slice: never stored, and no name a publisher uses (``<pool>-<driver>-<n>``)."""
    return "devplug-probe-" + hashlib.sha256(f"{pool}\0{driver}".encode()).hexdigest()[:16]


def _resources(version: str) -> Any:
    """lightkube's typed models of ``version`` (``lightkube.resources.resource_v1beta1``, ...)."""
    return importlib.import_module(f"lightkube.resources.resource_{version}")


def slice_to_wire(version: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """A ResourceSlice (or its spec's devices) built in v1's shape, as ``version`` takes it."""
    out = copy.deepcopy(dict(body))
    out["apiVersion"] = f"{GROUP}/{version}"
    if version == "v1beta1":
        spec = out.get("spec") or {}
        if "devices" in spec:  # a slice of counter sets has none (not even an empty list: 1.35+ refuses both)
            spec["devices"] = [
                {"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}} for d in spec["devices"] or ()
            ]
    return out


def slice_from_wire(version: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """A ResourceSlice as ``version`` gives it, in v1's shape (what the publisher compares with what it builds)."""
    out = copy.deepcopy(dict(body))
    if version == "v1beta1":
        spec = out.get("spec") or {}
        devices = []
        for device in spec.get("devices") or ():
            basic = device.get("basic") if isinstance(device, Mapping) else None
            flat = {k: v for k, v in device.items() if k != "basic"}
            devices.append({**flat, **(basic if isinstance(basic, Mapping) else {})})
        if "devices" in spec:
            spec["devices"] = devices
        if spec.get("nodeName") == "":
            del spec["nodeName"]
    return out


class DraApi:
    """The ``resource.k8s.io`` version the front end talks (see the module's docstring): whole when built, by
    :meth:`discover` (a daemon) or :meth:`fixed` (no discovery: a test, or a caller that knows)."""

    def __init__(
        self, client: AsyncClient, choice: DraApiChoice, *, node: str | None = None, driver: str = "", pool: str = ""
    ) -> None:
        self._client = client
        self._choice = choice
        #: Where the dry run writes (None: no dry run; :meth:`refresh` keeps the taints choice).
        self._node = node
        self._driver = driver
        self._pool = pool or (node or "")
        self._lock = asyncio.Lock()
        #: How many times the version was found (1: at start).
        self.discoveries = 1

    @classmethod
    def fixed(
        cls,
        client: AsyncClient,
        version: str = "v1",
        *,
        taints: bool = True,
        consumable_capacity: bool = False,
        partitionable: bool = False,
    ) -> DraApi:
        """``version``, taken as served, without discovery or dry run (the caller knows the server); consumable
        capacity and counter sets are not used unless the caller says the server keeps them."""
        if version not in SUPPORTED:
            raise ValueError(f"devplug speaks resource.k8s.io {', '.join(SUPPORTED)}, not {version!r}")
        reason = "assumed (no discovery)"
        choice = DraApiChoice(version, (version,), taints, reason, consumable_capacity, reason, partitionable, reason)
        return cls(client, choice)

    @classmethod
    async def discover(cls, client: AsyncClient, *, node: str, driver: str, pool: str) -> DraApi:
        """The newest supported version the server serves, and whether it keeps device taints (a dry run of a slice
        of ``driver`` on ``node`` in ``pool``). Raises :class:`DraApiVersionError` when it serves none devplug
        speaks, :class:`~devplug.errors.KubeApiError` when the server cannot be asked."""
        choice = await _choose(client, node=node, driver=driver, pool=pool)
        return cls(client, choice, node=node, driver=driver, pool=pool)

    # --- what users read

    @property
    def choice(self) -> DraApiChoice:
        return self._choice

    @property
    def version(self) -> str:
        return self._choice.version

    def slice_resource(self) -> Any:
        """lightkube's ResourceSlice class of the version in use."""
        return _resources(self._choice.version).ResourceSlice

    def claim_resource(self) -> Any:
        """lightkube's ResourceClaim class of the version in use."""
        return _resources(self._choice.version).ResourceClaim

    def describe(self) -> dict[str, Any]:
        return {**self._choice.describe(), "discoveries": self.discoveries}

    # --- finding it again

    async def refresh(self, why: str, *, seen: DraApiChoice | None = None) -> DraApiChoice:
        """Discover the version (and the taints, by dry run) again, because of ``why``; when ``seen`` is given and
        another caller found the version since that choice, its answer stands (one discovery for all who ask).
        Raises as :meth:`discover` does; the version in use stays until an answer comes."""
        async with self._lock:
            if seen is not None and self._choice is not seen:
                return self._choice
            if self._node is None:  # fixed: nothing to discover
                return self._choice
            log.info("resource.k8s.io: discovering the version to use again (%s)", why)
            choice = await _choose(self._client, node=self._node, driver=self._driver, pool=self._pool)
            if choice != self._choice:
                log.warning(
                    "resource.k8s.io: now %s (device taints: %s), was %s (device taints: %s)",
                    choice.api_version,
                    "used" if choice.taints else "not used",
                    self._choice.api_version,
                    "used" if self._choice.taints else "not used",
                )
            self._choice = choice
            self.discoveries += 1
            return choice

    def taints_dropped(self, why: str) -> None:
        """The server dropped taints it was sent (found after the fact, in a write's answer): none are sent from now
        on, until the next discovery."""
        if self._choice.taints:
            self._choice = replace(self._choice, taints=False, taints_reason=why)

    def consumable_capacity_dropped(self, why: str) -> None:
        """The server dropped ``allowMultipleAllocations`` or a ``requestPolicy`` it was sent (a write's answer):
        shared devices are published one device per replica from now on, until the next discovery."""
        if self._choice.consumable_capacity:
            self._choice = replace(self._choice, consumable_capacity=False, consumable_capacity_reason=why)

    def partitionable_dropped(self, why: str) -> None:
        """The server dropped ``sharedCounters`` or ``consumesCounters`` it was sent (a write's answer): parts are
        published without counters from now on, until the next discovery."""
        if self._choice.partitionable:
            self._choice = replace(self._choice, partitionable=False, partitionable_reason=why)


async def discover_or_close(client: AsyncClient, *, node: str, driver: str, pool: str) -> DraApi:
    """:meth:`DraApi.discover`; when it fails the client is closed before the error goes on (the front end's start
    fails with it, and the next start makes a client of its own)."""
    try:
        return await DraApi.discover(client, node=node, driver=driver, pool=pool)
    except BaseException:
        await client.close()
        raise


async def _served(client: AsyncClient) -> tuple[str, ...]:
    """The ``resource.k8s.io`` versions discovery lists (none when the group is not served)."""
    try:
        group = await get_json(client, f"apis/{GROUP}")
    except Exception as exc:
        if not_served(exc):
            return ()
        raise KubeApiError(f"discovery of {GROUP} failed: {describe_api_error(exc)[0]}") from exc
    versions = [v.get("version") for v in (group.get("versions") or ()) if isinstance(v, Mapping)]
    return tuple(v for v in versions if isinstance(v, str))


async def _server_version(client: AsyncClient) -> str:
    """The server's ``gitVersion`` (``/version``), or a phrase saying it is unknown."""
    try:
        info = await get_json(client, "version")
    except Exception as exc:
        return f"version unknown: {describe_api_error(exc)[0]}"
    found = info.get("gitVersion") if isinstance(info, Mapping) else None
    return f"Kubernetes {found}" if isinstance(found, str) and found else "version unknown"


async def _choose(client: AsyncClient, *, node: str, driver: str, pool: str) -> DraApiChoice:
    served = await _served(client)
    usable = [v for v in SUPPORTED if v in served]
    if not usable:
        found = ", ".join(served) if served else "none"
        raise DraApiVersionError(
            f"the API server ({await _server_version(client)}) serves no {GROUP} version devplug speaks: it "
            f"serves {found}; devplug needs {', '.join(SUPPORTED[:-1])} or {SUPPORTED[-1]} (Kubernetes 1.34 and "
            f"later serve v1; on 1.32 and 1.33 enable the beta with the API server's --runtime-config="
            f"{GROUP}/v1beta1=true, and {GROUP}/v1beta2=true on 1.33)"
        )
    version = usable[0]
    probed = await _probe(client, version, node=node, driver=driver, pool=pool)
    taints, reason = probed[TAINTS]
    log.info(
        "%s: using %s (served: %s); device taints %s: %s; consumable capacity %s: %s; counter sets %s: %s",
        GROUP,
        version,
        ", ".join(served),
        "used" if taints else "not used, unavailable devices are left out of the slices",
        reason,
        "used" if probed[CONSUMABLE][0] else "not used, a shared device is published one device per replica",
        probed[CONSUMABLE][1],
        "used" if probed[COUNTERS][0] else "not used, parts are published without counters",
        probed[COUNTERS][1],
    )
    return DraApiChoice(version, served, taints, reason, *probed[CONSUMABLE], *probed[COUNTERS])


#: The features the dry run asks about, each with the device of the probe slice that carries its fields, those
#: fields (a refusal naming one of them: the version has no such field) and the gate that drops them.
TAINTS = "taints"
CONSUMABLE = "consumable_capacity"
COUNTERS = "partitionable"
_PROBED: dict[str, tuple[str, frozenset[str], str, str]] = {
    TAINTS: ("probe", frozenset({"taints"}), "DRADeviceTaints", "device taints"),
    CONSUMABLE: (
        "probe-shared",
        frozenset({"allowMultipleAllocations", "requestPolicy"}),
        "DRAConsumableCapacity",
        "consumable capacity",
    ),
    COUNTERS: ("probe-part", frozenset({"consumesCounters", "sharedCounters"}), "DRAPartitionableDevices", "counters"),
}
_NOT_DECLARED = re.compile(r"(\S+): field not declared in schema")


def _probe_device(feature: str) -> dict[str, Any]:
    """The device of the probe slice that carries ``feature``'s fields, valid as the API server validates them
    (``pkg/apis/resource/validation/validation.go``: ``validateDevice``; the request policy as
    ``validateRequestPolicyRange`` wants it; a counter set referenced need not be in the slice: the pool-wide
    check is the scheduler's)."""
    name = _PROBED[feature][0]
    if feature == TAINTS:
        return {"name": name, "taints": [{"key": TAINT_KEY, "value": "probe", "effect": TAINT_EFFECT}]}
    if feature == CONSUMABLE:
        policy = {"default": "1", "validRange": {"min": "1", "max": "2", "step": "1"}}
        return {
            "name": name,
            "allowMultipleAllocations": True,
            "capacity": {"shares": {"value": "2", "requestPolicy": policy}},
        }
    return {"name": name, "consumesCounters": [{"counterSet": "probe", "counters": {"probe": {"value": "1"}}}]}


def _kept(feature: str, device: Mapping[str, Any]) -> bool:
    """True when the dry run's answer still has ``feature``'s fields on its probe device."""
    if feature == TAINTS:
        return bool(device.get("taints"))
    if feature == CONSUMABLE:
        shares = (device.get("capacity") or {}).get("shares") or {}
        return device.get("allowMultipleAllocations") is True and bool(shares.get("requestPolicy"))
    return bool(device.get("consumesCounters"))


async def _probe(
    client: AsyncClient, version: str, *, node: str, driver: str, pool: str
) -> dict[str, tuple[bool, str]]:
    """Whether ``version`` of the server keeps device taints, consumable capacity and counters: a dry-run apply of
    a slice with one device carrying each (one request), whose answer keeps the fields of a feature whose gate is
    on and drops those of a gate that is off (``dropDisabledFields`` in ``pkg/registry/resource/resourceslice/
    strategy.go``: ``dropDisabledDRADeviceTaintsFields``, ``dropDisabledDRAConsumableCapacityFields``, and
    ``dropDisabledDRAPartitionableDevicesFields``, which drops ``sharedCounters`` and ``consumesCounters``
    together, so the device's field answers for both). A version without some of the fields (1.32's v1beta1 has
    none, 1.33's no consumable capacity) refuses the apply naming each (``field not declared in schema``): those
    features are off, and when others are left to ask about, a second dry run without the refused fields asks.
    ``sharedCounters`` is not sent: from 1.35 a slice holds them or devices, not both."""
    answers: dict[str, tuple[bool, str]] = {}
    while len(answers) < len(_PROBED):
        asked = [f for f in _PROBED if f not in answers]
        refused = await _dry_run(client, version, asked, node=node, driver=driver, pool=pool)
        if isinstance(refused, set):
            for feature in asked:
                if _PROBED[feature][1] & refused:
                    answers[feature] = (
                        False,
                        f"{GROUP}/{version} of this API server has no {_PROBED[feature][3]} (it refused the field)",
                    )
            continue
        devices = {d.get("name"): d for d in refused if isinstance(d, Mapping)}
        for feature in asked:
            gate = _PROBED[feature][2]
            if _kept(feature, devices.get(_PROBED[feature][0]) or {}):
                answers[feature] = (True, "kept by the API server (a dry run)")
            else:
                answers[feature] = (False, f"dropped by the API server (a dry run): its feature gate {gate} is off")
    return answers


async def _dry_run(
    client: AsyncClient, version: str, features: list[str], *, node: str, driver: str, pool: str
) -> list[Any] | set[str]:
    """The devices of a dry-run apply of the probe slice carrying ``features``' devices, or the set of field names
    the version refused (each one of the probed features' fields)."""
    from lightkube import ApiError

    body = slice_to_wire(
        version,
        {
            "kind": "ResourceSlice",
            "metadata": {"name": probe_name(pool, driver)},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": pool, "generation": 0, "resourceSliceCount": 1},
                "devices": [_probe_device(f) for f in features],
            },
        },
    )
    model = _resources(version).ResourceSlice
    what = f"the dry run of a ResourceSlice with a device taint, consumable capacity and counters ({GROUP}/{version})"
    try:
        answer = await client.apply(
            cast(Any, model.from_dict(body)), field_manager=_PROBE_MANAGER, force=True, dry_run=True
        )
    except ApiError as exc:
        message = exc.status.message or ""
        refused = {path.rsplit(".", 1)[-1] for path in _NOT_DECLARED.findall(message)}
        ours = frozenset().union(*(_PROBED[f][1] for f in features))
        if refused and refused <= ours:
            return refused
        raise KubeApiError(f"{what} failed: {describe_api_error(exc)[0]}") from exc
    except Exception as exc:
        raise KubeApiError(f"{what} failed: {describe_api_error(exc)[0]}") from exc
    kept = slice_from_wire(version, answer.to_dict())
    return list((kept.get("spec") or {}).get("devices") or ())
