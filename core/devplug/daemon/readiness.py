"""Why a daemon cannot serve as it should: one set of rules for ``/readyz`` and ``devplug status``.

``/readyz`` asks the daemon's live objects (:class:`~devplug.daemon.metricsendpoint.MetricsEndpoint`), ``devplug
status`` the status file another process reads (:func:`facts_from_status`); both turn what they have into the same
facts (:class:`NodeFacts`, one :class:`ResourceFacts` per resource) and ask :func:`reasons`, so that one never says
ready while the other names a problem. The status file is written within a second of every change, a PodResources
read that failed included, and the duration rules are computed at the moment of asking from the time the failure
began, so a status read a second after ``/readyz`` answers the same.

The rules, each a :class:`Reason` (its ``rule`` names it) and what ``devplug status`` exits with while the daemon
runs (:func:`exit_code`; 3, :data:`EXIT_NOT_RUNNING`, when no daemon runs):

* ``not-registered``, ``failed`` (:data:`EXIT_PROBLEM`, 6): a resource is not registered with the kubelet (starting,
  registering, draining after a reload removed it), or its start failed (retried with backoff);
* ``driver-problem`` (6): a resource's driver says it cannot follow its devices now (``ctx.report_problem``: a
  folder watch whose folder became a file, an event stream that keeps failing); what it advertises may be stale;
* ``release-failing`` (6): a release of a resource keeps failing (its devices stay out of service until the
  driver's release succeeds; retried with backoff);
* ``pod-resources`` (6): PodResources has been unreadable for longer than ``max([release] grace_period, 3 x
  interval)``: no release can be decided;
* ``liveness`` (6): container liveness is unknown while ``[liveness] required`` says releases must wait for it;
* ``nothing-served`` (:data:`EXIT_NOTHING_SERVED`, 7): a registered resource has devices and none of them healthy
  (the driver reports them all unhealthy, or the resource is degraded): nothing can be served.

7 wins over 6 when both apply. ``/readyz`` answers 503 with every reason's text for any of them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "EXIT_NOTHING_SERVED",
    "EXIT_NOT_RUNNING",
    "EXIT_PROBLEM",
    "NodeFacts",
    "Reason",
    "ResourceFacts",
    "exit_code",
    "facts_from_status",
    "pod_resources_bound",
    "reasons",
]

#: ``devplug status``: no daemon runs with that state dir (or its status file is unusable).
EXIT_NOT_RUNNING = 3
#: ``devplug status``: the daemon runs with a problem ``/readyz`` reports too (see the module's docstring).
EXIT_PROBLEM = 6
#: ``devplug status``: the daemon runs, but a resource has no healthy device: nothing can be served.
EXIT_NOTHING_SERVED = 7

_REGISTERED = "registered"
_FAILED = "failed"


@dataclass(frozen=True)
class ResourceFacts:
    """What the rules need of one resource."""

    name: str
    state: str  # a ResourceState's value
    devices: int
    healthy: int
    failing_releases: int
    last_error: str | None = None
    #: Why the driver cannot follow its devices now (``ctx.report_problem``), or None.
    driver_problem: str | None = None


@dataclass(frozen=True)
class NodeFacts:
    """What the rules need of the node: PodResources reads, container liveness."""

    #: Since when PodResources reads fail without a break (None: they do not), and the last failure.
    pod_resources_failing_since: float | None
    pod_resources_error: str | None
    #: How long PodResources may be unreadable before no release can be decided (:func:`pod_resources_bound`).
    pod_resources_bound: float
    #: Why container liveness is unknown while ``[liveness] required`` (None: known, or not required).
    liveness_problem: str | None = None


@dataclass(frozen=True)
class Reason:
    """One reason the daemon is not ready: the rule, and the words ``/readyz`` and ``devplug status`` use."""

    rule: str
    text: str

    @property
    def nothing_served(self) -> bool:
        return self.rule == "nothing-served"


def pod_resources_bound(grace_period: float, interval: float) -> float:
    """How long PodResources may be unreadable before it is a problem: a release waits out the grace period."""
    return max(grace_period, 3 * interval)


def reasons(resources: Iterable[ResourceFacts], node: NodeFacts, now: float | None = None) -> list[Reason]:
    """Why the daemon is not ready, in the order of the module's docstring; nothing when it is."""
    now = time.time() if now is None else now
    resources = list(resources)
    found: list[Reason] = []
    unregistered = [r.name for r in resources if r.state not in (_REGISTERED, _FAILED)]
    if unregistered:
        found.append(Reason("not-registered", f"not registered with the kubelet: {', '.join(unregistered)}"))
    for r in resources:
        if r.state == _FAILED:
            found.append(Reason("failed", f"{r.name}: failed: {r.last_error}"))
    for r in resources:
        if r.driver_problem is not None:
            found.append(
                Reason("driver-problem", f"{r.name}: the driver cannot follow its devices: {r.driver_problem}")
            )
    for r in resources:
        if r.failing_releases:
            plural = "s" if r.failing_releases != 1 else ""
            found.append(
                Reason(
                    "release-failing",
                    f"{r.name}: {r.failing_releases} release{plural} failing (its devices stay out of service until "
                    "the driver's release succeeds)",
                )
            )
    since = node.pod_resources_failing_since
    if since is not None and now - since > node.pod_resources_bound:
        found.append(
            Reason(
                "pod-resources",
                f"PodResources unreadable for {now - since:.0f} s ({node.pod_resources_error}): no release can be "
                "decided",
            )
        )
    if node.liveness_problem is not None:
        found.append(Reason("liveness", f"container liveness unknown ([liveness] required): {node.liveness_problem}"))
    for r in resources:
        if r.state == _REGISTERED and r.devices and not r.healthy:
            found.append(Reason("nothing-served", f"{r.name}: no device can be served: all {r.devices} unhealthy"))
    return found


def exit_code(found: Sequence[Reason]) -> int:
    """``devplug status``'s exit code for a running daemon with these reasons (0: none)."""
    if any(r.nothing_served for r in found):
        return EXIT_NOTHING_SERVED
    return EXIT_PROBLEM if found else 0


def facts_from_status(data: Mapping[str, Any]) -> tuple[list[ResourceFacts], NodeFacts]:
    """The facts a status file (``<state dir>/status.json``, as :func:`~devplug.daemon.status.read_status` returns
    it) holds."""
    resources = []
    for res in data.get("resources") or []:
        counts = res.get("counts") or {}
        resources.append(
            ResourceFacts(
                name=str(res.get("name")),
                state=str(res.get("state")),
                devices=int(counts.get("devices") or 0),
                healthy=int(counts.get("healthy") or 0),
                failing_releases=len(res.get("release_failures") or {}),
                last_error=res.get("last_error"),
                driver_problem=str(res["driver_problem"]) if res.get("driver_problem") else None,
            )
        )
    release = data.get("release") or {}
    liveness = release.get("liveness") or {}
    unknown = liveness.get("state") == "unknown" and bool(liveness.get("required"))
    node = NodeFacts(
        pod_resources_failing_since=release.get("failing_since"),
        pod_resources_error=release.get("last_error"),
        pod_resources_bound=pod_resources_bound(
            float(release.get("grace_period") or 0.0), float(release.get("interval") or 0.0)
        ),
        liveness_problem=str(liveness.get("problem")) if unknown else None,
    )
    return resources, node
