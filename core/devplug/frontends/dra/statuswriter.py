"""Writing a prepared claim's device status into the API server, and taking it away at unprepare (KEP-4817).

:class:`ClaimStatusWriter` holds, for one DRA driver on one node, the ``status.devices`` entries
(:mod:`~devplug.frontends.dra.devicestatus`) of each claim it prepared, and writes them:

* **how**: a server-side apply of ``{"status": {"devices": [...]}}`` on the claim's ``status`` subresource,
  field manager the DRA driver's name, forced, as the Go drivers do (kubernetes-sigs/dranet,
  ``pkg/driver/nri_hooks.go``: ``ResourceClaims(ns).ApplyStatus(ctx, claim, metav1.ApplyOptions{FieldManager:
  driverName, Force: true})``, in the background, failures logged, never failing the pod). ``status.devices`` is a
  list map keyed by driver, device, pool and shareID (``+listType=map`` in ``k8s.io/api/resource/v1/types.go``), so
  each entry is owned by the manager that applied it: another driver's entries stay as they are. The version is the
  one discovery chose (:class:`~devplug.frontends.dra.apiversions.DraApi`); ``status.devices`` has one shape in
  ``v1``, ``v1beta2`` and ``v1beta1`` (``shareID`` from 1.34, gate ``DRAConsumableCapacity``);
* **when**: after a prepare answered (:meth:`prepared`), in the background: the workload has its devices, the
  status is information, so no failure of it fails the prepare. Again when the kubelet repeats the prepare
  (:meth:`again`; an apply of the same entries is no write for the server), and at start for every claim still
  held (:meth:`resume`: a daemon killed before its write finished);
* **removal**: at unprepare (:meth:`unprepared`), an apply of ``{"status": {"devices": []}}`` as the same manager:
  server-side apply removes the entries that manager owned and no longer sends, and only those. A claim already
  deleted (``404``) has nothing to remove;
* **kept**: the entries of each claim are kept in ``<state dir>/<uid>.json`` (:func:`devplug.atomic.write_json_atomic`,
  written before the apply, so it survives ``kill -9``), with the claim's namespace and name; a removal marks it
  ``removing`` first, and the file goes once the entries are gone. So a restarted daemon writes the entries of
  the claims it holds again, and finishes the removals an earlier run began;
* **failures**: ``5xx``, ``429``, ``409``, ``403`` and network errors are retried with devplug's one backoff
  (:class:`~devplug.backoff.Backoff`, ``Retry-After`` honoured), :data:`ATTEMPTS` times in all, each logged with
  the claim and its devices; ``422`` (the driver's data is invalid for the server: ``validateDeviceStatus``,
  ``pkg/apis/resource/validation/validation.go``) is logged once, naming the claim, the devices and the server's
  message, and not retried. ``403`` usually means missing RBAC: ``patch`` on ``resourceclaims/status`` and, with
  ``DRAResourceClaimGranularStatusAuthorization`` (beta and on in 1.36), ``associated-node:patch`` on the
  synthetic ``resourceclaims/driver`` named after the driver (``pkg/registry/resource/authz.go``,
  ``AuthorizedForDeviceStatus``);
* **not supported**: a server whose gate ``DRAResourceClaimDeviceStatus`` is off (alpha and off in 1.32, beta and
  on from 1.33, GA in 1.37: ``pkg/features/kube_features.go``) drops ``status.devices`` on write
  (``dropDisabledDRAResourceClaimDeviceStatusFields``, ``pkg/registry/resource/resourceclaim/strategy.go``): the
  answer lacks the entries it was sent. That is noted once (a warning, and :meth:`describe` says why), and
  nothing more is written for this daemon's run.

Counts and the last failure are in :meth:`describe` (``devplug status``, the resource's DRA ``claim_status``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devplug.atomic import read_json, write_json_atomic
from devplug.backoff import Backoff
from devplug.frontends.dra.claims import ClaimRef
from devplug.frontends.dra.devicestatus import StatusEntries, entry_key
from devplug.kube.client import describe_api_error, not_served
from devplug.kube.ids import is_uid
from devplug.text.logsafe import id_list, shorten

if TYPE_CHECKING:
    from lightkube import AsyncClient

    from devplug.frontends.dra.apiversions import DraApi

__all__ = ["ATTEMPTS", "ClaimStatusWriter"]

log = logging.getLogger("devplug.frontends.dra")

#: How many times a write or a removal is tried before it is given up (logged, counted in :meth:`describe`).
ATTEMPTS = 6
#: The backoff between tries: 0.5 s, doubling, at most 10 s (about 25 s in all).
RETRY_MIN_S = 0.5
RETRY_MAX_S = 10.0

_WRITTEN = "written"
_REMOVING = "removing"


class _Refused(Exception):
    """The server refused the write for good (422): retrying would not help."""


class _NotKept(Exception):
    """The server dropped ``status.devices`` (its gate is off)."""


@dataclass
class _Kept:
    """One claim's kept file: its reference, its entries and whether they are being removed."""

    claim: ClaimRef
    entries: list[dict[str, Any]]
    device_ids: list[str]
    state: str = _WRITTEN

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.claim.namespace,
            "name": self.claim.name,
            "uid": self.claim.uid,
            "entries": self.entries,
            "device_ids": self.device_ids,
            "state": self.state,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> _Kept:
        claim = ClaimRef(str(data["namespace"]), str(data["name"]), str(data["uid"]))
        entries = [dict(e) for e in data.get("entries") or () if isinstance(e, Mapping)]
        ids = [str(i) for i in data.get("device_ids") or ()]
        return cls(claim, entries, ids, str(data.get("state", _WRITTEN)))


