"""A stand-in for kube-scheduler's DRA plugin: it allocates devices of published ResourceSlices to a pod's claims.

It writes through the API server stand-in's storage (:mod:`devplug.testing.apiserver`) as ``kube-scheduler``, in
the order the scheduler's ``dynamicresources`` plugin does in PreBind (``pkg/scheduler/framework/plugins/
dynamicresources/dynamicresources.go``, ``extendeddynamicresources.go``, Kubernetes 1.36):

1. the pod's claims: each ``spec.resourceClaims[].resourceClaimName`` (must exist; templates are not modelled);
   and, for KEP-5004, the extended resources of its containers that a DeviceClass maps
   (``spec.extendedResourceName``, or the implicit ``deviceclass.resource.kubernetes.io/<class>``; the class
   created last wins, then the name sorted first) when the node's ``status.allocatable`` does not offer them
   (a device plugin's resource wins): one claim made for the pod, ``generateName: <pod>-extended-resources-``,
   owned by the pod (``controller: true``), annotated ``resource.kubernetes.io/extended-resource-claim: "true"``,
   one request per container and resource, ``container-<index>-request-<index of the resource among the
   container's sorted requests>``, ``exactly`` ``{deviceClassName, allocationMode: ExactCount, count}``;
2. for each claim not yet allocated: the finalizer ``resource.kubernetes.io/delete-protection``, then the status
   (``status`` subresource): ``allocation.devices.results`` (request, driver, pool, device per device; and
   ``adminAccess``, ``shareID``, ``consumedCapacity`` as below),
   ``allocation.devices.config`` (each class config ``FromClass`` for the requests of that class, then the
   claim's own ``FromClaim``), ``allocation.nodeSelector`` (``matchFields metadata.name In [node]``),
   ``allocationTimestamp``; and ``reservedFor`` gains the pod (``resource: pods``, name, uid);
3. the pod: ``status.extendedResourceClaimStatus`` (request mappings and the claim's name) when a claim was made
   for it, then the binding to the node.

Allocation follows the structured allocator of 1.36 (``k8s.io/dynamic-resource-allocation/structured/internal/
incubating/allocator_incubating.go``, the variant kube-scheduler runs while DRAConsumableCapacity and
DRAPartitionableDevices are beta; the feature gates are the API server's, ``Storage.disabled_features``):

* **what is taken** (``pkg/scheduler/framework/plugins/dynamicresources/allocateddevices.go``,
  ``foreachAllocatedDevice``): every allocated claim's results, but those with ``adminAccess: true`` (not
  considered allocated); a result with a ``shareID`` is a share of a device (its ``consumedCapacity`` adds to the
  device's ``AggregatedCapacity``), any other takes the device whole;
* **admin access** (``allocateOne``/``allocateDevice``): a request with ``adminAccess: true`` gets devices whether
  other claims have them or not (only a device this claim already has is skipped), its results say
  ``adminAccess: true``; with DRAAdminAccess off such a request is an error (``validateDeviceRequest``);
* **consumable capacity** (:mod:`devplug.testing.apiserver.capacity`, ``consumable_capacity.go``): a device with
  ``allowMultipleAllocations: true`` is never taken whole: each allocation gets a fresh ``shareID`` (a UID) and
  ``consumedCapacity`` (every capacity of the device: the amount requested rounded by the policy, the policy's
  default, or the whole value), and is possible while the sums fit the capacities; other claims and several
  requests of one claim may share it (a request's next device is looked for *after* the previous one, so one
  request takes a device once). A device without it stays exclusive; a request naming a capacity a device does
  not publish (keys compared as written) skips that device; with DRAConsumableCapacity off a request with
  ``capacity`` is an error and ``allowMultipleAllocations`` is ignored;
* **counters** (``checkAvailableCounters``, ``pools_incubating.go``'s ``getAndValidateCounterSets`` and
  ``validateDeviceCounterConsumption``): the pool's ``sharedCounters`` (from all its slices of the newest
  generation, on any node) less what every allocated device of the pool (admin access aside) consumes, less what
  this run's devices consume, must stay >= 0 for every counter; a shared device consumes its counters once (its
  later shares skip the check). A pool with two counter sets of one name, or a device naming a counter set or
  counter the pool has not, is invalid: none of its devices is allocated. With DRAPartitionableDevices off,
  devices consuming counters are not allocated;
* all of a pod's claims are allocated in memory first (a run: what one claim takes counts for the next), by the
  allocator's search (``allocateOne``: each device of each request in turn, the first usable candidate, going
  back to try the previous device's next candidate when a later one finds none), then written: a pod that cannot
  get every claim changes nothing. A claim needing more than 32 devices is refused (``AllocationResultsMaxSize``);
  the search skips positions that leave a request too few candidates and gives up after
  :data:`SEARCH_BUDGET` candidates tried (where the real scheduler's Filter times out).

Simplified against the real allocator: one node is given, not chosen; devices come from that node's slices
(``spec.nodeName``), ``allNodes`` slices and, with ``perDeviceNodeSelection``, the devices naming the node or all
nodes; pools with fewer slices than ``resourceSliceCount`` are skipped; devices are tried in pool, slice name and
device order (no scoring); ``allocationMode: All`` takes the matching devices no other claim has; constraints,
``firstAvailable``, tolerations and binding conditions are not modelled (a device with a ``NoSchedule``/
``NoExecute`` taint is never used); class configs are listed once per request. CEL selectors (the class's and the
request's) are understood only as ``&&``-joined comparisons ``device.driver == "<name>"`` and
``device.attributes["<domain>"].<name> == <string|int|bool>``; anything else is refused naming the expression,
rather than matched wrongly.
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from devplug.testing.apiserver import capacity as consumable
from devplug.testing.apiserver.errors import ApiStatusError
from devplug.testing.apiserver.quantity import QuantityError, parse
from devplug.testing.apiserver.resources import by_plural
from devplug.testing.apiserver.storage import Storage, Writer, now_text

__all__ = ["EXTENDED_CLAIM_ANNOTATION", "FINALIZER", "SchedulerStandIn", "SchedulingError"]

FINALIZER = "resource.kubernetes.io/delete-protection"
EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"
_WRITER = Writer("kube-scheduler")
#: ``resourceapi.AllocationResultsMaxSize``: the allocator refuses a claim needing more devices.
MAX_RESULTS = 32
#: Candidate devices one scheduling attempt may try before giving up (see ``SchedulerStandIn._search``).
SEARCH_BUDGET = 100_000
_TERM = re.compile(
    r'^\s*device\.(?:driver|attributes\["(?P<domain>[^"]+)"\]\.(?P<attr>[A-Za-z_][A-Za-z0-9_]*))\s*==\s*(?P<value>"[^"]*"|-?\d+|true|false)\s*$'
)


class SchedulingError(Exception):
    """The pod cannot be scheduled (no such claim or class, not enough free devices, a selector not modelled)."""


_Id = tuple[str, str, str]


@dataclass(frozen=True)
class _Device:
    driver: str
    pool: str
    name: str
    attributes: Mapping[str, Any]
    capacity: Mapping[str, Any] = field(default_factory=dict)
    multiple: bool = False
    #: ``consumesCounters``: (counter set, {counter: amount}) per entry.
    counters: tuple[tuple[str, Mapping[str, Fraction]], ...] = ()

    @property
    def id(self) -> _Id:
        return (self.driver, self.pool, self.name)


@dataclass
class _Pool:
    """One pool's devices for the node (in slice name and device order), its counter sets and every device of it
    (for the counters allocated devices consume); ``invalid`` says why none of it may be allocated."""

    devices: list[_Device]
    counter_sets: dict[str, dict[str, Fraction]]
    every_device: list[_Device]
    invalid: str | None = None


@dataclass
class _Allocated:
    """``AllocatedState`` from the stored claims: devices taken whole, devices with shares and their aggregated
    consumed capacity."""

    whole: set[_Id] = field(default_factory=set)
    shared: set[_Id] = field(default_factory=set)
    capacity: dict[_Id, dict[str, Fraction]] = field(default_factory=dict)

    def has(self, device: _Id) -> bool:
        """``IsDeviceAllocated``: taken whole or shared at least once."""
        return device in self.whole or device in self.shared


@dataclass
class _Run:
    """What one scheduling run allocates on top of :class:`_Allocated` (``allocatingDevices``,
    ``allocatingCapacity``, ``consumedCounters``), across the pod's claims."""

    devices: dict[_Id, set[int]] = field(default_factory=dict)
    capacity: dict[_Id, dict[str, Fraction]] = field(default_factory=dict)
    counters: dict[tuple[str, str], dict[str, dict[str, Fraction]]] = field(default_factory=dict)

    def copy(self) -> _Run:
        return copy.deepcopy(self)

    def restore(self, saved: _Run) -> None:
        """The rollback ``allocateDevice`` returns: back to ``saved``."""
        again = saved.copy()
        self.devices, self.capacity, self.counters = again.devices, again.capacity, again.counters


