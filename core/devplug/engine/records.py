"""The allocation ledger's records: immutable values, checked when read from disk and written compactly.

A :class:`AllocationRecord` is one allocation (one tenancy of its devices): the
devices of one container, plus the devices of later containers of the same pod
that reused some of them (the kubelet hands the devices of finished init
containers to app containers without any release in between, so those form one
allocation and are released once). ``pending`` devices are being prepared by an
Allocate that has not answered yet.

Records never change: the :class:`~devplug.engine.ledger.Ledger` replaces a
record by a changed copy (``dataclasses.replace``) and notes the change for its
journal, so nothing can change one behind its back.

A :class:`QuarantinedRecord` is an entry that failed its checks on load.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
import operator
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from types import MappingProxyType
from typing import Any

from devplug.text.compactjson import compact_json
from devplug.types import ContainerAllocation, DeviceStatus

__all__ = [
    "QUARANTINE_PREFIX",
    "AllocationRecord",
    "QuarantinedRecord",
    "new_record_id",
    "prepared_summary",
    "record_json",
    "replaced",
]

_ids = itertools.count(1)

#: The ID prefix of the record that holds a quarantined entry's devices until they are released through the driver.
QUARANTINE_PREFIX = "quarantined-"

_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class AllocationRecord:
    """One allocation (one tenancy of its devices) and where it is in its life.

    ``post_stop_begun`` and ``deallocate_begun`` are written before the driver's
    hook is called, ``post_stopped`` and the record's removal after it returned:
    a daemon killed in between calls the hook again after its restart, with
    ``retry=True`` (the hooks' contract is at-least-once, the retry flagged).
    """

    id: str
    devices: tuple[str, ...] = ()
    pending: tuple[str, ...] = ()
    created: float = 0.0
    pod: str | None = None
    pod_uid: str | None = None
    seen_at: float | None = None
    allocated_at: float | None = None
    releasing: bool = False
    post_stop_done: bool = False
    post_stopped: tuple[str, ...] = ()
    post_stop_begun: tuple[str, ...] = ()
    deallocate_begun: bool = False
    kep_at: float | None = None
    adopted: str | None = None
    prepared: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    #: The DRA claim of the tenancy (through DRA: its UID, and ``namespace/name``; None through the device-plugin
    #: API), and the UIDs of the other pods sharing it (its ``reservedFor``), whose containers are waited for too.
    claim_uid: str | None = None
    claim: str | None = None
    pod_uids: tuple[str, ...] = ()

    def tenant_pods(self) -> tuple[str | None, ...]:
        """The UIDs of the pods whose containers may use the devices (``(None,)`` when none is known)."""
        pods = tuple(dict.fromkeys(p for p in (self.pod_uid, *self.pod_uids) if p))
        return pods or (None,)

    def all_devices(self) -> list[str]:
        """``devices``, then the ``pending`` ones not among them."""
        if not self.pending:
            return list(self.devices)
        return [*self.devices, *[d for d in self.pending if d not in self.devices]]

    def device_status(self) -> dict[str, DeviceStatus]:
        """The device status the driver's ``allocate`` answered, kept by the confirmation (:func:`prepared_summary`),
        by device ID; an entry that does not read back is left out (a record written by hand, or by a newer
        devplug)."""
        found: dict[str, DeviceStatus] = {}
        kept = self.prepared.get("device_status")
        if isinstance(kept, Mapping):
            for device_id, value in kept.items():
                with contextlib.suppress(ValueError):
                    found[str(device_id)] = DeviceStatus.from_json(value)
        return found

    def to_json(self) -> dict[str, Any]:
        """Every field, as the file holds it (lists and objects)."""
        return {name: _thawed(getattr(self, name)) for name in _FIELD_CHECKS}

    @classmethod
    def from_json(cls, data: object) -> AllocationRecord:
        """A record from its JSON form, every field checked; :class:`ValueError` naming the bad field."""
        if not isinstance(data, dict):
            raise ValueError(f"an allocation record must be an object, not {type(data).__name__}")
        unknown = sorted(set(data) - set(_FIELD_CHECKS))
        if unknown:
            raise ValueError(f"unknown fields {unknown}")
        if "id" not in data:
            raise ValueError("no 'id'")
        for name, value in data.items():
            if not _FIELD_CHECKS[name](value):
                raise ValueError(f"field {name!r} has a bad value {_short(value)}")
        return cls(**{name: _frozen(value) for name, value in data.items()})


def _frozen(value: Any) -> Any:
    """A JSON value with its lists as tuples and its objects as read-only mappings."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    return value


def _thawed(value: Any) -> Any:
    """The JSON value of a frozen one (:func:`_frozen` undone)."""
    if isinstance(value, tuple):
        return [_thawed(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _thawed(v) for k, v in value.items()}
    return value


def _is_str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_time(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _optional(check: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: value is None or check(value)


def _is_id(value: object) -> bool:
    return isinstance(value, str) and bool(value)


#: Every field of a record and the check its JSON value must pass (also the order of the file's keys).
_FIELD_CHECKS: dict[str, Callable[[object], bool]] = {
    "id": _is_id,
    "devices": _is_str_list,
    "pending": _is_str_list,
    "created": _is_time,
    "pod": _optional(lambda v: isinstance(v, str)),
    "pod_uid": _optional(lambda v: isinstance(v, str)),
    "seen_at": _optional(_is_time),
    "allocated_at": _optional(_is_time),
    "releasing": lambda v: isinstance(v, bool),
    "post_stop_done": lambda v: isinstance(v, bool),
    "post_stopped": _is_str_list,
    "post_stop_begun": _is_str_list,
    "deallocate_begun": lambda v: isinstance(v, bool),
    "kep_at": _optional(_is_time),
    "adopted": _optional(lambda v: isinstance(v, str)),
    "prepared": lambda v: isinstance(v, dict),
    "claim_uid": _optional(_is_id),
    "claim": _optional(lambda v: isinstance(v, str)),
    "pod_uids": _is_str_list,
}
assert list(_FIELD_CHECKS) == [f.name for f in fields(AllocationRecord)], "every field has its check"

#: Each field's default (a field at its default is not written: loading fills it in, as it does for records
#: written before the field existed).
_DEFAULTS: dict[str, object] = {
    f.name: f.default_factory() if f.default is MISSING and f.default_factory is not MISSING else f.default
    for f in fields(AllocationRecord)
    if f.name != "id"
}


#: The fields after ``id`` with their defaults, as pairs (for :func:`record_json`).
_DEFAULTED = tuple(_DEFAULTS.items())


def record_json(record: AllocationRecord) -> str:
    """A record's JSON as the ledger writes it: the fields not at their defaults (a new record is three).

    Fast path (issue 42): ``prepared`` is made JSON-ready by :func:`_json_ready` (tuples of strings passed as they
    are: the encoder writes a tuple as a list), not by :func:`_thawed`, whose ``isinstance(value, Mapping)`` is an
    ABC check per value. A confirmed record's JSON (the mock's ``prepared``, 4 devices; one per Allocate) went from
    24.7 to 14.5 us in a loop on a quiet moment of the 2-core VM, 47.5 to 32.8 on a loaded one (medians of 41
    interleaved rounds); a new record's is unchanged. The text is the same byte for byte
    (tests/engine/test_record_fast_paths.py).
    """
    out: dict[str, Any] = {"id": record.id}
    for name, default in _DEFAULTED:
        value = getattr(record, name)
        if value != default:
            out[name] = _json_ready(value) if name == "prepared" else value
    return compact_json(out)


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _json_ready(value: Any) -> Any:
    """``value`` as :func:`compact_json` encodes it the way it encodes :func:`_thawed`'s result: read-only mappings
    as dicts; tuples and lists as they are when they hold only strings (the encoder writes both as lists)."""
    kind = type(value)
    if kind is MappingProxyType or kind is dict:
        return {k: _json_ready(v) for k, v in value.items()}
    if kind is tuple or kind is list:
        for item in value:
            if type(item) is not str:
                return [_json_ready(v) for v in value]
        return value
    if kind in _SCALARS:
        return value
    return _thawed(value)


#: Every field's name, in order; its slot's setter; all of a record's values in one C call (for :func:`replaced`).
_FIELD_NAMES = tuple(f.name for f in fields(AllocationRecord))
_FIELD_POSITIONS = {name: position for position, name in enumerate(_FIELD_NAMES)}
_SLOT_SETTERS = tuple(getattr(AllocationRecord, name).__set__ for name in _FIELD_NAMES)
_values_of = operator.attrgetter(*_FIELD_NAMES)


def replaced(record: AllocationRecord, **changes: Any) -> AllocationRecord:
    """``dataclasses.replace(record, **changes)``: a copy of ``record`` with ``changes`` (``TypeError`` for a name
    that is not a field).

    Fast path (issue 42): ``dataclasses.replace`` walks the fields' definitions and calls the frozen class's
    ``__init__`` (an ``object.__setattr__`` per field) on every call. Here the values are read in one
    ``attrgetter`` call and set through the slots' own setters: a confirm's copy went from 8.0 to 4.8 us in a loop
    (15.7 to 9.1 on a loaded moment; medians of 41 interleaved rounds). A confirm makes one per Allocate, a release
    several.
    """
    values = list(_values_of(record))
    for name, value in changes.items():
        position = _FIELD_POSITIONS.get(name)
        if position is None:
            raise TypeError(f"AllocationRecord has no field {name!r}")
        values[position] = value
    copy = object.__new__(AllocationRecord)
    for set_slot, value in zip(_SLOT_SETTERS, values, strict=True):
        set_slot(copy, value)
    return copy


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class QuarantinedRecord:
    """A ledger entry that failed its checks on load: kept aside, shown in ``devplug status``.

    Its devices may have been handed to a pod and never cleaned: they are held by a record of their own
    (:attr:`record_id`), withheld from the kubelet, and released through the driver (``post_stop`` and
    ``deallocate`` with ``retry=True``) once no pod holds them; or the operator clears it
    (``devplug quarantine clear``). Either drops the entry.
    """

    index: int
    reason: str
    raw: object

    @property
    def key(self) -> str:
        """A name for the entry that does not change with its position (a digest of its content)."""
        text = json.dumps(self.raw, sort_keys=True, separators=(",", ":"), default=repr)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def record_id(self) -> str:
        """The ID of the record that holds its devices until they are released."""
        return QUARANTINE_PREFIX + self.key

    def pod_uid(self) -> str | None:
        """The pod UID the entry names, if it is readable."""
        uid = self.raw.get("pod_uid") if isinstance(self.raw, dict) else None
        return uid if isinstance(uid, str) and uid else None

    def describe(self) -> str:
        return f"quarantined ledger record #{self.index} ({self.reason})"

    def devices(self) -> list[str]:
        """The device IDs the entry seems to name (best effort, for the operator)."""
        if not isinstance(self.raw, dict):
            return []
        found: list[str] = []
        for key in ("devices", "pending"):
            value = self.raw.get(key)
            if isinstance(value, list):
                found.extend(v for v in value if isinstance(v, str) and v not in found)
        return found


def new_record_id() -> str:
    return f"{int(time.time() * 1000):x}-{os.getpid():x}-{next(_ids)}"


def prepared_summary(allocation: ContainerAllocation) -> Mapping[str, Any]:
    """What the driver prepared for a container, as kept in the ledger (for status and post-mortems), and the
    device status its ``allocate`` answered, when it gave one (contract 1.1: journalled with the confirmation, so
    a DRA claim whose prepare a kill cut after it gets its status from here when the kubelet asks again)."""
    summary: dict[str, Any] = {
        "envs": MappingProxyType(dict(allocation.envs)),
        "mounts": tuple(m.container_path for m in allocation.mounts),
        "devices": tuple(d.container_path for d in allocation.devices),
        "annotations": MappingProxyType(dict(allocation.annotations)),
        "cdi_devices": tuple(c.name for c in allocation.cdi_devices),
    }
    if allocation.device_status:
        summary["device_status"] = {i: s.to_json() for i, s in allocation.device_status.items()}
    return MappingProxyType(summary)
