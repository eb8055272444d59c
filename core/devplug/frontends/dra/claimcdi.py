"""One CDI spec file per prepared DRA claim: what each of its requests gives a container, as CDI devices.

A DRA driver hands devices to containers only through CDI: ``NodePrepareResources``
answers fully qualified CDI device IDs whose spec files the driver wrote
(``k8s.io/kubelet/pkg/apis/dra/v1``; the container runtime reads the spec dir,
normally ``/var/run/cdi``). A container may use the whole claim or one of its
requests (``resources.claims[].request``): the kubelet gives it the CDI IDs of
the devices of that request. So each request becomes one CDI device:

* the file ``<spec_dir>/dra-<driver>-<claim uid>.json``, kind ``<driver>/claim``,
  one device per request, ``<claim uid>-<request>``, whose ``containerEdits``
  hold the environment, device nodes and mounts of that request (the format and
  the lowest ``cdiVersion`` as :func:`devplug.engine.cdi.build_spec` writes
  them): what the request's devices describe, and what the driver's ``allocate``
  answered for the claim (one answer per claim: every request gets it); written
  atomically before the kubelet gets the answer, deleted when the claim is
  unprepared;
* the file name does not start with ``devplug-``, so the start-up clean-up of the
  resources' own spec files (:func:`devplug.engine.cdi.remove_stale_specs`)
  leaves prepared claims' files alone across a daemon restart;
* a copy is kept in the resource's state folder (``keep_dir``): the spec dir is
  usually a tmpfs (``/var/run``) that a reboot empties while the kubelet still
  holds the claim prepared (``dra_manager_state``) and starts its containers
  again; :meth:`ClaimCdiSpecs.restore` writes a spec back from its copy when it
  is missing or differs (at start for every prepared claim, and when the kubelet
  prepares it again).

**Durability.** Both files are replaced atomically (a temporary file renamed over
the name: never a mix, whenever the daemon is killed). Only the kept copy is
fdatasync'ed (and its folder fsync'ed) before the kubelet gets its answer: it is
what survives a power loss, and what the spec is made again from. The spec in the
spec dir is written without syncs (one write and a rename): on the usual tmpfs a
sync does nothing, and on a disk a power loss that tore or lost it is repaired
by :meth:`ClaimCdiSpecs.restore` at start, which compares it with the kept copy.
Both are written in one trip to a worker thread. A removal unlinks both without
a sync: a kept copy a power loss brings back has no record of its claim, and the
reconciliation removes it.

A request with nothing for the container (no env, device node or mount) gets
no CDI device (CDI refuses a device without edits), a claim with none no file.
Container annotations cannot be carried by CDI; they are dropped (and logged).

File names come only from claim UIDs that are Kubernetes UIDs
(:func:`devplug.kube.ids.is_uid`), and each path must stay in its folder; any
other UID names no file (an ``OSError``, ``EINVAL``), whoever passed it. A spec
is removed only when something says this daemon wrote it: a ledger record of
the claim, or the kept copy (written with the spec, it is the record of the
spec across restarts and lost ledgers); each removal is logged with the claim.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from devplug.atomic import write_atomic
from devplug.engine import SPEC_FILE_MODE, build_spec
from devplug.kube.ids import is_uid
from devplug.text.logsafe import shorten
from devplug.types import ContainerAllocation

__all__ = ["ClaimCdiSpecs"]

log = logging.getLogger("devplug.frontends.dra")


def _write(path: Path, data: bytes, *, sync: bool = True) -> None:
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    write_atomic(path, data, SPEC_FILE_MODE, sync=sync)


def _write_both(kept: Path, spec: Path, data: bytes) -> None:
    """The kept copy, durable (see the module's docstring), then the spec, atomic but not synced."""
    _write(kept, data)
    _write(spec, data, sync=False)


def _holds(path: Path, data: bytes) -> bool | None:
    """Whether ``path`` is a regular file holding ``data`` (None: there is nothing). Opened without following a
    link or blocking on a FIFO: anything but a regular file holds something else, and is replaced."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != len(data):
            return False
        return os.read(fd, len(data) + 1) == data
    except OSError:
        return False
    finally:
        os.close(fd)


def _remove(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def _inside(folder: Path, name: str) -> Path:
    """``folder / name``, refused (``OSError``, ``EINVAL``) unless it is a plain file name in ``folder``."""
    path = folder / name
    plain = name not in ("", ".", "..") and "/" not in name and "\0" not in name
    if not plain or Path(os.path.normpath(path)).parent != Path(os.path.normpath(folder)):
        raise OSError(errno.EINVAL, f"'{shorten(name)}' is not a file name in {folder}; refused")
    return path


class ClaimCdiSpecs:
    """The CDI spec files of one DRA driver's prepared claims."""

    def __init__(self, spec_dir: Path, driver: str, keep_dir: Path) -> None:
        self.spec_dir = spec_dir
        self.driver = driver
        self.keep_dir = keep_dir
        self.kind = f"{driver}/claim"

    @staticmethod
    def _checked(claim_uid: str) -> str:
        if not is_uid(claim_uid):
            raise OSError(
                errno.EINVAL, f"claim uid '{shorten(claim_uid)}' is not a Kubernetes UID: it names no CDI spec file"
            )
        return claim_uid

    def path(self, claim_uid: str) -> Path:
        """The claim's spec file; ``OSError`` (``EINVAL``) when ``claim_uid`` is not a Kubernetes UID."""
        return _inside(self.spec_dir, f"dra-{self.driver}-{self._checked(claim_uid)}.json")

    def _kept(self, claim_uid: str) -> Path:
        return _inside(self.keep_dir, f"{self._checked(claim_uid)}.json")

    def device_id(self, claim_uid: str, request: str) -> str:
        """The fully qualified CDI device ID of a claim's request: ``<driver>/claim=<uid>-<request>``."""
        return f"{self.kind}={claim_uid}-{request}"

    async def write(self, claim_uid: str, requests: Mapping[str, ContainerAllocation]) -> dict[str, str]:
        """Write the claim's spec from what each request gives; the CDI device ID of each request that gives the
        container something. Raises ``OSError`` when the file cannot be written."""
        described = []
        for request, allocation in sorted(requests.items()):
            edits = ContainerAllocation(envs=allocation.envs, mounts=allocation.mounts, devices=allocation.devices)
            if allocation.annotations:
                log.debug(
                    "claim %s: container annotations %s cannot go through CDI; dropped",
                    claim_uid,
                    sorted(allocation.annotations),
                )
            if edits != ContainerAllocation():
                described.append((request, edits))
        if not described:
            await self.remove(claim_uid, recorded=True)
            return {}
        # Named here (``str`` keeps the names), not through a function of this module build_spec would call back.
        spec = build_spec(self.kind, [(f"{claim_uid}-{request}", edits) for request, edits in described], name=str)
        if spec is None:  # build_spec makes a spec of every non-empty list of described devices
            raise ValueError(f"claim {claim_uid}: no CDI spec was built from {len(described)} described request(s)")
        data = (json.dumps(spec, indent=2) + "\n").encode()
        await asyncio.to_thread(_write_both, self._kept(claim_uid), self.path(claim_uid), data)
        return {request: self.device_id(claim_uid, request) for request, _ in described}

    async def restore(self, claim_uid: str) -> dict[str, str]:
        """The CDI device IDs of the claim's requests (as :meth:`write` gave them), its spec written back from the
        kept copy if the spec dir lost it or holds other bytes (a power loss tore it); empty when the claim has no
        spec. Raises ``OSError`` when it cannot."""

        def restore() -> dict[str, str]:
            try:
                data = self._kept(claim_uid).read_bytes()
            except FileNotFoundError:
                return {}
            spec = self.path(claim_uid)
            found = _holds(spec, data)
            if found is not True:
                _write(spec, data, sync=False)
                why = "the spec dir lost it" if found is None else "the spec dir held something else"
                log.warning("restored the CDI spec %s of a prepared claim (%s)", spec, why)
            prefix = f"{claim_uid}-"
            names = [str(d["name"]) for d in json.loads(data)["devices"]]
            return {n[len(prefix) :]: f"{self.kind}={n}" for n in names if n.startswith(prefix)}

        return await asyncio.to_thread(restore)

    async def kept(self) -> list[str]:
        """The UIDs of the claims whose spec is kept (files not named after a Kubernetes UID are not this
        daemon's: they are left alone)."""

        def listing() -> list[str]:
            try:
                names = os.listdir(self.keep_dir)
            except FileNotFoundError:
                return []
            return sorted(n[: -len(".json")] for n in names if n.endswith(".json") and is_uid(n[: -len(".json")]))

        return await asyncio.to_thread(listing)

    async def remove(self, claim_uid: str, *, recorded: bool, claim: str | None = None) -> None:
        """Delete the claim's spec and its kept copy, if this daemon wrote them: ``recorded`` (a ledger record of
        the claim says it was prepared here) or the kept copy is there; else nothing is touched. ``claim`` names
        the claim in the log (default: its UID). A failure, or a UID that is not a Kubernetes UID, is logged (a
        stale spec names a claim no container can get any more)."""
        who = claim or f"claim uid {shorten(claim_uid)}"

        def remove() -> list[Path]:
            spec, kept = self.path(claim_uid), self._kept(claim_uid)
            if not recorded and not kept.exists():
                return []  # not written by this daemon (or removed already): not ours to delete
            return [path for path in (spec, kept) if _remove(path)]

        try:
            removed = await asyncio.to_thread(remove)
        except OSError as exc:
            log.error("cannot remove the CDI spec of %s: %s", who, exc)
            return
        if removed:
            log.info("removed the CDI spec of %s: %s", who, ", ".join(str(p) for p in removed))
