"""Finding the mock driver like the daemon does: the entry point, and the config with its options."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devplug import ConfigError
from devplug.config import parse_config
from devplug.drivers import HOOK_NAMES, DriverHooks, installed_drivers, load_driver_class
from devplug_mock import MockDriver, MockOptions


def config(options: dict[str, Any]) -> dict[str, Any]:
    return {"resources": {"example.com/mock": {"driver": "mock", "options": options}}}


def test_entry_point_finds_the_driver() -> None:
    assert load_driver_class("mock") is MockDriver
    info = installed_drivers()["mock"]
    assert info.distribution == "devplug-mock"


def test_driver_loaded_by_name_implements_every_hook(tmp_path: Path) -> None:
    cls: Any = load_driver_class("mock")
    hooks = DriverHooks("example.com/mock", cls(cls.Options(directory=tmp_path)))
    assert hooks.implemented() == list(HOOK_NAMES)  # every hook of the contract


def test_config_builds_the_options(tmp_path: Path) -> None:
    cfg = parse_config(config({"directory": str(tmp_path / "dev"), "count": 3}))
    [resource] = cfg.resources
    assert resource.driver_class is MockDriver
    assert resource.options == MockOptions(directory=tmp_path / "dev", count=3)


def test_count_is_optional(tmp_path: Path) -> None:
    [resource] = parse_config(config({"directory": str(tmp_path)})).resources
    assert resource.options.count is None


def test_relative_directory_is_relative_to_the_config_file(tmp_path: Path) -> None:
    [resource] = parse_config(config({"directory": "dev"}), source="x.toml", base=tmp_path).resources
    assert resource.options.directory == tmp_path / "dev"


@pytest.mark.parametrize(
    ("options", "key", "fragment"),
    [
        ({"directory": "/d", "cuont": 2}, "cuont", "did you mean 'count'"),
        ({"directory": "/d", "count": "four"}, "count", "expected an integer"),
        ({"directory": "/d", "count": 2.5}, "count", "expected an integer"),
        ({"directory": "/d", "count": True}, "count", "expected an integer"),
        ({"directory": "/d", "count": -1}, "count", ">= 0"),
        ({"directory": "/d", "inline_hooks": "yes"}, "inline_hooks", "expected true or false"),
        ({"directory": 7}, "directory", "expected a path"),
        ({"count": 2}, "directory", "missing required key"),
    ],
)
def test_bad_options_name_the_key(options: dict[str, Any], key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(config(options), source="devplug.toml")
    message = str(info.value)
    assert key in message
    assert fragment in message
    assert 'resources."example.com/mock".options' in message
    assert message.startswith("devplug.toml")


@pytest.mark.parametrize("count", [-1, True, 1.5])
def test_options_check_themselves(count: Any) -> None:
    with pytest.raises(ValueError, match="count"):
        MockOptions(directory=Path("/d"), count=count)


def test_options_accept_a_string_directory() -> None:
    assert MockOptions(directory="/d").directory == Path("/d")  # type: ignore[arg-type]
