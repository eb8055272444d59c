"""Coordination backends: where slot claims live, shared by every node.

Each backend keeps one claim per slot, holding the node's name, tied to a
liveness signal that ends when the node dies (an etcd lease, a Lease's
``renewTime``, a row's expiry): a dead node's claims expire with its lease TTL.
The driver calls a backend from several threads; implementations are
thread-safe.

* :mod:`~devplug_shared.backends.local` -- SQLite: one node, or several on one
  machine sharing the file (the default; the demo);
* :mod:`~devplug_shared.backends.etcd` -- etcd v3 through its HTTP/JSON gateway:
  multi-key transactions compare-and-create, one lease per node kept alive;
* :mod:`~devplug_shared.backends.kubernetes` -- a ``coordination.k8s.io/v1``
  Lease per slot, optimistic concurrency on ``resourceVersion``.

A backend that can tell when the claims change (inotify on the SQLite file,
etcd's watch API) says so through :meth:`Backend.watch`; the driver then reads
the holders at once, and its periodic read stays as the safety net.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from devplug import ConfigError
from devplug.options import parse_options
from devplug_shared.slots import Claim

__all__ = ["BACKENDS", "Backend", "StoreWatch", "build_backend", "parse_coordination"]


class StoreWatch(Protocol):
    """A running watch on the store (:meth:`Backend.watch`)."""

    def close(self) -> None:
        """Stop watching; returns once no more calls of the watch's callback start."""


class Backend(Protocol):
    """What the driver needs from a coordination store. Every call may raise ``StoreUnavailableError``."""

    #: Names the store in messages, e.g. ``etcd at http://10.0.0.1:2379``.
    description: str

    def open(self) -> None:
        """Connect and start (or resume) this node's lease. Called at driver start and after the lease was lost."""

    def keepalive(self, held: Sequence[str]) -> bool:
        """Renew this node's lease (and the claims on ``held``); False when the lease was lost (expired)."""

    def claim(self, slots: Sequence[str]) -> None:
        """Claim every slot for this node, all or nothing; slots already held by this node are kept.

        Raises ``SlotTakenError`` naming a slot another node holds (nothing claimed).
        """

    def release(self, slots: Sequence[str]) -> None:
        """Delete this node's claims on ``slots`` at once; slots not held by this node are left alone."""

    def holders(self) -> Mapping[str, Claim]:
        """Every live claim on this resource's slots, by slot."""

    def watch(self, changed: Callable[[], None]) -> StoreWatch | None:
        """Call ``changed`` (from a thread of the backend's, never blocking) soon after a claim may have changed in
        the store, until the watch is closed; None when this store offers no watch. Events may be missed (a
        dropped connection): the driver's periodic read of the holders repairs that."""

    def close(self) -> None:
        """Stop using the store; claims stay until their lease expires (the pods still hold the slots)."""


#: The backends by name, with their option dataclass's module and class names.
BACKENDS = ("local", "etcd", "kubernetes")


def parse_coordination(table: Mapping[str, Any], where: str) -> tuple[str, Any]:
    """Check a ``coordination`` table (``backend = "etcd"`` and that backend's options): (backend, options)."""
    rest = dict(table)
    kind = rest.pop("backend", "local")
    if kind == "local":
        from devplug_shared.backends.local import LocalOptions

        return kind, parse_options(LocalOptions, rest, where)
    if kind == "etcd":
        from devplug_shared.backends.etcd import EtcdOptions

        return kind, parse_options(EtcdOptions, rest, where)
    if kind == "kubernetes":
        from devplug_shared.backends.kubernetes import KubernetesOptions

        return kind, parse_options(KubernetesOptions, rest, where)
    raise ConfigError(f"{where}.backend: unknown backend {kind!r} (backends: {', '.join(BACKENDS)})")


def build_backend(kind: str, options: Any, *, node: str, resource: str, state_dir: Path) -> Backend:
    """The backend ``kind`` with its checked ``options`` (from :func:`parse_coordination`); connects lazily."""
    if kind == "etcd":
        from devplug_shared.backends.etcd import EtcdBackend

        return EtcdBackend(options, node=node, resource=resource, state_dir=state_dir)
    if kind == "kubernetes":
        from devplug_shared.backends.kubernetes import KubernetesBackend

        return KubernetesBackend(options, node=node, resource=resource)
    from devplug_shared.backends.local import LocalBackend

    return LocalBackend(options, node=node, resource=resource, state_dir=state_dir)
