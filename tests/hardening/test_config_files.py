"""Hardening, second round (issue 24, item 1): config files that are not what they seem.

A FIFO at the config path used to hang ``check-config``, ``run`` and a reload
for ever (the reload then held its lock, so later good reloads were ignored, and
SIGTERM could no longer end the daemon); a config of hundreds of megabytes was
read and parsed whole. Config files must be regular files of at most
:data:`devplug.config.file.MAX_CONFIG_BYTES`, opened without blocking, for every
command alike. Real FIFOs, real files, a real daemon; every command is bounded
by a timeout so that a hang fails the test instead of the suite.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from devplug.config.file import MAX_CONFIG_BYTES, read_config_bytes
from devplug.errors import ConfigError
from devplug.testing.configs import write_toml

if TYPE_CHECKING:
    from tests.hardening.conftest import Bench

RESOURCE = "example.com/mock"
EXIT_CONFIG = 2
#: What a command may take here before it counts as hung (each is a second or two when it works).
HUNG_S = 30.0


def _fifo(path: Path) -> Path:
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return path


def _oversized(path: Path, text: str) -> Path:
    """``text`` (a valid config) followed by a comment that takes the file one byte past the limit."""
    body = text.encode()
    path.write_bytes(body + b"#" + b"x" * (MAX_CONFIG_BYTES - len(body) - 1) + b"\n")
    assert path.stat().st_size == MAX_CONFIG_BYTES + 1
    return path


def test_check_config_refuses_a_fifo_at_once(bench: Bench) -> None:
    fifo = _fifo(bench.root / "fifo.toml")
    result = bench.cli("check-config", str(fifo), timeout=HUNG_S)
    assert result.returncode == EXIT_CONFIG, result.stderr
    assert f"{fifo}: the config file is a FIFO (named pipe), not a regular file" in result.stderr


def test_run_refuses_a_fifo_at_once(bench: Bench) -> None:
    fifo = _fifo(bench.root / "fifo.toml")
    result = bench.cli("run", "--config", str(fifo), timeout=HUNG_S)
    assert result.returncode == EXIT_CONFIG, result.stderr
    assert "is a FIFO (named pipe)" in result.stderr
    assert not (bench.state_dir / "devplug.lock").exists(), "nothing was started"


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda p: p.mkdir(), "a folder"),
        (lambda p: socket.socket(socket.AF_UNIX).bind(str(p)), "a unix socket"),
    ],
    ids=["folder", "socket"],
)
def test_other_non_regular_files_are_refused_naming_their_kind(bench: Bench, make: object, kind: str) -> None:
    path = bench.root / "odd.toml"
    make(path)  # type: ignore[operator]
    result = bench.cli("check-config", str(path), timeout=HUNG_S)
    assert result.returncode == EXIT_CONFIG
    assert f"{path}: the config file is {kind}, not a regular file" in result.stderr


def test_a_character_device_is_refused_without_reading_it() -> None:
    with pytest.raises(ConfigError) as info:
        read_config_bytes(Path("/dev/null"))
    assert "/dev/null: the config file is a character device, not a regular file" in str(info.value)


def test_a_link_to_a_regular_file_is_followed(bench: Bench) -> None:
    real = bench.write_config()
    link = bench.root / "configmap-key.toml"
    link.symlink_to(real)
    result = bench.cli("check-config", str(link), timeout=HUNG_S)
    assert result.returncode == 0, result.stderr
    assert f"{link}: ok" in result.stdout


def test_a_config_one_byte_over_the_limit_is_refused_and_one_at_it_accepted(bench: Bench) -> None:
    good = bench.write_config()
    text = good.read_text()
    over = _oversized(bench.root / "big.toml", text)
    result = bench.cli("check-config", str(over), timeout=HUNG_S)
    assert result.returncode == EXIT_CONFIG
    assert (
        f"{over}: the config file is 262145 bytes; devplug reads config files of at most 262144 bytes (256 KiB)"
        in result.stderr
    )
    at_limit = bench.root / "at-limit.toml"
    at_limit.write_bytes(over.read_bytes()[:-2] + b"\n")
    assert at_limit.stat().st_size == MAX_CONFIG_BYTES
    assert bench.cli("check-config", str(at_limit), timeout=HUNG_S).returncode == 0


def test_a_300_mib_sparse_config_is_refused_by_its_size(bench: Bench) -> None:
    huge = bench.root / "huge.toml"
    with huge.open("wb") as handle:
        handle.truncate(300 * 1024 * 1024)  # sparse: nothing is written to the disk
    result = bench.cli("check-config", str(huge), timeout=HUNG_S)
    assert result.returncode == EXIT_CONFIG
    assert f"{huge}: the config file is 300.0 MiB; devplug reads config files of at most 262144 bytes" in result.stderr


def test_reload_cli_refuses_a_fifo_config(bench: Bench) -> None:
    bench.start()
    fifo = _fifo(bench.root / "fifo.toml")
    result = bench.cli("reload", "--config", str(fifo), timeout=HUNG_S)
    assert result.returncode == EXIT_CONFIG
    assert "is a FIFO (named pipe)" in result.stderr


def _reload(bench: Bench) -> subprocess.CompletedProcess[str]:
    assert bench.daemon is not None
    return bench.cli("reload", "--state-dir", str(bench.state_dir), "--timeout", "20", timeout=HUNG_S)


def test_a_reload_of_a_fifo_is_refused_and_later_reloads_and_sigterm_still_work(bench: Bench) -> None:
    daemon = bench.start()
    config_path = daemon.config_path
    _fifo(config_path)
    refused = _reload(bench)
    assert refused.returncode == EXIT_CONFIG, refused.stderr
    assert "reload refused" in refused.stderr and "is a FIFO (named pipe)" in refused.stderr
    assert bench.kubelet.resource(RESOURCE) is not None, "the running config keeps serving"

    config_path.unlink()
    table = bench.mock_table(count=4)
    write_toml(config_path, {**daemon.config, "resources": {RESOURCE: {**table, "health_interval": 5.0}}})
    applied = _reload(bench)
    assert applied.returncode == 0, applied.stderr
    assert f"changed: {RESOURCE}" in applied.stdout
    assert daemon.stop(timeout=HUNG_S) == 0, daemon.log_text()[-3000:]


def test_a_reload_of_an_oversized_config_is_refused_naming_the_size(bench: Bench) -> None:
    daemon = bench.start()
    _oversized(daemon.config_path, daemon.config_path.read_text())
    refused = _reload(bench)
    assert refused.returncode == EXIT_CONFIG, refused.stderr
    assert "devplug reads config files of at most 262144 bytes (256 KiB)" in refused.stderr
    assert bench.status()["reload"]["last_result"] == "refused"
