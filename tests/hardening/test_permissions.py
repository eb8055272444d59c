"""Hardening, permissions and the plugin folder (issue 9): who may reach the daemon, and what it does when it cannot
write where it serves.

Held before the issue (kept): sockets are 0600 and state files 0600, a link
planted at the socket path is replaced (its target untouched), no shell
anywhere. Fixed by it: a read-only plugin folder shows in the status as
``last_error`` while retried (item 8), a regular file at ``device_plugin_dir``
is a clean config error (item 8), new state folders are 0700 (item 3).
"""

from __future__ import annotations

import ast
import contextlib
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp

if TYPE_CHECKING:
    from tests.hardening.conftest import Bench

RESOURCE = "example.com/mock"
ROOT = Path(__file__).resolve().parents[2]
EXIT_CONFIG = 2


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# --- held


def test_sockets_and_state_files_are_the_daemons_alone(bench: Bench) -> None:
    bench.start()
    request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=["mock0"])])
    bench.call("Allocate", request, dp.AllocateResponse)
    assert _mode(bench.socket()) == 0o600
    bench.wait((bench.resource_dir() / "ledger.json").exists, "the ledger")
    for path in (
        bench.resource_dir() / "ledger.json",
        bench.state_dir / "status.json",
        bench.state_dir / "devplug.lock",
    ):
        assert _mode(path) == 0o600, path
    for folder in (bench.state_dir, bench.resource_dir(), bench.resource_dir() / "driver"):
        assert _mode(folder) == 0o700, folder


def test_a_link_planted_at_the_socket_path_is_replaced_not_followed(bench: Bench, tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("keep\n")
    bench.plugin_dir.mkdir(exist_ok=True)
    bench.socket().symlink_to(target)
    bench.start()
    assert stat.S_ISSOCK(os.lstat(bench.socket()).st_mode)
    assert target.read_text() == "keep\n"


def _shell_calls(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in ("system", "popen", "getoutput", "getstatusoutput") or any(
            k.arg == "shell" and not (isinstance(k.value, ast.Constant) and k.value.value is False)
            for k in node.keywords
        ):
            yield f"{path.relative_to(ROOT)}:{node.lineno} calls {name}"


def test_no_shell_anywhere() -> None:
    sources = [p for folder in ("core", "drivers") for p in (ROOT / folder).rglob("*.py") if "gen" not in p.parts]
    assert [call for path in sources for call in _shell_calls(path)] == []


# --- the plugin folder


@contextlib.contextmanager
def _read_only(folder: Path) -> Iterator[None]:
    """Nobody may create files in ``folder`` meanwhile (root included: the immutable flag)."""
    if os.geteuid() == 0:
        made = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True, check=False)
        if made.returncode != 0:
            pytest.skip(f"cannot make {folder} read-only for root here: {made.stderr.strip()}")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
    else:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)


def test_a_read_only_plugin_folder_shows_as_last_error_and_serving_resumes(bench: Bench) -> None:
    registrations = bench.kubelet.registrations(RESOURCE)
    with _read_only(bench.plugin_dir):
        bench.start(wait=False)
        bench.wait(lambda: bench.resource_status()["last_error"], "a last_error in the status")
        error = bench.resource_status()["last_error"]
        assert f"serving on {bench.socket()} failed" in error, error
        assert "not permitted" in error or "denied" in error or "Read-only" in error, error
    bench.wait(lambda: bench.kubelet.registrations(RESOURCE) > registrations, "a registration once writable")
    bench.wait(lambda: bench.resource_status()["last_error"] is None, "the last_error cleared")


def test_a_regular_file_at_the_plugin_folder_is_a_config_error(bench: Bench) -> None:
    blocker = bench.root / "not-a-folder"
    blocker.write_text("")
    config = bench.write_config(edit=lambda c: c["kubelet"].update(device_plugin_dir=str(blocker)))
    result = bench.cli("run", "--config", str(config), timeout=30)
    assert result.returncode == EXIT_CONFIG, result.stderr
    assert f"kubelet.device_plugin_dir: {blocker} exists and is not a folder" in result.stderr
    assert "Traceback" not in result.stderr
