"""Driver option schemas are checked strictly, with errors naming the key."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from devplug.errors import ConfigError
from devplug.options import parse_options

WHERE = 'c.toml: resources."example.com/x".options'


@dataclass(frozen=True)
class Opts:
    directory: Path
    count: int | None = None
    ratio: float = 1.0
    enabled: bool = True
    mode: Literal["on-allocate", "at-start"] = "on-allocate"
    vendors: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.count is not None and self.count < 0:
            raise ValueError(f"count must be >= 0, got {self.count}")


def test_valid_table_converted() -> None:
    opts = parse_options(
        Opts,
        {"directory": "/d", "count": 3, "ratio": 2, "mode": "at-start", "vendors": ["8086"], "labels": {"a": "b"}},
        WHERE,
    )
    assert opts == Opts(Path("/d"), 3, 2.0, True, "at-start", ["8086"], {"a": "b"})


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"directory": "/d", "cuont": 1}, "options.cuont: unknown key; did you mean 'count'?"),
        ({}, "options.directory: missing required key (a path)"),
        ({"directory": "/d", "count": "4"}, "options.count: expected an integer, got '4'"),
        ({"directory": "/d", "count": True}, "options.count: expected an integer"),
        ({"directory": "/d", "enabled": "yes"}, "options.enabled: expected true or false"),
        ({"directory": "/d", "mode": "sometimes"}, "options.mode: expected one of 'on-allocate', 'at-start'"),
        ({"directory": "/d", "vendors": "8086"}, "options.vendors: expected a list of a string"),
        ({"directory": "/d", "vendors": [8086]}, "options.vendors[0]: expected a string"),
        ({"directory": "/d", "labels": {"a": 1}}, "options.labels.a: expected a string"),
        ({"directory": "/d", "count": -1}, "options: count must be >= 0, got -1"),
    ],
)
def test_errors_name_the_key(table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_options(Opts, table, WHERE)
    assert message in str(info.value)
    assert str(info.value).startswith('c.toml: resources."example.com/x"')


def test_driver_without_schema_takes_no_options() -> None:
    assert parse_options(None, {}, WHERE) is None
    with pytest.raises(ConfigError, match="takes no options"):
        parse_options(None, {"x": 1}, WHERE)
