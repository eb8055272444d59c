"""The shape of ``status.json``, checked before ``devplug status`` uses it.

The file is the daemon's, but anyone who can write the state dir (or a
disk error) can leave something else there: a list, wrong types, JSON nested
a million deep. :func:`check_status` says what is wrong and where
(``resources[0].counts.devices: expected an integer, got "x"``) instead of
the reader failing with a traceback. Keys the reader does not use are not
checked, so newer daemons may add some.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_PID", "check_status"]

#: The largest PID Linux hands out (pid_max is at most 2^22).
MAX_PID = 4194304


class _Optional:
    def __init__(self, spec: Any) -> None:
        self.spec = spec


class _Map:
    """An object with any string keys, every value of ``spec``."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec


Number = (int, float)

_RELEASE = {
    "devices": [str],
    "reason": str,
    "pod?": _Optional(str),
    "finished_at?": _Optional(Number),
    "duration_s": Number,
    "retry?": bool,
    "evidence?": _Optional(str),
}
_QUARANTINED = {"index?": int, "key?": str, "reason?": str, "devices?": [str]}
_DEVICE = {
    "id": str,
    "health": str,
    "driver_health?": str,
    "numa_nodes?": [int],
    "allocated?": bool,
    "pod?": _Optional(str),
    "releasing?": bool,
    "reason?": str,
}
_SHARE = {
    "device": str,
    "replicas": int,
    "in_use": int,
    "tenants": int,
    "releasing?": int,
    "pods?": [str],
}
_SHARING = {
    "replicas?": int,
    "configured_as?": _Optional(str),
    "fail_requests_greater_than_one?": bool,
    "devices?": [_SHARE],
}
_PARENT = {
    "parent": str,
    "counters": _Map(int),
    "in_use": _Map(int),
    "held": [str],
    "blocked": [str],
    "conflict?": str,
}
_COUNTS = {"devices?": int, "healthy?": int, "unhealthy?": int, "allocated?": int, "releasing?": int}
_RESOURCE = {
    "name": str,
    "driver": str,
    "state": str,
    "socket?": str,
    "registrations?": int,
    "registered_at?": _Optional(Number),
    "last_error?": _Optional(str),
    "degraded?": _Optional(str),
    "hooks?": [str],
    "counts?": _COUNTS,
    "devices_listed?": str,
    "devices?": [_DEVICE],
    "recent_releases?": [_RELEASE],
    "release_failures?": _Map(str),
    "busy_devices?": _Map(str),
    "quarantined_records?": [_QUARANTINED],
    "state_error?": _Optional(str),
    "driver_status?": _Optional({}),
    "driver_problem?": _Optional(str),
    "sharing?": _SHARING,
    "partitions?": [_PARENT],
    "frontend?": _Optional({}),
}
_STATUS = {
    "pid": int,
    "started_at?": _Optional(Number),
    "written_at?": _Optional(Number),
    "config?": _Optional(str),
    "stopped?": bool,
    "release?": _Optional(
        {
            "interval?": _Optional(Number),
            "grace_period?": _Optional(Number),
            "polls?": int,
            "failures?": int,
            "failing_since?": _Optional(Number),
            "last_success?": _Optional(Number),
            "last_error?": _Optional(str),
            "checkpoint_problem?": _Optional(str),
            "resource_errors?": _Map(str),
            "liveness?": _Optional(
                {
                    "state?": str,
                    "driver?": _Optional(str),
                    "kubepods?": _Optional(str),
                    "problem?": _Optional(str),
                    "required?": bool,
                }
            ),
            "awaiting_exit?": [
                {
                    "resource?": str,
                    "devices?": [str],
                    "pod?": _Optional(str),
                    "pod_uid?": _Optional(str),
                    "since?": _Optional(Number),
                    "why?": str,
                }
            ],
        }
    ),
    "reload?": _Optional(
        {
            "generation?": int,
            "loaded_at?": _Optional(Number),
            "attempts?": int,
            "last_at?": _Optional(Number),
            "last_result?": _Optional(str),
            "last_error?": _Optional(str),
            "trigger?": _Optional(str),
            "added?": [str],
            "changed?": [str],
            "removed?": [str],
            "unchanged?": [str],
        }
    ),
    "profiles?": _Optional(
        {
            "node?": _Optional(str),
            "node_source?": _Optional(str),
            "api?": str,
            "api_detail?": str,
            "resource_version?": str,
            "labels_read?": bool,
            "label?": _Optional(str),
            "defined?": [str],
            "active?": [str],
            "reasons?": _Map(str),
            "refused?": _Optional(str),
        }
    ),
    "resources?": [_RESOURCE],
}


def _describe(spec: Any) -> str:
    if isinstance(spec, _Optional):
        return f"{_describe(spec.spec)} or null"
    if isinstance(spec, _Map):
        return "an object"
    if isinstance(spec, list):
        return "a list"
    if isinstance(spec, dict):
        return "an object"
    if spec is Number:
        return "a number"
    return {int: "an integer", str: "a string", bool: "true or false"}[spec]


def _matches(value: Any, spec: Any) -> bool:
    if isinstance(spec, _Optional):
        return value is None or _matches(value, spec.spec)
    if isinstance(spec, _Map):
        return isinstance(value, dict)
    if isinstance(spec, list):
        return isinstance(value, list)
    if isinstance(spec, dict):
        return isinstance(value, dict)
    if spec is bool:
        return isinstance(value, bool)
    return isinstance(value, spec) and not isinstance(value, bool)


def _check(value: Any, spec: Any, where: str) -> None:
    if not _matches(value, spec):
        shown = repr(value) if not isinstance(value, (list, dict)) else type(value).__name__
        raise ValueError(f"{where or 'the top level'}: expected {_describe(spec)}, got {shown[:80]}")
    if isinstance(spec, _Optional):
        if value is not None:
            _check(value, spec.spec, where)
    elif isinstance(spec, _Map):
        for key, item in value.items():
            _check(item, spec.spec, f"{where}.{key}")
    elif isinstance(spec, list):
        for i, item in enumerate(value):
            _check(item, spec[0], f"{where}[{i}]")
    elif isinstance(spec, dict):
        for key, sub in spec.items():
            name = key.rstrip("?")
            inner = f"{where}.{name}" if where else name
            if name in value:
                _check(value[name], sub, inner)
            elif not key.endswith("?"):
                raise ValueError(f"{inner}: missing")


def check_status(data: Any) -> dict[str, Any]:
    """``data`` if it is shaped like a status file; ``ValueError`` naming the first bad field otherwise."""
    _check(data, _STATUS, "")
    if not 0 < data["pid"] <= MAX_PID:
        raise ValueError(f"pid: {data['pid']} is not a process ID")
    checked: dict[str, Any] = data
    return checked
