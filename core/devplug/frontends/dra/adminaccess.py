"""Admin access (KEP-5018): claims that reach devices other claims may hold, for monitoring, without exclusivity.

A request with ``adminAccess: true`` (``k8s.io/api/resource/v1/types.go``,
``ExactDeviceRequest.AdminAccess``: such claims "ignore all ordinary claims to the
device with respect to access modes and any resource allocations") is allocated
devices whether or not other claims hold them, and its results carry
``adminAccess: true`` (``allocateDevice`` in
``k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go``:
an admin-access request skips the in-use check). The front end prepares such a
result without the core: no ledger record (other claims keep preparing the device,
and it stays offered), no driver hook (``allocate``, ``pre_start``, ``post_stop``,
``deallocate``: nothing is set up for it, so nothing is cleaned); the container
gets the device's own description (``Device.allocation``: device nodes, mounts,
envs) through the claim's CDI spec, and unprepare removes only that spec.

**Who may.** Since Kubernetes 1.33 the API server refuses a claim (or claim
template, or claim status) asking for admin access unless its namespace carries
the label ``resource.kubernetes.io/admin-access: "true"``
(``pkg/registry/resource/utils.go``, ``AuthorizedForAdmin`` and
``AuthorizedForAdminStatus``; the key is ``DRAAdminNamespaceLabelKey`` in
``k8s.io/api/resource/v1/types.go`` v0.34.0 and later, ``resource.k8s.io/admin-access``
in 1.33's v1beta1, v0.33.0, which is accepted too, for a 1.33 control plane).
The front end checks it again at
prepare (:class:`NamespaceCheck`: a GET of the namespace): a server older than
that, or a label removed since the claim was made, and the claim is refused
(:class:`AdminAccessRefusedError`, naming the namespace and the label); the
daemon needs ``get`` on ``namespaces`` for it (``deploy/components/dra/rbac.yaml``).

**What is kept.** The admin-access claims prepared here are kept in one small
file of the resource's state folder (:class:`AdminClaims`, written atomically and
synced before the kubelet gets its answer, so a daemon killed at any point still
knows them): a repeated prepare answers from it (the namespace is not asked
again: the containers were given the device already), an unprepare after a restart
removes the spec, and the claim reconciliation forgets a claim that is gone
(:mod:`devplug.frontends.dra.reconcile`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from devplug.atomic import write_json_atomic
from devplug.frontends.dra.claims import ClaimError, ClaimReadError, ClaimRef

if TYPE_CHECKING:
    from lightkube import AsyncClient

__all__ = ["ADMIN_NAMESPACE_LABEL", "AdminAccessRefusedError", "AdminClaim", "AdminClaims", "NamespaceCheck"]

log = logging.getLogger("devplug.frontends.dra")

#: ``k8s.io/api/resource/v1/types.go``, ``DRAAdminNamespaceLabelKey`` (v0.34.0 and later).
ADMIN_NAMESPACE_LABEL = "resource.kubernetes.io/admin-access"
#: The same label as Kubernetes 1.33 named it (``k8s.io/api/resource/v1beta1/types.go`` v0.33.0).
ADMIN_NAMESPACE_LABEL_1_33 = "resource.k8s.io/admin-access"
#: The file's format version.
_VERSION = 1


class AdminAccessRefusedError(ClaimError):
    """The claim's namespace does not allow admin access (no ``resource.kubernetes.io/admin-access: "true"``)."""


