"""Driver option schemas: a dataclass per driver, checked strictly against the config.

A driver declares its options as a dataclass on its class::

    @dataclass(frozen=True)
    class Options:
        directory: Path
        count: int | None = None
        mode: Literal["on-allocate", "at-start"] = "on-allocate"

Supported field types: ``str``, ``int``, ``float`` (ints accepted; never NaN or infinity), ``bool``,
``pathlib.Path`` (from a string), ``Literal[...]``, ``X | None``,
``list[X]``, ``tuple[X, ...]`` and ``dict[str, X]`` of those. A field without a
default is required. Unknown keys, missing keys and wrong types are
:class:`~devplug.errors.ConfigError` naming the file, the resource and the key;
a ``ValueError`` raised by the dataclass's ``__post_init__`` becomes one too.

A folder option that must not point into the kernel's own trees (``/proc``,
``/sys``, ``/dev``) checks itself with :func:`refuse_kernel_trees` in
``__post_init__``: reading files there can block forever (``/proc/kmsg``) or
change the system.

A check that looks at the node (a file the option names exists, a NIC is
there) runs only while :func:`node_checks` is true: ``devplug check-config
--offline`` checks a config in a pipeline, off the node, with it false
(:func:`without_node_checks`), so only the keys and the values are checked
then. ``devplug run`` and ``devplug check-config`` on the node run every check.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import types
import typing
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

from devplug.errors import ConfigError

__all__ = [
    "KERNEL_TREES",
    "describe_type",
    "node_checks",
    "parse_options",
    "refuse_kernel_trees",
    "unknown_key_hint",
    "without_node_checks",
]

T = TypeVar("T")

_NODE_CHECKS: ContextVar[bool] = ContextVar("devplug_node_checks", default=True)


def node_checks() -> bool:
    """Whether an option's check may look at the node (a file it names exists, a device is there): false while
    ``devplug check-config --offline`` checks a config off the node, where such a check is skipped."""
    return _NODE_CHECKS.get()


@contextlib.contextmanager
def without_node_checks() -> Iterator[None]:
    """Within the block, :func:`node_checks` is false (in this context: thread and task)."""
    token = _NODE_CHECKS.set(False)
    try:
        yield
    finally:
        _NODE_CHECKS.reset(token)


def unknown_key_hint(key: str, known: typing.Iterable[str]) -> str:
    """A hint for a misspelt key: the closest known key, or the list of known keys."""
    import difflib  # only on the error path: it weighs on the daemon's footprint

    known = sorted(known)
    close = difflib.get_close_matches(key, known, n=1)
    if close:
        return f"did you mean {close[0]!r}?"
    return f"known keys: {', '.join(known)}" if known else "this table takes no keys"


def describe_type(tp: Any) -> str:
    """A type as an operator reads it in an error message."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is type(None):
        return "nothing"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " or ".join(describe_type(a) for a in args if a is not type(None))
    if origin in (list, tuple):
        return f"a list of {describe_type(args[0])}" if args else "a list"
    if origin is dict:
        return f"a table of {describe_type(args[1])}" if args else "a table"
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false", Path: "a path"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _convert(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:  # never from TOML, which has no null; JSON records have it
            return None
        errors = []
        for arm in args:
            if arm is type(None):
                continue
            try:
                return _convert(value, arm, where)
            except ConfigError as exc:
                errors.append(exc)
        raise ConfigError(f"{where}: expected {describe_type(tp)}, got {value!r}")
    if origin is Literal:
        if value in args and type(value) in {type(a) for a in args}:
            return value
        raise ConfigError(f"{where}: expected {describe_type(tp)}, got {value!r}")
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected {describe_type(tp)}, got {value!r}")
        items = [_convert(item, args[0], f"{where}[{i}]") for i, item in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected {describe_type(tp)}, got {value!r}")
        return {str(k): _convert(v, args[1], f"{where}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(f"{where}: expected a finite number, got {value!r}")
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is Path:
        if isinstance(value, str) and value:
            return Path(value)
    elif tp is Any:
        return value
    else:
        raise TypeError(f"unsupported option type {tp!r} at {where}")
    raise ConfigError(f"{where}: expected {describe_type(tp)}, got {type(value).__name__} {value!r}")


#: The kernel's own trees: their files are not data files (reads block, consume or change kernel state).
KERNEL_TREES: tuple[Path, ...] = (Path("/proc"), Path("/sys"), Path("/dev"))


def refuse_kernel_trees(path: Path, key: str, allowed: Path | None = None) -> None:
    """Raise ``ValueError`` naming ``key`` when ``path`` lies in ``/proc``, ``/sys`` or ``/dev``.

    Both the path as written (``..`` removed) and the path its links lead to
    are checked. ``allowed`` is the one tree the option is meant for (a
    sysfs root may be ``/sys``), refused nowhere else.
    """
    written = Path(os.path.abspath(path))
    _refuse_in_trees(written, path, key, allowed, "")
    try:
        resolved = Path(path).resolve()
    except (OSError, RuntimeError):  # unreadable links (EACCES) or a loop: what was written was checked
        return
    if resolved != written:
        _refuse_in_trees(resolved, path, key, allowed, f" (it leads to {resolved})")


def _refuse_in_trees(seen: Path, path: Path, key: str, allowed: Path | None, via: str) -> None:
    for tree in KERNEL_TREES:
        if tree != allowed and (seen == tree or tree in seen.parents):
            raise ValueError(
                f"{key}: {path} is inside {tree}{via}, a kernel tree this option must not point into "
                "(reading files there can block forever or change the system)"
            )


def parse_options(schema: type[T] | None, table: Mapping[str, Any], where: str) -> T | None:
    """Build an instance of the dataclass ``schema`` from a TOML table.

    ``where`` names the table for error messages, e.g.
    ``config.toml: resources."example.com/mock".options``. A driver without a
    schema (``None``) accepts no options and gets ``None``.
    """
    if schema is None:
        if table:
            key = next(iter(table))
            raise ConfigError(f"{where}.{key}: unknown key; this driver takes no options")
        return None
    if not dataclasses.is_dataclass(schema):
        raise TypeError(f"driver option schema {schema!r} is not a dataclass")
    hints = typing.get_type_hints(schema)
    fields = {f.name: f for f in dataclasses.fields(schema) if f.init}
    for key in table:
        if key not in fields:
            raise ConfigError(f"{where}.{key}: unknown key; {unknown_key_hint(key, fields)}")
    kwargs: dict[str, Any] = {}
    for name, fld in fields.items():
        if name in table:
            kwargs[name] = _convert(table[name], hints[name], f"{where}.{name}")
        elif fld.default is dataclasses.MISSING and fld.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{where}.{name}: missing required key ({describe_type(hints[name])})")
    try:
        return schema(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc
