"""How long devplug holds the kubelet's Allocate in each case of issue 35, and how soon it withholds a busy device.

The kubelet admits every pod of the node in one loop and waits for Allocate with no deadline, so each
millisecond devplug holds one is a millisecond no other pod is admitted or removed. Each case admits a pod whose
Allocate names devices an earlier tenancy had, through the dev kubelet with real containers in real cgroups, and
reads how long the kubelet waited from the daemon's own histogram (``devplug_kubelet_call_hold_seconds``: its
``_sum`` before and after one Allocate is that Allocate's hold, gate and refusal included):

* ``plain``: a free device no tenancy ever had (the floor of the cases below);
* ``rejected``: right after a pod the kubelet rejected at admission (its second resource's Allocate failed);
* ``short``: right after a pod that ran and finished, before any release pass (their interval is long here);
* ``beside_busy``: 2 of 4 devices, while a force-deleted pod's running container keeps the other 2 (withheld);
* ``window``: every device, right after a forced deletion whose container exits :data:`WINDOW_EXIT_S` later: the
  one case where an Allocate waits (the pod is being killed), bounded by ``[release] previous_tenant_wait``.

``withhold_ms``: a forced deletion of a pod whose container keeps running, to the kubelet seeing its device
unhealthy (the dev kubelet's view, polled every millisecond): the window in which an Allocate may still meet a
busy device. It spans a release pass (``[release] interval``, 1 s by default) and a ListAndWatch message.
"""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

from bench.settings import Settings
from bench.stats import percentile
from bench.workspace import Node
from devplug.devkubelet import ContainerSpec, DevKubeletThread, KubeletError, PodSpec
from devplug.engine.ledger import read_ledger_records
from devplug.kube.names import resource_state_dir

__all__ = ["FAILING", "HOLDING", "WINDOW_EXIT_S", "measure"]

#: The resource whose Allocates are timed (4 devices), and one whose Allocate always fails (the rejected case).
HOLDING, FAILING = "bench.dev/hold", "bench.dev/fail"
#: Seconds the window case's container takes to exit after SIGTERM.
WINDOW_EXIT_S = 0.3
_SUM = re.compile(r'^devplug_kubelet_call_hold_seconds_sum\{call="Allocate",resource="bench\.dev/hold"\} (\S+)$', re.M)