class NamespaceCheck:
    """Whether a namespace allows admin access, asked of the API server at each fresh prepare."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def check(self, claim: ClaimRef, devices: Iterable[str]) -> None:
        """Return when ``claim``'s namespace carries the label; :class:`AdminAccessRefusedError` when it does not
        (or does not exist), :class:`ClaimReadError` when the API server cannot tell (the kubelet retries)."""
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Namespace

        from devplug.kube.client import describe_api_error

        shown = ", ".join(devices)
        try:
            found = await self._client.get(Namespace, claim.namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                raise AdminAccessRefusedError(
                    claim,
                    f'admin access to {shown} needs the label {ADMIN_NAMESPACE_LABEL}: "true" on namespace '
                    f"{claim.namespace}, which the API server does not have; nothing was prepared",
                ) from exc
            if exc.status.code == 403:
                raise ClaimReadError(
                    f"{claim}: admin access needs namespace {claim.namespace}'s label {ADMIN_NAMESPACE_LABEL}, and "
                    f"the API server refused to give the namespace ({describe_api_error(exc)[0]}): the daemon's "
                    "ClusterRole needs get on namespaces"
                ) from exc
            raise ClaimReadError(
                f"{claim}: reading namespace {claim.namespace} for its admin-access label failed: "
                f"{describe_api_error(exc)[0]}"
            ) from exc
        except Exception as exc:
            raise ClaimReadError(
                f"{claim}: reading namespace {claim.namespace} for its admin-access label failed: "
                f"{describe_api_error(exc)[0]}"
            ) from exc
        labels = (found.metadata.labels if found.metadata is not None else None) or {}
        value = labels.get(ADMIN_NAMESPACE_LABEL)
        if value != "true" and labels.get(ADMIN_NAMESPACE_LABEL_1_33) != "true":
            has = f"it is {value!r}" if value is not None else "it has none"
            raise AdminAccessRefusedError(
                claim,
                f'admin access to {shown} is allowed only in a namespace labelled {ADMIN_NAMESPACE_LABEL}: "true" '
                f"(KEP-5018); namespace {claim.namespace} is not ({has}); nothing was prepared",
            )


@dataclass(frozen=True)
class AdminClaim:
    """One admin-access claim prepared here: its ``namespace/name`` and the device IDs of its admin part."""

    claim: str
    devices: tuple[str, ...]

    def ref(self, uid: str) -> ClaimRef:
        namespace, _, name = self.claim.partition("/")
        return ClaimRef(namespace, name, uid)


class AdminClaims:
    """The admin-access claims prepared here, by claim UID, kept in ``path`` (see the module's docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._claims: dict[str, AdminClaim] = self._load()
        self._lock = asyncio.Lock()

    def _load(self) -> dict[str, AdminClaim]:
        try:
            data = json.loads(self.path.read_bytes())
            claims = data["claims"]
            if data.get("version") != _VERSION or not isinstance(claims, dict):
                raise ValueError(f"version {data.get('version')!r}, claims of type {type(claims).__name__}")
            return {
                str(uid): AdminClaim(str(entry["claim"]), tuple(str(d) for d in entry["devices"]))
                for uid, entry in claims.items()
            }
        except FileNotFoundError:
            return {}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            aside = self.path.with_name(f"{self.path.name}.corrupt")
            with contextlib.suppress(OSError):
                os.replace(self.path, aside)
            log.error(
                "the admin-access claims file %s cannot be read (%s): moved to %s; the claims it held are not "
                "known any more: their CDI specs are removed by the reconciliation (no record keeps them), and a "
                "repeated prepare of one prepares it afresh",
                self.path,
                exc,
                aside,
            )
            return {}

    def get(self, claim_uid: str) -> AdminClaim | None:
        return self._claims.get(claim_uid)

    def __contains__(self, claim_uid: object) -> bool:
        return claim_uid in self._claims

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._claims))

    def __len__(self) -> int:
        return len(self._claims)

    async def put(self, claim_uid: str, claim: str, devices: Iterable[str]) -> None:
        """Keep a claim (synced before returning); ``OSError`` when the file cannot be written (nothing kept)."""
        async with self._lock:
            claims = {**self._claims, claim_uid: AdminClaim(claim, tuple(devices))}
            await asyncio.to_thread(self._write, claims)
            self._claims = claims

    async def forget(self, claim_uid: str) -> None:
        """Drop a claim (nothing when it is not kept); ``OSError`` when the file cannot be written."""
        async with self._lock:
            if claim_uid not in self._claims:
                return
            claims = {k: v for k, v in self._claims.items() if k != claim_uid}
            await asyncio.to_thread(self._write, claims)
            self._claims = claims

    def _write(self, claims: dict[str, AdminClaim]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "version": _VERSION,
            "claims": {uid: {"claim": c.claim, "devices": list(c.devices)} for uid, c in sorted(claims.items())},
        }
        write_json_atomic(self.path, payload)
