"""GetPreferredAllocation: all 1,000 devices (4 NUMA nodes) available, size 8; and the bare grpcio floor."""

from __future__ import annotations

from bench.client import PluginClient
from bench.payloads import device_ids, preferred_request
from bench.scenarios.series import CallSeries, interleave
from bench.settings import Settings
from bench.stats import summary_ms

__all__ = ["measure"]


def measure(settings: Settings, *, client: PluginClient, floor: PluginClient) -> dict[str, float]:
    request = preferred_request(device_ids(settings.devices_1k), settings.preferred_size)
    answer = client.preferred(request).container_responses[0].deviceIDs
    if len(answer) != settings.preferred_size:
        raise RuntimeError(f"GetPreferredAllocation answered {len(answer)} devices, not {settings.preferred_size}")
    dev = CallSeries("preferred", lambda _: client.preferred(request))
    flo = CallSeries("preferred-floor", lambda _: floor.preferred(request))
    for one in (dev, flo):
        one.warm_up(settings.warmup)
    interleave([dev, flo], settings.preferred_calls, settings.block)
    d, f = summary_ms(dev.samples), summary_ms(flo.samples)
    return {
        "preferred_p50_ms": d["p50"],
        "preferred_p99_ms": d["p99"],
        "preferred_floor_p99_ms": f["p99"],
        "preferred_ratio_p99": d["p99"] / f["p99"],
    }
