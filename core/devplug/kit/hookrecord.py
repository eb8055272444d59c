"""A record of a driver's hook calls, written by the driver and read by tests and ``devplug demo``.

Driver authors import it as :mod:`devplug.testing.recorder`; it lives outside
the test kit so that ``devplug demo`` can read the mock's record without
importing the kit.

A driver under test appends one JSON object per hook call to a JSONL file
in a folder (by default ``<folder>/.calls.jsonl``, a dotfile so a driver
whose devices are files never takes it for one)::

    {"hook":"deallocate","device_ids":["dev0"],"time":1700000000.25,"retry":true}

``retry`` is written only when true and ``error`` only when the hook
raised; a hook may add fields of its own (the mock's ``preferred_allocation``
adds ``must_include`` and ``size``). A call is recorded once the hook is done,
so a call still running is not in the file; :meth:`HookRecorder.begin` (and
:meth:`HookRecorder.call`, which calls it) also notes each call as it starts
in a second file, ``<file_name>.started``, so a test can tell a hook is
running (and kill the daemon in the middle of it). Each line is appended with a
single ``write`` on a file opened with ``O_APPEND``: lines never interleave,
even across processes (a killed daemon and its successor share the file).

The driver side::

    from devplug.testing.recorder import HookRecorder

    class MyDriver:
        def __init__(self, options):
            self.recorder = HookRecorder(options.directory)

        @hookimpl
        def deallocate(self, device_ids, retry):
            with self.recorder.call("deallocate", device_ids, retry=retry):
                ...  # the work; an exception is recorded as the call's error, then raised

The test side reads typed records with :func:`read_hook_calls` (or the raw
objects with :func:`read_call_log`).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devplug.text.compactjson import compact_json

__all__ = [
    "CALLS_FILE",
    "RELEASE_HOOKS",
    "STARTED_SUFFIX",
    "HookCall",
    "HookRecorder",
    "read_call_log",
    "read_hook_calls",
]

#: The default file name of the record, inside the folder given to :class:`HookRecorder`.
CALLS_FILE = ".calls.jsonl"

#: Appended to the record's file name for the file of calls that started.
STARTED_SUFFIX = ".started"

#: The hooks that release an allocation, in the order the engine calls them.
RELEASE_HOOKS = ("post_stop", "deallocate")

_CORE_FIELDS = ("hook", "device_ids", "time", "retry", "error")
_CORE_FIELDS_HEAD = frozenset(_CORE_FIELDS[:3])

log = logging.getLogger("devplug.kit.hookrecord")


@dataclass(frozen=True)
class HookCall:
    """One recorded hook call.

    ``time`` is the wall-clock time (``time.time()``) at which the hook
    returned or raised; ``retry`` is the ``retry`` argument of ``post_stop``
    and ``deallocate`` (False for other hooks); ``error`` is the message of
    the exception the hook raised, ``None`` when it returned; ``extra`` holds
    any further fields the driver recorded.
    """

    hook: str
    device_ids: tuple[str, ...]
    time: float
    retry: bool = False
    error: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when the hook returned (did not raise)."""
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        """The JSON object of one line of the record."""
        entry: dict[str, Any] = {"hook": self.hook, "device_ids": list(self.device_ids), "time": self.time}
        entry.update(self.extra)
        if self.retry:
            entry["retry"] = True
        if self.error is not None:
            entry["error"] = self.error
        return entry

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> HookCall:
        """A call from one line's JSON object; ``ValueError`` when it is not one."""
        try:
            hook, ids, stamp = entry["hook"], entry["device_ids"], entry["time"]
        except KeyError as exc:
            raise ValueError(f"a hook call record has no {exc.args[0]!r}: {entry!r}") from None
        if not isinstance(hook, str) or not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ValueError(f"not a hook call record: {entry!r}")
        error = entry.get("error")
        return cls(
            hook=hook,
            device_ids=tuple(ids),
            time=float(stamp),
            retry=entry.get("retry") is True,
            error=None if error is None else str(error),
            extra={k: v for k, v in entry.items() if k not in _CORE_FIELDS},
        )


#: The characters JSON's ASCII encoding writes as they are (the standard library's rule), but ``"``.
_PLAIN_BYTES = bytes(c for c in range(0x20, 0x7F) if c not in b'"\\')


def _ids_json(device_ids: Sequence[str]) -> str:
    """The JSON array of ``device_ids``: joined when no ID needs escaping (a GetPreferredAllocation offers
    1,000), encoded otherwise."""
    if not device_ids:
        return "[]"
    try:
        joined = '","'.join(device_ids)
        escaped = joined.encode("ascii").translate(None, _PLAIN_BYTES)  # what is left needs escaping
    except (TypeError, UnicodeEncodeError):  # not all strings (the encoder says what), or past ASCII
        return compact_json(list(device_ids))
    if len(escaped) != 2 * (len(device_ids) - 1) or escaped.count(b'"') != len(escaped):
        return compact_json(list(device_ids))  # more than the separators' quotes: an ID needs escaping
    return '["' + joined + '"]'


