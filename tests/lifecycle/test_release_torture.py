"""A randomized torture test of the release lifecycle (issue 8), bounded in steps and time, seeded.

Short-lived pods, pods rejected after one resource allocated, pods with init
containers, kubelet restarts with an empty pod list of random length, and
``kill -9`` of the daemon between steps and in the middle of releases, on a
stock and on a KEP kubelet. Checked throughout, from the dev kubelet's events
and the mock driver's call log:

* no ``post_stop``/``deallocate`` of a device while a running pod holds it;
* every tenancy of a device released (a successful ``deallocate``) before the
  driver's ``allocate`` of it for another pod;
* every device the kubelet attributes to a running pod is in the ledger;
* at the end, with every pod gone, every allocation released and the ledger
  empty.

Set ``DEVPLUG_TORTURE_SEED`` to replay a run; the seed is printed (and named in
every failure).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from devplug.devkubelet import ContainerSpec, KubeletEvent, PodPhase, PodSpec
from devplug.errors import KubeletError

if TYPE_CHECKING:
    from tests.lifecycle.conftest import Lab

RESOURCE = "example.com/mock"
RESOURCE_B = "example.com/other"
DEVICES = ("mock0", "mock1", "mock2")
STEPS = 30
BUDGET_S = 45.0


@dataclass
class Tenancy:
    """One pod's hold on a device, as the kubelet saw it."""

    pod: str
    allocated_at: float  # the kubelet's allocate event (after the driver's allocate returned)
    live_from: float | None = None  # pod-admitted
    ended_at: float | None = None  # finished, rejected or removed


@dataclass
class History:
    """Tenancies per device, rebuilt from the kubelet's events."""

    tenancies: dict[str, list[Tenancy]] = field(default_factory=dict)


def _pod_of(label: str) -> str:
    """``default/p3/app`` or ``default/p3 (uid ...)`` -> ``default/p3``."""
    head = label.split(" ", 1)[0].split(":", 1)[0]
    return "/".join(head.split("/")[:2])


def _history(events: list[KubeletEvent]) -> History:
    history = History()
    open_by_pod: dict[str, list[Tenancy]] = {}
    for event in events:
        if event.kind == "allocate" and event.resource == RESOURCE and ": failed" not in event.detail:
            pod = _pod_of(event.detail)
            for device in event.device_ids:
                current = history.tenancies.setdefault(device, [])
                if current and current[-1].pod == pod and current[-1].ended_at is None:
                    continue  # the pod's next container reusing it: one tenancy
                tenancy = Tenancy(pod, event.time)
                current.append(tenancy)
                open_by_pod.setdefault(pod, []).append(tenancy)
        elif event.kind == "pod-admitted":
            for tenancy in open_by_pod.get(_pod_of(event.detail), []):
                tenancy.live_from = event.time
        elif event.kind in ("pod-finished", "pod-rejected", "pod-removed"):
            for tenancy in open_by_pod.pop(_pod_of(event.detail), []):
                tenancy.ended_at = event.time
    return history


def _check_history(lab: Lab, seed: int) -> None:
    history = _history(lab.kubelet.events)
    calls = lab.calls(resource=RESOURCE)
    for device, tenancies in history.tenancies.items():
        mine = [c for c in calls if device in c["device_ids"]]
        for call in mine:
            if call["hook"] not in ("post_stop", "deallocate"):
                continue
            for t in tenancies:
                if (
                    t.live_from is not None
                    and t.live_from < call["time"]
                    and (t.ended_at is None or call["time"] < t.ended_at)
                ):
                    pytest.fail(
                        f"seed {seed}: {call['hook']} of {device} at {call['time']:.3f} while pod {t.pod} ran with it "
                        f"({t.live_from:.3f}..{t.ended_at})",
                        pytrace=False,
                    )
        for before, after in itertools.pairwise(tenancies):
            allocates = [c for c in mine if c["hook"] == "allocate" and c["time"] <= after.allocated_at]
            driver_allocate = allocates[-1]["time"] if allocates else after.allocated_at
            released = [
                c for c in mine if c["hook"] == "deallocate" and before.allocated_at < c["time"] <= driver_allocate
            ]
            if not released:
                pytest.fail(
                    f"seed {seed}: {device} went from pod {before.pod} to pod {after.pod} with no deallocate in "
                    f"between (allocated {before.allocated_at:.3f}, then {after.allocated_at:.3f})",
                    pytrace=False,
                )


def _check_ledger_holds_running_pods(lab: Lab, seed: int) -> None:
    def holds() -> bool:
        held = {d for r in lab.ledger() for d in (*r["devices"], *r["pending"])}
        return set(lab.kubelet.attributed(RESOURCE)) <= held

    lab.wait(holds, what=f"(seed {seed}) the ledger to hold every device a running pod has")