@dataclass
class _Slot:
    """One device a claim's request needs (``deviceIndices``): its candidates, and the result once chosen."""

    claim_index: int
    request: Mapping[str, Any]
    candidates: list[tuple[_Pool, _Device]]
    #: The slot of the request's previous device (the next one is looked for after it), None for the first.
    previous: _Slot | None
    #: ``allocationMode: All``: the one candidate this slot must take.
    only: int | None = None
    #: How many more devices the same request needs after this one (each after this one's position).
    after: int = 0
    position: int = -1
    entry: dict[str, Any] | None = None


def _amount(value: Any, where: str) -> Fraction:
    try:
        return parse(value.get("value") if isinstance(value, Mapping) else value).value
    except QuantityError as exc:
        raise SchedulingError(f"{where}: {exc}") from None


def _terms(expression: str) -> list[re.Match[str]]:
    """The comparisons of a selector the model understands; SchedulingError naming any other expression."""
    terms = []
    for term in expression.split("&&"):
        match = _TERM.match(term)
        if match is None:
            raise SchedulingError(
                f"the scheduler stand-in does not model the CEL selector {expression!r}: it understands only "
                '&&-joined device.driver == "..." and device.attributes["<domain>"].<name> == <literal>'
            )
        terms.append(match)
    return terms


