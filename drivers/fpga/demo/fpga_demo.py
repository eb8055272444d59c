"""``python drivers/fpga/demo/fpga_demo.py``: a region deprogrammed after its pod ends, on a machine without an FPGA.

In a temporary folder: the DFL model (:mod:`devplug.testing.dflsysfs`) with one
card of two regions, a blank image, a dev kubelet and the real daemon as a
child process on a generated config. A pod gets a region; its tenant loads a
bitstream of its own; the pod is deleted; the daemon loads the blank image
into the region, resets the port, verifies the region's ``afu_id`` and puts the
free card in power save. The demo prints each step, ``devplug status``, then
the checks it made, and exits 0 when all held (``--keep`` leaves the folder).

It runs on devplug's test kit (the devplug-testing distribution), so it lives beside the driver's package, not in
it: the driver's wheel and the image carry no demo (issue 39).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from devplug.kit import run_command
from devplug.testing.configs import dev_config, write_toml
from devplug.testing.daemon import DaemonProcess
from devplug.testing.demos import run_in_folder
from devplug.testing.dflsysfs import DflModel, model_image
from devplug.testing.kubelet import ContainerSpec, DevKubeletThread, PodSpec
from devplug.testing.waiting import poll_until

__all__ = ["main", "run_demo"]

RESOURCE = "example.com/fpga-region"
CARD = "0000:3b:00.0"
BLANK_AFU = "0b1a4c0000000000000000000000b1a4"
TENANT_AFU = "7e4a47000000000000000000000007e4"
Echo = Callable[[str], None]


def _health(kubelet: DevKubeletThread, device: str) -> str | None:
    view = kubelet.resource(RESOURCE)
    found = None if view is None else view.device(device)
    return None if found is None else found.health


def run_demo(root: Path, echo: Echo) -> bool:
    """Run the demo in ``root``; True when every check held."""
    model = DflModel(root / "machine")
    card = model.add_card(CARD, ports=2, afu_id=BLANK_AFU)
    blank = model_image(root / "blank.gbs", BLANK_AFU)
    echo(f"machine: card {CARD} ({card.fme}, regions {', '.join(card.ports)}) in the DFL model at {model.root}")
    options = {
        "backend": "dfl",
        "mode": "regions",
        "model_root": str(model.root),
        "blank_image": str(blank),
        "blank_afu_id": BLANK_AFU,
        "power_save_watts": 20,
    }
    config = dev_config(root, {RESOURCE: {"driver": "fpga", "options": options}}, release_interval=0.2)
    config_path = write_toml(root / "devplug.toml", config)
    echo(f"config: {config_path}\n")
    checks: list[tuple[str, bool]] = []
    # the model is the machine: its dev folder is the node's /dev, where the runtime looks for the devices
    kubelet = DevKubeletThread(
        root / "device-plugins", pod_resources_socket=root / "pod-resources" / "kubelet.sock", dev_root=model.dev_root
    )
    kubelet.start()
    daemon = DaemonProcess(config_path, root / "daemon.log", log_level="info")
    try:
        daemon.start()
        kubelet.wait_registered(RESOURCE, timeout=30)
        poll_until(lambda: _health(kubelet, f"{CARD}-region0"), "the device list")
        view = kubelet.resource(RESOURCE)
        assert view is not None
        echo("advertised: " + ", ".join(f"{d.id} ({d.health})" for d in view.devices))

        pod = kubelet.admit_pod(PodSpec("tenant", [ContainerSpec("app", {RESOURCE: 1})]))
        container = pod.container("app")
        (device,) = container.devices[RESOURCE]
        port = card.ports[int(device.rsplit("region", 1)[1])]
        allocation = container.allocations[RESOURCE]
        echo(f"pod tenant got {device}: devices {[d.host_path for d in allocation.devices]}")
        echo(f"  env {dict(sorted(allocation.envs.items()))}")
        model.set_afu_id(port, TENANT_AFU)
        echo(f"the tenant loads its own bitstream: {port} afu_id = {model.afu_id(port)}")

        kubelet.remove_pod("tenant")
        echo("pod tenant deleted; the daemon finds out through PodResources and the kubelet's checkpoint")
        poll_until(lambda: model.afu_id(port) == BLANK_AFU and model.power_max(card.fme) == 20_000_000, "the release")
        for entry in model.ioctl_log():
            loaded = f" -> afu_id {entry['afu_id']}" if "afu_id" in entry else ""
            echo(f"  ioctl {entry['ioctl']} on /dev/{entry['node']}{loaded}")
        echo(
            f"{port} afu_id = {model.afu_id(port)} (the blank image); card power1_max = {model.power_max(card.fme)} uW"
        )
        status = run_command(
            [sys.executable, "-m", "devplug", "status", "--config", str(config_path)], timeout=30, check=False
        )
        echo("\n$ devplug status\n" + status.stdout.rstrip())

        blank_loads = [e for e in model.programs(fme=card.fme) if e.get("afu_id") == BLANK_AFU]
        checks.append((f"{device} holds the blank image after its pod ended", model.afu_id(port) == BLANK_AFU))
        checks.append(("the blank image was loaded exactly once", len(blank_loads) == 1))
        checks.append(("the free card was put in power save (20 W)", model.power_max(card.fme) == 20_000_000))
        poll_until(lambda: _health(kubelet, device) == "Healthy", "the region back in service")
        checks.append((f"{device} is back in service", True))
    finally:
        code = daemon.stop() if daemon.running() else 0
        kubelet.close()
    checks.append(("the daemon stopped cleanly on SIGTERM", code == 0))
    echo("\nchecks:")
    for what, ok in checks:
        echo(f"  [{'ok' if ok else 'FAILED'}] {what}")
    if not all(ok for _, ok in checks):
        echo(f"daemon log: {root / 'daemon.log'}")
    return all(ok for _, ok in checks)


def main(argv: list[str] | None = None) -> int:
    """The command line: ``python drivers/fpga/demo/fpga_demo.py [--keep]``."""
    parser = argparse.ArgumentParser(prog="fpga_demo.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (model, config, daemon log)")
    args = parser.parse_args(argv)
    return run_in_folder(
        "dp-fpga-",
        lambda root: run_demo(root, print),
        keep=args.keep,
        logs="daemon.log",
        echo=print,
        complain=lambda line: print(line, file=sys.stderr),
    )


if __name__ == "__main__":
    sys.exit(main())
