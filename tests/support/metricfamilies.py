"""Every metric family a daemon's scrape can give, for the tests that check names against it (the metrics reference
in tests/test_docs.py, the alerts and dashboard in tests/deploy/test_monitoring.py)."""

from __future__ import annotations

from typing import Any

from devplug.daemon.metrics import EngineCollector, Metrics, NodeFigures
from devplug.engine import ResourceFigures


def every_family() -> list[Any]:
    """The families devplug's metrics module registers, with a resource of each front end (the DRA families exist
    only for a DRA resource), every event counted once and profiles in use (the profile metrics need them)."""
    metrics = Metrics()
    metrics.observer("example.com/a", "mock")
    metrics.handover("to", "done", 0.5)  # the handover series exist once one happened
    dra = metrics.observer("example.com/b", "mock")  # a resource served through DRA: every DRA series
    dra.claim_prepared(0.001)
    dra.claim_prepare_failed("claim_not_found", 0.001)
    dra.claim_unprepare_failed("release_failed", 0.001)
    dra.claim_gone("deleted")
    figures = [
        ResourceFigures(
            "example.com/a",
            1,
            0,
            registered=True,
            registrations=1,
            kubelet_restarts=0,
            shared=[("gpu0", 4, 1, 1)],
            unhealthy_reasons=[("gpu1", "fan stopped")],
        ),
        ResourceFigures(
            "example.com/b",
            1,
            0,
            registered=True,
            registrations=1,
            kubelet_restarts=0,
            frontend={
                "driver": "b.example.com",
                "pool": "node-a",
                "registration": {"registered": True, "socket_recreated": 0},
                "slices": {"generation": 1, "slices": 1, "in_sync": True, "synced_at": 1.0, "failures": 0},
                "claims": {"held": 0},
                "claim_status": {"written": 1, "removed": 0, "failures": 0, "invalid": 0},
            },
        ),
    ]
    node = NodeFigures(profiles=("big",), node_watched=True)  # the profile metrics, which need profiles
    metrics.registry.register(EngineCollector(lambda: figures, lambda: node))
    return list(metrics.registry.collect())
