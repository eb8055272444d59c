"""The DRA health stream from a device table, read over a real unix socket as the kubelet reads it: every device,
the driver's reason as the message (cut to the kubelet's 1024 bytes), withheld and degraded devices, the timeout,
and a message at every change and every resend period."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio

from devplug.api.gen.drahealth.v1alpha1 import api_pb2 as health_pb
from devplug.api.gen.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from devplug.engine.devicetable import DeviceTable
from devplug.frontends.dra.health import TIMEOUT_S, HealthService, health_report
from devplug.types import Device, Health, HealthReport
from tests.frontends.dra.conftest import run
from tests.frontends.dra.dranode import short_root


def _by_name(report: Any) -> dict[str, tuple[int, str, int, int]]:
    return {
        d.device.device_name: (d.health, d.message, d.health_check_timeout_seconds, d.last_updated_time)
        for d in report.devices
    }


def test_every_device_with_its_health_and_reason() -> None:
    table = DeviceTable()
    table.replace([Device("a"), Device("b", Health.UNHEALTHY, reason="ECC errors"), Device("c"), Device("D_1")])
    table.set_withheld(["c"])
    report = health_report(table, "node-a", 1000.7)
    assert {d.device.pool_name for d in report.devices} == {"node-a"}
    devices = _by_name(report)
    assert devices["a"] == (health_pb.HEALTHY, "", TIMEOUT_S, 1000)
    assert devices["b"] == (health_pb.UNHEALTHY, "ECC errors", TIMEOUT_S, 1000)
    assert devices["c"][:2] == (health_pb.UNHEALTHY, "being released (cleaned) after its previous claim")
    [hashed] = [n for n in devices if n not in ("a", "b", "c")]
    assert hashed.startswith("d-1-")  # the published device name, not the ID
    table.set_degraded("the driver's check_health failed 3 times")
    assert {v[:2] for v in _by_name(health_report(table, "node-a", 1.0)).values()} == {
        (health_pb.UNHEALTHY, "the resource is degraded: the driver's check_health failed 3 times")
    }


def test_a_shared_device_published_with_consumable_capacity_has_one_entry_under_its_own_name() -> None:
    """Issue 41: the kubelet matches health to a claim's devices by pool and name, so the consumable form's one
    device (named after the physical ID) gets one entry, unhealthy only when every replica is withheld."""
    table = DeviceTable()
    table.replace([Device("gpu0", replicas=3), Device("nic0")])
    assert set(_by_name(health_report(table, "p", 0, consumable=True))) == {"gpu0", "nic0"}
    assert len(_by_name(health_report(table, "p", 0))) == 4, "the replicas' form: one entry per replica"
    table.set_withheld(["gpu0::0", "gpu0::1"])
    assert _by_name(health_report(table, "p", 0, consumable=True))["gpu0"][0] == health_pb.HEALTHY
    table.set_withheld(["gpu0::0", "gpu0::1", "gpu0::2"])
    assert _by_name(health_report(table, "p", 0, consumable=True))["gpu0"][:2] == (
        health_pb.UNHEALTHY,
        "every share is being released (cleaned) after its previous claim",
    )


def test_a_part_withheld_only_for_its_parents_counters_is_healthy() -> None:
    """Issue 41: a region the engine withholds because the whole card is in use is sound hardware in use
    elsewhere, not an unhealthy device."""
    table = DeviceTable()
    table.replace([Device("card0-part0"), Device("card0-part1")])
    table.set_withheld(["card0-part0", "card0-part1"], partition_blocked=["card0-part1"])
    devices = _by_name(health_report(table, "p", 0))
    assert devices["card0-part0"][0] == health_pb.UNHEALTHY
    assert devices["card0-part1"][:2] == (health_pb.HEALTHY, "")


def test_a_message_is_cut_to_the_kubelets_1024_bytes() -> None:
    table = DeviceTable()
    table.replace([Device("a", Health.UNHEALTHY, reason="é" * 500)])
    [device] = health_report(table, "p", 0).devices
    assert device.message == "é" * 500  # 1000 bytes: kept
    table.set_health({"a": HealthReport(Health.UNHEALTHY, "\U0001d11e" * 300)})  # 300 characters, 1200 bytes
    [device] = health_report(table, "p", 0).devices
    assert device.message == "\U0001d11e" * 256  # 1024 bytes, no character split


def test_the_stream_sends_at_once_at_each_change_and_every_resend_period() -> None:
    async def scenario() -> None:
        with short_root() as root:
            table = DeviceTable()
            table.replace([Device("a"), Device("b")])
            service = HealthService(table, "node-a", resend=0.3)
            server = grpc.aio.server()
            health_grpc.add_DRAResourceHealthServicer_to_server(service, server)
            server.add_insecure_port(f"unix:{root / 'dra.sock'}")
            await server.start()
            try:
                async with grpc.aio.insecure_channel(f"unix:{root / 'dra.sock'}") as channel:
                    stream = health_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                        health_pb.NodeWatchResourcesRequest()
                    )
                    first = await asyncio.wait_for(stream.read(), 5)
                    assert {n: v[0] for n, v in _by_name(first).items()} == {
                        "a": health_pb.HEALTHY,
                        "b": health_pb.HEALTHY,
                    }
                    assert service.streams == 1
                    table.set_health({"b": HealthReport(Health.UNHEALTHY, "fan stopped")})
                    changed = await asyncio.wait_for(stream.read(), 5)
                    assert _by_name(changed)["b"][:2] == (health_pb.UNHEALTHY, "fan stopped")
                    loop = asyncio.get_running_loop()
                    start = loop.time()
                    resent = await asyncio.wait_for(stream.read(), 5)  # nothing changed: the resend
                    assert loop.time() - start >= 0.2
                    assert {n: v[:3] for n, v in _by_name(resent).items()} == {
                        n: v[:3] for n, v in _by_name(changed).items()
                    }
                    stream.cancel()
            finally:
                await server.stop(None)

    run(scenario, 30)