class Torture:
    def __init__(self, lab: Lab, seed: int) -> None:
        self.lab = lab
        self.seed = seed
        self.rng = random.Random(seed)
        self.next_pod = 0

    def pod_name(self) -> str:
        self.next_pod += 1
        return f"p{self.next_pod}"

    def running(self) -> list[str]:
        return [p.spec.name for p in self.lab.kubelet.pods()]

    def known(self) -> list[str]:
        return [p.spec.name for p in self.lab.kubelet.known_pods()]

    def admit(self, spec: PodSpec) -> None:
        with contextlib.suppress(KubeletError):  # not enough devices, or the rejected-pod step: part of the game
            self.lab.kubelet.admit_pod(spec)

    def step(self) -> str:
        rng = self.rng
        action = rng.choices(
            ["admit", "init", "short", "rejected", "finish", "remove", "kubelet", "kill", "kill-release"],
            weights=[6, 2, 4, 2, 4, 3, 2, 1, 1],
        )[0]
        if action == "admit":
            self.admit(PodSpec(self.pod_name(), [ContainerSpec("app", {RESOURCE: rng.randint(1, 2)})]))
        elif action == "init":
            containers = [ContainerSpec("init", {RESOURCE: 1}, init=True), ContainerSpec("app", {RESOURCE: 1})]
            self.admit(PodSpec(self.pod_name(), containers))
        elif action == "short":
            name = self.pod_name()
            self.admit(PodSpec(name, [ContainerSpec("app", {RESOURCE: 1})]))
            if self.lab.kubelet.pod_phase(name) is PodPhase.RUNNING:
                (self.lab.kubelet.finish_pod if rng.random() < 0.5 else self.lab.kubelet.remove_pod)(name)
        elif action == "rejected":
            self.admit(PodSpec(self.pod_name(), [ContainerSpec("app", {RESOURCE: 1, RESOURCE_B: 1})]))
        elif action == "finish" and self.running():
            self.lab.kubelet.finish_pod(rng.choice(self.running()))
        elif action == "remove" and self.known():
            self.lab.kubelet.remove_pod(rng.choice(self.known()))
        elif action == "kubelet":
            registrations = self.lab.kubelet.registrations(RESOURCE)
            self.lab.kubelet.restart(pod_list_delay=rng.uniform(0.0, 1.5))
            try:
                self.lab.kubelet.wait_registered(RESOURCE, timeout=15, after=registrations)
            except TimeoutError as exc:  # say why, as restart_process does: the daemon's log and the kubelet's events
                events = "\n".join(str(e) for e in self.lab.kubelet.events[-40:])
                pytest.fail(
                    f"(seed {self.seed}) {exc}\n--- kubelet events ---\n{events}\n--- daemon log ---\n{self.lab.log()}",
                    pytrace=False,
                )
            self.lab.wait_advertised()
        elif action == "kill":
            self.lab.kill()
            self.lab.restart_process()
        elif action == "kill-release" and self.running():
            self.kill_mid_release()
        else:
            return "skip"
        return action

    def kill_mid_release(self) -> None:
        lab = self.lab
        pod = self.rng.choice(lab.kubelet.pods())
        devices = pod.containers[-1].devices.get(RESOURCE, ())
        if not devices:
            return
        hook = self.rng.choice(["post_stop", "deallocate"])
        for device in devices:
            lab.write_device(device, f"delay={hook}:3")
        lab.kubelet.finish_pod(pod.spec.name)
        lab.wait(
            lambda: any(r["releasing"] for r in lab.ledger()) or lab.kubelet.kep_mode,
            what=f"(seed {self.seed}) the release of {devices} to be under way",
        )
        lab.kill()
        for device in devices:
            lab.write_device(device)
        lab.restart_process()


@pytest.mark.parametrize("kep", [False, True], ids=["stock", "kep"])
def test_release_torture(lab: Lab, kep: bool) -> None:
    seed = int(os.environ.get("DEVPLUG_TORTURE_SEED", random.SystemRandom().randrange(1 << 30)))
    print(f"torture seed {seed} (replay: DEVPLUG_TORTURE_SEED={seed})")
    lab.kubelet.kep_mode = kep
    tables: dict[str, dict[str, Any]] = {
        RESOURCE: lab.resource_table(count=len(DEVICES)),
        RESOURCE_B: lab.resource_table(RESOURCE_B, count=1),
    }
    lab.start(tables, release_interval=0.1, grace_period=1.0)
    lab.write_device("mock0", "fail=allocate", resource=RESOURCE_B)  # pods asking for it are rejected
    torture = Torture(lab, seed)
    deadline = time.monotonic() + BUDGET_S
    done: list[str] = []
    for _ in range(STEPS):
        if time.monotonic() > deadline:
            break
        done.append(torture.step())
        _check_ledger_holds_running_pods(lab, seed)
    for name in torture.known():
        lab.kubelet.remove_pod(name)
    lab.wait(lambda: not lab.ledger(), timeout=20, what=f"(seed {seed}) every allocation released; steps {done}")
    _check_history(lab, seed)
    for device in DEVICES:
        lab.wait(
            lambda device=device: not lab.driver_holds(device),  # type: ignore[misc]
            what=f"(seed {seed}) the driver to have given {device} back",
        )
    assert any(a in done for a in ("admit", "init", "short")), f"seed {seed}: no pod was ever admitted: {done}"
