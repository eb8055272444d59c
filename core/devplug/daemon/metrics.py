"""The Prometheus endpoint and the probes, when ``[metrics] enabled = true``.

Imported only then: it brings ``prometheus_client`` and ``http.server``, which
the daemon's idle memory does without otherwise (``make bench`` tracks it).

Two kinds of figures. Events are counted as they happen, by the
:class:`PrometheusObserver` each resource calls (O(1): label children are made
once and cached, so no label string is built on the Allocate path). What the
engine already keeps (devices by health, registration state and count, kubelet
restarts seen) is read at scrape time, on the event loop, by
:class:`EngineCollector`. A resource served through DRA adds its claims', its
registration's and its ResourceSlices' metrics (:mod:`devplug.daemon.drametrics`).

The HTTP server (:mod:`devplug.daemon.httpserve`: bounded connections, timeouts
for slow requests and idle connections, capped headers) runs in threads of its
own, on ``[metrics] address`` and ``port``:

* ``/metrics``: the exposition, in the Prometheus text format;
* ``/healthz``: 200 when the event loop runs a call scheduled onto it within
  :data:`PROBE_TIMEOUT_S`, 503 when it does not (a loop stuck in a blocking
  call, or gone): the HTTP thread answering proves nothing by itself;
* ``/readyz``: 200 when the daemon is ready (every configured resource
  registered with the kubelet; with ``[liveness] required``, the pods' cgroups
  readable), else 503 saying why.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import platform
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

import devplug
from devplug.contract import HOOK_CONTRACT
from devplug.daemon.drametrics import DraCounters, DraResourceCounters, dra_families
from devplug.daemon.httpserve import DEFAULT_LIMITS, HttpLimits, LimitedHttpServer, Response
from devplug.engine import ResourceFigures, ResourceObserver
from devplug.hookspecs import HOOK_NAMES

__all__ = [
    "EngineCollector",
    "Metrics",
    "MetricsServer",
    "NodeFigures",
    "PROBE_TIMEOUT_S",
    "PrometheusObserver",
]

T = TypeVar("T")

log = logging.getLogger("devplug.engine")


#: A driver's reason for an unhealthy device is cut to this many characters in a label.
REASON_LABEL_CHARS = 200

#: How long a probe (and a scrape's read of the engine) waits for the event loop to run a call.
PROBE_TIMEOUT_S = 2.0

#: Release latency buckets, seconds: a mock release takes milliseconds, a deprogrammed FPGA minutes.
RELEASE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
#: Kubelet call hold buckets, seconds: an Allocate answers in about a millisecond; a wait for a previous tenant
#: being killed lasts up to ``[release] previous_tenant_wait``, during which the kubelet admits no other pod.
KUBELET_HOLD_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: The kubelet calls whose holds are observed (``devplug.frontends.deviceplugin.servicer.KUBELET_WAITS``).
KUBELET_HELD_CALLS = ("Allocate", "GetPreferredAllocation")
#: Ledger write buckets, seconds: a journal append is microseconds, an fdatasync milliseconds.
LEDGER_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


@dataclass(frozen=True)
class NodeFigures:
    """What the daemon keeps about the node as a whole, read on the event loop at scrape time."""

    #: PodResources ``List`` calls made, and those that failed; when the last one succeeded (``time.time()``).
    pod_resources_reads: int = 0
    pod_resources_failures: int = 0
    pod_resources_last_success: float | None = None
    #: Whether the pods' cgroups can be read (container liveness known).
    liveness_known: bool = False
    #: Tenancies the kubelet no longer attributes, waiting for their pod's containers to exit.
    awaiting_exit: int = 0
    #: The per-node profiles the running config was composed with (:mod:`devplug.profiles`).
    profiles: tuple[str, ...] = ()
    #: Whether the node's labels choose profiles that cannot apply (the running config stays).
    profiles_refused: bool = False
    #: Whether the node's labels are being watched; None when the config has no profiles.
    node_watched: bool | None = None


class PrometheusObserver(ResourceObserver):
    """Counts one resource's events in the :class:`Metrics` it was made by."""

    def __init__(self, metrics: Metrics, resource: str, driver: str) -> None:
        self._metrics = metrics
        self._resource = resource
        self._driver = driver
        self._hooks: dict[str, tuple[Any, Any, Any]] = {}
        for hook in HOOK_NAMES:  # every hook of the contract has its counters (at 0) from the start
            self._hook(hook)
        self._allocations = metrics.allocations.labels(resource)
        self._held = {call: metrics.kubelet_call_seconds.labels(resource, call) for call in KUBELET_HELD_CALLS}
        self._releases = metrics.releases.labels(resource)
        self._release_seconds = metrics.release_seconds.labels(resource)
        self._ledger = {kind: metrics.ledger_seconds.labels(resource, kind) for kind in ("journal", "snapshot")}
        self._dra_counters: DraResourceCounters | None = None  # made on a DRA resource's first claim

    @property
    def _dra(self) -> DraResourceCounters:
        if self._dra_counters is None:
            self._dra_counters = self._metrics.dra.of(self._resource)
        return self._dra_counters

    def _hook(self, hook: str) -> tuple[Any, Any, Any]:
        children = self._hooks.get(hook)
        if children is None:
            labels = (self._resource, self._driver, hook)
            m = self._metrics
            children = (m.hook_calls.labels(*labels), m.hook_errors.labels(*labels), m.hook_timeouts.labels(*labels))
            self._hooks[hook] = children
        return children

    def hook_called(self, hook: str) -> None:
        self._hook(hook)[0].inc()

    def hook_failed(self, hook: str) -> None:
        self._hook(hook)[1].inc()

    def hook_timed_out(self, hook: str) -> None:
        self._hook(hook)[2].inc()

    def kubelet_call_held(self, call: str, seconds: float) -> None:
        child = self._held.get(call)
        if child is not None:
            child.observe(seconds)

    def allocated(self, containers: int) -> None:
        self._allocations.inc(containers)

    def released(self, seconds: float) -> None:
        self._releases.inc()
        self._release_seconds.observe(seconds)

    def ledger_written(self, kind: str, seconds: float) -> None:
        child = self._ledger.get(kind)
        if child is None:
            child = self._ledger[kind] = self._metrics.ledger_seconds.labels(self._resource, kind)
        child.observe(seconds)

    def claim_prepared(self, seconds: float) -> None:
        self._dra.prepared(seconds)

    def claim_prepare_failed(self, reason: str, seconds: float) -> None:
        self._dra.prepared(seconds, failure=reason)

    def claim_unprepared(self, seconds: float) -> None:
        self._dra.unprepared(seconds)

    def claim_unprepare_failed(self, reason: str, seconds: float) -> None:
        self._dra.unprepared(seconds, failure=reason)

    def claim_gone(self, cause: str) -> None:
        self._dra.gone(cause)


