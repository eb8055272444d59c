"""The metrics of resources served through DRA: claims prepared and unprepared, why they failed, prepared claims
found gone, the plugin watcher's registration and the ResourceSlices' publication.

Two kinds, as in :mod:`devplug.daemon.metrics`: events counted as they happen
(:class:`DraCounters`, through each resource's observer: label children made on
first use and cached), and what the DRA front end keeps, read at scrape time
from its ``describe()`` (:func:`dra_families`; resources served through the
device-plugin API have no DRA series).

No label names a claim (its UID, namespace or name) nor carries an error
message: a node prepares claims without end, and a series per claim would grow
the scrape forever. Failures are labelled by their kind, from a fixed set
(:data:`~devplug.frontends.dra.service.PREPARE_FAILURE_REASONS`); ``devplug
status`` and the log name the claim and say what was wrong.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from devplug.engine import ResourceFigures

__all__ = [
    "CLAIM_CALL_BUCKETS",
    "REGISTRATION_STATES",
    "STATUS_WRITE_OUTCOMES",
    "DraCounters",
    "DraResourceCounters",
    "dra_families",
]

#: Prepare and unprepare latency buckets, seconds: a mock claim takes a millisecond or two, an FPGA's allocate
#: (programming a bitstream) may take a minute.
CLAIM_CALL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: What the kubelet's plugin watcher last said: nothing yet, registered, or refused (its error is in status).
REGISTRATION_STATES = ("unknown", "registered", "refused")
#: The outcomes of the claims' device status writes, and the counts of the status writer's description they are.
STATUS_WRITE_OUTCOMES = {"written": "written", "removed": "removed", "failed": "failures", "invalid": "invalid"}


class DraCounters:
    """The DRA event counters of every resource, in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.prepares = Counter(
            "devplug_dra_claim_prepares",
            "Claims the kubelet asked to prepare (NodePrepareResources), each claim of each call, whatever came of it.",
            ["resource"],
            registry=r,
        )
        self.prepare_failures = Counter(
            "devplug_dra_claim_prepare_failures",
            "Claims that could not be prepared (the kubelet got that claim's error), by kind.",
            ["resource", "reason"],
            registry=r,
        )
        self.unprepares = Counter(
            "devplug_dra_claim_unprepares",
            "Claims the kubelet asked to unprepare (NodeUnprepareResources), each claim of each call.",
            ["resource"],
            registry=r,
        )
        self.unprepare_failures = Counter(
            "devplug_dra_claim_unprepare_failures",
            "Claims whose unprepare failed (their devices stay withheld; the kubelet calls again), by kind.",
            ["resource", "reason"],
            registry=r,
        )
        self.call_seconds = Histogram(
            "devplug_dra_claim_call_duration_seconds",
            "Seconds one claim's prepare or unprepare took in devplug, whatever came of it.",
            ["resource", "call"],
            buckets=CLAIM_CALL_BUCKETS,
            registry=r,
        )
        self.gone = Counter(
            "devplug_dra_claims_gone",
            "Prepared claims found deleted, replaced or deallocated in the API server with no unprepare to come: "
            "released by reconciliation once their pods' containers are gone.",
            ["resource", "cause"],
            registry=r,
        )

    def of(self, resource: str) -> DraResourceCounters:
        """One resource's children (made when first counted: a device-plugin resource never makes them)."""
        return DraResourceCounters(self, resource)


class DraResourceCounters:
    """One resource's DRA counters; children by reason and cause made once, on first use."""

    def __init__(self, counters: DraCounters, resource: str) -> None:
        self._c = counters
        self._resource = resource
        self._prepares = counters.prepares.labels(resource)
        self._unprepares = counters.unprepares.labels(resource)
        self._prepare_seconds = counters.call_seconds.labels(resource, "prepare")
        self._unprepare_seconds = counters.call_seconds.labels(resource, "unprepare")
        self._prepare_failures: dict[str, Any] = {}
        self._unprepare_failures: dict[str, Any] = {}
        self._gone: dict[str, Any] = {}

    def prepared(self, seconds: float, failure: str | None = None) -> None:
        self._prepares.inc()
        self._prepare_seconds.observe(seconds)
        if failure is not None:
            self._child(self._prepare_failures, self._c.prepare_failures, failure).inc()

    def unprepared(self, seconds: float, failure: str | None = None) -> None:
        self._unprepares.inc()
        self._unprepare_seconds.observe(seconds)
        if failure is not None:
            self._child(self._unprepare_failures, self._c.unprepare_failures, failure).inc()

    def gone(self, cause: str) -> None:
        self._child(self._gone, self._c.gone, cause).inc()

    def _child(self, cache: dict[str, Any], metric: Counter, label: str) -> Any:
        child = cache.get(label)
        if child is None:
            child = cache[label] = metric.labels(self._resource, label)
        return child


