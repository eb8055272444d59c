"""The kubelet's device-manager checkpoint file, read and written byte for byte as the kubelet does.

The kubelet records in ``/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint``
which container of which pod holds which devices of which resource, and which
resources have registered. devplug's engine reads it as evidence of who holds a
device; devplug's dev kubelet writes it the way a real kubelet would.

The file follows Kubernetes v1.32.10:

* ``pkg/kubelet/cm/devicemanager/checkpoint/checkpoint.go``: the ``Data``,
  ``checkpointData`` and ``PodDevicesEntry`` types, ``MarshalCheckpoint`` (Go's
  ``json.Marshal`` of ``Data``) and ``VerifyChecksum``;
* ``pkg/kubelet/checkpointmanager/checksum/checksum.go`` ``New`` with
  ``pkg/util/hash/hash.go`` ``DeepHashObject`` and
  ``k8s.io/apimachinery/pkg/util/dump/dump.go`` ``ForHash``: the checksum is
  FNV-32a over go-spew's ``%#v`` rendering of the ``Data`` part;
* ``pkg/kubelet/cm/devicemanager/manager.go`` ``writeCheckpoint``,
  ``getCheckpoint`` and ``readCheckpoint``, and ``pod_devices.go``
  ``toCheckpointData``/``fromCheckpointData``: what the kubelet puts in the file
  and how it reads it back (into a pre-made empty slice and map, then
  ``json.Unmarshal``, then the checksum).

The kubelet writes today only the "v2" layout, where ``DeviceIDs`` maps a NUMA
node (``-1`` for a device without topology, ``nodeWithoutTopology`` in
manager.go) to device IDs. Kubelets up to 1.19 wrote a "v1" layout where
``DeviceIDs`` was a plain list, hashed under the same type names
(``checkpointData``, ``PodDevicesEntry``) but with ``DeviceIDs`` as ``[]string``.
Kubelets 1.20 to 1.29 still read it (``checkpointv1.go``, removed in 1.30), placing
every device on NUMA node 0 (``GetDataInLatestFormat``); v1.32 no longer reads it.
:func:`parse_checkpoint` reads both, as 1.20 to 1.29 did: v2 first, then v1.

Go tells a nil slice or map (``null`` in JSON, ``<nil>`` in the hash) from an
empty one (``[]``/``{}``, ``[]``/``map[]``), and both reach the checksum. Python
values cannot, so parsing verifies the checksum on the file exactly as written,
and :func:`serialize_checkpoint`/:func:`checksum` build each value the way the
kubelet builds it:

* no entries: nil (``toCheckpointData`` appends to a nil slice) → ``null``;
* ``registered_devices``: always a map (``writeCheckpoint`` uses ``make``), each
  device list non-nil (``sets.Set.UnsortedList``) → ``{}`` and ``[]`` when empty;
* ``devices_by_numa``: always a map (``checkpoint.NewDevicesPerNUMA``); a node's
  device list is built by ``append``, so an empty one is nil → ``null``;
* ``alloc_response``: always non-nil (gogo-protobuf ``Marshal`` uses ``make``), so
  ``b""`` → ``""``.

So a file written here parses back equal, with the checksum the kubelet computes.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

__all__ = [
    "CHECKPOINT_FILE",
    "NODE_WITHOUT_TOPOLOGY",
    "CheckpointEntry",
    "CheckpointError",
    "KubeletCheckpoint",
    "checksum",
    "parse_checkpoint",
    "read_checkpoint",
    "serialize_checkpoint",
]

CHECKPOINT_FILE: Final = "kubelet_internal_checkpoint"
NODE_WITHOUT_TOPOLOGY: Final = -1  # the NUMA node of devices that report no topology (manager.go)

_V1_NUMA_NODE: Final = 0  # where kubelets 1.20-1.29 put the devices of a v1 entry (GetDataInLatestFormat)
_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1


class CheckpointError(ValueError):
    """The checkpoint cannot be read: unreadable, not JSON, a field of the wrong type, or a checksum mismatch."""


def _frozen_map(value: Any) -> Mapping[Any, Any]:
    return MappingProxyType(value)


def _check_str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what} {value!r} is not valid Unicode text: {e.reason}") from None
    return value


def _str_tuple(values: Iterable[str], what: str) -> tuple[str, ...]:
    if isinstance(values, str | bytes):
        raise TypeError(f"{what} must be a sequence of str, not a single {type(values).__name__}")
    return tuple(_check_str(v, what) for v in values)


@dataclass(frozen=True)
class CheckpointEntry:
    """The devices of one resource held by one container of one pod (a ``PodDevicesEntry``).

    ``devices_by_numa`` maps a NUMA node to the device IDs the kubelet recorded
    on it (:data:`NODE_WITHOUT_TOPOLOGY` for devices without topology; a device
    on several nodes is listed under each). ``alloc_response`` is the serialized
    v1beta1 ``ContainerAllocateResponse`` the plugin answered, ``b""`` if none.
    """

    pod_uid: str
    container: str
    resource: str
    devices_by_numa: Mapping[int, tuple[str, ...]]
    alloc_response: bytes = b""

    def __post_init__(self) -> None:
        _check_str(self.pod_uid, "pod_uid")
        _check_str(self.container, "container")
        _check_str(self.resource, "resource")
        nodes: dict[int, tuple[str, ...]] = {}
        for node, ids in dict(self.devices_by_numa).items():
            if isinstance(node, bool) or not isinstance(node, int):
                raise TypeError(f"NUMA node {node!r} must be an int")
            if not _INT64_MIN <= node <= _INT64_MAX:
                raise ValueError(f"NUMA node {node} does not fit in an int64")
            nodes[node] = _str_tuple(ids, f"device ID on NUMA node {node}")
        object.__setattr__(self, "devices_by_numa", _frozen_map(nodes))
        if not isinstance(self.alloc_response, bytes | bytearray | memoryview):
            raise TypeError(f"alloc_response must be bytes, not {type(self.alloc_response).__name__}")
        object.__setattr__(self, "alloc_response", bytes(self.alloc_response))

    def __hash__(self) -> int:
        return hash(
            (self.pod_uid, self.container, self.resource, frozenset(self.devices_by_numa.items()), self.alloc_response)
        )

    @property
    def device_ids(self) -> frozenset[str]:
        """Every device of the entry, over all NUMA nodes."""
        return frozenset(d for ids in self.devices_by_numa.values() for d in ids)


@dataclass(frozen=True)
class KubeletCheckpoint:
    """The contents of the checkpoint file: allocations in file order, and the registered resources.

    ``registered_devices`` maps each resource that had registered to the IDs of
    its healthy devices when the kubelet last wrote the file.
    """

    entries: tuple[CheckpointEntry, ...] = ()
    registered_devices: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: _frozen_map({}))

    def __post_init__(self) -> None:
        entries = tuple(self.entries)
        for entry in entries:
            if not isinstance(entry, CheckpointEntry):
                raise TypeError(f"entries must be CheckpointEntry, not {type(entry).__name__}")
        object.__setattr__(self, "entries", entries)
        registered = {
            _check_str(resource, "resource"): _str_tuple(ids, f"device ID of {resource!r}")
            for resource, ids in dict(self.registered_devices).items()
        }
        object.__setattr__(self, "registered_devices", _frozen_map(registered))

    def __hash__(self) -> int:
        return hash((self.entries, frozenset(self.registered_devices.items())))

    def entries_for(self, resource: str) -> tuple[CheckpointEntry, ...]:
        """The entries of one resource, in file order."""
        return tuple(e for e in self.entries if e.resource == resource)

    def holders(self, resource: str, device_id: str) -> tuple[CheckpointEntry, ...]:
        """The entries of ``resource`` that list ``device_id`` (on any NUMA node), in file order."""
        return tuple(e for e in self.entries if e.resource == resource and device_id in e.device_ids)


# --- The Go values --------------------------------------------------------------------------------
# The file's contents as the kubelet's Go values, keeping nil (None) apart from empty. ``device_ids`` is
# ``dict[int, list[str] | None] | None`` in the v2 layout and ``list[str] | None`` in the v1 layout.


@dataclass
class _GoEntry:
    pod_uid: str = ""
    container: str = ""
    resource: str = ""
    device_ids: Any = None
    alloc_resp: bytes | None = None


@dataclass
class _GoData:
    entries: list[_GoEntry] | None
    registered: dict[str, list[str] | None] | None


def _to_go(checkpoint: KubeletCheckpoint) -> _GoData:
    """The Go values the kubelet would hold for ``checkpoint`` (the nil/empty rule of the module docstring)."""
    entries = [
        _GoEntry(
            e.pod_uid,
            e.container,
            e.resource,
            {node: list(ids) or None for node, ids in e.devices_by_numa.items()},
            e.alloc_response,
        )
        for e in checkpoint.entries
    ]
    return _GoData(entries or None, {r: list(ids) for r, ids in checkpoint.registered_devices.items()})


def _from_go(data: _GoData, layout: int) -> KubeletCheckpoint:
    entries = []
    for e in data.entries or ():
        if layout == 1:
            by_numa = {_V1_NUMA_NODE: tuple(e.device_ids or ())}
        else:
            by_numa = {node: tuple(ids or ()) for node, ids in (e.device_ids or {}).items()}
        entries.append(CheckpointEntry(e.pod_uid, e.container, e.resource, by_numa, e.alloc_resp or b""))
    registered = {r: tuple(ids or ()) for r, ids in (data.registered or {}).items()}
    return KubeletCheckpoint(tuple(entries), registered)


# --- The checksum: go-spew's %#v rendering, as dump.ForHash configures it ------------------------
# In the formatter (unlike spew.Sdump) strings are written as they are, unquoted and unescaped; a value
# is preceded by its type in parentheses unless it is an element or a key or value of a map; nil slices
# and maps are "<nil>"; maps are "map[k:v k:v]" with keys sorted (ints by value, strings by bytes); byte
# slices are their bytes in decimal; struct fields are "Name:value", space separated.


def _spew_strings(values: list[str] | None) -> str:
    return "<nil>" if values is None else "[" + " ".join(values) + "]"


def _spew_bytes(value: bytes | None) -> str:
    return "([]uint8)<nil>" if value is None else "([]uint8)[" + " ".join(map(str, value)) + "]"


def _spew_device_ids(value: Any, layout: int) -> str:
    if layout == 1:
        return "([]string)" + _spew_strings(value)
    if value is None:
        return "(checkpoint.DevicesPerNUMA)<nil>"
    pairs = (f"{node}:{_spew_strings(value[node])}" for node in sorted(value))
    return "(checkpoint.DevicesPerNUMA)map[" + " ".join(pairs) + "]"


def _utf8_key(s: str) -> bytes:
    return s.encode("utf-8")


def _spew(data: _GoData, layout: int) -> bytes:
    if data.entries is None:
        entries = "([]checkpoint.PodDevicesEntry)<nil>"
    else:
        entries = (
            "([]checkpoint.PodDevicesEntry)["
            + " ".join(
                f"{{PodUID:(string){e.pod_uid} ContainerName:(string){e.container} ResourceName:(string){e.resource}"
                f" DeviceIDs:{_spew_device_ids(e.device_ids, layout)} AllocResp:{_spew_bytes(e.alloc_resp)}}}"
                for e in data.entries
            )
            + "]"
        )
    if data.registered is None:
        registered = "(map[string][]string)<nil>"
    else:
        pairs = (f"{r}:{_spew_strings(data.registered[r])}" for r in sorted(data.registered, key=_utf8_key))
        registered = "(map[string][]string)map[" + " ".join(pairs) + "]"
    text = f"(checkpoint.checkpointData){{PodDeviceEntries:{entries} RegisteredDevices:{registered}}}"
    return text.encode("utf-8")


def _fnv32a(data: bytes) -> int:
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def _go_checksum(data: _GoData, layout: int) -> int:
    return _fnv32a(_spew(data, layout))


def checksum(checkpoint: KubeletCheckpoint) -> int:
    """The checksum the kubelet computes for ``checkpoint`` as :func:`serialize_checkpoint` writes it (v2 layout)."""
    return _go_checksum(_to_go(checkpoint), 2)


# --- Writing: Go's json.Marshal -------------------------------------------------------------------
# encoding/json escapes '"' and '\\', writes \b \f \n \r \t short (\b and \f since Go 1.22, which
# Kubernetes v1.32 is built with), other control characters and the HTML-sensitive <, > and & as
# \u00xx, and U+2028/U+2029 as \u2028/\u2029; everything else is written as UTF-8. Map keys are sorted
# by their text (so NUMA nodes sort as "-1" < "0" < "1" < "10" < "2"), []byte is standard base64.

_JSON_ESCAPES: Final = {
    **{c: f"\\u{c:04x}" for c in range(0x20)},
    **{ord(c): f"\\u{ord(c):04x}" for c in "<>&\u2028\u2029"},
    ord('"'): '\\"',
    ord("\\"): "\\\\",
    ord("\b"): "\\b",
    ord("\f"): "\\f",
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
}


def _json_str(s: str) -> str:
    return '"' + s.translate(_JSON_ESCAPES) + '"'


def _json_strings(values: list[str] | None) -> str:
    return "null" if values is None else "[" + ",".join(map(_json_str, values)) + "]"


def _json_map(items: Iterable[tuple[str, str]]) -> str:
    return "{" + ",".join(f"{_json_str(k)}:{v}" for k, v in sorted(items, key=lambda kv: _utf8_key(kv[0]))) + "}"


def _marshal(data: _GoData, checksum_value: int) -> bytes:
    if data.entries is None:
        entries = "null"
    else:
        parts = []
        for e in data.entries:
            ids = (
                "null"
                if e.device_ids is None
                else _json_map((str(n), _json_strings(v)) for n, v in e.device_ids.items())
            )
            alloc = "null" if e.alloc_resp is None else '"' + base64.b64encode(e.alloc_resp).decode("ascii") + '"'
            parts.append(
                f'{{"PodUID":{_json_str(e.pod_uid)},"ContainerName":{_json_str(e.container)},'
                f'"ResourceName":{_json_str(e.resource)},"DeviceIDs":{ids},"AllocResp":{alloc}}}'
            )
        entries = "[" + ",".join(parts) + "]"
    registered = (
        "null" if data.registered is None else _json_map((r, _json_strings(v)) for r, v in data.registered.items())
    )
    text = f'{{"Data":{{"PodDeviceEntries":{entries},"RegisteredDevices":{registered}}},"Checksum":{checksum_value}}}'
    return text.encode("utf-8")


def serialize_checkpoint(checkpoint: KubeletCheckpoint) -> bytes:
    """The file the kubelet writes for ``checkpoint``: byte-identical to its ``json.Marshal`` output.

    Always the v2 layout (the only one kubelets since 1.20 write), with the
    nil/empty choices described in the module docstring and the checksum of
    :func:`checksum`.
    """
    data = _to_go(checkpoint)
    return _marshal(data, _go_checksum(data, 2))


# --- Reading: Go's json.Unmarshal into the kubelet's types ---------------------------------------
# As encoding/json does: field names match case-insensitively, unknown fields are ignored, null leaves a
# string or number as it was and makes a slice or map nil, a repeated field decodes into what the earlier
# one left (a map gains keys, a slice's elements are decoded over), []byte is base64 (line breaks
# ignored) or an array of numbers, map[int64] keys are parsed like strconv.ParseInt, invalid UTF-8 and
# lone surrogates in strings become U+FFFD.


class _Bad(Exception):
    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)


class _Obj(list[tuple[str, Any]]):
    """A JSON object, as its (key, value) pairs in order."""


@dataclass(frozen=True)
class _Num:
    text: str
    integer: bool


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_INT_KEY: Final = re.compile(r"[+-]?[0-9]+")
_FOLD: Final = {**{ord(c): ord(c.upper()) for c in "abcdefghijklmnopqrstuvwxyz"}, 0x212A: ord("K"), 0x17F: ord("S")}


def _go_text(s: str) -> str:
    return _SURROGATE.sub("\ufffd", s)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, _Obj):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, _Num):
        return f"the number {value.text}"
    return type(value).__name__  # pragma: no cover - json.loads makes nothing else


def _fields(value: _Obj, names: tuple[str, ...]) -> Iterable[tuple[str, Any]]:
    """The (field name, value) pairs of a JSON object that match ``names`` as encoding/json matches them."""
    folded = {n.upper(): n for n in names}
    for key, item in value:
        name = folded.get(_go_text(key).translate(_FOLD))
        if name is not None:
            yield name, item


def _dec_str(value: Any, old: str, path: str) -> str:
    if value is None:
        return old
    if isinstance(value, str):
        return _go_text(value)
    raise _Bad(path, f"expected a string, got {_kind(value)}")


def _dec_uint(value: Any, old: int, bits: int, path: str) -> int:
    if value is None:
        return old
    if isinstance(value, _Num) and value.integer and not value.text.startswith("-"):
        n = int(value.text)
        if n < 1 << bits:
            return n
    raise _Bad(path, f"expected an integer from 0 to {(1 << bits) - 1}, got {_kind(value)}")


def _dec_bytes(value: Any, old: bytes | None, path: str) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        text = value.replace("\r", "").replace("\n", "")
        try:
            return base64.b64decode(text.encode("ascii"), validate=True)
        except (UnicodeEncodeError, binascii.Error) as e:
            raise _Bad(path, f"not valid base64: {e}") from None
    if isinstance(value, list) and not isinstance(value, _Obj):
        prev = old or b""
        return bytes(_dec_uint(v, prev[i] if i < len(prev) else 0, 8, f"{path}[{i}]") for i, v in enumerate(value))
    raise _Bad(path, f"expected base64 text, got {_kind(value)}")


def _dec_strings(value: Any, old: list[str] | None, path: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, list) and not isinstance(value, _Obj):
        prev = old or []
        return [_dec_str(v, prev[i] if i < len(prev) else "", f"{path}[{i}]") for i, v in enumerate(value)]
    raise _Bad(path, f"expected a list of strings, got {_kind(value)}")


def _dec_numa(value: Any, old: dict[int, list[str] | None] | None, path: str) -> dict[int, list[str] | None] | None:
    if value is None:
        return None
    if not isinstance(value, _Obj):
        raise _Bad(path, f"expected an object of NUMA node to device IDs, got {_kind(value)}")
    result = dict(old) if old is not None else {}
    for key, item in value:
        text = _go_text(key)
        node = int(text) if _INT_KEY.fullmatch(text) else None
        if node is None or not _INT64_MIN <= node <= _INT64_MAX:
            raise _Bad(path, f"NUMA node {text!r} is not an int64")
        result[node] = _dec_strings(item, None, f"{path}[{text!r}]")
    return result


def _dec_registered(
    value: Any, old: dict[str, list[str] | None] | None, path: str
) -> dict[str, list[str] | None] | None:
    if value is None:
        return None
    if not isinstance(value, _Obj):
        raise _Bad(path, f"expected an object of resource to device IDs, got {_kind(value)}")
    result = dict(old) if old is not None else {}
    for key, item in value:
        resource = _go_text(key)
        result[resource] = _dec_strings(item, None, f"{path}[{resource!r}]")
    return result


_ENTRY_FIELDS: Final = ("PodUID", "ContainerName", "ResourceName", "DeviceIDs", "AllocResp")


def _dec_entry(value: Any, old: _GoEntry | None, layout: int, path: str) -> _GoEntry:
    entry = _GoEntry() if old is None else _GoEntry(**vars(old))
    if value is None:
        return entry
    if not isinstance(value, _Obj):
        raise _Bad(path, f"expected an object, got {_kind(value)}")
    for name, item in _fields(value, _ENTRY_FIELDS):
        where = f"{path}.{name}"
        if name == "PodUID":
            entry.pod_uid = _dec_str(item, entry.pod_uid, where)
        elif name == "ContainerName":
            entry.container = _dec_str(item, entry.container, where)
        elif name == "ResourceName":
            entry.resource = _dec_str(item, entry.resource, where)
        elif name == "AllocResp":
            entry.alloc_resp = _dec_bytes(item, entry.alloc_resp, where)
        elif layout == 1:
            entry.device_ids = _dec_strings(item, entry.device_ids, where)
        else:
            entry.device_ids = _dec_numa(item, entry.device_ids, where)
    return entry


def _dec_entries(value: Any, old: list[_GoEntry] | None, layout: int, path: str) -> list[_GoEntry] | None:
    if value is None:
        return None
    if not isinstance(value, list) or isinstance(value, _Obj):
        raise _Bad(path, f"expected a list of entries, got {_kind(value)}")
    prev = old or []
    return [_dec_entry(v, prev[i] if i < len(prev) else None, layout, f"{path}[{i}]") for i, v in enumerate(value)]


def _dec_file(tree: Any, layout: int) -> tuple[_GoData, int]:
    """The Go values of the file, decoded as getCheckpoint does: into an empty entry slice and map."""
    data = _GoData([], {})
    stored = 0
    if tree is None:
        return data, stored
    if not isinstance(tree, _Obj):
        raise _Bad("", f"expected a JSON object, got {_kind(tree)}")
    for name, item in _fields(tree, ("Data", "Checksum")):
        if name == "Checksum":
            stored = _dec_uint(item, stored, 64, "Checksum")
        elif item is not None:
            if not isinstance(item, _Obj):
                raise _Bad("Data", f"expected an object, got {_kind(item)}")
            for inner, sub in _fields(item, ("PodDeviceEntries", "RegisteredDevices")):
                where = f"Data.{inner}"
                if inner == "PodDeviceEntries":
                    data.entries = _dec_entries(sub, data.entries, layout, where)
                else:
                    data.registered = _dec_registered(sub, data.registered, where)
    return data, stored


def _verified(tree: Any, layout: int) -> _GoData:
    data, stored = _dec_file(tree, layout)
    computed = _go_checksum(data, layout)
    if computed != stored:
        raise _Bad("", f"checksum mismatch: the file says {stored}, its contents hash to {computed}")
    return data


def _looks_v1(tree: Any) -> bool:
    """Whether some entry's DeviceIDs is a JSON list, as only the v1 layout has."""
    if not isinstance(tree, _Obj):
        return False
    for _, data in _fields(tree, ("Data",)):
        if isinstance(data, _Obj):
            for _, entries in _fields(data, ("PodDeviceEntries",)):
                for entry in entries if isinstance(entries, list) else ():
                    if isinstance(entry, _Obj):
                        for _, ids in _fields(entry, ("DeviceIDs",)):
                            if isinstance(ids, list) and not isinstance(ids, _Obj):
                                return True
    return False


