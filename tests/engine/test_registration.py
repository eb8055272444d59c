"""Registration, advertised options, and re-registration after kubelet restarts."""

from __future__ import annotations

import stat
from collections.abc import Sequence
from pathlib import Path

from devplug import Device, hookimpl
from devplug.devkubelet import ContainerSpec, DevKubeletThread, PodSpec
from devplug.testing.daemon import DaemonThread
from devplug.testing.plugin import DaemonFactory
from devplug.testing.waiting import poll_until
from devplug_mock import read_calls

from .conftest import Wait, in_process_config, view_of

MOCK = "example.com/mock"


def test_registers_with_every_option_the_mock_implements(
    dev_kubelet: DevKubeletThread, devplug_daemon: DaemonFactory, mock_dir: Path
) -> None:
    devplug_daemon({MOCK: {"driver": "mock", "options": {"directory": str(mock_dir), "count": 3}}})
    view = view_of(dev_kubelet, MOCK)
    assert view.registered
    assert view.options.pre_start_required and view.options.get_preferred_allocation_available
    assert view.options.post_stop_required and view.options.deallocate_available
    assert view.endpoint == "devplug-example.com_mock.sock"
    socket = dev_kubelet.device_plugin_dir / view.endpoint
    assert stat.S_ISSOCK(socket.stat().st_mode)
    assert stat.S_IMODE(socket.stat().st_mode) == 0o600
    dev_kubelet.wait_for(lambda k: view_of(k, MOCK).capacity == 3, timeout=5)


class OnlyDevices:
    """A driver with the one required hook."""

    @hookimpl
    def list_devices(self) -> Sequence[Device]:
        return [Device("only-0"), Device("only-1")]


def test_options_follow_the_hooks_a_driver_implements(dev_kubelet: DevKubeletThread, devplug_root: Path) -> None:
    with DaemonThread(in_process_config(devplug_root, {"example.com/only": OnlyDevices})):
        dev_kubelet.wait_registered("example.com/only", timeout=10)
        flags = view_of(dev_kubelet, "example.com/only").options
        assert not flags.pre_start_required
        assert not flags.get_preferred_allocation_available
        assert not flags.post_stop_required
        assert not flags.deallocate_available
        dev_kubelet.wait_for(lambda k: view_of(k, "example.com/only").allocatable == 2, timeout=5)


def test_waits_for_a_kubelet_that_is_not_there_yet(devplug_root: Path) -> None:
    with DaemonThread(in_process_config(devplug_root, {"example.com/only": OnlyDevices})) as daemon:
        resource = daemon.daemon.resources[0]
        poll_until(lambda: resource.last_error is not None, "a registration error", 10)
        assert resource.last_error is not None
        assert "registration failed" in resource.last_error
        with DevKubeletThread(
            devplug_root / "device-plugins", pod_resources_socket=devplug_root / "pod-resources" / "kubelet.sock"
        ) as kubelet:
            kubelet.wait_registered("example.com/only", timeout=10)
            assert kubelet.registrations("example.com/only") == 1


def test_reregisters_after_kubelet_restarts_keeping_allocations(
    dev_kubelet: DevKubeletThread, devplug_daemon: DaemonFactory, mock_dir: Path, wait_until: Wait
) -> None:
    devplug_daemon({MOCK: {"driver": "mock", "options": {"directory": str(mock_dir), "count": 2}}})
    pod = dev_kubelet.admit_pod(PodSpec("holder", [ContainerSpec("c", {MOCK: 1})]))
    held = list(pod.containers[0].devices[MOCK])
    for restart in range(3):
        before = dev_kubelet.registrations(MOCK)
        dev_kubelet.restart()
        dev_kubelet.wait_registered(MOCK, timeout=10, after=before)
        wait_until(lambda: view_of(dev_kubelet, MOCK).allocatable == 2, f"healthy devices after restart {restart}")
    assert not [c for c in read_calls(mock_dir) if c["hook"] in ("post_stop", "deallocate")]
    dev_kubelet.remove_pod("holder")
    wait_until(
        lambda: [c["device_ids"] for c in read_calls(mock_dir) if c["hook"] == "deallocate"] == [held],
        "the held device's release after the pod was removed",
    )