def _held_s(port: int) -> float:
    """The daemon's running total of seconds the kubelet waited for its Allocates of :data:`HOLDING`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        found = _SUM.search(reply.read().decode())
    return float(found.group(1)) if found else 0.0


def _wait(predicate: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench: {what} did not happen within {timeout:g} s")
        time.sleep(0.001)


class _Cases:
    def __init__(self, kubelet: DevKubeletThread, port: int, ledger: Path) -> None:
        self.kubelet = kubelet
        self.port = port
        self.ledger = ledger
        self.n = 0

    def _name(self, what: str) -> str:
        self.n += 1
        return f"{what}-{self.n}"

    def held_ms(self, spec: PodSpec, *, refused_ok: bool = False) -> float:
        """Admit ``spec``; the milliseconds the kubelet waited for its Allocate of :data:`HOLDING`."""
        before = _held_s(self.port)
        try:
            self.kubelet.admit_pod(spec)
        except KubeletError:
            if not refused_ok:
                raise
        return (_held_s(self.port) - before) * 1000

    def health(self, device: str) -> str | None:
        view = self.kubelet.resource(HOLDING)
        dev = None if view is None else view.device(device)
        return None if dev is None else dev.health

    def settle(self, *pods: str) -> None:
        """Remove ``pods`` and wait until the daemon released everything and every device is healthy again."""
        for pod in pods:
            if self.kubelet.pod_phase(pod) is not None:
                self.kubelet.remove_pod(pod)
        _wait(
            lambda: (
                not read_ledger_records(self.ledger, HOLDING)
                and all(self.health(f"mock{i}") == "Healthy" for i in range(4))
            ),
            "every device released and healthy",
        )

    def plain(self) -> float:
        name = self._name("plain")
        held = self.held_ms(PodSpec(name, [ContainerSpec("c", {HOLDING: 1})]))
        self.settle(name)
        return held

    def rejected(self) -> float:
        name = self._name("rejected")
        both = PodSpec(name, [ContainerSpec("c", {HOLDING: 1, FAILING: 1})])
        try:
            self.kubelet.admit_pod(both)
        except KubeletError:
            pass
        else:
            raise RuntimeError("bench: the pod asking the failing resource was admitted")
        after = self._name("after-rejected")
        held = self.held_ms(PodSpec(after, [ContainerSpec("c", {HOLDING: 4})]))
        self.settle(name, after)
        return held

    def short(self) -> float:
        name = self._name("short")
        self.kubelet.admit_pod(PodSpec(name, [ContainerSpec("c", {HOLDING: 4})]))
        self.kubelet.finish_pod(name)
        self.kubelet.wait_pod_cleaned_up(name, timeout=30)
        after = self._name("after-short")
        held = self.held_ms(PodSpec(after, [ContainerSpec("c", {HOLDING: 4})]))
        self.settle(name, after)
        return held

    def beside_busy(self) -> tuple[float, float]:
        """The hold of a pod asking 2 of 4 devices while 2 are withheld, and how long withholding took (ms)."""
        name = self._name("busy")
        spec = PodSpec(name, [ContainerSpec("c", {HOLDING: 2}, stop_delay=float("inf"))], termination_grace_period=3)
        busy = self.kubelet.admit_pod(spec).container("c").devices[HOLDING]
        _wait(lambda: self.kubelet.containers_running(name), "the busy pod's container to run")
        removed = time.monotonic()
        self.kubelet.force_delete_pod(name)
        _wait(lambda: all(self.health(d) == "Unhealthy" for d in busy), "the busy devices withheld")
        withheld_ms = (time.monotonic() - removed) * 1000
        after = self._name("beside-busy")
        held = self.held_ms(PodSpec(after, [ContainerSpec("c", {HOLDING: 2})]))
        self.kubelet.wait_containers_exited(name, timeout=30)
        self.settle(after)
        return held, withheld_ms

    def window(self) -> float:
        name = self._name("window")
        spec = PodSpec(name, [ContainerSpec("c", {HOLDING: 4}, stop_delay=WINDOW_EXIT_S)], termination_grace_period=5)
        self.kubelet.admit_pod(spec)
        _wait(lambda: self.kubelet.containers_running(name), "the window pod's container to run")
        self.kubelet.force_delete_pod(name)
        after = self._name("after-window")
        held = self.held_ms(PodSpec(after, [ContainerSpec("c", {HOLDING: 4})]), refused_ok=True)
        self.kubelet.wait_containers_exited(name, timeout=30)
        self.settle(after)
        return held


def measure(settings: Settings, node: Node, kubelet: DevKubeletThread, port: int) -> dict[str, float]:
    ledger = resource_state_dir(Path(node.config["state"]["dir"]), HOLDING) / "ledger.json"
    cases = _Cases(kubelet, port, ledger)
    rounds = 1 if settings.quick else 10
    plain, rejected, short, beside, window, withheld = [], [], [], [], [], []
    for _ in range(rounds):
        plain.append(cases.plain())
        rejected.append(cases.rejected())
        short.append(cases.short())
        held, took = cases.beside_busy()
        beside.append(held)
        withheld.append(took)
        window.append(cases.window())
    floor = percentile(plain, 50)
    out = {
        "hold_plain_ms": floor,
        "hold_rejected_max_ms": max(rejected),
        "hold_short_pod_max_ms": max(short),
        "hold_beside_busy_max_ms": max(beside),
        "hold_window_max_ms": max(window),
        "withhold_p50_ms": percentile(withheld, 50),
        "withhold_max_ms": max(withheld),
    }
    out["hold_outside_window_ratio"] = max(*rejected, *short, *beside) / floor
    return out