def _int_literal(text: str) -> _Num:
    return _Num(text, True)


def _float_literal(text: str) -> _Num:
    return _Num(text, False)


def _load_json(data: bytes, source: str) -> Any:
    try:
        return json.loads(
            data.decode("utf-8", "surrogateescape"),
            object_pairs_hook=_Obj,
            parse_int=_int_literal,
            parse_float=_float_literal,
            parse_constant=_reject_constant,
        )
    except RecursionError:
        raise CheckpointError(f"{source}: not valid JSON: nested too deeply") from None
    except ValueError as e:
        raise CheckpointError(f"{source}: not valid JSON (truncated or corrupt?): {e}") from None


def parse_checkpoint(data: bytes, *, source: str = CHECKPOINT_FILE) -> KubeletCheckpoint:
    """The checkpoint in ``data`` (the file's bytes), its checksum verified; ``source`` names it in errors.

    Reads the v2 layout the kubelet writes today and, failing that, the v1
    layout of kubelets up to 1.19 (its devices put on NUMA node 0, as kubelets
    1.20-1.29 did). Accepts what Go's ``json.Unmarshal`` accepts, ``null`` for
    any list or map included. Raises :class:`CheckpointError` naming ``source``
    and what is wrong.
    """
    tree = _load_json(data, source)
    try:
        return _from_go(_verified(tree, 2), 2)
    except _Bad as v2_error:
        try:
            return _from_go(_verified(tree, 1), 1)
        except _Bad as v1_error:
            if _looks_v1(tree):
                raise CheckpointError(f"{source}: as a pre-1.20 (v1 layout) checkpoint: {v1_error}") from None
            raise CheckpointError(f"{source}: {v2_error}") from None


def read_checkpoint(path: Path) -> KubeletCheckpoint | None:
    """The checkpoint in the file at ``path``, or None if there is no such file.

    Raises :class:`CheckpointError` naming ``path`` if the file cannot be read
    or is corrupt.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read the kubelet checkpoint: {e.strerror or e}") from e
    return parse_checkpoint(data, source=str(path))
