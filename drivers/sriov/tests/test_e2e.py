"""End to end: the daemon serving devplug-sriov to the dev kubelet, pod after pod.

Against the real kernel (in the VM) the daemon is a child process (``devplug
run``) on the guest's sysfs. Against the models, whose effects happen only
behind their own access layers, the daemon runs in this process with the
driver built on them; everything else (gRPC, the dev kubelet, the ledger,
release detection) is the same.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from devplug.config import parse_config
from devplug.devkubelet import DevKubeletThread
from devplug.devkubelet.model import ContainerSpec, PodSpec
from devplug.host.sysfs import SysfsAccess
from devplug.testing.configs import dev_config
from devplug.testing.daemon import DaemonThread
from devplug.testing.pcisysfs import PciSysfsModel
from devplug_sriov import SriovDriver, SriovOptions
from devplug_sriov.netlink import VfLinks, VfSettings
from devplug_sriov.vfmodel import VfLinkModel

RESOURCE = "example.com/vf"
ENV = "PCIDEVICE_EXAMPLE_COM_VF"


def _in_process_daemon(
    root: Path, resources: dict[str, Any], sysfs: SysfsAccess, links: VfLinks, **knobs: Any
) -> DaemonThread:
    """The daemon in this process, its sriov driver built on the models (``knobs``: more of ``dev_config``)."""

    class SriovOnModel(SriovDriver):
        def __init__(self, options: SriovOptions) -> None:
            super().__init__(options, access=sysfs, links=links)

    config = parse_config(dev_config(root, resources, **knobs))
    config = replace(config, resources=tuple(replace(rc, driver_class=SriovOnModel) for rc in config.resources))
    return DaemonThread(config)


def _wait_free(kubelet: DevKubeletThread, devices: tuple[str, ...], resource: str = RESOURCE) -> None:
    """Wait until the kubelet sees ``devices`` healthy again (the daemon withholds them while releasing)."""

    def healthy(k: Any) -> bool:
        view = k.resource(resource)
        return view is not None and all(
            (dev := view.device(d)) is not None and dev.health == "Healthy" for d in devices
        )

    kubelet.wait_for(healthy, timeout=20, what=f"{', '.join(devices)} advertised healthy ({resource})")


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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The daemon's /metrics, parsed with prometheus_client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        body = conn.getresponse().read().decode()
    finally:
        conn.close()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def _status(state_dir: Path) -> dict[str, Any]:
    """The daemon's status file (``<state dir>/status.json``, what ``devplug status --json`` prints), by resource.

    Read directly: the CLI would cost some 20 s of Python start-up per call under TCG.
    """
    path = state_dir / "status.json"
    data = json.loads(path.read_text()) if path.exists() else {"resources": []}
    return {res["name"]: res for res in data["resources"]}


#: ``devplug status``'s exit code while a registered resource has devices and none healthy (docs/operator/install.md).
STATUS_NOTHING_SERVED = 7


def _status_text(state_dir: Path, code: int) -> str:
    """``devplug status``, as an operator reads it; it must exit ``code``."""
    result = subprocess.run(
        [sys.executable, "-m", "devplug", "status", "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == code, result.stderr
    return result.stdout


def test_network_vfs_on_igb_are_reset_between_pods_and_a_refused_reset_shows_in_status_and_metrics(
    nic: Any, kit: ModuleType, request: pytest.FixtureRequest
) -> None:
    """Two resources on the igb PF: ``net`` (VFs 0-1, reset to link state auto: igb accepts the reset) and ``down``
    (VF 2, reset to link state disable, which igb refuses: the VF stays out of service, trust cleared)."""
    kubelet: DevKubeletThread = request.getfixturevalue("dev_kubelet")
    net, down = "example.com/net", "example.com/down"
    port = _free_port()
    common: dict[str, Any] = {"rescan_interval": 0.2}
    if nic.name == "model":
        common |= {"sysfs_root": str(nic.sysfs.sysfs_root), "dev_root": str(nic.sysfs.dev_root)}
    resources = {
        net: {
            "driver": "sriov",
            "options": {**common, "pfs": [kit.NIC_PF], "num_vfs": 3, "vfs": [f"{kit.NIC_PF}#0-1"]},
        },
        down: {"driver": "sriov", "options": {**common, "vfs": [f"{kit.NIC_PF}#2"], "link_state": "disable"}},
    }
    metrics = {"enabled": True, "port": port}
    vfs = [kit.nic_vf(i) for i in range(3)]
    with contextlib.ExitStack() as stack:
        if nic.name == "model":
            root = request.getfixturevalue("devplug_root")
            stack.enter_context(_in_process_daemon(root, resources, nic.sysfs, nic.links, metrics=metrics))
            state_dir = root / "state"
            for name in (net, down):
                kubelet.wait_registered(name, timeout=kit.WAIT)
        else:
            daemon = request.getfixturevalue("devplug_daemon")(resources, metrics=metrics, timeout=kit.VM_WAIT)
            state_dir = daemon.state_dir
        for name, devices in ((net, vfs[:2]), (down, vfs[2:])):
            _wait_free(kubelet, tuple(devices), name)
        pf = nic.pf_netdev

        first = kubelet.admit_pod(PodSpec("first", [ContainerSpec("app", {net: 2})]))
        kubelet.admit_pod(PodSpec("second", [ContainerSpec("app", {down: 1})]))
        assert sorted(first.container("app").devices[net]) == vfs[:2]
        for index in range(3):  # each tenant's settings, made through the PF
            nic.links.set_vf(pf, index, mac=f"02:00:00:00:00:0{index + 1}", vlan=10 + index, trust=True)

        kubelet.remove_pod("first")
        kubelet.remove_pod("second")
        bound = kit.WAIT if nic.name == "model" else kit.VM_WAIT
        kit.eventually(
            lambda: [nic.links.vf_state(pf, i) for i in range(2)] == [kit.NEW_VF, kit.NEW_VF],
            f"{net}: both VFs reset to igb's defaults",
            bound,
        )
        _wait_free(kubelet, tuple(vfs[:2]), net)

        def refused() -> bool:
            res = _status(state_dir).get(down, {})
            return bool(res.get("release_failures")) and bool((res.get("driver_status") or {}).get("reset_failures"))

        kit.eventually(refused, f"{down}: the refused reset in the daemon's status", bound)
        status = _status(state_dir)
        res = status[down]
        (entry,) = res["devices"]
        assert (entry["id"], entry["health"], entry["driver_health"]) == (vfs[2], "Unhealthy", "Unhealthy")
        assert entry["reason"].startswith(f"{pf} VF 2: the kernel refused to reset its settings: link state: auto, ")
        assert res["driver_status"]["reset_failures"] == {vfs[2]: entry["reason"]}
        (failure,) = res["release_failures"].values()
        assert failure.startswith("deallocate: ") and "link state: auto, wanted disable" in failure
        assert nic.links.vf_state(pf, 2) == kit.NEW_VF  # all but the link state reset: trust cleared
        if nic.name == "model":  # the same through the CLI, where Python starts in milliseconds
            text = _status_text(state_dir, STATUS_NOTHING_SERVED)  # the down resource's only VF is out of service
            assert f"{vfs[2]} " in text and f"({entry['reason']})" in text, text

        samples = _scrape(port)
        assert samples[("devplug_devices", (("health", "unhealthy"), ("resource", down)))] == 1
        assert samples[("devplug_devices", (("health", "healthy"), ("resource", net)))] == 2
        errors = ("devplug_hook_errors_total", (("driver", "sriov"), ("hook", "deallocate"), ("resource", down)))
        assert samples[errors] >= 1
        assert status[net]["release_failures"] == {}

        again = kubelet.admit_pod(PodSpec("third", [ContainerSpec("app", {net: 2})]))
        assert sorted(again.container("app").devices[net]) == vfs[:2]
