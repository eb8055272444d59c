"""The TOML config: strict, with errors naming the file, the resource and the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from devplug.config import load_config
from devplug.errors import ConfigError, DriverNotFoundError

ROOT = Path(__file__).resolve().parents[2]

GOOD = """
[kubelet]
device_plugin_dir = "plugins"
pod_resources_socket = "/run/pr.sock"

[state]
dir = "state"

[release]
interval = 0.5
grace_period = 3

[resources."example.com/mock"]
driver = "mock"
options = { directory = "devs", count = 2 }
health_interval = 5
hook_timeout = 2.5
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "devplug.toml"
    path.write_text(text)
    return path


def test_good_config_is_typed_and_relative_paths_follow_the_file(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, GOOD))
    base = tmp_path.resolve()
    assert config.kubelet.device_plugin_dir == base / "plugins"
    assert config.kubelet.kubelet_socket == base / "plugins" / "kubelet.sock"
    assert config.kubelet.pod_resources_socket == Path("/run/pr.sock")
    assert config.state.dir == base / "state"
    assert (config.release.interval, config.release.grace_period) == (0.5, 3.0)
    (resource,) = config.resources
    assert resource.name == "example.com/mock" and resource.driver == "mock"
    assert resource.options.directory == base / "devs" and resource.options.count == 2
    assert (resource.health_interval, resource.hook_timeout) == (5.0, 2.5)


def test_example_config_is_valid() -> None:
    config = load_config(ROOT / "config.example.toml")
    assert [r.name for r in config.resources] == ["example.com/mock"]
    assert config.kubelet.device_plugin_dir == Path("/var/lib/kubelet/device-plugins")
    assert config.state.dir == Path("/var/lib/devplug")


def _replace(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (_replace("[state]", "[stat]"), "stat: unknown key; did you mean 'state'?"),
        (_replace('dir = "state"', 'dri = "state"'), "state.dri: unknown key; did you mean 'dir'?"),
        (
            _replace('device_plugin_dir = "plugins"', "device_plugin_dir = 3"),
            "kubelet.device_plugin_dir: expected a path",
        ),
        (
            _replace("interval = 0.5", "interval = 0"),
            "release.interval: must be a finite number of seconds from 0.01 to 3600",
        ),
        (_replace("grace_period = 3", 'grace_period = "3"'), "release.grace_period: expected a number of seconds"),
        (_replace('driver = "mock"', 'driver = "mokc"'), 'resources."example.com/mock".driver: no driver named'),
        (_replace('driver = "mock"', ""), 'resources."example.com/mock".driver: missing'),
        (
            _replace("hook_timeout = 2.5", "hook_timeout = 0"),
            "hook_timeout: must be a finite number of seconds from 0.01",
        ),
        (_replace("health_interval = 5", "health_intervall = 5"), "health_intervall: unknown key; did you mean"),
        (_replace("count = 2", 'count = "2"'), 'resources."example.com/mock".options.count: expected an integer'),
        (_replace("count = 2", "cuont = 2"), "options.cuont: unknown key; did you mean 'count'?"),
        (_replace("count = 2", "count = -2"), "options: "),
        (_replace('"example.com/mock"', '"mock"'), 'the kubelet would refuse the resource name "mock"'),
        (_replace('"example.com/mock"', '"Example.com/mock"'), "is not a lowercase DNS-1123 subdomain"),
        (_replace('"example.com/mock"', '"foo.kubernetes.io/mock"'), "reserved for native resources"),
        (_replace('"example.com/mock"', '"requests.example.com/mock"'), "must not start with 'requests.'"),
        (_replace('"example.com/mock"', '"example.com/-mock"'), "must be 1-63 characters"),
        (_replace('"example.com/mock"', '"example.com/' + "m" * 64 + '"'), "must be 1-63 characters"),
        ("[kubelet]\n", "no resources configured"),
        (_replace("[release]", "[metrics]\nenable = true\n[release]"), "metrics.enable: unknown key; did you mean"),
        (_replace("[release]", '[metrics]\nenabled = "yes"\n[release]'), "metrics.enabled: expected true or false"),
        (_replace("[release]", "[metrics]\nport = 0\n[release]"), "metrics.port: expected a TCP port from 1 to 65535"),
        (_replace("[release]", "[metrics]\nport = 9400.0\n[release]"), "metrics.port: expected a TCP port"),
        (
            _replace("[release]", '[metrics]\naddress = "localhost"\n[release]'),
            "metrics.address: 'localhost' is not an IP address",
        ),
        (_replace("[release]", "[cdi]\nspec_dir = 3\n[release]"), "cdi.spec_dir: expected a path"),
        (_replace("[release]", "[cdi]\nfallback = 1\n[release]"), "cdi.fallback: expected true or false"),
        (_replace("[release]", "[cdi]\nspecdir = 1\n[release]"), "cdi.specdir: unknown key; did you mean 'spec_dir'?"),
        (
            _replace("hook_timeout = 2.5", 'hook_timeout = 2.5\ncdi_kind = "example.com"'),
            "resources.\"example.com/mock\".cdi_kind: 'example.com' is not a CDI kind",
        ),
        (
            _replace("hook_timeout = 2.5", 'hook_timeout = 2.5\ncdi_kind = "Example.com/gpu"'),
            "is not a CDI kind",
        ),
        (
            _replace('"example.com/mock"', '"3com.example/mock"').replace(
                "[release]", "[cdi]\nenabled = true\n[release]"
            ),
            'resources."3com.example/mock": the resource name "3com.example/mock" is not a valid CDI kind',
        ),
        (
            _replace("[release]", "[cdi]\nenabled = true\n[release]")
            + '[resources."example.com/other"]\ndriver = "mock"\ncdi_kind = "example.com/mock"\n'
            + 'options = { directory = "other" }\n',
            'resources."example.com/other".cdi_kind: "example.com/mock" is also the CDI kind of resource',
        ),
        (_replace("[release]", "[release]\nfoo ="), "not valid TOML"),
    ],
)
def test_each_error_names_file_table_and_key(tmp_path: Path, text: str, expected: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(str(path)), message
    assert expected in message, message


def test_unknown_driver_hint_lists_installed(tmp_path: Path) -> None:
    with pytest.raises(DriverNotFoundError, match=r"installed: .*mock"):
        load_config(_write(tmp_path, _replace('driver = "mock"', 'driver = "nope"')))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tmp_path / "absent.toml")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "devplug", *args], capture_output=True, text=True, timeout=60)


