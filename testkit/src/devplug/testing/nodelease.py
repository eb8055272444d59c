"""A model of the kubelet's node Lease heartbeat, writing into a :class:`~devplug.testing.leaseapi.LeaseStore`.

Every kubelet keeps a Lease named after its node in the namespace
``kube-node-lease`` (``v1.NamespaceNodeLease``); the node lifecycle controller
reads it to tell a live node from a dead or partitioned one. This follows
Kubernetes v1.32:

* ``pkg/kubelet/kubelet.go`` builds the controller with the lease duration
  ``NodeLeaseDurationSeconds`` (the kubelet config's ``nodeLeaseDurationSeconds``,
  40 by default, ``pkg/kubelet/apis/config/v1beta1/defaults.go``) and a renew
  interval of that times ``nodeLeaseRenewIntervalFraction = 0.25`` (10 s);
* ``k8s.io/component-helpers/apimachinery/lease/controller.go``: each interval
  (with 4 % jitter, ``wait.JitterUntil``) it updates the Lease it last wrote,
  setting only ``spec.renewTime``; when it has none or the update fails on a
  conflict it gets the Lease, creating it when missing with ``holderIdentity``
  and ``leaseDurationSeconds`` (and ``renewTime``);
* the Lease's owner reference to the Node object is not modelled (a test that
  creates Node objects on the server and wants it sets it itself).

Tests stop it to make a node die (or be cut off from the API server) and start
it again for a node that comes back.
"""

from __future__ import annotations

import random
import threading
from datetime import datetime, timezone
from typing import Any

from devplug.testing.leaseapi import ApiStatusError, LeaseStore

__all__ = ["NODE_LEASE_NAMESPACE", "NodeLeaseHeartbeat", "RENEW_FRACTION"]

#: ``v1.NamespaceNodeLease``.
NODE_LEASE_NAMESPACE = "kube-node-lease"
#: ``nodeLeaseRenewIntervalFraction`` in ``pkg/kubelet/kubelet.go``.
RENEW_FRACTION = 0.25
#: ``wait.JitterUntil``'s jitter factor in the lease controller.
JITTER = 0.04


def _micro_time() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class NodeLeaseHeartbeat:
    """One node's kubelet heartbeat: ``kube-node-lease/<node>`` renewed every ``duration * 0.25`` seconds."""

    def __init__(self, store: LeaseStore, node: str, duration: int = 40) -> None:
        self.store = store
        self.node = node
        self.duration = duration
        self.renew_interval = duration * RENEW_FRACTION
        self._latest: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: How many renewals succeeded (tests wait on it).
        self.renewals = 0

    def _new_lease(self) -> dict[str, Any]:
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.node, "namespace": NODE_LEASE_NAMESPACE},
            "spec": {"holderIdentity": self.node, "leaseDurationSeconds": self.duration, "renewTime": _micro_time()},
        }

    def sync(self) -> None:
        """One heartbeat: update the last Lease written, or get (create when missing) and update it."""
        if self._latest is not None:
            lease = {**self._latest, "spec": {**self._latest["spec"], "renewTime": _micro_time()}}
            try:
                self._latest = self.store.update(NODE_LEASE_NAMESPACE, self.node, lease)
                self.renewals += 1
                return
            except ApiStatusError:
                self._latest = None  # a conflict (or the Lease is gone): fall back to ensuring it
        try:
            current = self.store.get(NODE_LEASE_NAMESPACE, self.node)
        except ApiStatusError as exc:
            if exc.code != 404:
                raise
            self._latest = self.store.create(NODE_LEASE_NAMESPACE, self._new_lease())
            self.renewals += 1
            return
        current["spec"] = {**current.get("spec", {}), "renewTime": _micro_time()}
        self._latest = self.store.update(NODE_LEASE_NAMESPACE, self.node, current)
        self.renewals += 1

    def _run(self) -> None:
        while not self._stop.wait(self.renew_interval * (1 + JITTER * random.random())):
            self.sync()

    def start(self) -> NodeLeaseHeartbeat:
        """Start renewing (the first heartbeat happens before this returns)."""
        self._stop.clear()
        self.sync()
        self._thread = threading.Thread(target=self._run, name=f"node-lease-{self.node}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop renewing (the node died or lost the API server); the Lease stays and expires."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10.0)
            self._thread = None
