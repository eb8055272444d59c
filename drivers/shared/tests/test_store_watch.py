"""A claim made or deleted on one node is seen on the others at once, through a watch on the store (inotify on the
SQLite file, etcd's watch API), and the periodic read still repairs what no event tells (issue 42)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from devplug.testing.waiting import poll_until
from devplug_shared.backends import build_backend, parse_coordination
from devplug_shared.backends.etcdwatch import EtcdPrefixWatch

if TYPE_CHECKING:
    from conftest import Cluster, Store

#: conftest's resource (test modules cannot import it at run time: ``--import-mode=importlib``).
RESOURCE = "example.com/shared"

#: ``refresh_interval`` and ``lease_ttl`` of the nodes that must learn by events: their keeper's step comes every
#: ``min(refresh_interval, lease_ttl / 3)`` = 1200 s, far beyond any wait here, so what they learn, an event told.
NEVER = 3600.0


@pytest.mark.parametrize("store", ["local", "etcd"], indirect=True)
def test_a_slot_taken_and_freed_on_one_node_is_seen_on_the_other_without_its_periodic_read(cluster: Cluster) -> None:
    """Node b reads the store only every 20 minutes; it still sees node a's claim, then the release of the slot when
    node a's pod ends, and admits a pod on it."""
    a = cluster.add_node("node-a", capacity=1, refresh_interval=NEVER, lease_ttl=NEVER)
    b = cluster.add_node("node-b", capacity=1, refresh_interval=NEVER, lease_ttl=NEVER)
    pod, (slot,) = cluster.admit(a)
    cluster.wait_view(b, slot, "Unhealthy", timeout=30.0)
    cluster.delete(a, pod)
    cluster.wait_view(b, slot, "Healthy", timeout=30.0)
    _, got = cluster.admit(b)
    assert got == (slot,)
    assert cluster.check_invariant() == {slot: "node-b"}


@pytest.mark.parametrize("store", ["local"], indirect=True)
def test_a_claim_that_ends_without_an_event_is_freed_by_the_periodic_read(cluster: Cluster) -> None:
    """The watch is on, but a claim whose holder's daemon was killed ends when its hold runs out, with no write to
    the file and so no event: node b's periodic read (every second here) frees the slot."""
    a = cluster.add_node("node-a", capacity=1, lease_ttl=1.0, hold_ttl=1.0)
    b = cluster.add_node("node-b", capacity=1, refresh_interval=1.0, lease_ttl=NEVER)
    assert "watching the store" in b.log(), b.log()[-3000:]
    _, (slot,) = cluster.admit(a)
    cluster.wait_view(b, slot, "Unhealthy", timeout=30.0)
    cluster.kill(a)  # kill -9: no release, no write; node a's claim dies 1 s after its last renewal
    cluster.wait_view(b, slot, "Healthy", timeout=30.0)


@pytest.mark.parametrize("store", ["etcd"], indirect=True)
def test_the_etcd_watch_opens_again_after_a_partition_and_says_the_claims_may_have_changed(store: Store) -> None:
    """A claim made while the watch's connection is cut reaches no event; once the network heals, the watch opens
    its stream again and tells the driver to read the holders."""
    proxy = store.proxy()
    kind, options = parse_coordination(store.table(proxy=proxy), "coordination")
    folder = store.root / "backend-watcher"
    folder.mkdir()
    backend = build_backend(kind, options, node="watcher", resource=RESOURCE, state_dir=Path(folder))
    told = threading.Event()
    watch = backend.watch(told.set)
    assert isinstance(watch, EtcdPrefixWatch)
    observer = store.backend("observer")
    try:
        poll_until(watch.ready.is_set, "the watch's stream to open", 30.0)
        proxy.cut()
        observer.open()
        observer.claim(["dev-0"])  # while the watch is cut off: no event reaches it
        assert not told.is_set(), "the watch was told through a cut connection"
        proxy.heal()
        poll_until(told.is_set, "the watch to open again and say the claims may have changed", 60.0)
    finally:
        watch.close()
        backend.close()
        observer.close()
