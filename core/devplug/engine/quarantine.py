"""Clearing quarantined ledger records by hand: ``devplug quarantine clear``.

A ledger record that fails its checks on load is quarantined
(:class:`~devplug.engine.ledger.QuarantinedRecord`): the devices it names are
withheld until they are released through the driver, which happens once no
pod holds them. When the operator knows better (the devices are clean, or gone
for good), ``devplug quarantine clear`` drops such entries without calling the
driver:

* with a daemon running on the state dir, it leaves a request,
  ``<state dir>/resources/<domain>/<name>/clear-quarantine.json`` (the keys to
  clear, or ``null`` for all), which the daemon applies at its next release
  pass (:func:`apply_clear_request`) and then deletes;
* with no daemon running, it takes the state dir's lock and applies it to the
  ledger on disk itself (:func:`clear_offline`).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from devplug.atomic import write_atomic
from devplug.engine.ledger import Ledger, QuarantinedRecord, load_readonly
from devplug.engine.statedir import existing_resource_dir
from devplug.errors import StateError
from devplug.kube.names import resource_state_dir

__all__ = [
    "CLEAR_REQUEST",
    "apply_clear_request",
    "clear_offline",
    "read_quarantined",
    "request_path",
    "write_clear_request",
]

#: The request's file name, in the resource's state folder.
CLEAR_REQUEST = "clear-quarantine.json"
#: A request larger than this is not one (keys are 16 characters).
_MAX_REQUEST_BYTES = 64 * 1024


def request_path(state_dir: Path, resource: str) -> Path:
    """Where the request to clear ``resource``'s quarantined records goes."""
    return resource_state_dir(state_dir, resource) / CLEAR_REQUEST


def write_clear_request(state_dir: Path, resource: str, keys: Sequence[str] | None) -> Path:
    """Leave a request to clear ``keys`` (all when None) for the daemon; returns its path."""
    path = request_path(state_dir, resource)
    if existing_resource_dir(state_dir, resource) is None:
        raise StateError(f"{path.parent}: no state of resource {resource} here (is this the daemon's state dir?)")
    write_atomic(path, (json.dumps({"keys": None if keys is None else list(keys)}) + "\n").encode())
    return path


def _read_request(path: Path) -> list[str] | None:
    """The keys a request names (None: all); :class:`ValueError` for anything that is not a request."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_REQUEST_BYTES:
            raise ValueError("not a regular file of a request's size")
        data = json.loads(os.read(fd, _MAX_REQUEST_BYTES + 1))
    finally:
        os.close(fd)
    if not isinstance(data, dict) or "keys" not in data:
        raise ValueError('expected {"keys": [...]} or {"keys": null}')
    keys = data["keys"]
    if keys is None:
        return None
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ValueError('expected {"keys": [...]} or {"keys": null}')
    return keys


def apply_clear_request(ledger: Ledger, state_folder: Path) -> list[QuarantinedRecord] | None:
    """Apply a pending request in ``state_folder`` to ``ledger`` and delete it; the entries cleared, or None when
    there was no request. A malformed request is deleted too (:class:`ValueError` says why)."""
    path = state_folder / CLEAR_REQUEST
    try:
        keys = _read_request(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        path.unlink(missing_ok=True)
        raise ValueError(f"{path}: ignored: {exc}") from exc
    cleared = ledger.clear_quarantined(keys)
    path.unlink(missing_ok=True)
    return cleared


def read_quarantined(state_dir: Path, resource: str) -> list[QuarantinedRecord]:
    """The quarantined entries of ``resource``'s ledger on disk (read only: nothing is moved or written), its
    folders and files checked and read as the daemon does (:mod:`devplug.engine.statedir`): a FIFO or a link
    where the ledger belongs is a :class:`StateError` naming it."""
    folder = existing_resource_dir(state_dir, resource)
    if folder is None:
        return []
    return list(load_readonly(folder / "ledger.json", resource).quarantined)


async def clear_offline(ledger: Ledger, keys: Sequence[str] | None) -> list[QuarantinedRecord]:
    """With no daemon running (the caller holds the state dir's lock): clear ``keys`` (all when None) in the ledger
    on disk, and fold the journal into a new snapshot."""
    ledger.load()
    cleared = ledger.clear_quarantined(keys)
    await ledger.save(sync=True)
    await ledger.compact()
    ledger.close()
    return cleared
