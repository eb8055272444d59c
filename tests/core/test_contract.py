"""The hook contract's version: a driver built for another contract is refused when it is discovered."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from devplug import HOOK_CONTRACT
from devplug.contract import parse_contract
from devplug.drivers import installed_drivers, load_driver_class
from devplug.errors import DriverLoadError
from devplug.testing.configs import dev_config, write_toml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

Make = Callable[[str, str, str], Path]

ROOT = Path(__file__).resolve().parents[2]

# A driver whose hooks would fail loudly if anything called them: a refused driver must never get that far.
DRIVER = """
from devplug import Device, hookimpl

class Driver:
{declaration}
    @hookimpl
    def list_devices(self):
        raise RuntimeError("list_devices of a refused driver was called")
"""


def _driver(make: Make, name: str, declaration: str) -> Path:
    dist = f"devplug-test-{name}"
    source = DRIVER.format(declaration=f"    {declaration}\n" if declaration else "    pass\n")
    return make(dist, source, f"[devplug.drivers]\n{name} = devplug_test_{name}:Driver\n")


def test_the_core_speaks_a_well_formed_contract() -> None:
    assert parse_contract(HOOK_CONTRACT) == (1, 1)
    for bad in ("1", "1.0.0", "v1.0", "01.0", "1.x", ""):
        with pytest.raises(ValueError, match="not a contract version"):
            parse_contract(bad)


#: What each shipped driver declares: the core's contract, but the mock's stays 1.0: a driver subclassing the mock
#: inherits its declaration (tests/fixtures/devplug-legacy's test of it is a user's test), and the mock's 1.1
#: features are options it is given, never a hook it requires of the core.
SHIPPED_CONTRACTS = {"mock": "1.0", "vfio": HOOK_CONTRACT, "sriov": HOOK_CONTRACT, "fpga": HOOK_CONTRACT}
SHIPPED_CONTRACTS["shared"] = HOOK_CONTRACT


def test_every_shipped_driver_declares_the_contract_it_is_written_for() -> None:
    for name, declared in SHIPPED_CONTRACTS.items():
        assert load_driver_class(name).hook_contract == declared, name  # type: ignore[attr-defined]


@pytest.mark.parametrize("declared", [HOOK_CONTRACT, "1.0"])
def test_a_driver_built_for_this_contract_loads(fake_distribution: Make, declared: str) -> None:
    _driver(fake_distribution, "current", f"hook_contract = {declared!r}")
    assert load_driver_class("current").__name__ == "Driver"


@pytest.mark.parametrize(
    ("declared", "advice"),
    [
        ("2.0", "upgrade devplug to a release that speaks hook contract 2.0"),
        ("1.2", "upgrade devplug to a release that speaks hook contract 1.2"),
        ("0.9", "install a devplug-test-other release built for hook contract 1.x"),
    ],
)
def test_a_driver_built_for_another_contract_is_refused(fake_distribution: Make, declared: str, advice: str) -> None:
    _driver(fake_distribution, "other", f"hook_contract = {declared!r}")
    assert "other" in installed_drivers()  # discovered, and refused only when loaded
    with pytest.raises(DriverLoadError) as info:
        load_driver_class("other")
    message = str(info.value)
    assert f"driver 'other' from devplug-test-other 1.2.3 was built for hook contract {declared}" in message
    assert f"this devplug speaks hook contract {HOOK_CONTRACT}" in message
    assert advice in message


def test_a_driver_declaring_no_contract_is_taken_as_contract_1_0_with_the_line_to_add(
    fake_distribution: Make, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 25: a driver written before the attribute existed (contract 1.0) kept working, with a warning."""
    _driver(fake_distribution, "undeclared", "")
    assert load_driver_class("undeclared").__name__ == "Driver"
    (warning,) = [r.getMessage() for r in caplog.records if "declares no hook contract" in r.getMessage()]
    assert "driver 'undeclared' from devplug-test-undeclared 1.2.3" in warning
    assert f"called as a driver of hook contract 1.0 (this devplug speaks {HOOK_CONTRACT})" in warning
    assert "hook_contract = '1.0'" in warning


@pytest.mark.parametrize(("declared", "expected"), [("1", "must be a string"), ("'one'", "not a contract version")])
def test_a_malformed_declaration_is_refused(fake_distribution: Make, declared: str, expected: str) -> None:
    _driver(fake_distribution, "malformed", f"hook_contract = {declared}")
    with pytest.raises(DriverLoadError, match=expected) as info:
        load_driver_class("malformed")
    assert "devplug-test-malformed 1.2.3" in str(info.value)


