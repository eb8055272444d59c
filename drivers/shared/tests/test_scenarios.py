"""Nodes sharing slots through each backend: real daemons, real dev kubelets, the store as it really is.

Every test runs against ``local`` (SQLite), a real ``etcd`` on loopback and the
Lease API model (``kubernetes``), through the ``store`` fixture.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from devplug.errors import KubeletError

if TYPE_CHECKING:
    from conftest import Cluster, Node

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"


def test_two_nodes_share_a_device_slot_by_slot(cluster: Cluster) -> None:
    a = cluster.add_node("node-a")
    b = cluster.add_node("node-b")
    assert set(a.health()) == set(b.health()) == {"dev-0", "dev-1"}, "the same slot IDs on every node"

    pod_a, (slot_a,) = cluster.admit(a)
    assert cluster.holders() == {slot_a: "node-a"}
    cluster.wait_view(b, slot_a, UNHEALTHY)
    cluster.check_invariant()

    _, (slot_b,) = cluster.admit(b)
    assert slot_b != slot_a, "B got the slot A does not hold"
    cluster.check_invariant()
    cluster.wait_view(a, slot_b, UNHEALTHY)
    with pytest.raises(KubeletError):  # a third pod: nothing free on A
        cluster.admit(a)

    cluster.delete(a, pod_a)  # released at once: the claim is deleted, B may take the slot
    cluster.wait(lambda: slot_a not in cluster.holders(), f"{slot_a}'s claim to be deleted after its pod ended")
    cluster.wait_view(b, slot_a, HEALTHY)
    _, (again,) = cluster.admit(b)
    assert again == slot_a
    assert cluster.check_invariant() == {slot_a: "node-b", slot_b: "node-b"}


def test_kill_9_keeps_the_claims_of_running_pods(cluster: Cluster) -> None:
    a = cluster.add_node("node-a")
    b = cluster.add_node("node-b")
    pod, (slot,) = cluster.admit(a)
    cluster.kill(a)
    cluster.wait_view(b, slot, UNHEALTHY)
    _, (other,) = cluster.admit(b)
    assert other != slot
    cluster.start(a)  # within the lease TTL: the lease is resumed, the claim kept
    assert cluster.holders() == {slot: "node-a", other: "node-b"}
    cluster.check_invariant()
    cluster.delete(a, pod)
    cluster.wait(lambda: slot not in cluster.holders(), f"{slot} to be released by the restarted daemon")


def test_preferred_allocation_steers_to_free_slots_and_allocate_names_a_holder(cluster: Cluster) -> None:
    # node-b never re-reads the store by itself (no watch, refresh and lease renewal far away): its kubelet's view
    # goes stale.
    b = cluster.add_node("node-b", refresh_interval=3600.0, watch_store=False, lease_ttl=3600.0, capacity=3)
    intruder = cluster.store.backend("node-x")
    intruder.open()
    intruder.claim(["dev-0"])
    try:
        assert b.health() == {"dev-0": HEALTHY, "dev-1": HEALTHY, "dev-2": HEALTHY}
        pod, (steered,) = cluster.admit(b)  # the kubelet offers dev-0 first; GetPreferredAllocation reads the store
        assert steered == "dev-1"
        cluster.delete(b, pod)
        cluster.wait(lambda: "dev-1" not in cluster.holders(), "dev-1 to be released")
        intruder.claim(["dev-1", "dev-2"])
        with pytest.raises(KubeletError) as caught:
            cluster.admit(b)
        assert "is held by node node-x" in str(caught.value)
        assert "nothing of this request was claimed" in str(caught.value)
        assert cluster.holders() == {"dev-0": "node-x", "dev-1": "node-x", "dev-2": "node-x"}
        cluster.wait(lambda: UNHEALTHY in b.health().values(), "what the failed claim learnt to reach the kubelet")
    finally:
        intruder.release(["dev-0", "dev-1", "dev-2"])
        intruder.close()


def test_a_request_for_several_slots_is_all_or_nothing(cluster: Cluster) -> None:
    # node-b's view goes stale as above (no watch, no periodic read).
    b = cluster.add_node("node-b", refresh_interval=3600.0, watch_store=False, lease_ttl=3600.0, capacity=3)
    intruder = cluster.store.backend("node-x")
    intruder.open()
    intruder.claim(["dev-2"])
    try:
        with pytest.raises(KubeletError) as caught:
            cluster.admit(b, count=3)
        assert "slot dev-2" in str(caught.value) and "node-x" in str(caught.value)
        assert cluster.holders() == {"dev-2": "node-x"}, "no slot of the failed request stays claimed"
        assert b.kubelet.attributed("example.com/shared") == {}
    finally:
        intruder.close()


def test_a_dead_nodes_claims_expire_with_its_lease(cluster: Cluster) -> None:
    # etcd, local: the claims stand hold_ttl (3 s) after the last renewal; kubernetes: until the node's kubelet
    # Lease (4 s here) and the slot's Lease (2 s) have both run out.
    a = cluster.add_node("node-a", lease_ttl=2.0, hold_ttl=3.0)
    b = cluster.add_node("node-b")
    _, (slot,) = cluster.admit(a)
    _, (other,) = cluster.admit(b)
    cluster.wait_view(b, slot, UNHEALTHY)
    cluster.node_dies(a)  # daemon, pods and kubelet
    cluster.wait(lambda: slot not in cluster.holders(), f"node-a's claim on {slot} to expire once the node is gone")
    cluster.wait_view(b, slot, HEALTHY)
    _, (taken,) = cluster.admit(b)
    assert taken == slot
    assert cluster.check_invariant() == {slot: "node-b", other: "node-b"}


def test_a_partition_fails_new_allocates_and_never_releases_a_running_pods_claim(cluster: Cluster) -> None:
    # etcd and kubernetes: node-a reaches the store through a proxy that is cut. local: the SQLite file is
    # locked (BEGIN EXCLUSIVE) for everyone, a store outage, as a node cannot be cut from its own file.
    local = cluster.store.kind == "local"
    a = cluster.add_node("node-a", partitionable=True, lease_ttl=60.0)  # the partition is far shorter
    b = cluster.add_node("node-b")
    pod, (slot,) = cluster.admit(a)
    cluster.wait_view(b, slot, UNHEALTHY)  # node-b knew of the claim before the store went away
    outage = cluster.outage(a)
    outage.cut()
    cluster.wait(lambda: not _status(a).get("store_ok", True), "node-a to notice the partition")

    with pytest.raises(KubeletError) as caught:
        cluster.admit(a)
    assert "the coordination store" in str(caught.value) and "unreachable" in str(caught.value)

    cluster.delete(a, pod)  # the release cannot reach the store: the claim stays, the engine retries
    cluster.wait(lambda: "cannot release slot(s)" in a.log(), "node-a's release to fail in the partition")
    assert outage.holders() == {slot: "node-a"}, "a partition never releases a claim"
    assert b.health()[slot] == UNHEALTHY
    if not local:  # node-b still reaches the store
        _, (other,) = cluster.admit(b)
        assert other != slot

    outage.heal()
    cluster.wait(lambda: slot not in cluster.holders(), f"{slot} to be released once the store is back")
    cluster.wait_view(b, slot, HEALTHY)
    _, (taken,) = cluster.admit(b)
    assert taken == slot
    cluster.check_invariant()


def _status(node: Node) -> dict[str, object]:
    import json

    try:
        data: dict[str, object] = json.loads((node.state_dir / "shared-status.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return data


# Not on the local backend: its outage locks the file for every node, so no other node can take a slot meanwhile.
@pytest.mark.parametrize("store", ["etcd", "kubernetes"], indirect=True)
def test_after_a_partition_longer_than_the_lease_a_node_claims_its_pods_slots_again(cluster: Cluster) -> None:
    # The whole node is cut off: its daemon from the store, and (kubernetes) its kubelet from the API server.
    a = cluster.add_node("node-a", partitionable=True, lease_ttl=2.0, hold_ttl=3.0)
    b = cluster.add_node("node-b")
    cluster.admit(a)
    cluster.admit(a)
    outage = cluster.outage(a)
    outage.cut()
    if a.heartbeat is not None:
        a.heartbeat.stop()
    cluster.wait(lambda: not cluster.holders(), "node-a's claims to expire once it is cut off")
    cluster.wait(lambda: set(b.health().values()) == {HEALTHY}, "node-b to see both slots free")
    _, (taken,) = cluster.admit(b)  # the documented risk of a partition longer than the hold
    outage.heal()
    if a.heartbeat is not None:
        a.heartbeat.start()
    kept = ({"dev-0", "dev-1"} - {taken}).pop()
    cluster.wait(lambda: cluster.holders() == {kept: "node-a", taken: "node-b"}, "node-a to claim its free slot again")
    conflict = cluster.wait(lambda: _status(a).get("conflicts"), "node-a to report the slot it lost")
    assert conflict == [f"slot {taken} is held by node node-b while a pod on node node-a holds it"]
    assert f"CONFLICT: slot {taken}" in a.log()
