"""The ``etcd`` backend: etcd v3 transactions and leases, through etcd's HTTP/JSON gateway (etcd3gw).

::

    coordination = { backend = "etcd", endpoints = ["http://10.0.0.1:2379", "http://10.0.0.2:2379"],
                     lease_ttl = 10.0, hold_ttl = 360.0, prefix = "/devplug/shared" }

A slot's claim is the key ``<prefix>/<resource>/<slot>`` whose value is
``{"holder": <node>, "since": <unix time>}``, attached to the node's *hold*
lease (``LeaseGrant`` with ``hold_ttl``). Beside it the node keeps a liveness
key, ``<prefix>/.nodes/<resource>/<node>``, on a second lease of ``lease_ttl``;
the daemon renews both with ``LeaseKeepAlive`` every third of ``lease_ttl``.
Claiming is one transaction (etcd's ``Txn``, atomic across keys):
``create_revision == 0`` for each free slot, ``mod_revision ==`` the one read
for each slot this node already holds, then a ``Put`` of every slot with the
hold lease; if any compare fails, nothing is written, the keys are read again
and a slot held by another node is named with its holder. Releasing deletes
this node's keys in one transaction guarded by their ``mod_revision``.

etcd sees neither the kubelet nor the pods, so it cannot tell a daemon that
crashed (its pods still running) from a dead node. The two leases say what it
can: a holder whose liveness key is gone has a daemon that stopped renewing
(crashed, crash-looping, restarting, or its node dead or cut off); its claims
stand until its hold lease runs out, ``hold_ttl`` after the last renewal, and
only then does etcd delete them and the slots move. A daemon back within
``hold_ttl`` resumes both leases (their IDs are kept in the driver's state
folder; one that ran out is granted anew) and claims its pods' slots again
before anyone could take them. Keep ``hold_ttl`` above the longest time a
daemon may be down on a live node (the kubelet's crash-loop back-off reaches
300 s); it is also how long a dead node's slots stay taken.

The endpoints are tried in order: a connection error moves to the next.

:meth:`EtcdBackend.watch` keeps a watch open on ``<prefix>/<resource>/``
(:mod:`~devplug_shared.backends.etcdwatch`), so a claim deleted or created by
any node is read at once.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from devplug.atomic import write_atomic
from devplug_shared.backends.common import check_absolute, check_seconds
from devplug_shared.backends.etcdwatch import EtcdPrefixWatch
from devplug_shared.slots import Claim, SlotTakenError, StoreUnavailableError, sorted_slots

__all__ = ["EtcdBackend", "EtcdOptions"]

T = TypeVar("T")

#: How many times a claim or release transaction is retried when the keys changed between read and write.
_TXN_ATTEMPTS = 8
_CHURN = "the keys kept changing between read and write; try again"


@dataclass(frozen=True)
class EtcdOptions:
    """``endpoints``: client URLs; ``prefix``: key prefix; ``lease_ttl``, ``hold_ttl``, ``timeout`` (seconds);
    TLS files."""

    endpoints: list[str] = field(default_factory=lambda: ["http://127.0.0.1:2379"])
    prefix: str = "/devplug/shared"
    lease_ttl: float = 10.0
    hold_ttl: float = 360.0
    timeout: float = 3.0
    ca_cert: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ValueError("endpoints: give at least one etcd client URL like 'http://10.0.0.1:2379'")
        for i, url in enumerate(self.endpoints):
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
                raise ValueError(f"endpoints[{i}]: {url!r} is not an etcd client URL like 'http://10.0.0.1:2379'")
        if not self.prefix.startswith("/") or self.prefix.endswith("/"):
            raise ValueError(f"prefix: {self.prefix!r} must start with '/' and not end with one")
        check_seconds("lease_ttl", self.lease_ttl, 2.0, 3600.0)
        check_seconds("hold_ttl", self.hold_ttl, 2.0, 86400.0)
        if self.hold_ttl < self.lease_ttl:
            raise ValueError(
                f"hold_ttl: {self.hold_ttl!r} is shorter than lease_ttl ({self.lease_ttl!r}); claims must stand at "
                "least as long as the daemon that holds them counts as alive"
            )
        check_seconds("timeout", self.timeout, 0.05, 60.0)
        for name in ("ca_cert", "cert", "key"):
            check_absolute(name, getattr(self, name))
        if (self.cert is None) != (self.key is None):
            raise ValueError("cert, key: give both the client certificate and its key, or neither")


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _unb64(text: str) -> str:
    return base64.b64decode(text).decode(errors="replace")


def _range(prefix: str) -> dict[str, Any]:
    """A range request for every key under ``prefix`` (which ends in ``/``)."""
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    return {"request_range": {"key": _b64(prefix), "range_end": _b64(end)}}


class EtcdBackend:
    """Slot claims as etcd keys on this node's lease."""

    def __init__(self, options: EtcdOptions, *, node: str, resource: str, state_dir: Path) -> None:
        self.options = options
        self.node = node
        self.resource = resource
        self.description = f"etcd at {', '.join(options.endpoints)}"
        self._base = f"{options.prefix}/{resource}/"
        #: The nodes' liveness keys of this resource: ``<prefix>/.nodes/<resource>/<node>``.
        self._nodes = f"{options.prefix}/.nodes/{resource}/"
        self._lease_file = state_dir / "etcd-lease.json"
        self._clients: list[Any] = []
        self._current = 0
        #: The liveness lease (``lease_ttl``) and the hold lease (``hold_ttl``) the claims hang on.
        self._lease_id: int | None = None
        self._hold_id: int | None = None
        self._lock = threading.Lock()

    # --- connection

    def _make_clients(self) -> list[Any]:
        from etcd3gw.client import Etcd3Client

        clients = []
        for url in self.options.endpoints:
            parts = urlsplit(url)
            clients.append(
                Etcd3Client(
                    host=parts.hostname or "127.0.0.1",
                    port=parts.port or 2379,
                    protocol=parts.scheme,
                    ca_cert=str(self.options.ca_cert) if self.options.ca_cert else None,
                    cert_cert=str(self.options.cert) if self.options.cert else None,
                    cert_key=str(self.options.key) if self.options.key else None,
                    timeout=self.options.timeout,
                    api_path="/v3/",  # etcd >= 3.4; Debian's etcd-server 3.4 and every current release
                )
            )
        return clients

    def _call(self, action: str, slots: Sequence[str], fn: Callable[[Any], T]) -> T:
        """Run ``fn(client)`` on the current endpoint, moving on to the next after a connection error."""
        from etcd3gw import exceptions as etcd_errors

        with self._lock:
            if not self._clients:
                self._clients = self._make_clients()
            clients, start = self._clients, self._current
        last: Exception | None = None
        for step in range(len(clients)):
            index = (start + step) % len(clients)
            try:
                result = fn(clients[index])
            except (etcd_errors.ConnectionFailedError, etcd_errors.ConnectionTimeoutError) as exc:
                last = exc
                continue
            except etcd_errors.Etcd3Exception as exc:
                raise StoreUnavailableError.of(self.description, action, slots, exc.detail_text or exc) from exc
            with self._lock:
                self._current = index
            return result
        raise StoreUnavailableError.of(self.description, action, slots, last)

    def _txn(self, action: str, slots: Sequence[str], txn: dict[str, Any]) -> dict[str, Any]:
        def run(client: Any) -> dict[str, Any]:
            result: dict[str, Any] = client.transaction(txn)
            return result

        return self._call(action, slots, run)

    # --- lease

    def open(self) -> None:
        """Resume the leases recorded in the state folder that etcd still has, grant the others, and put this
        node's liveness key."""
        saved = self._saved_leases()
        self._lease_id = self._resume_or_grant(saved.get("lease_id"), self.options.lease_ttl, "liveness")
        self._hold_id = self._resume_or_grant(saved.get("hold_id"), self.options.hold_ttl, "hold")
        write_atomic(
            self._lease_file,
            json.dumps({"lease_id": self._lease_id, "hold_id": self._hold_id, "node": self.node}).encode(),
        )
        self._put_liveness()

    def _resume_or_grant(self, lease_id: int | None, ttl: float, what: str) -> int:
        if lease_id is not None and self._refresh(lease_id, f"resume the node's {what} lease") > 0:
            return lease_id
        seconds = max(1, round(ttl))

        def grant(client: Any) -> int:
            result = client.post(client.get_url("/lease/grant"), json={"TTL": seconds, "ID": 0})
            return int(result["ID"])

        return self._call(f"grant the node's {what} lease", (), grant)

    def _put_liveness(self) -> None:
        value = json.dumps({"node": self.node, "since": time.time()})
        put = {
            "request_put": {"key": _b64(self._nodes + self.node), "value": _b64(value), "lease": str(self._lease_id)}
        }
        self._txn("put the node's liveness key", (), {"success": [put]})

    def _saved_leases(self) -> dict[str, int]:
        try:
            data = json.loads(self._lease_file.read_text())
            if data.get("node") != self.node:
                return {}
            return {key: int(data[key]) for key in ("lease_id", "hold_id") if data.get(key) is not None}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return {}

    def _refresh(self, lease_id: int, action: str) -> int:
        """LeaseKeepAlive once; the remaining TTL, or -1 when etcd no longer has the lease."""
        from etcd3gw import exceptions as etcd_errors

        def keepalive(client: Any) -> int:
            try:
                result = client.post(client.get_url("/lease/keepalive"), json={"ID": lease_id})
            except etcd_errors.Etcd3Exception as exc:
                if "lease not found" in str(exc.detail_text or exc):
                    return -1
                raise
            return int(result.get("result", {}).get("TTL", -1))

        return self._call(action, (), keepalive)

    def keepalive(self, held: Sequence[str]) -> bool:
        """Renew both leases; False when etcd had let the hold lease expire (the claims are gone). A liveness lease
        that ran out (a long stall) is granted anew with the liveness key."""
        if self._lease_id is None or self._hold_id is None:
            return False
        if self._refresh(self._hold_id, "renew the node's hold lease") <= 0:
            return False
        if self._refresh(self._lease_id, "renew the node's liveness lease") <= 0:
            self._lease_id = self._resume_or_grant(None, self.options.lease_ttl, "liveness")
            write_atomic(
                self._lease_file,
                json.dumps({"lease_id": self._lease_id, "hold_id": self._hold_id, "node": self.node}).encode(),
            )
            self._put_liveness()
        return True

    # --- claims

    def _read(self, action: str, slots: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The current key-values of ``slots`` (absent ones missing), read in one transaction."""
        txn = {"success": [{"request_range": {"key": _b64(self._base + slot)}} for slot in slots]}
        result = self._txn(action, slots, txn)
        found: dict[str, dict[str, Any]] = {}
        for response in result.get("responses", []):
            for kv in response.get("response_range", {}).get("kvs", []):
                found[_unb64(kv["key"])[len(self._base) :]] = kv
        return found

    def _claim_of(self, slot: str, kv: Mapping[str, Any]) -> Claim:
        try:
            value = json.loads(_unb64(kv.get("value", "")))
            return Claim(slot, str(value["holder"]), float(value["since"]))
        except (ValueError, KeyError, TypeError):
            return Claim(slot, f"<unreadable value of {self._base + slot}>", time.time())

    def claim(self, slots: Sequence[str]) -> None:
        """One transaction creating (or keeping) every slot's key on this node's lease, or nothing."""
        ordered = sorted_slots(slots)
        for _ in range(_TXN_ATTEMPTS):
            current = self._read("claim slot(s)", ordered)
            compares: list[dict[str, Any]] = []
            puts: list[dict[str, Any]] = []
            now = time.time()
            for slot in ordered:
                key = _b64(self._base + slot)
                kv = current.get(slot)
                since = now
                if kv is None:
                    compares.append({"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0"})
                else:
                    claim = self._claim_of(slot, kv)
                    if claim.holder != self.node:
                        raise SlotTakenError.of(self.resource, claim)
                    since = claim.since
                    compares.append(
                        {"key": key, "target": "MOD", "result": "EQUAL", "mod_revision": kv["mod_revision"]}
                    )
                value = json.dumps({"holder": self.node, "since": since})
                puts.append({"request_put": {"key": key, "value": _b64(value), "lease": str(self._hold_id)}})
            result = self._txn("claim slot(s)", ordered, {"compare": compares, "success": puts})
            if result.get("succeeded"):
                return
        raise StoreUnavailableError.of(self.description, "claim slot(s)", ordered, _CHURN)

    def release(self, slots: Sequence[str]) -> None:
        """Delete this node's keys among ``slots`` in one transaction guarded by their ``mod_revision``."""
        ordered = sorted_slots(slots)
        for _ in range(_TXN_ATTEMPTS):
            current = self._read("release slot(s)", ordered)
            mine = {s: kv for s, kv in current.items() if self._claim_of(s, kv).holder == self.node}
            if not mine:
                return
            compares = [
                {"key": kv["key"], "target": "MOD", "result": "EQUAL", "mod_revision": kv["mod_revision"]}
                for kv in mine.values()
            ]
            deletes = [{"request_delete_range": {"key": kv["key"]}} for kv in mine.values()]
            if self._txn("release slot(s)", ordered, {"compare": compares, "success": deletes}).get("succeeded"):
                return
        raise StoreUnavailableError.of(
            self.description, "release slot(s)", ordered, "the keys kept changing; try again"
        )

    def holders(self) -> Mapping[str, Claim]:
        """Every key under ``<prefix>/<resource>/``: the standing claims (etcd deleted those whose hold ran out);
        a claim whose holder's liveness key is gone says so (:attr:`Claim.kept`)."""
        txn = {"success": [_range(self._base), _range(self._nodes)]}
        result = self._txn("read the slots' holders", (), txn)
        responses = result.get("responses", [])
        slots = responses[0].get("response_range", {}).get("kvs", []) if responses else []
        nodes = responses[1].get("response_range", {}).get("kvs", []) if len(responses) > 1 else []
        alive = {_unb64(kv["key"])[len(self._nodes) :] for kv in nodes}
        claims: dict[str, Claim] = {}
        for kv in slots:
            slot = _unb64(kv["key"])[len(self._base) :]
            claim = self._claim_of(slot, kv)
            if claim.holder not in alive and claim.holder != self.node:
                claim = Claim(
                    claim.slot,
                    claim.holder,
                    claim.since,
                    claim.renewed,
                    f"kept: node {claim.holder}'s daemon stopped renewing its liveness key (crashed, restarting, or "
                    "its node is gone); its claims stand until its hold lease runs out (hold_ttl after its last "
                    "renewal), as its pods may still use them",
                )
            claims[slot] = claim
        return claims

    def watch(self, changed: Callable[[], None]) -> EtcdPrefixWatch:
        """Call ``changed`` at every change of a claim of this resource, through etcd's watch API on its own
        clients (a stream holds its connection).

        Fast path (issue 42): a claim another node deletes is read at once instead of at the next
        ``refresh_interval`` read, which saved up to that interval (1 s by default, half on average) of every
        hand-over. Lease renewals change no key: an idle cluster sends nothing on the stream.
        """
        return EtcdPrefixWatch(self._make_clients(), self._base, changed, connect_timeout=self.options.timeout).start()

    def close(self) -> None:
        """Stop using etcd; the lease is left to expire (or to be resumed by the next start)."""
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            session = getattr(client, "session", None)
            if session is not None:
                session.close()
