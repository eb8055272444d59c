"""End to end: the daemon serving devplug-sriov to the dev kubelet, pod after pod.

Against the real kernel (in the VM) the daemon is a child process (``devplug
run``) on the guest's sysfs. Against the models, whose effects happen only
behind their own access layers, the daemon runs in this process with the
driver built on them; everything else (gRPC, the dev kubelet, the ledger,
release detection) is the same.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from devplug.config import parse_config
from devplug.devkubelet import DevKubeletThread
from devplug.devkubelet.model import ContainerSpec, PodSpec
from devplug.sysfs import SysfsAccess
from devplug.testing.configs import dev_config
from devplug.testing.daemon import DaemonThread
from devplug.testing.pcisysfs import PciSysfsModel
from devplug_sriov import SriovDriver, SriovOptions
from devplug_sriov.netlink import VfLinks, VfSettings
from devplug_sriov.vfmodel import VfLinkModel

RESOURCE = "example.com/vf"
ENV = "PCIDEVICE_EXAMPLE_COM_VF"


def _in_process_daemon(root: Path, resources: dict[str, Any], sysfs: SysfsAccess, links: VfLinks) -> DaemonThread:
    """The daemon in this process, its sriov driver built on the models."""

    class SriovOnModel(SriovDriver):
        def __init__(self, options: SriovOptions) -> None:
            super().__init__(options, access=sysfs, links=links)

    config = parse_config(dev_config(root, resources))
    config = replace(config, resources=tuple(replace(rc, driver_class=SriovOnModel) for rc in config.resources))
    return DaemonThread(config)


def _wait_free(kubelet: DevKubeletThread, devices: tuple[str, ...]) -> None:
    """Wait until the kubelet sees ``devices`` healthy again (the daemon withholds them while releasing)."""

    def healthy(k: Any) -> bool:
        view = k.resource(RESOURCE)
        return view is not None and all(
            (dev := view.device(d)) is not None and dev.health == "Healthy" for d in devices
        )

    kubelet.wait_for(healthy, timeout=20, what=f"{', '.join(devices)} advertised healthy again")


def _pod(kubelet: DevKubeletThread, name: str) -> tuple[str, ...]:
    pod = kubelet.admit_pod(PodSpec(name, [ContainerSpec("app", {RESOURCE: 2})]))
    container = pod.container("app")
    devices = container.devices[RESOURCE]
    assert container.allocations[RESOURCE].envs[ENV] == ",".join(devices)
    return tuple(sorted(devices))


def test_two_vfs_bound_for_a_pod_and_restored_once_before_the_next(
    backend: Any, kit: ModuleType, request: pytest.FixtureRequest
) -> None:
    kubelet: DevKubeletThread = request.getfixturevalue("dev_kubelet")
    sysfs = backend.sysfs
    options: dict[str, Any] = {"pfs": [kit.PF], "num_vfs": 2, "vf_driver": "vfio-pci", "rescan_interval": 0.2}
    vfs = (kit.vf(0), kit.vf(1))
    daemon: Any = None
    with contextlib.ExitStack() as stack:
        if backend.name == "model":
            kubelet.dev_root = sysfs.dev_root  # the model is the node: the runtime finds /dev/vfio there
            options |= {"sysfs_root": str(sysfs.sysfs_root), "dev_root": str(sysfs.dev_root)}
            resources = {RESOURCE: {"driver": "sriov", "options": options}}
            stack.enter_context(
                _in_process_daemon(request.getfixturevalue("devplug_root"), resources, sysfs, VfLinkModel())
            )
            kubelet.wait_registered(RESOURCE, timeout=kit.WAIT)
            kubelet.wait_for(lambda k: bool(k.events_of("list-and-watch", RESOURCE)), timeout=kit.WAIT)
        else:
            daemon = request.getfixturevalue("devplug_daemon")({RESOURCE: {"driver": "sriov", "options": options}})

        assert _pod(kubelet, "first") == vfs
        assert [kit.driver_of(sysfs, a) for a in vfs] == ["vfio-pci", "vfio-pci"]

        if daemon is not None:  # kill -9 while the pod holds the VFs: the restart re-creates nothing
            registrations = kubelet.registrations(RESOURCE)
            daemon.process.kill()
            daemon.process.start()
            kubelet.wait_registered(RESOURCE, timeout=kit.WAIT, after=registrations)
            assert kit.attr(sysfs, kit.PF, "sriov_numvfs") == "2"
            assert [kit.driver_of(sysfs, a) for a in vfs] == ["vfio-pci", "vfio-pci"]

        kubelet.remove_pod("first")

        def restored() -> bool:
            return all(
                kit.driver_of(sysfs, a) is None and kit.attr(sysfs, a, "driver_override") == "(null)" for a in vfs
            )

        kit.eventually(restored, "both VFs back without a driver and without driver_override")
        _wait_free(kubelet, vfs)

        assert _pod(kubelet, "second") == vfs
        assert [kit.driver_of(sysfs, a) for a in vfs] == ["vfio-pci", "vfio-pci"]
        if daemon is not None:
            log = daemon.process.log_text()
            assert log.count(f"[{RESOURCE}] released ") == 1, log  # one release between the pods


def test_a_pod_gets_two_network_vfs_and_the_next_pod_gets_them_reset_once(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    kubelet: DevKubeletThread = request.getfixturevalue("dev_kubelet")
    model = PciSysfsModel(tmp_path / "machine")
    kubelet.dev_root = model.dev_root  # the model is the node: the runtime finds /dev/vfio there
    model.add_device("0000:3b:00.0", 0x8086, 0x1572, 0x020000, numa_node=0, iommu_group=20, driver="i40e")
    model.enable_sriov("0000:3b:00.0", 8, 0x154C, offset=16, vf_driver="iavf", netdev="ens1f0")
    links = VfLinkModel()
    links.add_pf("ens1f0", 8)
    options = {
        "pfs": ["ens1f0"],
        "num_vfs": 2,
        "rescan_interval": 0.2,
        "sysfs_root": str(model.sysfs_root),
        "dev_root": str(model.dev_root),
    }
    resources = {RESOURCE: {"driver": "sriov", "options": options}}
    vfs = ("0000:3b:02.0", "0000:3b:02.1")
    with _in_process_daemon(request.getfixturevalue("devplug_root"), resources, model, links):
        kubelet.wait_registered(RESOURCE, timeout=20)
        kubelet.wait_for(lambda k: bool(k.events_of("list-and-watch", RESOURCE)), timeout=20)

        assert _pod(kubelet, "first") == vfs
        for index in range(2):  # the tenant configures its VFs
            links.set_vf("ens1f0", index, mac=f"02:00:00:00:00:0{index}", vlan=42, trust=True)

        kubelet.remove_pod("first")
        kubelet.wait_for(lambda k: len(links.resets) == 2, timeout=20, what="both VFs reset through netlink")
        _wait_free(kubelet, vfs)

        assert _pod(kubelet, "second") == vfs
        assert sorted(links.resets) == [("ens1f0", 0), ("ens1f0", 1)]  # once each, before the second pod
        assert [links.vf("ens1f0", i) for i in range(2)] == [VfSettings(), VfSettings()]
