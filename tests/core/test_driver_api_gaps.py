"""The driver API gaps of issue 27, closed compatibly: health with a reason per device, a driver's default
``health_interval``, the resource settings (``hook_timeout``) seen by ``check_resources``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from devplug import Device, Health, HealthReport, ResourceSettings, hookimpl
from devplug.config import parse_config
from devplug.drivers import DriverHooks
from devplug.engine.devicetable import DeviceTable
from devplug.errors import ConfigError, DriverError
from devplug.testing.configs import dev_config
from devplug.types import MAX_REASON_CHARS

Make = Callable[[str, str, str], Path]


class Probing:
    answer: object = None

    @hookimpl
    def list_devices(self) -> Sequence[Device]:
        return [Device("d0"), Device("d1")]

    @hookimpl
    def check_health(self, devices: Sequence[Device]) -> object:
        return type(self).answer


def _checked(answer: object) -> dict[str, Health | HealthReport]:
    Probing.answer = answer
    return DriverHooks("example.com/x", Probing()).check_health([Device("d0"), Device("d1")])


def test_check_health_takes_reports_healths_and_their_strings_and_names_a_bad_value() -> None:
    report = HealthReport(Health.UNHEALTHY, "link down")
    assert _checked({"d0": report, "d1": "Healthy"}) == {"d0": report, "d1": Health.HEALTHY}
    with pytest.raises(DriverError) as bad:
        _checked({"d0": Health.HEALTHY, "d1": "broken"})
    assert "check_health gave device 'd1' 'broken'" in str(bad.value) and "HealthReport" in str(bad.value)


def test_a_health_report_is_checked_and_its_reason_bounded() -> None:
    assert HealthReport("Unhealthy", "x").health is Health.UNHEALTHY  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"HealthReport\.health must be a Health"):
        HealthReport("sick")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"HealthReport\.reason must be a string"):
        HealthReport(Health.UNHEALTHY, 7)  # type: ignore[arg-type]
    assert len(HealthReport(Health.UNHEALTHY, "x" * 5000).reason) == MAX_REASON_CHARS


def test_the_table_takes_a_reason_with_the_health_and_keeps_it_for_a_bare_health() -> None:
    table = DeviceTable()
    table.replace([Device("d0"), Device("d1")])
    assert table.set_health({"d0": HealthReport(Health.UNHEALTHY, "link down")}) == ["d0"]
    assert (table.reported("d0").health, table.reported("d0").reason) == (Health.UNHEALTHY, "link down")  # type: ignore[union-attr]
    assert table.set_health({"d0": HealthReport(Health.UNHEALTHY, "no carrier")}) == ["d0"]  # only the reason changed
    assert table.set_health({"d0": Health.UNHEALTHY}) == []  # a bare health keeps the reason
    assert table.reported("d0").reason == "no carrier"  # type: ignore[union-attr]
    assert table.set_health({"d0": HealthReport(Health.HEALTHY), "gone": Health.UNHEALTHY}) == ["d0"]
    assert (table.reported("d0").health, table.reported("d0").reason) == (Health.HEALTHY, "")  # type: ignore[union-attr]


DRIVER = """
from devplug import Device, hookimpl

class Driver:
    hook_contract = "1.0"
{body}
    @hookimpl
    def list_devices(self):
        return [Device("d0")]
"""


def _config(make: Make, root: Path, body: str, table: dict[str, object] | None = None) -> object:
    make("devplug-test-gaps", DRIVER.format(body=body), "[devplug.drivers]\ngaps = devplug_test_gaps:Driver\n")
    resources: dict[str, dict[str, object]] = {
        "example.com/a": {"driver": "gaps", **(table or {})},
        "example.com/b": {"driver": "gaps"},
    }
    return parse_config(dev_config(root, resources))


def test_a_drivers_default_health_interval_applies_where_the_config_sets_none(
    fake_distribution: Make, tmp_path: Path
) -> None:
    config = _config(fake_distribution, tmp_path, "    health_interval = 7.5\n", {"health_interval": 2})
    assert [rc.health_interval for rc in config.resources] == [2.0, 7.5]  # type: ignore[attr-defined]


def test_a_bad_default_health_interval_names_the_resource_and_the_driver(
    fake_distribution: Make, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as bad:
        _config(fake_distribution, tmp_path, "    health_interval = -1\n")
    message = str(bad.value)
    assert "resources.\"example.com/a\": health_interval, the default of driver 'gaps' (its class attribute)" in message
    assert "got -1" in message


def test_without_a_default_health_checks_stay_off(fake_distribution: Make, tmp_path: Path) -> None:
    config = _config(fake_distribution, tmp_path, "")
    assert [rc.health_interval for rc in config.resources] == [0.0, 0.0]  # type: ignore[attr-defined]


SEEN: list[object] = []  # what the drivers' check_resources were given

CHECKING = """
    @classmethod
    def check_resources(cls, options, settings):
        import tests.core.test_driver_api_gaps as here
        here.SEEN.append(dict(settings))
        for name, s in settings.items():
            if s.hook_timeout < 10:
                raise ValueError(f"{name}: erasing takes 10 s, longer than hook_timeout {s.hook_timeout:g}")
"""

LEGACY = """
    @classmethod
    def check_resources(cls, options):
        import tests.core.test_driver_api_gaps as here
        here.SEEN.append(sorted(options))
"""


def test_check_resources_sees_each_resources_settings(fake_distribution: Make, tmp_path: Path) -> None:
    SEEN.clear()
    with pytest.raises(ConfigError) as refused:
        _config(fake_distribution, tmp_path, CHECKING, {"hook_timeout": 5, "replicas": 2})
    (seen,) = SEEN
    assert seen == (
        {
            "example.com/a": ResourceSettings(hook_timeout=5.0, health_interval=0.0, replicas=2),
            "example.com/b": ResourceSettings(hook_timeout=30.0, health_interval=0.0, replicas=1),
        }
    )
    message = str(refused.value)
    assert 'resources "example.com/a", "example.com/b" (driver gaps)' in message
    assert "example.com/a: erasing takes 10 s, longer than hook_timeout 5" in message


def test_a_check_resources_without_settings_is_called_as_before(fake_distribution: Make, tmp_path: Path) -> None:
    SEEN.clear()
    _config(fake_distribution, tmp_path, LEGACY)
    (seen,) = SEEN
    assert seen == ["example.com/a", "example.com/b"]
