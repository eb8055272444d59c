"""End to end: the daemon (a child process) serving devplug-vfio to the dev kubelet.

The daemon's driver uses the host's sysfs through real file I/O, which the
in-process kernel model cannot stand behind, so this scenario runs against
the real kernel only (in the VM); its ``[model]`` case says so and skips.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

import pytest

from devplug import DeviceSpec
from devplug.devkubelet import DevKubeletThread
from devplug.devkubelet.model import ContainerSpec, PodSpec

WAIT = 30.0  # seconds: a generous bound on "eventually", never a timing assertion


def _eventually(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.05)


def test_a_pod_gets_the_nic_through_the_kubelet_and_gives_it_back(
    backend: Any, kit: ModuleType, request: pytest.FixtureRequest
) -> None:
    if backend.name == "model":
        pytest.skip("the daemon is a child process; the in-process kernel model cannot serve its sysfs writes")
    kubelet: DevKubeletThread = request.getfixturevalue("dev_kubelet")
    start_daemon = request.getfixturevalue("devplug_daemon")
    sysfs = backend.sysfs
    start_daemon({"example.com/nic": {"driver": "vfio", "options": {"devices": ["8086:10d3"], "rescan_interval": 0.2}}})
    group = kit.group_of(sysfs, kit.NIC)

    pod = kubelet.admit_pod(PodSpec("vm", [ContainerSpec("guest", {"example.com/nic": 1})]))

    container = pod.container("guest")
    assert container.devices["example.com/nic"] == (kit.NIC,)
    allocation = container.allocations["example.com/nic"]
    assert allocation.envs["PCI_RESOURCE_EXAMPLE_COM_NIC"] == kit.NIC
    assert set(allocation.devices) == {
        DeviceSpec("/dev/vfio/vfio", "/dev/vfio/vfio", "rw"),
        DeviceSpec(f"/dev/vfio/{group}", f"/dev/vfio/{group}", "rw"),
    }
    assert kit.driver_of(sysfs, kit.NIC) == "vfio-pci"

    kubelet.remove_pod("vm")

    _eventually(lambda: kit.driver_of(sysfs, kit.NIC) == "e1000e", "the NIC is back on e1000e")
    assert kit.override_of(sysfs, kit.NIC) == "(null)"
