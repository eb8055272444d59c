"""How much of everything a run does: the full run (``make bench``) and the tiny ``--quick`` one."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FULL", "QUICK", "Settings"]


@dataclass(frozen=True)
class Settings:
    quick: bool
    allocate_calls: int  # measured Allocate calls per series
    block: int  # calls per interleaved block (devplug, then each floor)
    warmup: int  # unmeasured calls before each series
    empty_ledger_calls: int  # Allocate with a KEP Deallocate after each call (diagnostic)
    held_calls: int  # per series of the held-0 / held-1000 comparison (a p99 of 1,000 is its 10th worst)
    preferred_calls: int
    unix_round_trips: int
    law_samples: int  # pushes per device count (median)
    churn_period_s: float  # one device's health flips this often during the churn series
    reregister_restarts: int
    release_pods: int
    release_spacing_s: float  # pod removals are this far apart (not a divisor of the 1 s interval)
    startup_runs: int
    idle_settle_s: float
    idle_s: float
    devices_small: int = 10
    devices_1k: int = 1_000
    devices_10k: int = 10_000
    numa_nodes: int = 4
    per_call: int = 4  # devices per Allocate (one container)
    held_allocations: int = 1_000  # allocations held during the "held 1000" series
    preferred_size: int = 8
    idle_resources: int = 3
    idle_devices: int = 100
    flood_connections: int = 1_300  # slow clients held open on the metrics port (issue 24 saw 1,313)
    flood_calls: int = 1_000  # Allocate calls measured without and with the flood
    flood_devices: int = 100
    flood_probes: int = 10  # probes answered during the flood (one after each tenth of its calls)
    handovers: int = 5  # rolling-update handovers measured, one after another
    handover_devices: int = 1_000  # the mock resource whose Allocates are timed across the handovers
    handover_steady_calls: int = 300  # Allocates before the first handover: the floor's sample
    dra_rounds: int = 500  # DRA prepare + unprepare rounds measured (one claim each), beside the floor's
    dra_warmup: int = 50  # unmeasured rounds before them
    dra_health_rounds: int = 25  # a device turned unhealthy and healthy again, this many times


FULL = Settings(
    quick=False,
    allocate_calls=2_000,
    block=125,
    warmup=50,
    empty_ledger_calls=500,
    held_calls=1_000,
    preferred_calls=2_000,
    unix_round_trips=2_000,
    law_samples=20,
    churn_period_s=0.02,
    reregister_restarts=20,
    release_pods=20,
    release_spacing_s=0.37,
    startup_runs=5,
    idle_settle_s=3.0,
    idle_s=30.0,
)

QUICK = Settings(
    quick=True,
    handovers=1,
    handover_devices=100,
    handover_steady_calls=50,
    held_allocations=100,
    allocate_calls=40,
    block=20,
    warmup=5,
    empty_ledger_calls=20,
    held_calls=20,
    preferred_calls=40,
    unix_round_trips=100,
    law_samples=3,
    churn_period_s=0.02,
    reregister_restarts=2,
    release_pods=2,
    release_spacing_s=0.37,
    startup_runs=1,
    idle_settle_s=0.5,
    idle_s=2.0,
    flood_connections=100,
    flood_calls=40,
    flood_devices=20,
    flood_probes=2,
    dra_rounds=20,
    dra_warmup=5,
    dra_health_rounds=3,
)
