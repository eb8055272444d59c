"""The daemon's metrics endpoint, when ``[metrics] enabled``: :class:`~devplug.daemon.metrics.Metrics` served on
``[metrics] address`` and ``port``, reading at each scrape (on the event loop) every resource's figures, the node's,
and for ``/readyz`` why the daemon is not ready.

Imported only when the metrics are enabled (it brings ``prometheus_client``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from devplug.config import Config
from devplug.daemon.metrics import Metrics, MetricsServer, NodeFigures
from devplug.daemon.readiness import NodeFacts, ResourceFacts, pod_resources_bound, reasons
from devplug.engine import ExitEvidence, Resource, ResourceFigures
from devplug.errors import ConfigError

if TYPE_CHECKING:
    from devplug.frontends.deviceplugin.reconciler import Reconciler

__all__ = ["MetricsEndpoint"]

log = logging.getLogger("devplug.engine")


class MetricsEndpoint:
    """Serves ``metrics`` (``/metrics``, ``/healthz``, ``/readyz``) from :meth:`start` to :meth:`close`.

    ``config`` is the config running now (a reload changes it), ``resources``
    the resources alive.
    """

    def __init__(
        self,
        metrics: Metrics,
        config: Callable[[], Config],
        resources: Callable[[], Iterable[Resource]],
        reconciler: Callable[[], Reconciler | None],
        exits: ExitEvidence,
        profiles: Callable[[], Mapping[str, Any] | None] = lambda: None,
    ) -> None:
        self.metrics = metrics
        self._profiles = profiles
        self._config = config
        self._resources = resources
        self._reconciler = reconciler
        self._exits = exits
        self._server: MetricsServer | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Serve; :class:`ConfigError` naming the keys when the address cannot be bound."""
        config = self._config()
        mc = config.metrics
        try:
            self._server = self.metrics.serve(
                mc.address, mc.port, loop, self.figures, self.not_ready, node=self.node_figures
            )
        except OSError as exc:
            raise ConfigError(
                f"{config.path or '<config>'}: metrics: cannot serve on {mc.address} port {mc.port}: "
                f"{exc.strerror or exc} (set [metrics] address and port)"
            ) from exc
        log.info("metrics on http://%s:%d/metrics (probes /healthz, /readyz)", mc.address, mc.port)

    def close(self) -> None:
        """Stop serving (nothing when never started)."""
        if self._server is not None:
            self._server.close()

    # --- read on the event loop by the metrics server's thread

    def figures(self) -> list[ResourceFigures]:
        """Every resource's figures."""
        return [r.figures() for r in self._resources()]

    def node_figures(self) -> NodeFigures:
        """The node's figures: PodResources reads, container liveness, tenancies waiting for their pods' exit."""
        reconciler = self._reconciler()  # None: no resource is served through the device-plugin API
        profiles = self._profiles()
        return NodeFigures(
            profiles=self._config().applied,
            profiles_refused=bool(profiles and profiles.get("refused")),
            node_watched=None if profiles is None else profiles.get("api") == "watching",
            pod_resources_reads=reconciler.polls if reconciler is not None else 0,
            pod_resources_failures=reconciler.failures if reconciler is not None else 0,
            pod_resources_last_success=reconciler.last_success if reconciler is not None else None,
            liveness_known=self._exits.liveness.layout is not None,
            awaiting_exit=reconciler.awaiting_exit() if reconciler is not None else 0,
        )

    def not_ready(self) -> list[str]:
        """Why the daemon is not ready (``/readyz``); nothing when it is. The rules are ``devplug status``'s too
        (:mod:`devplug.daemon.readiness`)."""
        config = self._config()
        resources = []
        for r in self._resources():
            figures = r.figures()
            resources.append(
                ResourceFacts(
                    name=r.name,
                    state=r.state.value,
                    devices=figures.healthy + figures.unhealthy,
                    healthy=figures.healthy,
                    failing_releases=figures.failing_releases,
                    last_error=r.last_error,
                    driver_problem=r.driver_problem,
                )
            )
        liveness, reconciler = self._exits.liveness, self._reconciler()
        node = NodeFacts(
            pod_resources_failing_since=reconciler.failing_since if reconciler is not None else None,
            pod_resources_error=reconciler.last_error if reconciler is not None else None,
            pod_resources_bound=pod_resources_bound(config.release.grace_period, config.release.interval),
            liveness_problem=liveness.problem if config.liveness.required and not liveness.available() else None,
        )
        return [reason.text for reason in reasons(resources, node)]
