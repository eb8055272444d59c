"""``[metrics] address`` and ``port``'s defaults (issue 40): the pod's IP from ``POD_IP`` when the config names no
address (the DaemonSet sets it from the downward API's ``status.podIP``), else 127.0.0.1; port 19400, which no
common exporter has (9400, the earlier default, is NVIDIA dcgm-exporter's), and the old port still configurable."""

from __future__ import annotations

from pathlib import Path

import pytest

from devplug.config import DEFAULT_METRICS_PORT, POD_IP_ENV, load_config
from devplug.errors import ConfigError

CONFIG = """
[kubelet]
device_plugin_dir = "plugins"
pod_resources_socket = "/run/pr.sock"

[state]
dir = "state"

[resources."example.com/mock"]
driver = "mock"
options = { directory = "devs", count = 1 }
"""


def _load(tmp_path: Path, metrics: str = "") -> tuple[str, int]:
    path = tmp_path / "devplug.toml"
    path.write_text(CONFIG + (f"\n[metrics]\n{metrics}\n" if metrics else ""))
    config = load_config(path)
    return config.metrics.address, config.metrics.port


def test_without_pod_ip_the_default_is_this_node_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(POD_IP_ENV, raising=False)
    assert _load(tmp_path) == ("127.0.0.1", 19400)
    monkeypatch.setenv(POD_IP_ENV, "")  # a pod without an IP yet gives the empty string
    assert _load(tmp_path) == ("127.0.0.1", 19400)


@pytest.mark.parametrize("pod_ip", ["10.244.1.7", "fd00:10:244::7"])
def test_pod_ip_is_the_default_address(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pod_ip: str) -> None:
    monkeypatch.setenv(POD_IP_ENV, pod_ip)
    assert _load(tmp_path, "enabled = false") == (pod_ip, DEFAULT_METRICS_PORT)


def test_an_address_in_the_config_wins_over_pod_ip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POD_IP_ENV, "10.244.1.7")
    assert _load(tmp_path, 'address = "0.0.0.0"') == ("0.0.0.0", 19400)
    assert _load(tmp_path, 'address = "127.0.0.1"') == ("127.0.0.1", 19400)


def test_the_old_port_is_still_configurable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(POD_IP_ENV, raising=False)
    assert _load(tmp_path, "port = 9400") == ("127.0.0.1", 9400)


def test_a_pod_ip_that_is_no_ip_address_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POD_IP_ENV, "node-a.example.com")
    with pytest.raises(ConfigError) as info:
        _load(tmp_path)
    message = str(info.value)
    assert "[metrics] address from the environment variable POD_IP: 'node-a.example.com' is not an IP address" in (
        message
    )
    assert "status.podIP" in message  # the hint says where POD_IP should come from


def test_a_bad_address_in_the_config_names_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POD_IP_ENV, "10.244.1.7")
    with pytest.raises(ConfigError, match=r"metrics\.address: 'localhost' is not an IP address"):
        _load(tmp_path, 'address = "localhost"')