def _call_line(call: HookCall) -> bytes:
    """One line of the record: the text of ``compact_json(call.to_json())`` and a newline, the ID list joined
    rather than encoded string by string."""
    if not _CORE_FIELDS_HEAD.isdisjoint(call.extra):  # the extra fields overwrite hook, device_ids or time
        return (compact_json(call.to_json()) + "\n").encode()
    tail: dict[str, Any] = dict(call.extra)
    if call.retry:
        tail["retry"] = True
    if call.error is not None:
        tail["error"] = call.error
    head = (
        f'{{"hook":{compact_json(call.hook)},"device_ids":{_ids_json(call.device_ids)},"time":{compact_json(call.time)}'
    )
    return (head + ("," + compact_json(tail)[1:] if tail else "}") + "\n").encode()


class HookRecorder:
    """Appends a driver's hook calls to ``<folder>/<file_name>``; thread-safe and safe across processes.

    Create one when the driver is constructed; call :meth:`record` after each
    hook (or wrap the hook's work in :meth:`call`). A call that cannot be
    recorded (the folder was removed) is logged as a warning to ``logger``
    and does not fail the hook.
    """

    def __init__(self, folder: Path, file_name: str = CALLS_FILE, *, logger: logging.Logger | None = None) -> None:
        self.path = Path(folder) / file_name
        self.started_path = Path(folder) / (file_name + STARTED_SUFFIX)
        self._log = logger if logger is not None else log
        self._lock = threading.Lock()
        self._fds: dict[Path, int] = {}

    def record(
        self,
        hook: str,
        device_ids: Sequence[str],
        *,
        retry: bool = False,
        error: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> HookCall:
        """Append one finished call, stamped with the time now; returns what was recorded."""
        call = HookCall(hook, tuple(device_ids), time.time(), retry, error, dict(extra or {}))
        self._append(self.path, call)
        return call

    def begin(
        self, hook: str, device_ids: Sequence[str], *, retry: bool = False, extra: Mapping[str, Any] | None = None
    ) -> HookCall:
        """Note that a call starts now (in ``<file_name>.started``); returns what was noted."""
        call = HookCall(hook, tuple(device_ids), time.time(), retry, None, dict(extra or {}))
        self._append(self.started_path, call)
        return call

    def _append(self, path: Path, call: HookCall) -> None:
        line = _call_line(call)
        with self._lock:
            try:
                os.write(self._descriptor(path), line)
            except OSError as exc:  # the folder was removed under us: the hook itself still counts
                self._log.warning("cannot record the %s call in %s: %s", call.hook, path, exc)

    def _descriptor(self, path: Path) -> int:
        """The open ``O_APPEND`` descriptor of ``path``, (re)opened when missing or when the file was removed.

        Kept open between calls: a driver watching its own folder (the mock) then sees no close event per call.
        """
        fd = self._fds.get(path)
        if fd is not None and os.fstat(fd).st_nlink > 0:
            return fd
        if fd is not None:
            del self._fds[path]
            os.close(fd)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._fds[path] = fd
        return fd

    def close(self) -> None:
        """Close the record's files (the next call reopens them)."""
        with self._lock:
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    @contextmanager
    def call(
        self,
        hook: str,
        device_ids: Sequence[str],
        *,
        retry: bool = False,
        extra: Mapping[str, Any] | None = None,
    ) -> Iterator[None]:
        """Note the call's start, then record it when the ``with`` body ends: with the exception's message if
        it raised (re-raised)."""
        self.begin(hook, device_ids, retry=retry, extra=extra)
        try:
            yield
        except Exception as exc:
            self.record(hook, device_ids, retry=retry, error=str(exc), extra=extra)
            raise
        self.record(hook, device_ids, retry=retry, extra=extra)

    def calls(self) -> list[HookCall]:
        """Every call recorded so far in this recorder's file (by any process), oldest first."""
        return read_hook_calls(self.path.parent, self.path.name)


def read_call_log(folder: Path, file_name: str = CALLS_FILE, *, started: bool = False) -> list[dict[str, Any]]:
    """The raw JSON object of every recorded call, oldest first (``[]`` when nothing was recorded);
    with ``started``, of every call noted as it started instead.

    A last line still being written (no newline yet) is left out.
    """
    path = Path(folder) / (file_name + STARTED_SUFFIX if started else file_name)
    try:
        data = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    calls: list[dict[str, Any]] = []
    for line in data.splitlines(keepends=True):
        if line.endswith("\n") and line.strip():
            calls.append(json.loads(line))
    return calls


def read_hook_calls(
    folder: Path,
    file_name: str = CALLS_FILE,
    *,
    hook: str | None = None,
    device: str | None = None,
    ok: bool | None = None,
    started: bool = False,
) -> list[HookCall]:
    """The recorded calls, oldest first, typed; filtered by ``hook``, by a ``device`` among their IDs,
    and by outcome (``ok=True`` calls that returned, ``False`` calls that raised, ``None`` both).

    With ``started``, the calls noted as they started (:meth:`HookRecorder.begin`), finished or not.
    """
    return [
        call
        for call in map(HookCall.from_json, read_call_log(folder, file_name, started=started))
        if (hook is None or call.hook == hook)
        and (device is None or device in call.device_ids)
        and (ok is None or call.ok == ok)
    ]
