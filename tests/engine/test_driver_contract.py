"""The driver contract's conveniences (issue 10): per-device allocation data instead of an allocate hook,
check_health returning every device, and the capabilities the kubelet options derive from."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from devplug import ContainerAllocation, Device, DeviceSpec, DriverContext, Health, Mount, hookimpl
from devplug.cli.statusview import format_status
from devplug.daemon.status import read_status
from devplug.devkubelet import ContainerSpec, DevKubeletThread, PodSpec
from devplug.drivers import HOOK_NAMES, DriverHooks
from devplug.hookspecs import ChecksResources, DriverClass
from devplug.testing.daemon import DaemonThread
from devplug.testing.devnodes import make_char_device

from .conftest import Wait, in_process_config, view_of

SIMPLE = "example.com/simple"


def _device(name: str) -> Device:
    return Device(
        name,
        allocation=ContainerAllocation(
            envs={f"SIMPLE_{name.upper()}": "1"},
            devices=(DeviceSpec(f"/dev/{name}", f"/dev/{name}", "rw"),),
            mounts=(Mount(f"/run/{name}", f"/var/run/{name}", read_only=True),),
        ),
    )


class Simple:
    """A driver with no allocate hook: its devices say what a container gets."""

    @hookimpl
    def list_devices(self) -> Sequence[Device]:
        return [_device("s0"), _device("s1")]


class Flaky:
    """A driver whose check_health returns every device, healthy or not."""

    sick: set[str] = set()  # noqa: RUF012  (the test flips it)

    @hookimpl
    def list_devices(self) -> Sequence[Device]:
        return [Device("f0"), Device("f1")]

    @hookimpl
    def check_health(self, devices: Sequence[Device]) -> Mapping[str, Health]:
        return {d.id: Health.UNHEALTHY if d.id in self.sick else Health.HEALTHY for d in devices}


def test_a_driver_without_allocate_hands_out_what_its_devices_declare(
    dev_kubelet: DevKubeletThread, devplug_root: Path
) -> None:
    node_dev = devplug_root / "dev"  # the node's /dev, where the runtime looks for /dev/s0 and /dev/s1
    node_dev.mkdir()
    for name in ("s0", "s1"):
        make_char_device(node_dev / name)
    dev_kubelet.dev_root = node_dev
    with DaemonThread(in_process_config(devplug_root, {SIMPLE: Simple})):
        dev_kubelet.wait_registered(SIMPLE, timeout=10)
        dev_kubelet.wait_for(lambda k: len(view_of(k, SIMPLE).healthy_ids) == 2, timeout=10)
        pod = dev_kubelet.admit_pod(PodSpec("p", [ContainerSpec("c", {SIMPLE: 2})]))
        allocation = pod.container("c").allocations[SIMPLE]
    assert dict(allocation.envs) == {"SIMPLE_S0": "1", "SIMPLE_S1": "1"}
    assert {d.container_path for d in allocation.devices} == {"/dev/s0", "/dev/s1"}
    assert {m.container_path for m in allocation.mounts} == {"/run/s0", "/run/s1"}


def test_check_health_may_return_every_device_and_only_changes_are_applied(
    dev_kubelet: DevKubeletThread, devplug_root: Path, wait_until: Wait, caplog: pytest.LogCaptureFixture
) -> None:
    Flaky.sick = set()
    config = in_process_config(devplug_root, {"example.com/flaky": Flaky}, health_interval=0.05)
    with caplog.at_level(logging.INFO, logger="devplug.engine"), DaemonThread(config):
        dev_kubelet.wait_registered("example.com/flaky", timeout=10)
        Flaky.sick = {"f1"}
        wait_until(lambda: view_of(dev_kubelet, "example.com/flaky").healthy_ids == ("f0",), "f1 to turn unhealthy")
        Flaky.sick = set()
        wait_until(lambda: len(view_of(dev_kubelet, "example.com/flaky").healthy_ids) == 2, "f1 to recover")
    changes = [r.getMessage() for r in caplog.records if "health is now" in r.getMessage()]
    assert changes == ["[example.com/flaky f1] health is now Unhealthy", "[example.com/flaky f1] health is now Healthy"]


def test_capabilities_are_computed_once_and_name_the_hooks_in_contract_order() -> None:
    hooks = DriverHooks(SIMPLE, Flaky())
    capabilities = hooks.capabilities()
    assert capabilities.implemented == ("list_devices", "check_health")
    assert capabilities.check_health and not capabilities.allocate and not capabilities.post_stop
    assert HOOK_NAMES[0] == "start" and HOOK_NAMES[-1] == "deallocate" and len(HOOK_NAMES) == 9


def test_the_driver_class_protocols() -> None:
    class WithOptions:
        Options = dict

        def __init__(self, options: object) -> None:
            self.options = options

        @classmethod
        def check_resources(cls, options: Mapping[str, object]) -> None:
            return None

    assert isinstance(WithOptions({}), DriverClass)
    assert issubclass(WithOptions, ChecksResources)
    assert not issubclass(Simple, ChecksResources)


class Publishing:
    """A driver that publishes its own status when it starts."""

    @hookimpl
    def start(self, ctx: DriverContext) -> None:
        ctx.publish_status({"slots": {"cam-0": {"holder": "node-b", "age_s": 3}}, "mode": "shared"})
        with pytest.raises(ValueError, match="JSON"):
            ctx.publish_status({"bad": object()})

    @hookimpl
    def list_devices(self) -> Sequence[Device]:
        return [Device("p0")]


def test_a_driver_publishes_its_own_status_for_devplug_status(
    dev_kubelet: DevKubeletThread, devplug_root: Path, wait_until: Wait
) -> None:
    config = in_process_config(devplug_root, {"example.com/pub": Publishing})
    with DaemonThread(config):
        dev_kubelet.wait_registered("example.com/pub", timeout=10)
        wait_until(
            lambda: (read_status(config.state.dir)["resources"][0].get("driver_status") or {}).get("mode") == "shared",
            "the published status in status.json",
        )
        data = read_status(config.state.dir)
    (res,) = data["resources"]
    assert res["driver_status"] == {"slots": {"cam-0": {"holder": "node-b", "age_s": 3}}, "mode": "shared"}
    shown = format_status(data)
    assert "driver status:" in shown and "mode: shared" in shown and '"holder": "node-b"' in shown