class EngineCollector(Collector):
    """The figures the engine keeps, read through ``read`` and ``node`` (which run on the event loop) at every
    scrape."""

    def __init__(
        self, read: Callable[[], Sequence[ResourceFigures]], node: Callable[[], NodeFigures] = NodeFigures
    ) -> None:
        self._read = read
        self._node = node

    def collect(self) -> Iterable[Metric]:
        resources = self._read()
        return [*self._resources(resources), *dra_families(resources), *self._node_metrics(self._node())]

    @staticmethod
    def _node_metrics(node: NodeFigures) -> list[Metric]:
        reads = CounterMetricFamily(
            "devplug_podresources_reads", "PodResources List calls made to find releases.", labels=[]
        )
        reads.add_metric([], node.pod_resources_reads)
        failures = CounterMetricFamily(
            "devplug_podresources_read_failures", "PodResources List calls that failed (nothing released).", labels=[]
        )
        failures.add_metric([], node.pod_resources_failures)
        last = GaugeMetricFamily(
            "devplug_podresources_last_success_timestamp_seconds",
            "When PodResources last answered (Unix time; 0: never).",
            labels=[],
        )
        last.add_metric([], node.pod_resources_last_success or 0.0)
        liveness = GaugeMetricFamily(
            "devplug_container_liveness_known",
            "1 while the pods' cgroups can be read (releases wait for a pod's last process), 0 while they cannot "
            "(releases wait [liveness] unknown_grace).",
            labels=[],
        )
        liveness.add_metric([], 1 if node.liveness_known else 0)
        awaiting = GaugeMetricFamily(
            "devplug_tenancies_awaiting_exit",
            "Allocations the kubelet no longer attributes whose pod's containers may still run.",
            labels=[],
        )
        awaiting.add_metric([], node.awaiting_exit)
        return [reads, failures, last, liveness, awaiting, *EngineCollector._profile_metrics(node)]

    @staticmethod
    def _profile_metrics(node: NodeFigures) -> list[Metric]:
        active = GaugeMetricFamily(
            "devplug_profile_active",
            "1 for each per-node profile the running config was composed with (none: the base config).",
            labels=["profile"],
        )
        for name in node.profiles:
            active.add_metric([name], 1)
        refused = GaugeMetricFamily(
            "devplug_profiles_refused",
            "1 while the node's labels choose profiles that cannot apply (unknown, conflicting, invalid); the "
            "running config stays.",
            labels=[],
        )
        refused.add_metric([], 1 if node.profiles_refused else 0)
        found: list[Metric] = [active, refused]
        if node.node_watched is not None:
            watched = GaugeMetricFamily(
                "devplug_node_watch_up",
                "1 while the daemon watches its Node's labels (for profiles), 0 while it cannot.",
                labels=[],
            )
            watched.add_metric([], 1 if node.node_watched else 0)
            found.append(watched)
        return found

    @staticmethod
    def _resources(figures: Sequence[ResourceFigures]) -> list[Metric]:
        devices = GaugeMetricFamily(
            "devplug_devices", "Devices advertised to the kubelet, by health.", labels=["resource", "health"]
        )
        registered = GaugeMetricFamily(
            "devplug_resource_registered", "1 while the resource is registered with the kubelet.", labels=["resource"]
        )
        registrations = CounterMetricFamily(
            "devplug_registrations", "Successful registrations with the kubelet.", labels=["resource"]
        )
        restarts = CounterMetricFamily(
            "devplug_kubelet_restarts",
            "Kubelet restarts seen (socket removed, kubelet.sock recreated, its ListAndWatch stream ended).",
            labels=["resource"],
        )
        replicas = GaugeMetricFamily(
            "devplug_shared_device_replicas",
            "Replicas a shared physical device is advertised as.",
            labels=["resource", "device"],
        )
        in_use = GaugeMetricFamily(
            "devplug_shared_device_replicas_in_use",
            "Replicas of a shared physical device that allocations hold.",
            labels=["resource", "device"],
        )
        tenants = GaugeMetricFamily(
            "devplug_shared_device_tenants",
            "Allocations (tenancies) holding a replica of a shared physical device.",
            labels=["resource", "device"],
        )
        allocated = GaugeMetricFamily(
            "devplug_devices_allocated", "Devices allocations hold (replicas count one each).", labels=["resource"]
        )
        busy = GaugeMetricFamily(
            "devplug_devices_busy",
            "Devices no hook may touch now: a hook past hook_timeout still runs on them, or a quarantined ledger "
            "record names them (advertised unhealthy).",
            labels=["resource"],
        )
        withheld_busy = GaugeMetricFamily(
            "devplug_devices_withheld_busy",
            "Devices withheld (advertised unhealthy) because the kubelet no longer attributes them while their "
            "tenant's containers still run, or may: the kubelet gives the next pod a free device instead.",
            labels=["resource"],
        )
        failing = GaugeMetricFamily(
            "devplug_releases_failing", "Releases failing, retried with backoff.", labels=["resource"]
        )
        reasons = GaugeMetricFamily(
            "devplug_device_unhealthy",
            "1 for each device its driver reports unhealthy, with the driver's reason (say, a VF whose trust could "
            "not be cleared).",
            labels=["resource", "device", "reason"],
        )
        for f in figures:
            for device, reason in f.unhealthy_reasons:
                reasons.add_metric([f.resource, device, reason[:REASON_LABEL_CHARS]], 1)
            allocated.add_metric([f.resource], f.allocated)
            busy.add_metric([f.resource], f.busy)
            withheld_busy.add_metric([f.resource], f.withheld_busy)
            failing.add_metric([f.resource], f.failing_releases)
            for device, count, used, held_by in f.shared:
                replicas.add_metric([f.resource, device], count)
                in_use.add_metric([f.resource, device], used)
                tenants.add_metric([f.resource, device], held_by)
            devices.add_metric([f.resource, "healthy"], f.healthy)
            devices.add_metric([f.resource, "unhealthy"], f.unhealthy)
            registered.add_metric([f.resource], 1 if f.registered else 0)
            registrations.add_metric([f.resource], f.registrations)
            restarts.add_metric([f.resource], f.kubelet_restarts)
        return [
            devices,
            registered,
            registrations,
            restarts,
            replicas,
            in_use,
            tenants,
            allocated,
            busy,
            withheld_busy,
            failing,
            reasons,
        ]

    def describe(self) -> Iterable[Metric]:
        return []  # read only at scrape time (registering must not call the engine)


