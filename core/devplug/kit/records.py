"""A driver's own records, kept crash-safe in one JSON file of its state folder.

A driver that changes a device (binds it, programs it, erases it) must know
after a crash what it may have half done. The rule is always the same: record
what you are about to do, *then* do it, and record that it is done. A
:class:`RecordStore` is that record: tables of typed records by key (a device
ID), in one JSON file replaced atomically (:func:`devplug.atomic.write_atomic`)
on every change, so the file is always either the old or the new state::

    @dataclass(frozen=True)
    class Erase:
        phase: Literal["erasing", "failed"]
        reason: str = ""

    store = RecordStore(ctx.state_dir / "nvme-state.json", what="the nvme driver's state",
                        recover="erase the drives it names by hand, then remove it")
    erasing = store.table("drives", Erase)
    erasing.put("nvme0", Erase("erasing"))        # written before the erase starts
    run_command([...], timeout=600)
    erasing.drop("nvme0")                         # written once it is done

On disk::

    {"version": 1, "drives": {"nvme0": {"phase": "erasing", "reason": ""}}}

Records are frozen dataclasses whose fields have the types driver options
may have (``str``, ``int``, ``float``, ``bool``, ``Path``, ``Literal[...]``,
``X | None``, lists, tuples and ``dict[str, X]`` of those; see
:mod:`devplug.options`), or one of those types itself (a table of strings).
A field with a default may be missing from the file (a field added later).
Anything else in the file (an unknown version, key or value, a missing
field) is refused when the table is read, with a :class:`devplug.DriverError`
naming the file, the table, the key and what was wrong, and saying how to
recover (``recover``): the driver's ``start`` then fails and the resource is
not served, rather than acting on state it does not understand. A table the
driver does not read is kept as it is.

Changes go through the table (:meth:`RecordTable.put`, :meth:`~RecordTable.update`,
:meth:`~RecordTable.replace`, :meth:`~RecordTable.drop`), each written before it
returns; records are never edited in place. A write that fails raises
:class:`devplug.DriverError` and changes nothing, in memory or on disk.
Thread-safe: hooks of different devices may change one store at once.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePath
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from devplug.atomic import write_atomic
from devplug.errors import ConfigError, DriverError
from devplug.options import parse_options

__all__ = ["RecordStore", "RecordTable"]

R = TypeVar("R")

#: The field a table of plain values (not dataclasses) reads its values through.
_VALUE = "value"


def _to_json(value: Any) -> Any:
    """A record (or a field's value) as JSON: dataclasses as objects, paths as strings, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _to_json(v) for k, v in value.items()}
    return value


class RecordTable(Mapping[str, R], Generic[R]):
    """One table of a :class:`RecordStore`: records of one type by key; read like a mapping, changed through
    its methods (each change written to the file before it returns)."""

    def __init__(self, store: RecordStore, name: str, record_type: type[R], records: dict[str, R]) -> None:
        self._store = store
        self.name = name
        self.record_type = record_type
        self._records: Mapping[str, R] = MappingProxyType(records)

    def __getitem__(self, key: str) -> R:
        return self._records[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def __repr__(self) -> str:
        return f"<RecordTable {self.name!r} of {self._store.path}: {dict(self._records)!r}>"

    def snapshot(self) -> Mapping[str, R]:
        """The records now, as a read-only mapping that later changes leave alone."""
        return self._records

    def put(self, key: str, record: R) -> None:
        """Add or replace the record of ``key``."""
        self.update({key: record})

    def drop(self, *keys: str) -> None:
        """Remove the records of ``keys`` (those that exist); nothing is written when none does."""
        present = [k for k in keys if k in self._records]
        if present:
            self.update(dict.fromkeys(present))

    def replace(self, key: str, **changes: Any) -> R:
        """The record of ``key`` with ``changes`` to its fields (:func:`dataclasses.replace`), stored and returned.

        :class:`KeyError` when there is no such record.
        """
        record = dataclasses.replace(self._records[key], **changes)  # type: ignore[type-var]
        self.put(key, record)
        return record

    def update(self, changes: Mapping[str, R | None]) -> None:
        """Apply several changes in one write: each key to its new record, or removed where it maps to ``None``
        (no changes: nothing is written)."""
        if not changes:
            return
        for key, record in changes.items():
            if not isinstance(key, str) or not key:
                raise TypeError(
                    f"{self._store.path}: table {self.name!r}: a key must be a non-empty string, not {key!r}"
                )
            if record is not None and not isinstance(record, self.record_type):
                raise TypeError(
                    f"{self._store.path}: table {self.name!r}: the record of {key!r} must be a "
                    f"{self.record_type.__name__}, not {record!r}"
                )
        self._store._change(self, changes)

    def _set(self, records: dict[str, R]) -> None:
        self._records = MappingProxyType(records)


class RecordStore:
    """The tables of one JSON file (see the module docstring); the file is read when the store is made.

    ``what`` names the file's content in errors ("the vfio driver's state");
    ``recover`` says what an operator should do with a file that cannot be
    read ("restore the devices by hand, then remove it"). ``version`` is the
    format's version, written in the file and checked when it is read.
    The folder must exist (``ctx.state_dir`` does when ``start`` is called).
    """

    def __init__(self, path: Path, *, what: str = "a driver's records", recover: str = "", version: int = 1) -> None:
        self.path = Path(path)
        self.what = what
        self.recover = recover
        self.version = version
        self._lock = threading.Lock()
        self._tables: dict[str, RecordTable[Any]] = {}
        self._raw: dict[str, Any] = self._read()

    def __repr__(self) -> str:
        return f"<RecordStore {self.path} tables={sorted(self._tables)}>"

    def _refuse(self, problem: str) -> DriverError:
        hint = f": {self.recover}" if self.recover else ""
        return DriverError(f"{self.path}: cannot read {self.what} ({problem}){hint}")

    def _read(self) -> dict[str, Any]:
        try:
            text = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise self._refuse(exc.strerror or str(exc)) from exc
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise self._refuse(f"not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise self._refuse(f"expected a JSON object, found {type(data).__name__}")
        if data.get("version") != self.version:
            raise self._refuse(f"unknown version {data.get('version')!r}, expected {self.version}")
        return {k: v for k, v in data.items() if k != "version"}

    def table(self, name: str, record_type: type[R]) -> RecordTable[R]:
        """The table ``name`` of records of ``record_type``, read from the file (empty when it has none).

        :class:`devplug.DriverError` when a record cannot be read as ``record_type`` (see the module docstring).
        Asking for one table twice gives the same object.
        """
        with self._lock:
            known = self._tables.get(name)
            if known is not None:
                if known.record_type is not record_type:
                    raise TypeError(f"{self.path}: table {name!r} holds {known.record_type.__name__} records")
                return known
            raw = self._raw.get(name, {})
            if not isinstance(raw, dict):
                raise self._refuse(f"table {name!r} is not a JSON object")
            records = {str(key): self._decode(name, str(key), value, record_type) for key, value in raw.items()}
            table = RecordTable(self, name, record_type, records)
            self._tables[name] = table
            return table

    def _decode(self, table: str, key: str, value: Any, record_type: type[R]) -> R:
        where = f"{table}[{key!r}]"
        try:
            if dataclasses.is_dataclass(record_type):
                if not isinstance(value, dict):
                    raise ConfigError(f"{where}: expected a JSON object, got {value!r}")
                record = parse_options(record_type, value, where)
            else:
                holder = dataclasses.make_dataclass("_Value", [(_VALUE, record_type)])
                record = getattr(parse_options(holder, {_VALUE: value}, where), _VALUE)
        except ConfigError as exc:
            raise self._refuse(str(exc).replace(f"{where}.{_VALUE}:", f"{where}:")) from exc
        return record  # type: ignore[return-value]

    def _change(self, table: RecordTable[R], changes: Mapping[str, R | None]) -> None:
        with self._lock:
            records = dict(table.snapshot())
            for key, record in changes.items():
                if record is None:
                    records.pop(key, None)
                else:
                    records[key] = record
            content = dict(self._raw)
            for name, other in self._tables.items():
                content[name] = {k: _to_json(v) for k, v in sorted((records if other is table else other).items())}
            data = {"version": self.version, **dict(sorted(content.items()))}
            try:
                write_atomic(self.path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())
            except OSError as exc:
                raise DriverError(f"{self.path}: cannot write {self.what}: {exc.strerror or exc}") from exc
            self._raw = content
            table._set(records)