def _selector_matches(expression: str, device: _Device) -> bool:
    for match in _terms(expression):
        value = json.loads(match["value"])
        if match["attr"] is None:
            if device.driver != value:
                return False
            continue
        domain, attr = match["domain"], match["attr"]
        found = device.attributes.get(f"{domain}/{attr}")
        if found is None and domain == device.driver:
            found = device.attributes.get(attr)  # an attribute without a domain is in the driver's
        if not isinstance(found, Mapping) or value not in [found.get(k) for k in ("string", "int", "bool", "version")]:
            return False
    return True


class SchedulerStandIn:
    """Schedules pods onto a given node, allocating their claims from the node's published devices."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._claims = by_plural("resourceclaims")
        self._pods = by_plural("pods")

    # --- what is published and taken

    def _on(self, gate: str) -> bool:
        return gate not in self.storage.disabled_features

    def _device(self, driver: str, pool: str, device: Mapping[str, Any], where: str) -> _Device:
        counters = tuple(
            (
                str(entry.get("counterSet")),
                {
                    str(k): _amount(v, f"{where}.consumesCounters[{i}].counters[{k}]")
                    for k, v in (entry.get("counters") or {}).items()
                },
            )
            for i, entry in enumerate(device.get("consumesCounters") or [])
            if isinstance(entry, Mapping)
        )
        return _Device(
            driver,
            pool,
            device["name"],
            device.get("attributes") or {},
            device.get("capacity") or {},
            device.get("allowMultipleAllocations") is True and self._on("DRAConsumableCapacity"),
            counters,
        )

    @staticmethod
    def _targets(spec: Mapping[str, Any], device: Mapping[str, Any], node: str) -> bool:
        if spec.get("nodeName") == node or spec.get("allNodes") is True:
            return True
        per_device = spec.get("perDeviceNodeSelection") is True
        return per_device and (device.get("nodeName") == node or device.get("allNodes") is True)

    def _pools(self, node: str) -> list[_Pool]:
        """``GatherPools``: each complete pool of the newest generation with devices for ``node``."""
        by_pool: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for s in self.storage.objects(by_plural("resourceslices")):
            by_pool.setdefault((s["spec"]["driver"], s["spec"]["pool"]["name"]), []).append(s)
        partitionable = self._on("DRAPartitionableDevices")
        pools = []
        for (driver, pool_name), slices in sorted(by_pool.items()):
            newest = max(int(s["spec"]["pool"].get("generation", 0)) for s in slices)
            current = sorted(
                (s for s in slices if int(s["spec"]["pool"].get("generation", 0)) == newest),
                key=lambda s: s["metadata"]["name"],
            )
            if len(current) < int(current[0]["spec"]["pool"].get("resourceSliceCount", 1)):
                continue
            pool = _Pool([], {}, [])
            names: set[str] = set()
            for s in current:
                spec = s["spec"]
                for j, counter_set in enumerate(spec.get("sharedCounters") or [] if partitionable else []):
                    name = str(counter_set.get("name"))
                    if name in pool.counter_sets:
                        pool.invalid = pool.invalid or f"duplicate counter set name {name}"
                    pool.counter_sets[name] = {
                        str(k): _amount(v, f"slice {s['metadata']['name']}: sharedCounters[{j}].counters[{k}]")
                        for k, v in (counter_set.get("counters") or {}).items()
                    }
                for i, raw in enumerate(spec.get("devices") or []):
                    device = self._device(driver, pool_name, raw, f"slice {s['metadata']['name']}: devices[{i}]")
                    if device.name in names:
                        pool.invalid = pool.invalid or f"duplicate device name {device.name}"
                    names.add(device.name)
                    pool.every_device.append(device)
                    if not self._targets(spec, raw, node):
                        continue
                    if any(t.get("effect") in ("NoSchedule", "NoExecute") for t in raw.get("taints") or []):
                        continue
                    pool.devices.append(device)
            for device in pool.every_device:
                for set_name, amounts in device.counters:
                    if set_name not in pool.counter_sets:
                        pool.invalid = pool.invalid or f"counter set {set_name} not found"
                    elif any(k not in pool.counter_sets[set_name] for k in amounts):
                        pool.invalid = pool.invalid or f"counter not found in counter set {set_name}"
            if pool.devices:
                pools.append(pool)
        return pools

    def _allocated(self) -> _Allocated:
        """``foreachAllocatedDevice`` over every stored claim."""
        state = _Allocated()
        for claim in self.storage.objects(self._claims):
            allocation = (claim.get("status") or {}).get("allocation") or {}
            for result in (allocation.get("devices") or {}).get("results") or []:
                if result.get("adminAccess") is True:
                    continue  # "Is not considered as allocated."
                device = (result["driver"], result["pool"], result["device"])
                if result.get("shareID") and self._on("DRAConsumableCapacity"):
                    state.shared.add(device)
                    aggregated = state.capacity.setdefault(device, {})
                    for name, text in (result.get("consumedCapacity") or {}).items():
                        aggregated[name] = aggregated.get(name, Fraction(0)) + _amount(text, "consumedCapacity")
                else:
                    state.whole.add(device)
        return state

    def _class(self, name: str) -> dict[str, Any]:
        try:
            return self.storage.get(by_plural("deviceclasses"), "", name)
        except ApiStatusError as exc:
            raise SchedulingError(f"device class {name!r} does not exist") from exc

    # --- allocation

    def _counters_fit(self, pool: _Pool, device: _Device, allocated: _Allocated, run: _Run) -> bool:
        """``checkAvailableCounters``: with ``device``'s consumption added to the run's, every counter of the pool
        stays within what the counter sets hold less what allocated devices consume; if not, nothing is added."""
        available = {name: dict(counters) for name, counters in pool.counter_sets.items()}
        for other in pool.every_device:
            if allocated.has(other.id):
                for set_name, amounts in other.counters:
                    for counter, amount in amounts.items():
                        if counter in available.get(set_name, {}):
                            available[set_name][counter] -= amount
        consumed = run.counters.setdefault((device.driver, device.pool), {})
        for set_name, amounts in device.counters:
            for counter, amount in amounts.items():
                consumed.setdefault(set_name, {})[counter] = consumed.get(set_name, {}).get(counter, 0) + amount
        for set_name, counters in available.items():
            for counter, left in counters.items():
                if left < consumed.get(set_name, {}).get(counter, 0):
                    for back_set, amounts in device.counters:
                        for back, amount in amounts.items():
                            consumed[back_set][back] -= amount
                    return False
        return True

    def _take(
        self,
        pool: _Pool,
        device: _Device,
        exactly: Mapping[str, Any],
        claim_index: int,
        allocated: _Allocated,
        run: _Run,
    ) -> dict[str, Any] | None:
        """``allocateDevice`` for one candidate: the result entry's device fields when the device is usable for
        the request (and the run now holds it), None when not."""
        admin = exactly.get("adminAccess") is True
        if admin:
            if not device.multiple and claim_index in run.devices.get(device.id, set()):
                return None
        elif device.id in allocated.whole or run.devices.get(device.id):
            return None
        if device.counters and not self._on("DRAPartitionableDevices"):
            return None
        requests = (exactly.get("capacity") or {}).get("requests")
        if self._on("DRAConsumableCapacity") and not consumable.fits(
            allocated.capacity.get(device.id, {}), requests, device.capacity, run.capacity.get(device.id, {})
        ):
            return None
        capacity_in_use = device.id in allocated.capacity or device.id in run.capacity
        check_counters = bool(device.counters) and not (device.multiple and capacity_in_use)
        if check_counters and not self._counters_fit(pool, device, allocated, run):
            return None
        entry: dict[str, Any] = {"driver": device.driver, "pool": device.pool, "device": device.name}
        if admin:
            entry["adminAccess"] = True
        if device.multiple:
            amounts = consumable.consumed_capacity(requests, device.capacity)
            share = run.capacity.setdefault(device.id, {})
            for name, amount in amounts.items():
                share[name] = share.get(name, Fraction(0)) + amount.value
            entry["shareID"] = str(uuid.uuid4())
            if amounts:
                entry["consumedCapacity"] = {name: amount.text() for name, amount in amounts.items()}
        else:
            run.devices.setdefault(device.id, set()).add(claim_index)
        return entry

    def _check_request(self, claim_name: str, request: Mapping[str, Any]) -> None:
        """``validateDeviceRequest``'s refusals: no ``exactly``, admin access or capacity with the gate off."""
        exactly = request.get("exactly")
        if exactly is None:
            raise SchedulingError(f"request {request.get('name')!r}: the stand-in allocates only `exactly` requests")
        if exactly.get("adminAccess") is not None and not self._on("DRAAdminAccess"):
            raise SchedulingError(
                f"claim {claim_name}, request {request['name']}: admin access is requested, but the feature is disabled"
            )
        if exactly.get("capacity") is not None and not self._on("DRAConsumableCapacity"):
            raise SchedulingError(
                f"claim {claim_name}, request {request['name']}: has capacity requests, but the "
                "DRAConsumableCapacity feature is disabled"
            )

    @staticmethod
    def _candidates(pools: list[_Pool]) -> Iterator[tuple[_Pool, _Device]]:
        for pool in pools:
            if pool.invalid is None:
                for device in pool.devices:
                    yield pool, device

    def _slots(self, claims: Sequence[Mapping[str, Any]], node: str) -> tuple[list[_Slot], list[_Pool]]:
        """Every device the claims need, in claim, request and device order (``allocateOne``'s walk)."""
        pools = self._pools(node)
        candidates = list(self._candidates(pools))
        slots: list[_Slot] = []
        for claim_index, claim in enumerate(claims):
            meta = claim.get("metadata") or {}
            claim_name = str(meta.get("name") or meta.get("generateName", ""))
            requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
            for request in requests:
                self._check_request(claim_name, request)
            wanted = sum(
                int(r["exactly"].get("count", 1)) for r in requests if r["exactly"].get("allocationMode") != "All"
            )
            if wanted > MAX_RESULTS:
                raise SchedulingError(
                    f"claim {claim_name}: number of requested devices {wanted} exceeds the claim limit of {MAX_RESULTS}"
                )
            for request in requests:
                exactly = request["exactly"]
                device_class = self._class(exactly["deviceClassName"])
                selectors = [
                    s["cel"]["expression"]
                    for s in (device_class["spec"].get("selectors") or []) + (exactly.get("selectors") or [])
                ]
                for expression in selectors:
                    _terms(expression)  # refused before any device is looked at
                matching = [(p, d) for p, d in candidates if all(_selector_matches(e, d) for e in selectors)]
                previous: _Slot | None = None
                if exactly.get("allocationMode", "ExactCount") == "All":
                    allocated = self._allocated()
                    free = [
                        i
                        for i, (_, d) in enumerate(matching)
                        if exactly.get("adminAccess") is True or d.id not in allocated.whole
                    ]
                    if not free:
                        raise SchedulingError(
                            f"claim {claim_name}: request {request['name']!r} wants all device(s) of class "
                            f"{exactly['deviceClassName']!r}; node {node} has 0 free"
                        )
                    for i in free:
                        previous = _Slot(claim_index, request, matching, previous, only=i)
                        slots.append(previous)
                    continue
                count = int(exactly.get("count", 1))
                for k in range(count):
                    previous = _Slot(claim_index, request, matching, previous, after=count - 1 - k)
                    slots.append(previous)
        return slots, pools

    def _search(self, slots: list[_Slot], at: int, allocated: _Allocated, run: _Run, progress: list[int]) -> bool:
        """``allocateOne``: the first full solution, trying each slot's candidates in order and going back to the
        previous slot's next candidate when a later slot finds none. ``progress``: [the deepest slot reached,
        candidates tried]; past :data:`SEARCH_BUDGET` tries the search gives up (SchedulingError), where the real
        scheduler's Filter would time out (DRASchedulerFilterTimeout, 10 s)."""
        progress[0] = max(progress[0], at)
        if at == len(slots):
            return True
        slot = slots[at]
        exactly = slot.request["exactly"]
        if slot.only is not None:
            positions: range = range(slot.only, slot.only + 1)
        else:  # positions leaving too few candidates for the request's later devices cannot lead anywhere
            start = slot.previous.position + 1 if slot.previous is not None else 0
            positions = range(start, len(slot.candidates) - slot.after)
        for position in positions:
            progress[1] += 1
            if progress[1] > SEARCH_BUDGET:
                raise SchedulingError(
                    f"the scheduler stand-in gave up after trying {SEARCH_BUDGET} candidate devices (the real "
                    "scheduler's Filter times out after 10 s: DRASchedulerFilterTimeout)"
                )
            saved = run.copy()
            entry = self._take(*slot.candidates[position], exactly, slot.claim_index, allocated, run)
            if entry is None:
                continue
            slot.position, slot.entry = position, {"request": slot.request["name"], **entry}
            if self._search(slots, at + 1, allocated, run, progress):
                return True
            run.restore(saved)
            slot.position, slot.entry = -1, None
        return False

    def _plan(self, claims: Sequence[Mapping[str, Any]], node: str) -> list[dict[str, Any]]:
        """The allocation of each of ``claims`` (all or none: SchedulingError naming the request that could not be
        satisfied)."""
        slots, pools = self._slots(claims, node)
        progress = [0, 0]
        if not self._search(slots, 0, self._allocated(), _Run(), progress):
            stuck = slots[min(progress[0], len(slots) - 1)]
            allocated = self._allocated()
            free = sum(
                1
                for pool, device in stuck.candidates
                if self._take(pool, device, stuck.request["exactly"], stuck.claim_index, allocated, _Run()) is not None
            )
            exactly = stuck.request["exactly"]
            same = [s for s in slots if s.request is stuck.request]
            meta = claims[stuck.claim_index].get("metadata") or {}
            invalid = [p.invalid for p in pools if p.invalid]
            raise SchedulingError(
                f"claim {meta.get('name') or meta.get('generateName', '')}: request {stuck.request['name']!r} wants "
                f"{'all' if stuck.only is not None else len(same)} device(s) of class "
                f"{exactly['deviceClassName']!r}; node {node} has {free} free"
                + (f" (invalid pools: {'; '.join(invalid)})" if invalid else "")
            )
        return [
            self._allocation(claim, [s for s in slots if s.claim_index == i], node) for i, claim in enumerate(claims)
        ]

    def _allocation(self, claim: Mapping[str, Any], slots: list[_Slot], node: str) -> dict[str, Any]:
        """The claim's ``status.allocation``: its results, the class configs per request then the claim's."""
        configs: list[dict[str, Any]] = []
        devices = (claim.get("spec") or {}).get("devices") or {}
        for request in devices.get("requests") or []:
            device_class = self._class(request["exactly"]["deviceClassName"])
            for config in device_class["spec"].get("config") or []:
                configs.append(
                    {"source": "FromClass", "requests": [request["name"]], **{k: v for k, v in config.items()}}
                )
        for config in devices.get("config") or []:
            configs.append({"source": "FromClaim", **{k: v for k, v in config.items()}})
        allocation: dict[str, Any] = {
            "devices": {"results": [s.entry for s in slots]},
            "nodeSelector": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
            },
            "allocationTimestamp": now_text(),
        }
        if configs:
            allocation["devices"]["config"] = configs
        return allocation

    def _reserve(
        self, claim: dict[str, Any], pod: Mapping[str, Any], allocation: dict[str, Any] | None
    ) -> dict[str, Any]:
        namespace, name = claim["metadata"]["namespace"], claim["metadata"]["name"]
        finalizers = claim["metadata"].get("finalizers") or []
        if FINALIZER not in finalizers:
            claim = self.storage.update(
                self._claims,
                namespace,
                name,
                {**claim, "metadata": {**claim["metadata"], "finalizers": [*finalizers, FINALIZER]}},
                _WRITER,
            )
        status = dict(claim.get("status") or {})
        if status.get("allocation") is None and allocation is not None:
            status["allocation"] = allocation
        reserved = list(status.get("reservedFor") or [])
        if all(r.get("uid") != pod["metadata"]["uid"] for r in reserved):
            reserved.append({"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]})
        status["reservedFor"] = reserved
        return self.storage.update(self._claims, namespace, name, {**claim, "status": status}, _WRITER, "status")

    # --- KEP-5004: extended resources through DRA

    def _class_for(self, resource_name: str) -> dict[str, Any] | None:
        candidates = [
            c
            for c in self.storage.objects(by_plural("deviceclasses"))
            if c["spec"].get("extendedResourceName") == resource_name
            or IMPLICIT_PREFIX + c["metadata"]["name"] == resource_name
        ]
        if not candidates:
            return None
        candidates.sort(key=lambda c: c["metadata"]["name"])
        candidates.sort(key=lambda c: c["metadata"]["creationTimestamp"], reverse=True)
        return candidates[0]

    def _extended_claim(
        self, pod: Mapping[str, Any], node: Mapping[str, Any]
    ) -> tuple[dict[str, Any], list[dict[str, str]]] | None:
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        spec = pod.get("spec") or {}
        containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        requests: list[dict[str, Any]] = []
        mappings: list[dict[str, str]] = []
        for index, container in enumerate(containers):
            resources = container.get("resources") or {}
            wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
            for rindex, resource_name in enumerate(sorted(wanted)):
                device_class = self._class_for(resource_name)
                count = int(str(wanted[resource_name]))
                if device_class is None or count == 0 or str(allocatable.get(resource_name, "0")) not in ("0", ""):
                    continue
                request_name = f"container-{index}-request-{rindex}"
                requests.append(
                    {
                        "name": request_name,
                        "exactly": {
                            "deviceClassName": device_class["metadata"]["name"],
                            "allocationMode": "ExactCount",
                            "count": count,
                        },
                    }
                )
                mappings.append(
                    {"containerName": container["name"], "resourceName": resource_name, "requestName": request_name}
                )
        if not requests:
            return None
        meta = pod["metadata"]
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "generateName": f"{meta['name']}-extended-resources-",
                "namespace": meta["namespace"],
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"], "controller": True}
                ],
                "annotations": {EXTENDED_CLAIM_ANNOTATION: "true"},
            },
            "spec": {"devices": {"requests": sorted(requests, key=lambda r: str(r["name"]))}},
        }
        return claim, mappings

    # --- the pod

    def schedule(self, namespace: str, pod_name: str, node_name: str) -> list[dict[str, Any]]:
        """Allocate the pod's claims on ``node_name``, reserve them for it, bind it; the claims as stored."""
        pod = self.storage.get(self._pods, namespace, pod_name)
        node = self.storage.get(by_plural("nodes"), "", node_name)
        claims = []
        for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
            claim_name = entry.get("resourceClaimName")
            if not claim_name:
                raise SchedulingError(
                    f"pod {namespace}/{pod_name}: claim {entry.get('name')!r} comes from a template, which the "
                    "stand-in does not model"
                )
            try:
                claims.append(self.storage.get(self._claims, namespace, claim_name))
            except ApiStatusError as exc:
                raise SchedulingError(
                    f"pod {namespace}/{pod_name}: resource claim {claim_name!r} does not exist"
                ) from exc
        extended = self._extended_claim(pod, node)
        every = [*claims, *([extended[0]] if extended is not None else [])]
        pending = [c for c in every if (c.get("status") or {}).get("allocation") is None]
        planned = iter(self._plan(pending, node_name))
        allocations = [next(planned) if (c.get("status") or {}).get("allocation") is None else None for c in every]
        if extended is not None:
            claims.append(self.storage.create(self._claims, namespace, extended[0], _WRITER))
        stored = [self._reserve(claim, pod, allocation) for claim, allocation in zip(claims, allocations, strict=True)]
        if extended is not None:
            status = {
                **(pod.get("status") or {}),
                "extendedResourceClaimStatus": {
                    "requestMappings": extended[1],
                    "resourceClaimName": stored[-1]["metadata"]["name"],
                },
            }
            pod = self.storage.update(self._pods, namespace, pod_name, {**pod, "status": status}, _WRITER, "status")
        self.storage.bind(namespace, pod_name, node_name, _WRITER)
        return stored

    def deallocate(self, namespace: str, claim_name: str) -> dict[str, Any]:
        """What the resourceclaim controller does once no pod uses a claim: clear ``reservedFor`` and the
        allocation, then drop the finalizer (so a claim being deleted goes)."""
        claim = self.storage.get(self._claims, namespace, claim_name)
        claim = self.storage.update(self._claims, namespace, claim_name, {**claim, "status": {}}, _WRITER, "status")
        finalizers = [f for f in claim["metadata"].get("finalizers") or [] if f != FINALIZER]
        return self.storage.update(
            self._claims,
            namespace,
            claim_name,
            {**claim, "metadata": {**claim["metadata"], "finalizers": finalizers}},
            _WRITER,
        )
