"""Options checked at check-config time with errors naming the key; the status command; the demo."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from devplug.config import load_config
from devplug.errors import ConfigError
from devplug.testing.configs import dev_config, write_toml
from devplug_shared import SharedDriver, SharedOptions
from devplug_shared.status import main as status_main
from shared_demo import run_demo


def _config(tmp_path: Path, options: dict[str, object]) -> Path:
    config = dev_config(tmp_path, {"example.com/cam": {"driver": "shared", "options": options}})
    return write_toml(tmp_path / "devplug.toml", config)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"discovery": {"devices": ["cam-a"]}, "capacity": 0}, "options: capacity: must be an integer 1-1024"),
        ({"discovery": {"handler": "onvif"}}, "options: discovery.handler: no discovery handler 'onvif' is installed"),
        ({"discovery": {"devices": ["Cam A"]}}, "discovery: devices[0]: device name 'Cam A' must be"),
        (
            {"discovery": {"devices": ["cam"]}, "coordination": {"backend": "etcd", "endpointz": []}},
            "coordination.endpointz: unknown key; did you mean 'endpoints'?",
        ),
        (
            {"discovery": {"devices": ["cam"]}, "coordination": {"backend": "zookeeper"}},
            "coordination.backend: unknown backend 'zookeeper' (backends: local, etcd, kubernetes)",
        ),
        (
            {"discovery": {"devices": ["cam"]}, "coordination": {"backend": "local", "path": "rel.sqlite"}},
            "coordination: path: rel.sqlite must be an absolute path",
        ),
        (
            {"discovery": {"devices": ["cam"]}, "coordination": {"backend": "kubernetes", "lease_ttl": 0.5}},
            "lease_ttl: must be 2-3600 seconds",
        ),
        ({"discovery": {"devices": ["cam"]}, "node_name": "Node_A"}, "node_name: 'Node_A' is not a Kubernetes node"),
    ],
)
def test_check_config_names_the_bad_key(tmp_path: Path, options: dict[str, object], message: str) -> None:
    path = _config(tmp_path, options)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert message in str(caught.value)
    assert 'resources."example.com/cam".options' in str(caught.value)


def test_a_good_config_checks_and_builds(tmp_path: Path) -> None:
    path = _config(
        tmp_path,
        {
            "capacity": 2,
            "node_name": "node-a",
            "discovery": {"handler": "tcp", "targets": {"cam-a": "10.0.0.5:554"}},
            "coordination": {"backend": "etcd", "endpoints": ["http://10.0.0.1:2379"]},
        },
    )
    config = load_config(path)
    (resource,) = config.resources
    assert resource.driver_class is SharedDriver and isinstance(resource.options, SharedOptions)
    result = subprocess.run(
        [sys.executable, "-m", "devplug", "check-config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_status_without_a_daemon_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _config(tmp_path, {"discovery": {"devices": ["cam"]}})
    assert status_main(["--config", str(path)]) == 3
    assert "is the daemon running?" in capsys.readouterr().err
    assert status_main(["--config", str(tmp_path / "missing.toml")]) == 2


def test_the_demo_shares_one_device_between_two_nodes_and_a_third_pod_waits() -> None:
    root = Path(tempfile.mkdtemp(prefix="dps-demo-", dir="/tmp"))  # short: unix socket paths
    try:
        result = run_demo(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert {result["pod-1"], result["pod-2"]} == {"camera-0", "camera-1"}
    assert "requested number of devices unavailable" in result["pod-3-waited"]
    assert result["pod-3"] == result["pod-2"], "pod-3 gets the slot pod-2 freed on the other node"