def test_check_config_cli(tmp_path: Path) -> None:
    ok = _cli("check-config", str(_write(tmp_path, GOOD)))
    assert ok.returncode == 0 and "example.com/mock: driver mock" in ok.stdout
    bad = _cli("check-config", str(_write(tmp_path, _replace("count = 2", "cuont = 2"))))
    assert bad.returncode == 2
    assert "options.cuont: unknown key" in bad.stderr
    assert not (tmp_path / "state").exists() and not (tmp_path / "devs").exists()  # validated, nothing started


def test_drivers_cli_lists_mock_with_its_hooks() -> None:
    result = _cli("drivers", "--json")
    assert result.returncode == 0
    import json

    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["mock"]["distribution"] == "devplug-mock"
    assert "deallocate" in rows["mock"]["hooks"] and "list_devices" in rows["mock"]["hooks"]


def test_metrics_and_cdi_defaults_and_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_IP", raising=False)
    config = load_config(_write(tmp_path, GOOD))
    assert (config.metrics.enabled, config.metrics.address, config.metrics.port) == (False, "127.0.0.1", 19400)
    assert (config.cdi.enabled, config.cdi.spec_dir, config.cdi.fallback) == (False, Path("/var/run/cdi"), True)
    assert config.resources[0].cdi_kind == "example.com/mock"
    text = GOOD.replace(
        "[release]",
        '[metrics]\nenabled = true\naddress = "::"\nport = 9500\n'
        '[cdi]\nenabled = true\nspec_dir = "cdi"\nfallback = false\n[release]',
    ).replace("hook_timeout = 2.5", 'hook_timeout = 2.5\ncdi_kind = "vendor.example/mock.v1"')
    config = load_config(_write(tmp_path, text))
    assert (config.metrics.enabled, config.metrics.address, config.metrics.port) == (True, "::", 9500)
    assert (config.cdi.enabled, config.cdi.spec_dir, config.cdi.fallback) == (True, tmp_path.resolve() / "cdi", False)
    assert config.resources[0].cdi_kind == "vendor.example/mock.v1"


def test_metrics_enabled_without_prometheus_client_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # how Python marks a module as not importable
    path = _write(tmp_path, GOOD.replace("[release]", "[metrics]\nenabled = true\n[release]"))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: metrics.enabled: the metrics endpoint needs prometheus-client, which is not installed; "
        "pip install 'devplug[metrics]' (or set enabled = false)"
    )
    load_config(_write(tmp_path, GOOD.replace("[release]", "[metrics]\nenabled = false\n[release]")))
