"""The ``etcd`` backend: etcd v3 transactions and leases, through etcd's HTTP/JSON gateway (etcd3gw).

::

    coordination = { backend = "etcd", endpoints = ["http://10.0.0.1:2379", "http://10.0.0.2:2379"],
                     lease_ttl = 10.0, prefix = "/devplug/shared" }

A slot's claim is the key ``<prefix>/<resource>/<slot>`` whose value is
``{"holder": <node>, "since": <unix time>}``, attached to the node's lease
(``LeaseGrant`` with ``lease_ttl``, renewed with ``LeaseKeepAlive`` every third
of it). Claiming is one transaction (etcd's ``Txn``, atomic across keys):
``create_revision == 0`` for each free slot, ``mod_revision ==`` the one read
for each slot this node already holds, then a ``Put`` of every slot with the
lease; if any compare fails, nothing is written, the keys are read again and a
slot held by another node is named with its holder. Releasing deletes this
node's keys in one transaction guarded by their ``mod_revision``. When the
daemon dies, its lease expires after ``lease_ttl`` and etcd deletes its keys;
a restart within the TTL resumes the lease (its ID is kept in the driver's
state folder), so the pods' claims survive a daemon restart.

The endpoints are tried in order: a connection error moves to the next.
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
from devplug_shared.slots import Claim, SlotTakenError, StoreUnavailableError, sorted_slots

__all__ = ["EtcdBackend", "EtcdOptions"]

T = TypeVar("T")

#: How many times a claim or release transaction is retried when the keys changed between read and write.
_TXN_ATTEMPTS = 8
_CHURN = "the keys kept changing between read and write; try again"


@dataclass(frozen=True)
class EtcdOptions:
    """``endpoints``: client URLs; ``prefix``: key prefix; ``lease_ttl``, ``timeout`` (seconds); TLS files."""

    endpoints: list[str] = field(default_factory=lambda: ["http://127.0.0.1:2379"])
    prefix: str = "/devplug/shared"
    lease_ttl: float = 10.0
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
        check_seconds("timeout", self.timeout, 0.05, 60.0)
        for name in ("ca_cert", "cert", "key"):
            check_absolute(name, getattr(self, name))
        if (self.cert is None) != (self.key is None):
            raise ValueError("cert, key: give both the client certificate and its key, or neither")


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _unb64(text: str) -> str:
    return base64.b64decode(text).decode(errors="replace")


class EtcdBackend:
    """Slot claims as etcd keys on this node's lease."""

    def __init__(self, options: EtcdOptions, *, node: str, resource: str, state_dir: Path) -> None:
        self.options = options
        self.node = node
        self.resource = resource
        self.description = f"etcd at {', '.join(options.endpoints)}"
        self._base = f"{options.prefix}/{resource}/"
        self._lease_file = state_dir / "etcd-lease.json"
        self._clients: list[Any] = []
        self._current = 0
        self._lease_id: int | None = None
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
        """Resume the lease recorded in the state folder if etcd still has it, else grant a new one."""
        lease_id = self._saved_lease()
        if lease_id is not None and self._refresh(lease_id, "resume the node's lease") > 0:
            self._lease_id = lease_id
            return
        ttl = max(1, round(self.options.lease_ttl))

        def grant(client: Any) -> int:
            result = client.post(client.get_url("/lease/grant"), json={"TTL": ttl, "ID": 0})
            return int(result["ID"])

        self._lease_id = self._call("grant the node's lease", (), grant)
        write_atomic(self._lease_file, json.dumps({"lease_id": self._lease_id, "node": self.node}).encode())

    def _saved_lease(self) -> int | None:
        try:
            data = json.loads(self._lease_file.read_text())
            return int(data["lease_id"]) if data.get("node") == self.node else None
        except (OSError, ValueError, KeyError, TypeError):
            return None

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
        """Renew the node's lease; False when etcd had let it expire (its keys are gone)."""
        if self._lease_id is None:
            return False
        return self._refresh(self._lease_id, "renew the node's lease") > 0

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
                puts.append({"request_put": {"key": key, "value": _b64(value), "lease": str(self._lease_id)}})
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
        """Every key under ``<prefix>/<resource>/``: the live claims (etcd deleted the expired ones)."""
        start = self._base
        end = start[:-1] + chr(ord(start[-1]) + 1)
        txn = {"success": [{"request_range": {"key": _b64(start), "range_end": _b64(end)}}]}
        result = self._txn("read the slots' holders", (), txn)
        claims: dict[str, Claim] = {}
        for response in result.get("responses", []):
            for kv in response.get("response_range", {}).get("kvs", []):
                slot = _unb64(kv["key"])[len(self._base) :]
                claims[slot] = self._claim_of(slot, kv)
        return claims

    def close(self) -> None:
        """Stop using etcd; the lease is left to expire (or to be resumed by the next start)."""
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            session = getattr(client, "session", None)
            if session is not None:
                session.close()
