"""Release on a stock kubelet: a pod leaves PodResources until the driver's deallocate finished.

The daemon runs with the default release interval (1.0 s). Pods of one
container and one device each are admitted through the dev kubelet; once the
daemon's ledger shows every allocation seen in PodResources, the pods are
removed one by one, ``release_spacing_s`` apart (not a divisor of the
interval, so removals land at every phase of the poll). Each removal's time
is taken when remove_pod returned (the pod is gone from PodResources); the
end is the time the mock driver logged its deallocate call (it logs after the
hook's work, with time.time(); same clock, same machine).
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.settings import Settings
from bench.stats import percentile
from bench.workspace import Node
from devplug.devkubelet import ContainerSpec, DevKubeletThread, PodSpec
from devplug.engine.ledger import read_ledger_records
from devplug.kube.names import resource_state_dir
from devplug_mock import read_calls

__all__ = ["deallocated_at", "measure"]


def _ledger_path(node: Node, resource: str) -> Path:
    return resource_state_dir(Path(node.config["state"]["dir"]), resource) / "ledger.json"


def _all_seen(ledger: Path, resource: str, count: int) -> bool:
    records = read_ledger_records(ledger, resource)
    return len(records) == count and all(r.get("seen_at") is not None for r in records)


def deallocated_at(folder: Path, since: dict[str, float], timeout: float = 30.0) -> dict[str, float]:
    """Device -> when the mock's first successful ``deallocate`` of it at or after ``since[device]`` finished."""
    finished: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(finished) < len(since):
        if time.monotonic() > deadline:
            raise TimeoutError(f"deallocate never came for {sorted(set(since) - set(finished))}")
        for call in read_calls(folder):
            if call["hook"] == "deallocate" and "error" not in call:
                for device in call["device_ids"]:
                    if device in since and device not in finished and call["time"] >= since[device]:
                        finished[device] = call["time"]
        time.sleep(0.05)
    return finished


def measure(settings: Settings, node: Node, kubelet: DevKubeletThread) -> dict[str, float]:
    resource = next(iter(node.config["resources"]))
    folder = node.mock_folder(resource)
    pods: dict[str, str] = {}  # pod name -> its device
    for i in range(settings.release_pods):
        name = f"rel-{i}"
        admitted = kubelet.admit_pod(PodSpec(name, [ContainerSpec("c", {resource: 1})]))
        pods[name] = admitted.container("c").devices[resource][0]
    ledger = _ledger_path(node, resource)
    deadline = time.monotonic() + 30
    while not _all_seen(ledger, resource, len(pods)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the daemon did not see every pod in PodResources within 30 s ({ledger})")
        time.sleep(0.05)
    removed: dict[str, float] = {}  # device -> when its pod left PodResources
    for name, device in pods.items():
        kubelet.remove_pod(name)
        removed[device] = time.time()
        time.sleep(settings.release_spacing_s)
    finished = deallocated_at(folder, removed)
    samples = [1000.0 * (finished[d] - removed[d]) for d in removed]
    return {"release_p50_ms": percentile(samples, 50), "release_p99_ms": percentile(samples, 99)}
