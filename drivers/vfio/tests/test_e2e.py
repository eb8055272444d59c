"""End to end: the daemon (a child process) serving devplug-vfio to the dev kubelet.

Against the real kernel (in the VM) the daemon is a child process on the
host's sysfs. Against the kernel model, whose effects happen only behind its
own file-access layer, the daemon runs in this process with the driver built
on the model; everything else (gRPC, the dev kubelet, the ledger) is the same.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from devplug import DeviceSpec
from devplug.config import parse_config
from devplug.devkubelet import DevKubeletThread
from devplug.devkubelet.model import ContainerSpec, PodSpec
from devplug.testing.configs import dev_config
from devplug.testing.daemon import DaemonThread
from devplug.testing.waiting import WAIT, poll_until
from devplug_vfio import VfioDriver, VfioOptions


def test_a_pod_gets_the_nic_through_the_kubelet_and_gives_it_back(
    backend: Any, kit: ModuleType, request: pytest.FixtureRequest
) -> None:
    kubelet: DevKubeletThread = request.getfixturevalue("dev_kubelet")
    sysfs = backend.sysfs
    resources = {"example.com/nic": {"driver": "vfio", "options": {"devices": ["8086:10d3"], "rescan_interval": 0.2}}}
    with contextlib.ExitStack() as stack:
        if backend.name == "model":
            kubelet.dev_root = sysfs.dev_root  # the model is the node: the runtime finds /dev/vfio there
            stack.enter_context(_in_process_daemon(request.getfixturevalue("devplug_root"), resources, sysfs))
            kubelet.wait_registered("example.com/nic", timeout=WAIT)
            kubelet.wait_for(lambda k: bool(k.events_of("list-and-watch", "example.com/nic")), timeout=WAIT)
        else:
            request.getfixturevalue("devplug_daemon")(resources)
        _pod_gets_the_nic_and_gives_it_back(kubelet, sysfs, kit)


def _in_process_daemon(root: Path, resources: dict[str, Any], sysfs: Any) -> DaemonThread:
    """The daemon in this process, its vfio driver built on the kernel model."""

    class VfioOnModel(VfioDriver):
        def __init__(self, options: VfioOptions) -> None:
            super().__init__(options, access=sysfs)

    config = parse_config(dev_config(root, resources))
    config = replace(config, resources=tuple(replace(rc, driver_class=VfioOnModel) for rc in config.resources))
    return DaemonThread(config)


def _pod_gets_the_nic_and_gives_it_back(kubelet: DevKubeletThread, sysfs: Any, kit: ModuleType) -> None:
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

    poll_until(lambda: kit.driver_of(sysfs, kit.NIC) == "e1000e", "the NIC back on e1000e")
    assert kit.override_of(sysfs, kit.NIC) == "(null)"