class Metrics:
    """The daemon's metrics: event counters and histograms, and the engine's figures read at scrape time."""

    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # no *_created series: the start time says as much
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.allocations = Counter(
            "devplug_allocations", "Container allocations answered to the kubelet.", ["resource"], registry=r
        )
        self.releases = Counter("devplug_releases", "Allocations released.", ["resource"], registry=r)
        self.kubelet_call_seconds = Histogram(
            "devplug_kubelet_call_hold_seconds",
            "Seconds the kubelet waited for devplug's answer to a call it makes in its pod admission loop with no "
            "deadline (Allocate, GetPreferredAllocation): every other pod of the node waited as long.",
            ["resource", "call"],
            buckets=KUBELET_HOLD_BUCKETS,
            registry=r,
        )
        self.release_seconds = Histogram(
            "devplug_release_duration_seconds",
            "Seconds from a release's start (pod gone, or a KEP call) to its last driver hook returning.",
            ["resource"],
            buckets=RELEASE_BUCKETS,
            registry=r,
        )
        hook_labels = ["resource", "driver", "hook"]
        self.hook_calls = Counter("devplug_hook_calls", "Driver hook calls.", hook_labels, registry=r)
        self.hook_errors = Counter("devplug_hook_errors", "Driver hook calls that raised.", hook_labels, registry=r)
        self.hook_timeouts = Counter(
            "devplug_hook_timeouts", "Driver hook calls abandoned after hook_timeout.", hook_labels, registry=r
        )
        self.ledger_seconds = Histogram(
            "devplug_ledger_write_duration_seconds",
            "Seconds an allocation-ledger write took (journal append, fdatasync'ed when asked; snapshot).",
            ["resource", "kind"],
            buckets=LEDGER_BUCKETS,
            registry=r,
        )
        self.handovers = Counter(
            "devplug_handovers",
            "Handovers between two instances on this state dir: role from (handed over) or to (took over), "
            "outcome done or failed.",
            ["role", "outcome"],
            registry=r,
        )
        self.handover_seconds = Gauge(
            "devplug_handover_last_duration_seconds",
            "Seconds the last handover took, from the new instance's request to the old one's done.",
            ["role"],
            registry=r,
        )
        build = Gauge(
            "devplug_build_info",
            "1, labelled with devplug's version, the hook contract it offers and Python's version.",
            ["version", "hook_contract", "python"],
            registry=r,
        )
        build.labels(devplug.__version__, HOOK_CONTRACT, platform.python_version()).set(1)
        self.dra = DraCounters(r)
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes, open fds, ...

    def handover(self, role: str, outcome: str, seconds: float | None) -> None:
        """Count a handover this instance took part in (``role``: "from" or "to")."""
        self.handovers.labels(role, outcome).inc()
        if seconds is not None:
            self.handover_seconds.labels(role).set(seconds)

    def observer(self, resource: str, driver: str) -> PrometheusObserver:
        """The observer a resource calls (its label children made now, once)."""
        return PrometheusObserver(self, resource, driver)

    def serve(
        self,
        address: str,
        port: int,
        loop: asyncio.AbstractEventLoop,
        figures: Callable[[], Sequence[ResourceFigures]],
        not_ready: Callable[[], Sequence[str]],
        probe_timeout: float = PROBE_TIMEOUT_S,
        limits: HttpLimits = DEFAULT_LIMITS,
        node: Callable[[], NodeFigures] = NodeFigures,
    ) -> MetricsServer:
        """Start the HTTP server (raises ``OSError`` when the address cannot be bound); ``not_ready`` says why the
        daemon is not ready (nothing: ready), called on the event loop."""
        server = MetricsServer(self.registry, address, port, loop, not_ready, probe_timeout, limits)
        self.registry.register(EngineCollector(lambda: server.on_loop(figures), lambda: server.on_loop(node)))
        server.start()
        return server


