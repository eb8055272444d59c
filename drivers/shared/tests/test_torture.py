"""Random admissions, deletions and ``kill -9`` of daemons on three nodes, against each backend.

Seeded (``DEVPLUG_SHARED_SEED=<n>`` replays a run; the seed is printed and in
every failure message), bounded in steps and in time. After every step: no
slot is held by live pods on two nodes, and every slot a live pod holds is
claimed in the store by that pod's node. Every slot freed by a deleted pod
leaves the store within the release delay, and at the end every slot can be
claimed again.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from devplug.errors import KubeletError

if TYPE_CHECKING:
    from conftest import Cluster

STEPS = 20
SECONDS = 12.0
#: What a rejected admission may say: the kubelet found too few healthy slots; the driver lost a race for a slot
#: (naming its holder); or the engine refused a slot the driver had just learnt another node holds ("unhealthy").
EXPECTED_REJECTIONS = (
    "requested number of devices unavailable",
    "no healthy devices present",
    "is held by node",
    "unhealthy device IDs",
)


def _released(cluster: Cluster, node: str, held: tuple[str, ...]) -> Callable[[], bool]:
    """Whether ``node`` no longer holds any of ``held`` in the store."""
    return lambda: all(cluster.holders().get(slot) != node for slot in held)


def test_random_pods_and_crashes_never_put_two_nodes_on_one_slot(cluster: Cluster) -> None:
    seed = int(os.environ.get("DEVPLUG_SHARED_SEED") or random.randrange(2**32))
    print(f"devplug-shared torture: seed {seed} (replay with DEVPLUG_SHARED_SEED={seed})")
    rng = random.Random(seed)
    nodes = [cluster.add_node(f"node-{c}", devices=("cam-a", "cam-b"), capacity=2) for c in "abc"]
    slots = {"cam-a-0", "cam-a-1", "cam-b-0", "cam-b-1"}
    pods: list[tuple[str, str, tuple[str, ...]]] = []  # (node name, pod, slots)
    started = time.monotonic()
    done = {"admit": 0, "rejected": 0, "delete": 0, "kill": 0}
    for step in range(STEPS):
        if time.monotonic() - started > SECONDS:
            break
        where = f"seed {seed}, step {step}"
        action = rng.choices(["admit", "delete", "kill"], weights=[5, 3, 1])[0]
        if action == "delete" and not pods:
            action = "admit"
        node = rng.choice(nodes)
        if action == "admit":
            result = cluster.try_admit(node, count=rng.choice([1, 1, 2]))
            if isinstance(result, KubeletError):
                assert any(text in str(result) for text in EXPECTED_REJECTIONS), f"{where}: {result}"
                done["rejected"] += 1
            else:
                pods.append((node.name, *result))
                done["admit"] += 1
        elif action == "delete":
            name, pod, held = pods.pop(rng.randrange(len(pods)))
            owner = cluster.nodes[name]
            cluster.delete(owner, pod)
            cluster.wait(_released(cluster, name, held), f"{where}: {pod}'s slots {held} to be released by {name}")
            done["delete"] += 1
        else:
            cluster.restart(node)  # kill -9, start again within the lease TTL
            done["kill"] += 1
        try:
            cluster.check_invariant()
        except AssertionError as exc:
            raise AssertionError(f"{where} ({action} on {node.name}): {exc}") from exc
    print(f"devplug-shared torture: {done} in {time.monotonic() - started:.1f} s")

    for name, pod, _ in pods:
        cluster.delete(cluster.nodes[name], pod)
    cluster.wait(lambda: not cluster.holders(), f"seed {seed}: every claim to be released")
    first = nodes[0]
    cluster.wait(
        lambda: set(first.health().values()) == {"Healthy"}, f"seed {seed}: {first.name} to see every slot free"
    )
    got: set[str] = set()
    for _ in slots:
        got.update(cluster.admit(first)[1])
    assert got == slots, f"seed {seed}: every slot can be claimed again"
    cluster.check_invariant()
