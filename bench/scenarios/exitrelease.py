"""Container exit to deallocate done, when the kubelet has already forgotten the pod (issue 23).

Pods of one container and one device each are admitted through the dev kubelet, whose containers are real
processes in real cgroups; each container traps SIGTERM for :data:`EXIT_DELAY_S` (longer than the daemon's release
interval, so the daemon has seen the tenancy unattributed and waits on its pod's cgroup by then). Once the daemon's
ledger holds every pod's UID (learnt from the kubelet's checkpoint), the pods are force-deleted
``exit_spacing_s`` apart: the kubelet drops each from PodResources and its checkpoint at once, and its container
exits :data:`EXIT_DELAY_S` later. A sample runs from that exit (the dev kubelet's ``container-exited`` event) to the
mock driver's record of its ``deallocate`` (written after the hook's work; both ``time.time()`` on one machine). On
cgroup v2 the release is woken by an inotify event on the pod's ``cgroup.events``; on v1 the pods being waited for
are polled every 50 ms.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.scenarios.release import deallocated_at
from bench.settings import Settings
from bench.stats import percentile
from bench.workspace import Node
from devplug.devkubelet import ContainerSpec, DevKubeletThread, PodSpec
from devplug.engine.ledger import read_ledger_records
from devplug.kube.names import resource_state_dir

__all__ = ["EXIT_DELAY_S", "measure"]

#: Seconds each container takes to exit after SIGTERM (above the default release interval of 1 s).
EXIT_DELAY_S = 1.5


def _uids_learnt(ledger: Path, resource: str, uids: set[str]) -> bool:
    return uids <= {r.get("pod_uid") for r in read_ledger_records(ledger, resource)}


def measure(settings: Settings, node: Node, kubelet: DevKubeletThread, label: str) -> dict[str, float]:
    resource = next(iter(node.config["resources"]))
    folder = node.mock_folder(resource)
    pods: dict[str, str] = {}  # pod name -> its device
    for i in range(settings.release_pods):
        name = f"exit-{i}"
        spec = PodSpec(name, [ContainerSpec("c", {resource: 1}, stop_delay=EXIT_DELAY_S)], termination_grace_period=10)
        pods[name] = kubelet.admit_pod(spec).container("c").devices[resource][0]
    ledger = resource_state_dir(Path(node.config["state"]["dir"]), resource) / "ledger.json"
    uids = {kubelet.pod_uid(name) for name in pods}
    deadline = time.monotonic() + 30
    while not _uids_learnt(ledger, resource, uids):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the daemon did not learn every pod's UID within 30 s ({ledger})")
        time.sleep(0.05)
    for name in pods:
        kubelet.force_delete_pod(name)
        time.sleep(settings.release_spacing_s)
    for name in pods:
        kubelet.wait_containers_exited(name, timeout=30)
    exited: dict[str, float] = {}  # device -> when its pod's container exited
    for event in kubelet.events:
        if event.kind == "container-exited":
            for name, device in pods.items():
                if f"/{name}/" in f"{event.detail.split(' ', 1)[0]}/":
                    exited[device] = event.time
    finished = deallocated_at(folder, {d: 0.0 for d in exited})  # any deallocate of it: none before the exit
    samples = [1000.0 * (finished[d] - exited[d]) for d in exited]
    if min(samples) < -5:  # the daemon cannot clean a device before its container exits: a broken measurement
        raise RuntimeError(f"deallocate before the container exited: {sorted(samples)[:3]} ms")
    return {
        f"exit_release_p50_ms_{label}": percentile(samples, 50),
        f"exit_release_p99_ms_{label}": percentile(samples, 99),
    }
