"""Hardening, config (issue 9): numbers and paths an operator (or a careless template) can write.

Held before the issue (kept): resource names that would traverse paths are
refused. Fixed by it: NaN, infinity and absurd durations are refused (item
5); driver options pointing a device folder into ``/proc``, ``/sys`` or
``/dev`` where the driver does not expect it are refused at check-config
(item 1); ``[shutdown] timeout`` is a checked key like the others.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from devplug.config import load_config
from devplug.errors import ConfigError
from devplug.testing.configs import write_toml

if TYPE_CHECKING:
    from tests.hardening.conftest import Bench

RESOURCE = "example.com/mock"
EXIT_CONFIG = 2

BASE: dict[str, Any] = {
    "kubelet": {"device_plugin_dir": "plugins", "pod_resources_socket": "pr.sock"},
    "state": {"dir": "state"},
    "release": {"interval": 0.5, "grace_period": 3.0},
    "shutdown": {"timeout": 5.0},
}


def _config(tmp_path: Path, **changes: dict[str, Any]) -> Path:
    """A config file: BASE, one mock resource, with tables updated by ``changes`` (``resource`` for the resource)."""
    data: dict[str, Any] = {key: dict(value) for key, value in BASE.items()}
    resource: dict[str, Any] = {"driver": "mock", "options": {"directory": str(tmp_path / "devs")}}
    for table, values in changes.items():
        (resource if table == "resource" else data.setdefault(table, {})).update(values)
    data["resources"] = {RESOURCE: resource}
    return write_toml(tmp_path / "devplug.toml", data)


def _refused(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(str(path)), message
    return message


# --- item 5: durations


DURATIONS = [
    ("release", "interval", "release.interval"),
    ("release", "grace_period", "release.grace_period"),
    ("shutdown", "timeout", "shutdown.timeout"),
    ("resource", "health_interval", 'resources."example.com/mock".health_interval'),
    ("resource", "hook_timeout", 'resources."example.com/mock".hook_timeout'),
]


@pytest.mark.parametrize(("table", "key", "where"), DURATIONS, ids=[d[2].rsplit(".", 1)[-1] for d in DURATIONS])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 1e12, -1.0], ids=str)
def test_non_finite_and_absurd_durations_are_refused_naming_the_key(
    tmp_path: Path, table: str, key: str, where: str, value: float
) -> None:
    message = _refused(_config(tmp_path, **{table: {key: value}}))
    assert f"{where}: must be a finite number of seconds from" in message, message


@pytest.mark.parametrize(
    ("table", "key", "value"),
    [("release", "interval", 0.001), ("resource", "hook_timeout", 0), ("resource", "health_interval", 0.001)],
)
def test_durations_too_short_to_be_meant_are_refused(tmp_path: Path, table: str, key: str, value: float) -> None:
    assert f"{key}: must be a finite number of seconds from 0.01" in _refused(
        _config(tmp_path, **{table: {key: value}})
    )


def test_sane_durations_are_accepted(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path, resource={"health_interval": 0, "hook_timeout": 86400}))
    assert config.shutdown.timeout == 5.0 and config.resources[0].health_interval == 0.0


def test_check_config_refuses_a_nan_interval_with_exit_2(bench: Bench, tmp_path: Path) -> None:
    result = bench.cli("check-config", str(_config(tmp_path, release={"interval": float("nan")})))
    assert result.returncode == EXIT_CONFIG
    assert "release.interval: must be a finite number of seconds from 0.01 to 3600, got nan" in result.stderr


def test_a_non_finite_driver_option_is_refused(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path / "vfio.toml",
        {
            "resources": {
                "example.com/nic": {"driver": "vfio", "options": {"vendors": ["8086"], "rescan_interval": float("nan")}}
            }
        },
    )
    assert 'resources."example.com/nic".options.rescan_interval: expected a finite number, got nan' in _refused(path)


def test_a_misspelt_shutdown_key_gets_a_hint(tmp_path: Path) -> None:
    assert "shutdown.timout: unknown key; did you mean 'timeout'?" in _refused(
        _config(tmp_path, shutdown={"timout": 3})
    )


# --- item 1: device folders in kernel trees


@pytest.mark.parametrize("folder", ["/proc", "/proc/self", "/sys/kernel", "/dev", "/dev/shm/mock", "/tmp/../proc"])
def test_the_mock_refuses_a_device_folder_in_a_kernel_tree(tmp_path: Path, folder: str) -> None:
    message = _refused(_config(tmp_path, resource={"options": {"directory": folder}}))
    assert 'resources."example.com/mock".options: directory:' in message and "is inside /" in message, message


def test_the_mock_refuses_a_link_into_a_kernel_tree(tmp_path: Path) -> None:
    (tmp_path / "innocent").symlink_to("/proc")
    message = _refused(_config(tmp_path, resource={"options": {"directory": str(tmp_path / "innocent")}}))
    assert "is inside /proc (it leads to /proc)" in message, message


def test_check_config_refuses_proc_before_anything_reads_it(bench: Bench, tmp_path: Path) -> None:
    result = bench.cli("check-config", str(_config(tmp_path, resource={"options": {"directory": "/proc"}})))
    assert result.returncode == EXIT_CONFIG
    assert "directory: /proc is inside /proc" in result.stderr


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"sysfs_root": "/proc"}, "sysfs_root: /proc is inside /proc"),
        ({"sysfs_root": "/dev/x"}, "sysfs_root: /dev/x is inside /dev"),
        ({"dev_root": "/sys"}, "dev_root: /sys is inside /sys"),
        ({"dev_root": "/proc/1/root/dev"}, "dev_root: /proc/1/root/dev is inside /proc"),
    ],
)
def test_vfio_refuses_roots_in_the_wrong_kernel_tree(tmp_path: Path, options: dict[str, str], said: str) -> None:
    table = {"driver": "vfio", "options": {"vendors": ["8086"], **options}}
    assert said in _refused(write_toml(tmp_path / "vfio.toml", {"resources": {"example.com/nic": table}}))


def test_vfio_keeps_its_own_kernel_trees(tmp_path: Path) -> None:
    table = {"driver": "vfio", "options": {"vendors": ["8086"], "sysfs_root": "/sys", "dev_root": "/dev"}}
    config = load_config(write_toml(tmp_path / "vfio.toml", {"resources": {"example.com/nic": table}}))
    assert config.resources[0].options.sysfs_root == Path("/sys")


# --- held: resource names cannot traverse paths


@pytest.mark.parametrize(
    "name", ["example.com/../x", "../etc/x", "example.com/a/../../b", "example.com/.", "example.com/..", "/x"]
)
def test_resource_names_that_would_traverse_paths_are_refused(tmp_path: Path, name: str) -> None:
    path = write_toml(tmp_path / "names.toml", {"resources": {name: {"driver": "mock", "options": {"directory": "d"}}}})
    assert "the kubelet would refuse the resource name" in _refused(path)
