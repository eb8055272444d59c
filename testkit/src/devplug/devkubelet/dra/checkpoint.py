"""``dra_manager_state``: the DRA manager's checkpoint of its claim cache, as the kubelet writes and reads it.

Follows ``pkg/kubelet/cm/dra/checkpoint`` and ``pkg/kubelet/cm/dra/state``
(Kubernetes 1.34 to 1.36; 1.32 and 1.33 below):

* the file (in the kubelet's root directory) is Go's ``json.Marshal`` of
  ``Checkpoint{Data string; Checksum uint32}``: ``Data`` is itself the JSON
  text of ``CheckpointData{kind: "DRACheckpoint", apiVersion:
  "checkpoint.dra.kubelet.k8s.io/v1", Entries}``, ``Checksum`` the CRC-32
  (IEEE) of that text (``NewCheckpoint``, ``VerifyChecksum``);
* each entry is a ``ClaimInfoState`` with Go's field names and no JSON tags:
  ``ClaimUID``, ``ClaimName``, ``Namespace``, ``PodUIDs`` (a ``sets.Set``:
  an object whose keys are the UIDs, values ``{}``) and ``DriverState``
  (driver name -> ``{"Devices": [...]}``, each device ``PoolName``,
  ``DeviceName``, ``ShareID``, ``RequestNames``, ``CDIDeviceIDs``, nil as ``null``;
  ``ShareID`` from 1.35 on, ``state/state.go``: before, ``state.Device`` has no such field);
* **1.32 and 1.33** (``state/checkpoint.go`` and ``state/state.go`` of v1.32.10 as
  KubeEdge vendors it; the same list name in the file quoted in issue #131513,
  April 2025): the list is ``CheckpointData.ClaimInfoStateList``, and Go's
  decoder ignores the other name, so a kubelet of one layout reads none of
  the claims a kubelet of the other wrote (a downgrade forgets them);
* it is rewritten whole (``syncToCheckpoint``) through the checkpoint
  manager's file store: a temporary file beside it, then a rename
  (``filestore.go`` ``writeFile``);
* a file whose checksum does not match, or that does not parse, stops the
  kubelet's start ("could not initialize checkpoint manager, please drain
  node and remove dra state file"): :func:`load_claims` raises.

Go's encoder writes map keys sorted, struct fields in declaration order,
and escapes ``<``, ``>``, ``&``, U+2028 and U+2029 (``encoding/json``).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from devplug.devkubelet.checkpointing import write_file_atomically
from devplug.devkubelet.dra.model import ClaimState, PreparedDevice
from devplug.errors import KubeletError

__all__ = [
    "CHECKPOINT_API_VERSION",
    "CHECKPOINT_KIND",
    "CLAIM_INFO_STATE_LIST",
    "ENTRIES",
    "STATE_FILE",
    "load_claims",
    "serialize_claims",
    "store_claims",
]

#: The file name, in the kubelet's root directory (``draManagerStateFileName``).
STATE_FILE = "dra_manager_state"
CHECKPOINT_KIND = "DRACheckpoint"
CHECKPOINT_API_VERSION = "checkpoint.dra.kubelet.k8s.io/v1"

_HTML_ESCAPES = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026", 0x2028: "\\u2028", 0x2029: "\\u2029"}


def _go_json(value: Any) -> str:
    """Go's ``json.Marshal`` text of plain data built in Go's field order (maps already sorted by the caller)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.translate(_HTML_ESCAPES)  # only string contents can hold these characters


def _strings(values: tuple[str, ...]) -> list[str] | None:
    return list(values) if values else None


#: The list's name in ``CheckpointData`` from 1.34 on, and in 1.32 and 1.33.
ENTRIES = "Entries"
CLAIM_INFO_STATE_LIST = "ClaimInfoStateList"


def _device_entry(device: PreparedDevice, share_ids: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"PoolName": device.pool_name, "DeviceName": device.device_name}
    if share_ids:
        entry["ShareID"] = device.share_id
    entry["RequestNames"] = _strings(device.request_names)
    entry["CDIDeviceIDs"] = _strings(device.cdi_device_ids)
    return entry


def _entry(claim: ClaimState, share_ids: bool) -> dict[str, Any]:
    drivers = {
        driver: {"Devices": [_device_entry(d, share_ids) for d in claim.devices[driver]] or None}
        for driver in sorted(claim.devices)
    }
    return {
        "ClaimUID": claim.uid,
        "ClaimName": claim.name,
        "Namespace": claim.namespace,
        "PodUIDs": {uid: {} for uid in sorted(claim.pod_uids)},
        "DriverState": drivers,
    }


def serialize_claims(claims: Iterable[ClaimState], *, list_name: str = ENTRIES, share_ids: bool = True) -> bytes:
    """The bytes the kubelet writes for these cache entries (in the order given, as its map iteration gave them).

    ``list_name`` and ``share_ids`` are the release's layout (1.32/1.33: ``ClaimInfoStateList``, no ``ShareID``;
    1.34: ``Entries``, no ``ShareID``; 1.35+: ``Entries`` with ``ShareID``).
    """
    data = _go_json(
        {
            "kind": CHECKPOINT_KIND,
            "apiVersion": CHECKPOINT_API_VERSION,
            list_name: [_entry(c, share_ids) for c in claims],
        }
    )
    checksum = zlib.crc32(data.encode("utf-8")) & 0xFFFFFFFF
    return _go_json({"Data": data, "Checksum": checksum}).encode("utf-8")


def store_claims(path: Path, claims: Iterable[ClaimState], *, list_name: str = ENTRIES, share_ids: bool = True) -> None:
    """``syncToCheckpoint``: the whole cache, written atomically at ``path``; :class:`KubeletError` when it fails."""
    try:
        write_file_atomically(path, serialize_claims(claims, list_name=list_name, share_ids=share_ids))
    except OSError as exc:
        raise KubeletError(f"checkpoint ResourceClaim state: could not save checkpoint {path.name}: {exc}") from exc


def _device(raw: Mapping[str, Any], where: str, share_ids: bool) -> PreparedDevice:
    share = raw.get("ShareID") if share_ids else None
    if share is not None and not isinstance(share, str):
        raise ValueError(f"{where}: ShareID must be a string or null")
    return PreparedDevice(
        pool_name=_str(raw.get("PoolName", ""), f"{where}.PoolName"),
        device_name=_str(raw.get("DeviceName", ""), f"{where}.DeviceName"),
        request_names=_str_list(raw.get("RequestNames"), f"{where}.RequestNames"),
        cdi_device_ids=_str_list(raw.get("CDIDeviceIDs"), f"{where}.CDIDeviceIDs"),
        share_id=share,
    )


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where} must be a string, got {value!r}")
    return value


def _str_list(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ValueError(f"{where} must be a list of strings or null, got {value!r}")
    return tuple(_str(v, where) for v in value)


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be an object or null, got {value!r}")
    return value


def _claim(raw: Any, index: int, share_ids: bool) -> ClaimState:
    where = f"Entries[{index}]"
    entry = _object(raw, where)
    drivers: dict[str, tuple[PreparedDevice, ...]] = {}
    for driver, state in _object(entry.get("DriverState"), f"{where}.DriverState").items():
        devices = _object(state, f"{where}.DriverState[{driver}]").get("Devices")
        if devices is not None and not isinstance(devices, list):
            raise ValueError(f"{where}.DriverState[{driver}].Devices must be a list or null")
        drivers[driver] = tuple(
            _device(
                _object(d, f"{where}.DriverState[{driver}].Devices[{i}]"), f"{where}.DriverState[{driver}]", share_ids
            )
            for i, d in enumerate(devices or ())
        )
    return ClaimState(
        namespace=_str(entry.get("Namespace", ""), f"{where}.Namespace"),
        name=_str(entry.get("ClaimName", ""), f"{where}.ClaimName"),
        uid=_str(entry.get("ClaimUID", ""), f"{where}.ClaimUID"),
        pod_uids=frozenset(_object(entry.get("PodUIDs"), f"{where}.PodUIDs")),
        devices=drivers,
        prepared=False,  # newClaimInfoFromState: a restored claim is prepared again before it counts as prepared
    )


def load_claims(path: Path, *, list_name: str = ENTRIES, share_ids: bool = True) -> list[ClaimState]:
    """``GetOrCreate``: the entries of the checkpoint at ``path`` (none when it does not exist).

    ``list_name`` and ``share_ids`` are the release's layout: a list under
    another name, or a ``ShareID`` the release's ``state.Device`` lacks, is
    ignored, as Go's decoder ignores unknown fields.

    Raises :class:`KubeletError` naming the file and what is wrong when it
    cannot be read, does not parse or its checksum does not match: the
    kubelet refuses to start then.
    """
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise KubeletError(f"could not read the DRA checkpoint {path}: {exc}") from exc
    hint = "please drain node and remove dra state file"
    try:
        outer = json.loads(blob)
        if not isinstance(outer, dict) or not isinstance(outer.get("Data"), str):
            raise ValueError('"Data" must be a string holding the checkpoint data')
        checksum = outer.get("Checksum")
        if not isinstance(checksum, int) or isinstance(checksum, bool):
            raise ValueError('"Checksum" must be a number')
        data: str = outer["Data"]
        expected = zlib.crc32(data.encode("utf-8")) & 0xFFFFFFFF
        if expected != checksum:
            raise ValueError(f"checkpoint is corrupted: checksum {checksum} in the file, {expected} computed")
        inner = json.loads(data)
        if not isinstance(inner, dict):
            raise ValueError("the checkpoint data must be an object")
        entries = inner.get(list_name)
        if entries is not None and not isinstance(entries, list):
            raise ValueError(f'"{list_name}" must be a list or null')
        return [_claim(raw, i, share_ids) for i, raw in enumerate(entries or ())]
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise KubeletError(f"could not initialize the DRA checkpoint {path} ({hint}): {exc}") from exc