def _devplug(*args: str) -> subprocess.CompletedProcess[str]:
    # The fake distribution's folder reaches the child through PYTHONPATH (set by the fixture).
    return subprocess.run([sys.executable, "-m", "devplug", *args], capture_output=True, text=True, timeout=60)


def test_the_daemon_refuses_it_before_serving_anything(fake_distribution: Make, devplug_root: Path) -> None:
    _driver(fake_distribution, "future", 'hook_contract = "2.0"')
    config = dev_config(devplug_root, {"example.com/future": {"driver": "future"}})
    path = write_toml(devplug_root / "c.toml", config)
    for command in (["check-config", str(path)], ["run", "--config", str(path)]):
        result = _devplug(*command)
        # A driver that cannot be loaded for a configured resource is a config error naming the file and key.
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert f'{path}: resources."example.com/future".driver: driver' in result.stderr
        assert "driver 'future' from devplug-test-future 1.2.3 was built for hook contract 2.0" in result.stderr
        assert "list_devices of a refused driver" not in result.stderr
    assert not list((devplug_root / "device-plugins").glob("*.sock")), "a refused driver's resource was served"


def test_devplug_drivers_shows_contracts_and_the_refusal(fake_distribution: Make) -> None:
    _driver(fake_distribution, "future", 'hook_contract = "2.0"')
    rows = {row["name"]: row for row in json.loads(_devplug("drivers", "--json").stdout)}
    assert rows["mock"]["hook_contract"] == SHIPPED_CONTRACTS["mock"]
    assert "hook_contract" not in rows["future"]
    assert "was built for hook contract 2.0" in rows["future"]["error"]
    text = _devplug("drivers").stdout
    assert f"devplug-mock 0.1.0 (hook contract {SHIPPED_CONTRACTS['mock']})" in text
    assert "BROKEN: driver 'future' from devplug-test-future 1.2.3 was built for hook contract 2.0" in text


def test_devplug_drivers_lists_an_undeclared_driver_as_contract_1_0_with_its_warning(fake_distribution: Make) -> None:
    """Issue 38: the listing read ``hook_contract`` with no default and crashed (exit 1, also with --json) as soon
    as a driver written before the attribute was installed."""
    _driver(fake_distribution, "undeclared", "")
    line = "driver 'undeclared' from devplug-test-undeclared 1.2.3: class Driver declares no hook contract"
    listed = _devplug("drivers", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert rows["undeclared"]["hook_contract"] == "1.0"
    assert rows["undeclared"]["hooks"] == ["list_devices"]
    (warning,) = rows["undeclared"]["warnings"]
    assert warning.startswith(line) and "set the class attribute hook_contract = '1.0'" in warning
    assert "warnings" not in rows["mock"]
    text = _devplug("drivers")
    assert text.returncode == 0, text.stderr
    assert "devplug-test-undeclared 1.2.3 (hook contract 1.0)\n           hooks: list_devices\n" in text.stdout
    assert f"           warning: {line}" in text.stdout
    assert line not in text.stderr  # said once, in the listing


def test_check_config_says_the_warning_once_however_many_resources_use_the_driver(
    fake_distribution: Make, devplug_root: Path
) -> None:
    _driver(fake_distribution, "undeclared", "")
    resources = {f"example.com/u{i}": {"driver": "undeclared"} for i in range(3)}
    path = write_toml(devplug_root / "c.toml", dev_config(devplug_root, resources))
    checked = _devplug("check-config", str(path))
    assert checked.returncode == 0, checked.stderr
    assert checked.stderr.count("declares no hook contract") == 1, checked.stderr
    assert "example.com/u2: driver undeclared" in checked.stdout


def test_version_names_the_contract() -> None:
    result = _devplug("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"devplug 0.1.0 (hook contract {HOOK_CONTRACT})"


def test_each_driver_wheel_pins_a_compatible_core_range() -> None:
    core_version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    major, minor = (int(p) for p in core_version.split(".")[:2])
    expected = f"devplug>={major}.{minor},<{major}.{minor + 1}"
    for pyproject in sorted((ROOT / "drivers").glob("*/pyproject.toml")):
        dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
        core = [d for d in dependencies if d.split(">")[0].split("<")[0].split("=")[0].strip() == "devplug"]
        assert core == [expected], f"{pyproject.relative_to(ROOT)}: {core}"