class ClaimStatusWriter:
    """The device status of one driver's claims on one node (see the module's docstring).

    ``client``: the front end's lightkube client; ``api``: the ``resource.k8s.io`` version in use; ``state_dir``:
    where each claim's entries are kept (made when first needed).
    """

    def __init__(self, client: AsyncClient, api: DraApi, *, driver: str, name: str, state_dir: Path) -> None:
        self._client = client
        self._api = api
        self.driver = driver
        self.name = name
        self.state_dir = Path(state_dir)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        #: The UIDs whose entries are kept in the state folder (read or written by this run), so that the unprepare
        #: of a claim with no status costs no look at the disk (a worker thread's hop: ~0.4 ms of every unprepare).
        self._kept: set[str] = set()
        #: Why nothing is written (the server drops ``status.devices``), or None.
        self.unsupported: str | None = None
        self.written = 0
        self.removed = 0
        self.failures = 0
        self.invalid = 0
        self.last_error: str | None = None
        #: Claims (by UID) whose 422 was logged: each is logged once.
        self._invalid_logged: set[str] = set()

    # --- what the preparer calls

    async def prepared(self, claim: ClaimRef, found: StatusEntries) -> None:
        """A claim was prepared and the driver said ``found`` of its devices: keep the entries, and write them in
        the background. Returns once they are kept (a claim with no entries keeps nothing); never raises for the
        status (a file that cannot be kept is logged: the claim is prepared)."""
        if found.unmatched:
            log.warning(
                "[%s] the driver's allocate gave a device status for %s, which %s was not given: left out",
                self.name,
                id_list(found.unmatched),
                claim,
            )
        if not found.entries or self.unsupported is not None:
            return
        kept = _Kept(claim, [dict(e) for e in found.entries], list(found.device_ids))
        try:
            await asyncio.to_thread(self._save, kept)
        except (OSError, ValueError) as exc:
            log.error("[%s] cannot keep the device status of %s in %s: %s", self.name, claim, self.state_dir, exc)
        self._start(claim.uid, self._write(kept))

    async def again(self, claim: ClaimRef) -> bool:
        """The kubelet prepared ``claim`` again: write its kept entries again (in the background), in case they are
        missing (a daemon killed before its write, someone removed them). Whether entries were kept for it (none:
        the caller may have them from elsewhere, :meth:`prepared`)."""
        if self.unsupported is not None:
            return True
        kept = await asyncio.to_thread(self._load, claim.uid)
        if kept is not None and kept.state == _WRITTEN and claim.uid not in self._tasks:
            self._start(claim.uid, self._write(kept))
        return kept is not None

    async def unprepared(self, claim: ClaimRef) -> None:
        """``claim`` was unprepared: remove its entries in the background (a write still trying is stopped first).
        Returns once the removal is marked in its kept file; nothing kept, nothing to remove."""
        if claim.uid not in self._kept and claim.uid not in self._tasks:
            return
        await self._stop(claim.uid)
        kept = await asyncio.to_thread(self._load, claim.uid)
        if kept is None:
            return
        kept.state = _REMOVING
        try:
            await asyncio.to_thread(self._save, kept)
        except (OSError, ValueError) as exc:
            log.error("[%s] cannot mark the device status of %s for removal: %s", self.name, claim, exc)
        self._start(claim.uid, self._remove(kept))

    async def resume(self, held: Iterable[str]) -> None:
        """At start: write again the entries of the claims still ``held`` (by UID), and remove those of the others
        (an unprepare an earlier run began, or a claim released while the daemon was down)."""
        wanted = set(held)
        for kept in await asyncio.to_thread(self._all):
            if kept.state == _WRITTEN and kept.claim.uid in wanted:
                if self.unsupported is None:
                    self._start(kept.claim.uid, self._write(kept))
            else:
                kept.state = _REMOVING
                self._start(kept.claim.uid, self._remove(kept))

    async def idle(self) -> None:
        """Return once no write or removal runs (for tests and a stop)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

    async def close(self) -> None:
        """Stop the writes and removals under way (their files stay: the next run finishes them)."""
        for uid in list(self._tasks):
            await self._stop(uid)

    def describe(self) -> dict[str, Any]:
        """For ``devplug status``."""
        return {
            "written": self.written,
            "removed": self.removed,
            "failures": self.failures,
            "invalid": self.invalid,
            "pending": len(self._tasks),
            "last_error": self.last_error,
            "unsupported": self.unsupported,
        }

    # --- tasks, one per claim

    def _start(self, uid: str, work: Any) -> None:
        """Run ``work`` for the claim ``uid``, in place of any still running for it (newer entries win)."""
        previous = self._tasks.get(uid)
        if previous is not None:
            previous.cancel()
        task = asyncio.ensure_future(work)
        self._tasks[uid] = task

        def done(t: asyncio.Task[None]) -> None:
            if self._tasks.get(uid) is t:
                del self._tasks[uid]
            if not t.cancelled() and t.exception() is not None:
                log.error("[%s] the device status task of claim uid %s failed: %r", self.name, uid, t.exception())

        task.add_done_callback(done)

    async def _stop(self, uid: str) -> None:
        task = self._tasks.pop(uid, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # --- the API server

    def _body(self, claim: ClaimRef, entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return {
            "apiVersion": self._api.choice.api_version,
            "kind": "ResourceClaim",
            "metadata": {"name": claim.name, "namespace": claim.namespace},
            "status": {"devices": [dict(e) for e in entries]},
        }

    async def _apply(self, claim: ClaimRef, entries: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
        """Apply ``entries`` as the claim's ``status.devices`` of this driver; the claim as stored after, or None
        when there is no such claim (404)."""
        from lightkube import ApiError
        from lightkube.types import PatchType

        version = self._api.version
        resource = importlib.import_module(f"lightkube.resources.resource_{version}").ResourceClaimStatus
        try:
            answer = await self._client.patch(
                resource,
                claim.name,
                self._body(claim, entries),
                namespace=claim.namespace,
                patch_type=PatchType.APPLY,
                field_manager=self.driver,
                force=True,
            )
        except ApiError as exc:
            if not_served(exc):
                with contextlib.suppress(Exception):
                    await self._api.refresh(f"writing the device status of {claim} answered {exc.status.message}")
                raise
            if exc.status.code == 404:
                return None
            if exc.status.code == 422:
                raise _Refused(str(exc.status.message or describe_api_error(exc)[0])) from exc
            raise
        stored: dict[str, Any] = answer.to_dict()
        return stored

    def _check_kept(self, stored: Mapping[str, Any], entries: Sequence[Mapping[str, Any]]) -> None:
        """:class:`_NotKept` when the answer holds none of the entries sent (the server drops the field)."""
        if not entries:
            return
        back = {entry_key(e) for e in (stored.get("status") or {}).get("devices") or () if isinstance(e, Mapping)}
        if not any(entry_key(e) in back for e in entries):
            raise _NotKept(
                f"the API server ({self._api.choice.api_version}) dropped status.devices from the claim it was "
                "written to: its feature gate DRAResourceClaimDeviceStatus is off (alpha in 1.32, on by default "
                "from 1.33)"
            )

    async def _attempts(self, what: str, kept: _Kept, entries: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
        """Apply ``entries`` until it works, at most :data:`ATTEMPTS` times; raises the last failure."""
        backoff = Backoff(RETRY_MIN_S, RETRY_MAX_S)
        devices = id_list(kept.device_ids) or "its devices"
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return await self._apply(kept.claim, entries)
            except _Refused:
                raise
            except Exception as exc:
                message, retry_after = describe_api_error(exc)
                self.last_error = f"{kept.claim}: {what}: {message}"
                hint = ""
                if getattr(getattr(exc, "status", None), "code", None) == 403:
                    hint = (
                        " (RBAC: patch on resourceclaims/status, and associated-node:patch on resourceclaims/driver "
                        f"named {self.driver})"
                    )
                if attempt == ATTEMPTS:
                    raise
                delay = backoff.next(retry_after)
                log.warning(
                    "[%s] %s of %s (%s) failed: %s%s; trying again in %.1f s",
                    self.name,
                    what,
                    kept.claim,
                    devices,
                    message,
                    hint,
                    delay,
                )
                await asyncio.sleep(delay)
        return None  # not reached

    async def _write(self, kept: _Kept) -> None:
        devices = id_list(kept.device_ids) or "its devices"
        try:
            stored = await self._attempts("writing the device status", kept, kept.entries)
            if stored is not None:
                self._check_kept(stored, kept.entries)
        except _Refused as exc:
            self.invalid += 1
            self.last_error = f"{kept.claim}: the device status of {devices} is invalid: {shorten(str(exc), 1024)}"
            if kept.claim.uid not in self._invalid_logged:
                self._invalid_logged.add(kept.claim.uid)
                log.error(
                    "[%s] the API server refused the device status the driver gave for %s of %s (the claim stays "
                    "prepared): %s",
                    self.name,
                    devices,
                    kept.claim,
                    shorten(str(exc), 1024),
                    extra={"device": devices},
                )
            return
        except _NotKept as exc:
            if self.unsupported is None:
                self.unsupported = str(exc)
                log.warning(
                    "[%s] %s; no device status is written into claims from now on (this daemon's run)", self.name, exc
                )
            return
        except Exception as exc:
            self.failures += 1
            self.last_error = f"{kept.claim}: writing the device status: {describe_api_error(exc)[0]}"
            log.error(
                "[%s] gave up writing the device status of %s of %s after %d tries: %s (written again when the "
                "kubelet prepares it again, or at the next start)",
                self.name,
                devices,
                kept.claim,
                ATTEMPTS,
                describe_api_error(exc)[0],
                extra={"device": devices},
            )
            return
        if stored is None:
            log.info("[%s] %s is gone: its device status was not written", self.name, kept.claim)
            return
        self.written += 1
        log.info("[%s] wrote the device status of %s into %s", self.name, devices, kept.claim)

    async def _remove(self, kept: _Kept) -> None:
        try:
            await self._attempts("removing the device status", kept, [])
        except Exception as exc:  # _Refused too: an empty list is never invalid, but say so if it is
            self.failures += 1
            self.last_error = f"{kept.claim}: removing the device status: {describe_api_error(exc)[0]}"
            log.error(
                "[%s] gave up removing the device status of %s: %s (tried again at the next start)",
                self.name,
                kept.claim,
                describe_api_error(exc)[0],
            )
            return
        self.removed += 1
        await asyncio.to_thread(self._drop, kept.claim.uid)
        log.info("[%s] removed the device status of %s", self.name, kept.claim)

    # --- the kept files

    def _path(self, uid: str) -> Path:
        if not is_uid(uid):  # a UID names the file: nothing else may
            raise ValueError(f"{shorten(uid)!r} is not a Kubernetes UID")
        return self.state_dir / f"{uid}.json"

    def _save(self, kept: _Kept) -> None:
        path = self._path(kept.claim.uid)
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._kept.add(kept.claim.uid)  # before the write: a failed write may still have left the file
        write_json_atomic(path, kept.to_json())

    def _load(self, uid: str) -> _Kept | None:
        try:
            found = _Kept.from_json(read_json(self._path(uid)))
            self._kept.add(uid)
            return found
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("[%s] ignoring the kept device status of claim uid %s: %s", self.name, shorten(uid), exc)
            return None

    def _all(self) -> list[_Kept]:
        try:
            names = sorted(os.listdir(self.state_dir))
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            uid, dot, ext = name.rpartition(".")
            if dot and ext == "json" and is_uid(uid):
                kept = self._load(uid)
                if kept is not None:
                    found.append(kept)
        return found

    def _drop(self, uid: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(uid).unlink()
        self._kept.discard(uid)
