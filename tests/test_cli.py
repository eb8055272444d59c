"""The command line: the demo, the dev kubelet in the foreground, JSON logs, exit codes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from devplug.cli.run import parse_run_args
from devplug.testing.configs import dev_config, write_toml
from devplug.testing.waiting import poll_until


def _devplug(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "devplug", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("mode", [[], ["--kep"]], ids=["stock", "kep"])
def test_demo_runs_the_whole_lifecycle(mode: list[str]) -> None:
    result = _devplug("demo", *mode)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for hook in ("preferred_allocation", "allocate", "pre_start", "post_stop", "deallocate"):
        assert f"driver   {hook}" in out, hook
    assert "FAILED" not in out
    checks = [line for line in out.splitlines() if line.strip().startswith("[ok]")]
    assert len(checks) >= 15
    assert out.rstrip().endswith("lifecycle checks passed")


def test_demo_profiles_moves_a_node_between_profiles() -> None:
    result = _devplug("demo", "--profiles")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "FAILED" not in out
    for line in (
        "$ kubectl label node demo-node devplug.io/profile=big.gpu-less --overwrite",
        "  [ok] started on profile big: 8 devices advertised",
        "  [ok] applied: example.com/other removed, example.com/mock unchanged",
        "  [ok] an unknown profile is refused, the running config stays",
        "  [ok] back to the base: example.com/mock changed to 4 devices, example.com/other added back",
        "11/11 checks passed",
    ):
        assert line in out.splitlines(), line
    assert any(line.endswith("released once the pod ended") and "[ok]" in line for line in out.splitlines())


def _wait_for(predicate: Callable[[], object], what: str, timeout: float = 15) -> None:
    __tracebackhide__ = True
    poll_until(predicate, what, timeout)


def test_foreground_dev_kubelet_and_json_logs(devplug_root: Path) -> None:
    plugin_dir = devplug_root / "device-plugins"
    kubelet = subprocess.Popen(
        [sys.executable, "-m", "devplug", "kubelet", "--dir", str(plugin_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    mock_dir = devplug_root / "mock"
    config = dev_config(
        devplug_root, {"example.com/mock": {"driver": "mock", "options": {"directory": str(mock_dir), "count": 1}}}
    )
    path = write_toml(devplug_root / "c.toml", config)
    log_path = devplug_root / "daemon.jsonl"
    with open(log_path, "w") as log:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "devplug", "run", "--config", str(path), "--log-format", "json"],
            stdout=log,
            stderr=log,
        )
        try:
            _wait_for(lambda: "registered with the kubelet" in log_path.read_text(), "the daemon to register")
        finally:
            daemon.send_signal(signal.SIGTERM)
            assert daemon.wait(20) == 0
            kubelet.send_signal(signal.SIGINT)
            kubelet_out, _ = kubelet.communicate(timeout=20)
    assert kubelet.returncode == 0, kubelet_out
    assert "example.com/mock" in kubelet_out and "register" in kubelet_out
    records = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    assert records, log_path.read_text()
    registered = [r for r in records if "registered with the kubelet" in r["message"]]
    assert registered[0]["level"] == "info"
    assert registered[0]["logger"] == "devplug.engine"
    assert registered[0]["resource"] == "example.com/mock"
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)


def test_bad_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[resources."example.com/m"]\ndriver = "mock"\noptions = { directory = "d", colour = 1 }\n')
    result = _devplug("run", "--config", str(path))
    assert result.returncode == 2
    assert f'{path}: resources."example.com/m".options.colour: unknown key' in result.stderr


def test_run_does_not_load_click_or_importlib_metadata(tmp_path: Path) -> None:
    """The daemon is the long-lived process: what ``devplug run`` imports stays resident (issue 11, idle RSS)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "devplug", "run", "--config", str(tmp_path / "missing.toml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "missing.toml" in proc.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "devplug.cli.run" in imported
    unwanted = {"click", "importlib.metadata", "hashlib", "argparse", "shutil", "bz2", "lzma"}
    assert not imported & unwanted, sorted(imported & unwanted)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--config is required"),
        (["--config"], "--config needs a value"),
        (
            ["--config", "c.toml", "--log-level", "loud"],
            "--log-level: 'loud' is not one of debug, info, warning, error",
        ),
        (["--config=c.toml", "--log-format=xml"], "--log-format: 'xml' is not one of text, json"),
        (["--config", "c.toml", "--verbose"], "unknown argument '--verbose'"),
    ],
)
def test_run_usage_errors_exit_2_naming_the_option(args: list[str], message: str) -> None:
    result = _devplug("run", *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "usage: devplug run --config FILE" in result.stderr


def test_run_options_take_either_form() -> None:
    assert parse_run_args(["--config=a.toml", "--log-level", "debug"]) == {
        "--config": "a.toml",
        "--log-format": "text",
        "--log-level": "debug",
    }


# A device node the mock driver hands out (issue 40, item 6): check-config on the node refuses what `devplug run` would
# refuse at start ("is not a character or block device"); --offline, off the node, still checks keys and values only.
def _mock_config(tmp_path: Path, device_node: Path) -> Path:
    path = tmp_path / "devplug.toml"
    path.write_text(
        f'[kubelet]\ndevice_plugin_dir = "{tmp_path}/plugins"\n[state]\ndir = "{tmp_path}/state"\n'
        f'[resources."example.com/mock"]\ndriver = "mock"\n'
        f'options = {{ directory = "{tmp_path}/devs", count = 1, device_node = "{device_node}" }}\n'
    )
    return path


def test_check_config_refuses_a_device_node_that_is_not_one(tmp_path: Path) -> None:
    regular = tmp_path / "notadev"
    regular.write_text("")
    result = _devplug("check-config", str(_mock_config(tmp_path, regular)))
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{regular} is not a character or block device" in result.stderr
    assert not (tmp_path / "devs").exists(), "checked, nothing started"


def test_check_config_offline_skips_the_device_node_check(tmp_path: Path) -> None:
    result = _devplug("check-config", "--offline", str(_mock_config(tmp_path, tmp_path / "notadev")))
    assert result.returncode == 0, result.stderr
    assert "(offline: keys and values; nothing of the node checked)" in result.stdout


def test_check_config_accepts_a_real_device_node(tmp_path: Path) -> None:
    result = _devplug("check-config", str(_mock_config(tmp_path, Path("/dev/null"))))
    assert result.returncode == 0, result.stderr
