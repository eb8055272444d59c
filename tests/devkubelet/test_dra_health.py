"""The dev kubelet's DRA health: NodeWatchResources streams into the health cache and a pod's allocatedResourcesStatus.

Each message is the plugin's complete list; a device left out, or never
reported again, turns Unknown once its timeout (``health_check_timeout_seconds``
or the kubelet's default) passed; a stream's end makes the driver's devices
Unknown and the kubelet opens it again.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from devplug.api.gen.drahealth.v1alpha1 import api_pb2 as health_pb
from devplug.devkubelet import ContainerClaim, ContainerSpec, DevKubelet, PodClaim, PodSpec, ResourceClaimRef
from devplug.devkubelet.dra import HealthStatus, ResourceHealth, ResourceStatus
from devplug.devkubelet.dra.health import truncate_message
from tests.devkubelet.draplugin import (
    DRIVER,
    FAST,
    DRAPlugin,
    claim_pod,
    device,
    dra_kubelet,
    health_report,
    registered,
)

HEALTHY, UNHEALTHY = health_pb.HEALTHY, health_pb.UNHEALTHY


def _health(kubelet: DevKubelet, device: str, pool: str = "pool-0") -> HealthStatus:
    return kubelet.device_health(DRIVER, pool, device).health


async def _streaming(plugin: DRAPlugin, count: int = 1) -> None:
    await plugin.wait_for(lambda p: p.open_health_streams >= count, what=f"{count} open health stream(s)")


def test_each_report_is_the_complete_list_and_a_device_left_out_turns_unknown_after_its_timeout(
    plugin_dir: Path,
) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir, replace(FAST, default_health_timeout=0.4)) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                await _streaming(plugin)
                a = health_pb.DeviceHealth(
                    device=health_pb.DeviceIdentifier(pool_name="pool-0", device_name="a"),
                    health=HEALTHY,
                    health_check_timeout_seconds=60,
                )
                b = health_pb.DeviceHealth(
                    device=health_pb.DeviceIdentifier(pool_name="pool-0", device_name="b"),
                    health=UNHEALTHY,
                    message="ECC errors",
                )  # no timeout: the kubelet's default (0.4 s here, 30 s in a kubelet)
                plugin.send_health(health_pb.NodeWatchResourcesResponse(devices=[a, b]))
                await kubelet.wait_for(lambda k: _health(k, "b") is HealthStatus.UNHEALTHY, what="b unhealthy")
                assert _health(kubelet, "a") is HealthStatus.HEALTHY
                assert kubelet.device_health(DRIVER, "pool-0", "b").message == "ECC errors"
                assert _health(kubelet, "never-reported") is HealthStatus.UNKNOWN

                plugin.send_health(health_pb.NodeWatchResourcesResponse(devices=[a]))  # b left out
                await kubelet.wait_for(lambda k: bool(k.events_of("dra-health")), what="the first report recorded")
                assert _health(kubelet, "b") is HealthStatus.UNHEALTHY  # not before its timeout
                await kubelet.wait_for(lambda k: _health(k, "b") is HealthStatus.UNKNOWN, what="b to time out")
                assert kubelet.device_health(DRIVER, "pool-0", "b").message == ""
                assert _health(kubelet, "a") is HealthStatus.HEALTHY  # its own timeout is 60 s
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_a_device_whose_reports_stop_turns_unknown_after_its_own_timeout(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                await _streaming(plugin)
                plugin.send_health(health_report(("pool-0", "a", HEALTHY), timeout=1))
                await kubelet.wait_for(lambda k: _health(k, "a") is HealthStatus.HEALTHY, what="a healthy")
                start = asyncio.get_running_loop().time()
                await kubelet.wait_for(lambda k: _health(k, "a") is HealthStatus.UNKNOWN, 5.0, what="a to time out")
                assert asyncio.get_running_loop().time() - start >= 0.9  # not before its 1 s
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_a_stream_that_ends_makes_the_drivers_devices_unknown_and_is_opened_again(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                await _streaming(plugin)
                plugin.send_health(health_report(("pool-0", "a", HEALTHY), timeout=60))
                await kubelet.wait_for(lambda k: _health(k, "a") is HealthStatus.HEALTHY, what="a healthy")
                plugin.end_health_streams()
                await kubelet.wait_for(lambda k: _health(k, "a") is HealthStatus.UNKNOWN, what="a cleared")
                assert kubelet.events_of("dra-health-stream-ended", DRIVER)
                await plugin.wait_for(lambda p: p.health_streams == 2, what="the stream opened again")
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_a_plugin_without_the_health_service_is_asked_again_and_again(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent, services=["v1.DRAPlugin"]).start()
            try:
                await registered(kubelet, plugin)
                await kubelet.wait_for(
                    lambda k: len(k.events_of("dra-health-stream-ended", DRIVER)) >= 2, what="two failed streams"
                )
                assert "code = UNIMPLEMENTED" in kubelet.events_of("dra-health-stream-ended", DRIVER)[0].detail
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_without_the_resource_health_status_gate_no_stream_is_opened(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir, replace(FAST, resource_health_status=False)) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                await kubelet.admit_pod(claim_pod("p", "pod-1", ("claim-a", "uid-a")))  # a call went through
                assert plugin.health_streams == 0
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_a_pods_allocated_resources_status_shows_its_devices_health(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                await _streaming(plugin)
                plugin.answers.devices["uid-a"] = [
                    device("pool-0", "gpu-1", "example.com/gpu=gpu-1", requests=["r1"]),
                    device("pool-0", "gpu-2", requests=["r2"]),  # no CDI ID: driver/pool/device
                ]
                ref = ResourceClaimRef("default", "claim-a", "uid-a", (DRIVER,))
                pod = PodSpec(
                    "p",
                    [
                        ContainerSpec("all", claims=["gpu"]),
                        ContainerSpec("only-r2", claims=[ContainerClaim("gpu", "r2")]),
                        ContainerSpec("none"),
                    ],
                    uid="pod-1",
                    resource_claims=[PodClaim("gpu", ref)],
                )
                await kubelet.admit_pod(pod)
                unknown = kubelet.allocated_resources_status("p", "all")
                assert unknown == (
                    ResourceStatus(
                        "claim:gpu",
                        (
                            ResourceHealth("example.com/gpu=gpu-1", HealthStatus.UNKNOWN),
                            ResourceHealth(f"{DRIVER}/pool-0/gpu-2", HealthStatus.UNKNOWN),
                        ),
                    ),
                )
                plugin.send_health(
                    health_pb.NodeWatchResourcesResponse(
                        devices=[
                            health_pb.DeviceHealth(
                                device=health_pb.DeviceIdentifier(pool_name="pool-0", device_name="gpu-1"),
                                health=HEALTHY,
                                health_check_timeout_seconds=60,
                            ),
                            health_pb.DeviceHealth(
                                device=health_pb.DeviceIdentifier(pool_name="pool-0", device_name="gpu-2"),
                                health=UNHEALTHY,
                                health_check_timeout_seconds=60,
                                message="fan stuck",
                            ),
                        ]
                    )
                )
                await kubelet.wait_for(lambda k: _health(k, "gpu-2") is HealthStatus.UNHEALTHY, what="gpu-2 unhealthy")
                assert kubelet.allocated_resources_status("p", "only-r2") == (
                    ResourceStatus(
                        "claim:gpu/r2", (ResourceHealth(f"{DRIVER}/pool-0/gpu-2", HealthStatus.UNHEALTHY, "fan stuck"),)
                    ),
                )
                assert kubelet.allocated_resources_status("p", "all")[0].resources[0] == ResourceHealth(
                    "example.com/gpu=gpu-1", HealthStatus.HEALTHY
                )
                assert kubelet.allocated_resources_status("p", "none") == ()
                assert kubelet.container_cdi_devices("p", "only-r2") == []
                assert kubelet.container_cdi_devices("p", "all") == ["example.com/gpu=gpu-1"]
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_without_the_message_gate_the_status_has_no_message(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir, replace(FAST, health_messages=False)) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                await _streaming(plugin)
                plugin.answers.devices["uid-a"] = [device("pool-0", "gpu-1")]
                await kubelet.admit_pod(claim_pod("p", "pod-1", ("claim-a", "uid-a")))
                plugin.send_health(health_report(("pool-0", "gpu-1", UNHEALTHY), timeout=60, message="hot"))
                await kubelet.wait_for(lambda k: _health(k, "gpu-1") is HealthStatus.UNHEALTHY, what="unhealthy")
                assert kubelet.device_health(DRIVER, "pool-0", "gpu-1").message == "hot"  # kept in the cache
                [status] = kubelet.allocated_resources_status("p", "app")
                assert status.resources == (ResourceHealth(f"{DRIVER}/pool-0/gpu-1", HealthStatus.UNHEALTHY),)
            finally:
                await plugin.stop()

    asyncio.run(body())


def test_a_long_message_is_cut_to_1024_bytes() -> None:
    assert truncate_message("x" * 1024) == "x" * 1024
    cut = truncate_message("y" * 2000)
    assert cut == "y" * 1021 + "..."
    assert len(cut.encode()) == 1024
    # cut on bytes, as Go slices a string: a character cut in two becomes U+FFFD
    assert truncate_message("é" * 600).endswith("\ufffd...")


def test_device_health_survives_a_kubelet_restart_until_its_timeout(plugin_dir: Path) -> None:
    async def body() -> None:
        async with dra_kubelet(plugin_dir) as kubelet:
            plugin = await DRAPlugin(plugin_dir.parent).start()
            try:
                await registered(kubelet, plugin)
                await _streaming(plugin)
                plugin.send_health(health_report(("pool-0", "a", UNHEALTHY), timeout=60, message="bad"))
                await kubelet.wait_for(lambda k: _health(k, "a") is HealthStatus.UNHEALTHY, what="a unhealthy")
                await kubelet.stop()
                assert (plugin_dir.parent / "dra_health_state").is_file()
                await kubelet.start()  # the cache is read back from dra_health_state
                assert kubelet.device_health(DRIVER, "pool-0", "a").health is HealthStatus.UNHEALTHY
                assert kubelet.device_health(DRIVER, "pool-0", "a").message == "bad"
            finally:
                await plugin.stop()

    asyncio.run(body())
