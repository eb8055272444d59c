"""Writing a config-shaped document as TOML (the standard library reads TOML but does not write it)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["dumps_toml", "write_toml"]


def _key(key: str) -> str:
    bare = key.replace("_", "").replace("-", "").isalnum()
    return key if bare else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (str, Path)):
        return json.dumps(str(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} as TOML")


def dumps_toml(data: Mapping[str, Any]) -> str:
    """TOML for a config-shaped document: top-level tables, ``resources`` as a table of tables.

    Nested tables below the second level are written inline.
    """
    lines: list[str] = []
    for section, body in data.items():
        if not isinstance(body, Mapping):
            lines.append(f"{_key(section)} = {_value(body)}")
            continue
        if section == "resources":
            for name, table in body.items():
                lines.append(f"\n[resources.{_key(name)}]")
                lines.extend(f"{_key(k)} = {_value(v)}" for k, v in table.items())
            continue
        lines.append(f"\n[{_key(section)}]")
        lines.extend(f"{_key(k)} = {_value(v)}" for k, v in body.items())
    return "\n".join(lines).lstrip() + "\n"


def write_toml(path: Path, data: Mapping[str, Any]) -> Path:
    """Write ``data`` as TOML to ``path`` and return the path."""
    path.write_text(dumps_toml(data))
    return path
