"""``devplug demo --profiles``: a node moving between per-node profiles, on a machine without a cluster.

A dev kubelet, the API server stand-in (:mod:`devplug.testing.apiserver`, serving the Node) and the real daemon
(a child process) run in a temporary folder. The config has a base (4 mock devices) and two profiles: ``big``
(8 devices) and ``gpu-less`` (removes the second resource). A pod holds a device of the second resource; the demo
relabels the node and shows what the daemon applies (changed, removed and draining, added back), what it refuses
(an unknown profile), and that the pod's device is released only when the pod ends. It needs the Kubernetes
client (``pip install 'devplug[kubernetes]'``).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devplug.config.tomlwrite import write_toml
from devplug.daemon.status import read_status
from devplug.devkubelet import ContainerSpec, DevKubeletThread, PodSpec
from devplug.devkubelet.daemonconfig import no_containers_liveness
from devplug.errors import StateError
from devplug.kit.hookrecord import read_hook_calls
from devplug.testing.process import DaemonProcess

__all__ = ["run_profiles_demo"]

Echo = Callable[[str], None]
NODE = "demo-node"
BIG = "example.com/mock"
OTHER = "example.com/other"


def _wait(predicate: Callable[[], Any], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


def _config(root: Path, kubeconfig: Path) -> dict[str, Any]:
    def mock(name: str, count: int) -> dict[str, Any]:
        return {"driver": "mock", "options": {"directory": str(root / name), "count": count}}

    return {
        "node": {"name": NODE},
        "kubernetes": {"kubeconfig": str(kubeconfig)},
        "kubelet": {
            "device_plugin_dir": str(root / "device-plugins"),
            "pod_resources_socket": str(root / "pod-resources" / "kubelet.sock"),
        },
        "state": {"dir": str(root / "state")},
        "release": {"interval": 0.2, "grace_period": 2.0},
        "liveness": no_containers_liveness(root),
        "resources": {BIG: mock("mock", 4), OTHER: mock("other", 2)},
        "profiles": {
            # its own folder: the mock keeps the device files it finds, so 8 in "mock" would stay 8 at count 4
            "big": {"description": "8 devices", "resources": {BIG: {"options": mock("mock-big", 8)["options"]}}},
            "gpu-less": {"description": "without the other resource", "remove": [OTHER]},
        },
    }


def run_profiles_demo(*, keep: bool = False, echo: Echo = print) -> bool:
    """Run the demo; return True when every check passed."""
    if importlib.util.find_spec("lightkube") is None:
        echo("devplug demo --profiles needs the Kubernetes client: pip install 'devplug[kubernetes]'")
        return False
    from devplug.testing.apiserver import ApiServer

    root = Path(tempfile.mkdtemp(prefix="devplug-profiles-demo-", dir="/tmp"))
    checks: list[tuple[str, bool]] = []

    def check(what: str, ok: bool) -> None:
        checks.append((what, ok))
        echo(f"  [{'ok' if ok else 'FAILED'}] {what}")

    try:
        with (
            ApiServer() as api,
            DevKubeletThread(
                root / "device-plugins", pod_resources_socket=root / "pod-resources" / "kubelet.sock"
            ) as kubelet,
        ):
            kubeconfig = root / "kubeconfig"
            cluster = {"name": "standin", "cluster": {"server": api.url}}
            context = {"name": "standin", "context": {"cluster": "standin", "user": "anonymous"}}
            kubeconfig.write_text(
                json.dumps(
                    {
                        "clusters": [cluster],
                        "users": [{"name": "anonymous", "user": {}}],
                        "contexts": [context],
                        "current-context": "standin",
                    }
                )
            )
            api.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {}}})
            config_path = write_toml(root / "config.toml", _config(root, kubeconfig))
            echo(f"devplug demo --profiles in {root}: node {NODE} served by the API server stand-in at {api.url}")
            echo("config: base 4 devices of example.com/mock and 2 of example.com/other; profiles big, gpu-less\n")

            def label(value: str | None) -> None:
                node = api.get("nodes", NODE)
                labels = dict(node["metadata"].get("labels") or {})
                labels.pop("devplug.io/profile", None)
                if value is not None:
                    labels["devplug.io/profile"] = value
                node["metadata"]["labels"] = labels
                api.update("nodes", node)
                echo(
                    f"$ kubectl label node {NODE} "
                    + (f"devplug.io/profile={value} --overwrite" if value else "devplug.io/profile-")
                )

            def capacity(resource: str) -> int | None:
                view = kubelet.resource(resource)
                return None if view is None else view.capacity

            def status() -> dict[str, Any]:
                return read_status(root / "state")

            def reloads(n: int) -> dict[str, Any] | None:
                try:
                    entry: dict[str, Any] = status().get("reload") or {}
                except StateError:  # not written yet
                    return None
                return entry if entry.get("attempts", 0) >= n else None

            label("big")
            daemon = DaemonProcess(config_path, root / "daemon.log", log_level="info")
            daemon.start()
            try:
                check("started on profile big: 8 devices advertised", _wait(lambda: capacity(BIG) == 8))
                check("example.com/other advertised (2 devices)", _wait(lambda: capacity(OTHER) == 2))
                admitted = kubelet.admit_pod(PodSpec("holder", [ContainerSpec("app", {OTHER: 1})]))
                (held,) = admitted.container("app").devices[OTHER]
                echo(f"pod holder holds {held} of {OTHER}")

                label("big.gpu-less")
                entry = reloads(1) if _wait(lambda: reloads(1)) else None
                check(
                    f"applied: {OTHER} removed, {BIG} unchanged",
                    entry is not None and entry["removed"] == [OTHER] and entry["unchanged"] == [BIG],
                )
                check(f"{OTHER} advertises nothing while the pod holds {held}", _wait(lambda: capacity(OTHER) == 0))

                label("big.huge")
                entry = reloads(2) if _wait(lambda: reloads(2)) else None
                refused = (entry or {}).get("last_error") or ""
                echo(f"  refused: {refused}")
                check("an unknown profile is refused, the running config stays", "'huge'" in refused)

                label(None)
                entry = reloads(3) if _wait(lambda: reloads(3)) else None
                check(
                    f"back to the base: {BIG} changed to 4 devices, {OTHER} added back",
                    entry is not None and entry["changed"] == [BIG] and entry["added"] == [OTHER],
                )
                check(f"{BIG} advertises 4 devices", _wait(lambda: capacity(BIG) == 4))
                check(f"{OTHER} advertises 2 devices again", _wait(lambda: capacity(OTHER) == 2))
                released = read_hook_calls(root / "other", hook="deallocate", device=held, ok=True)
                check(f"{held} still held: never released while the pod runs", released == [])

                kubelet.remove_pod("holder")
                check(
                    f"{held} released once the pod ended",
                    _wait(lambda: bool(read_hook_calls(root / "other", hook="deallocate", device=held, ok=True))),
                )
                shown = status().get("profiles") or {}
                echo(f"\nstatus: node {shown.get('node')}, profiles {shown.get('active')}, api {shown.get('api')}")
            finally:
                if daemon.running():
                    check("daemon exits 0 on SIGTERM", daemon.stop() == 0)
        ok = all(passed for _, passed in checks)
        echo(f"\n{sum(p for _, p in checks)}/{len(checks)} checks passed")
        if not ok:
            echo(f"daemon log: {root / 'daemon.log'}")
            keep = True
        return ok
    finally:
        if keep:
            echo(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