_TEXT = "text/plain; charset=utf-8"


class MetricsServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on one address, served from a thread of their own."""

    def __init__(
        self,
        registry: CollectorRegistry,
        address: str,
        port: int,
        loop: asyncio.AbstractEventLoop,
        not_ready: Callable[[], Sequence[str]],
        probe_timeout: float = PROBE_TIMEOUT_S,
        limits: HttpLimits = DEFAULT_LIMITS,
    ) -> None:
        self.registry = registry
        self.loop = loop
        self.probe_timeout = probe_timeout
        self._not_ready = not_ready
        self._http = LimitedHttpServer(address, port, self._route, limits)

    @property
    def port(self) -> int:
        """The port served on."""
        return self._http.port

    def start(self) -> None:
        self._http.start()

    def close(self) -> None:
        """Stop serving and close the socket."""
        self._http.close()

    def _route(self, method: str, path: str) -> Response:
        if path == "/metrics":
            return self.metrics()
        if path == "/healthz":
            return self.healthz()
        if path == "/readyz":
            return self.readyz()
        return 404, b"not found: try /metrics, /healthz or /readyz\n", _TEXT

    def on_loop(self, fn: Callable[[], T]) -> T:
        """``fn()`` run on the event loop; raises ``TimeoutError`` if the loop does not run it in time."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

        try:
            self.loop.call_soon_threadsafe(run)
        except RuntimeError as exc:  # the loop is closed
            raise TimeoutError(f"the event loop is gone: {exc}") from exc
        try:
            return future.result(timeout=self.probe_timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"the event loop did not run a call within {self.probe_timeout:g} s") from None

    # --- the endpoints: (status, body, content type)

    def metrics(self) -> tuple[int, bytes, str]:
        try:
            return 200, generate_latest(self.registry), CONTENT_TYPE_LATEST
        except TimeoutError as exc:
            return 503, f"{exc}\n".encode(), _TEXT

    def healthz(self) -> tuple[int, bytes, str]:
        try:
            self.on_loop(lambda: None)
        except TimeoutError as exc:
            return 503, f"unhealthy: {exc}\n".encode(), _TEXT
        return 200, b"ok\n", _TEXT

    def readyz(self) -> tuple[int, bytes, str]:
        try:
            reasons = self.on_loop(self._not_ready)
        except TimeoutError as exc:
            return 503, f"not ready: {exc}\n".encode(), _TEXT
        if reasons:
            return 503, f"not ready: {'; '.join(reasons)}\n".encode(), _TEXT
        return 200, b"ready\n", _TEXT