def _dra(frontend: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The DRA front end's description, or None for another front end."""
    return frontend if frontend is not None and "driver" in frontend and "pool" in frontend else None


def dra_families(figures: Sequence[ResourceFigures]) -> list[Metric]:
    """The DRA front ends' state, as they describe it now."""
    info = GaugeMetricFamily(
        "devplug_dra_driver_info",
        "1 for each resource served through DRA, labelled with its DRA driver name and pool.",
        labels=["resource", "driver", "pool"],
    )
    held = GaugeMetricFamily(
        "devplug_dra_claims_prepared", "Claims prepared on this node now (not yet unprepared).", labels=["resource"]
    )
    registration = GaugeMetricFamily(
        "devplug_dra_registration_state",
        "1 for what the kubelet's plugin watcher last said of the registration: unknown (nothing yet), registered, "
        "refused.",
        labels=["resource", "state"],
    )
    recreated = CounterMetricFamily(
        "devplug_dra_registration_socket_recreated",
        "Times the registration socket was made again after it vanished (the kubelet's plugins_registry wiped).",
        labels=["resource"],
    )
    in_sync = GaugeMetricFamily(
        "devplug_dra_slices_in_sync",
        "1 while the API server's ResourceSlices of the pool show the devices as they are, else 0.",
        labels=["resource"],
    )
    synced_at = GaugeMetricFamily(
        "devplug_dra_slices_last_sync_timestamp_seconds",
        "When the ResourceSlices were last known in step (Unix time; 0: never).",
        labels=["resource"],
    )
    failures = GaugeMetricFamily(
        "devplug_dra_slice_publish_failures",
        "Failed attempts in a row to publish the ResourceSlices (0 when the last one worked; devplug status says why).",
        labels=["resource"],
    )
    generation = GaugeMetricFamily(
        "devplug_dra_pool_generation", "The pool generation last published or adopted.", labels=["resource"]
    )
    slices = GaugeMetricFamily("devplug_dra_slices", "ResourceSlices published for the pool.", labels=["resource"])
    status_writes = CounterMetricFamily(
        "devplug_dra_claim_status_writes",
        "Writes of the claims' device status (KEP-4817) by outcome: written, removed, failed (a try that failed and "
        "is retried or given up), invalid (refused by the API server: the driver's data, logged once).",
        labels=["resource", "outcome"],
    )
    for f in figures:
        dra = _dra(f.frontend)
        if dra is None:
            continue
        info.add_metric([f.resource, str(dra["driver"]), str(dra["pool"])], 1)
        claims = dra.get("claims") or {}
        held.add_metric([f.resource], claims.get("held", 0))
        reg = dra.get("registration") or {}
        said = {None: "unknown", True: "registered", False: "refused"}[reg.get("registered")]
        for state in REGISTRATION_STATES:
            registration.add_metric([f.resource, state], 1 if state == said else 0)
        recreated.add_metric([f.resource], reg.get("socket_recreated", 0))
        sl = dra.get("slices") or {}
        in_sync.add_metric([f.resource], 1 if sl.get("in_sync") else 0)
        synced_at.add_metric([f.resource], sl.get("synced_at") or 0.0)
        failures.add_metric([f.resource], sl.get("failures", 0))
        generation.add_metric([f.resource], sl.get("generation", 0))
        slices.add_metric([f.resource], sl.get("slices", 0))
        cs = dra.get("claim_status") or {}
        if any(cs.get(key) for key in STATUS_WRITE_OUTCOMES.values()):  # no series until a status was written
            for outcome, key in STATUS_WRITE_OUTCOMES.items():
                status_writes.add_metric([f.resource, outcome], cs.get(key, 0))
    found: Iterable[Metric] = (
        info,
        held,
        registration,
        recreated,
        in_sync,
        synced_at,
        failures,
        generation,
        slices,
        status_writes,
    )
    return list(found)
