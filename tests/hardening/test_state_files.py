"""Hardening, state files (issue 9): planted links, foreign folders, corrupt files, old layouts.

Held before the issue (kept): corrupt and truncated ledgers are moved aside,
a link at the status file is replaced, not followed. Fixed by it: the lock
file and the resource folders refuse links and foreign owners (item 3), the
state is keyed by resource name and an old layout is moved into place
(item 6), ``devplug status`` says what is wrong with a malformed status file
instead of a traceback (item 8).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.devkubelet import ContainerSpec, PodSpec
from devplug.engine.ledger import read_ledger_records
from devplug.kube.names import legacy_state_folder_names
from devplug.testing.daemon import DaemonProcess

if TYPE_CHECKING:
    from tests.hardening.conftest import Bench

RESOURCE = "example.com/mock"
RESOURCE_B = "example.com/other"
EXIT_STATE = 3


def _run_refused(bench: Bench) -> tuple[int, str]:
    """``devplug run`` on the default config, expected to refuse at once; its exit code and stderr."""
    result = bench.cli("run", "--config", str(bench.write_config()), timeout=30)
    return result.returncode, result.stderr


def _ledger(bench: Bench, resource: str = RESOURCE) -> list[dict[str, Any]]:
    return read_ledger_records(bench.resource_dir(resource) / "ledger.json", resource)


# --- the lock (item 3)


def test_a_link_planted_at_the_lock_is_refused_and_its_target_untouched(bench: Bench, tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("do not overwrite\n")
    bench.state_dir.mkdir(mode=0o700)
    (bench.state_dir / "devplug.lock").symlink_to(target)
    code, stderr = _run_refused(bench)
    assert code == EXIT_STATE, stderr
    assert "devplug.lock: the daemon lock is a symbolic link" in stderr and str(target) in stderr
    assert "Traceback" not in stderr
    assert target.read_text() == "do not overwrite\n"


def test_a_fifo_at_the_lock_is_refused_without_blocking(bench: Bench) -> None:
    bench.state_dir.mkdir(mode=0o700)
    os.mkfifo(bench.state_dir / "devplug.lock")
    code, stderr = _run_refused(bench)
    assert code == EXIT_STATE and "the daemon lock is not a regular file" in stderr, stderr


def test_a_state_dir_that_is_a_link_is_refused(bench: Bench, tmp_path: Path) -> None:
    real = tmp_path / "real-state"
    real.mkdir()
    bench.state_dir.symlink_to(real)
    code, stderr = _run_refused(bench)
    assert code == EXIT_STATE, stderr
    assert "the state dir ([state] dir) is a symbolic link" in stderr
    assert list(real.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_state_dir_of_another_user_is_refused(bench: Bench) -> None:
    bench.state_dir.mkdir(mode=0o700)
    os.chown(bench.state_dir, 65534, 65534)
    code, stderr = _run_refused(bench)
    assert code == EXIT_STATE and "belongs to uid 65534" in stderr, stderr


# --- resource folders (item 3)


def test_a_linked_resource_folder_fails_that_resource_alone_and_gets_no_ledger(bench: Bench, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    folder = bench.resource_dir(RESOURCE)
    folder.parent.mkdir(parents=True, mode=0o700)
    folder.symlink_to(target)
    bench.start({RESOURCE: bench.mock_table(), RESOURCE_B: bench.mock_table(RESOURCE_B)}, wait=False)
    bench.wait(lambda: bench.resource_status(RESOURCE)["state"] == "failed", f"{RESOURCE} to fail")
    error = bench.resource_status(RESOURCE)["last_error"]
    assert f"{folder}: the state folder of {RESOURCE} is a symbolic link (to {target})" in error
    bench.wait(lambda: bench.resource_status(RESOURCE_B)["state"] == "registered", f"{RESOURCE_B} registered")
    assert list(target.iterdir()) == []


def test_a_linked_ledger_is_refused(bench: Bench, tmp_path: Path) -> None:
    target = tmp_path / "ledger-target"
    target.write_text("not yours\n")
    folder = bench.resource_dir(RESOURCE)
    folder.mkdir(parents=True, mode=0o700)
    (folder / "ledger.json").symlink_to(target)
    bench.start(wait=False)
    bench.wait(lambda: bench.resource_status()["state"] == "failed", f"{RESOURCE} to fail")
    assert "the allocation ledger of example.com/mock is a symbolic link" in bench.resource_status()["last_error"]
    assert target.read_text() == "not yours\n"


# --- the layout keyed by resource name (item 6)


@pytest.mark.parametrize("legacy", [0, 1], ids=["socket-named", "hash-named"])
def test_an_earlier_layout_is_moved_into_place_with_its_ledger(bench: Bench, legacy: int) -> None:
    bench.start()
    pod = bench.kubelet.admit_pod(PodSpec("p", [ContainerSpec("app", {RESOURCE: 1})]))
    device = pod.container("app").devices[RESOURCE][0]
    bench.wait(lambda: any(r["pod"] == "default/p" for r in _ledger(bench)), "the ledger to name pod p")
    before = _ledger(bench)
    assert bench.daemon is not None
    assert bench.daemon.process.stop() == 0
    # What a daemon before the fix left: the folder named after the socket (or its hash, for long plugin paths).
    old = bench.state_dir / "resources" / legacy_state_folder_names(RESOURCE)[legacy]
    os.rename(bench.resource_dir(), old)
    bench.resource_dir().parent.rmdir()
    bench.daemon.process.start()
    bench.wait(lambda: bench.resource_dir().joinpath("ledger.json").exists(), "the ledger at its new place")
    assert not old.exists()
    bench.wait(lambda: any(d["id"] == device and d["allocated"] for d in bench.resource_status()["devices"]), device)
    assert [r["id"] for r in _ledger(bench)] == [r["id"] for r in before]  # the same record, not a re-adoption
    assert f"moved its state from {old}" in bench.log()


def test_a_longer_plugin_folder_path_keeps_the_state(bench: Bench) -> None:
    bench.start()
    pod = bench.kubelet.admit_pod(PodSpec("p", [ContainerSpec("app", {RESOURCE: 1})]))
    device = pod.container("app").devices[RESOURCE][0]
    bench.wait(lambda: any(r["pod"] == "default/p" for r in _ledger(bench)), "the ledger to name pod p")
    before = _ledger(bench)
    assert bench.daemon is not None and bench.daemon.process.stop() == 0
    # Long enough that the socket name turns into a hash (unix socket paths end at 107 bytes).
    longer = bench.root / ("plugins-" + "x" * 90)
    config = bench.write_config(edit=lambda c: c["kubelet"].update(device_plugin_dir=str(longer)))
    process = DaemonProcess(config, bench.root / "longer.log").start()
    try:

        def allocated() -> dict[str, Any] | None:
            try:
                status = json.loads((bench.state_dir / "status.json").read_text())
            except (FileNotFoundError, ValueError):
                return None
            if status.get("pid") != process.pid:
                return None
            res: dict[str, Any] = status["resources"][0]
            polled = status["release"]["last_success"] is not None  # a lost ledger would have been rebuilt by now
            return res if polled and any(d["id"] == device and d["allocated"] for d in res["devices"]) else None

        res = bench.wait(allocated, f"{device} shown allocated by the daemon on {longer}")
        assert res["socket"].startswith(str(longer / "devplug-")) and RESOURCE.replace("/", "_") not in res["socket"]
        assert [r["id"] for r in _ledger(bench)] == [r["id"] for r in before]
        assert "adopted" not in process.log_text()  # the ledger was found, not rebuilt from PodResources
    finally:
        assert process.stop() == 0, process.log_text()


# --- corrupt and hostile files (held)


@pytest.mark.parametrize("content", [b"", b'{"format": 1, "resource": "example.com/mock", "allo', b"\x00\xff" * 50])
def test_a_truncated_or_garbled_ledger_is_moved_aside(bench: Bench, content: bytes) -> None:
    folder = bench.resource_dir()
    folder.mkdir(parents=True, mode=0o700)
    (folder / "ledger.json").write_bytes(content)
    bench.start()
    bench.wait(lambda: list(folder.glob("ledger.json.corrupt-*")), "the ledger moved aside")
    bench.wait(lambda: bench.resource_status()["state"] == "registered", "the status to show it registered")


def test_a_link_at_the_status_file_is_replaced_not_followed(bench: Bench, tmp_path: Path) -> None:
    target = tmp_path / "status-target"
    target.write_text("keep\n")
    bench.state_dir.mkdir(mode=0o700)
    (bench.state_dir / "status.json").symlink_to(target)
    bench.start()
    assert bench.status()["resources"][0]["name"] == RESOURCE
    assert not (bench.state_dir / "status.json").is_symlink()
    assert target.read_text() == "keep\n"


# --- devplug status on a malformed status file (item 8)


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"[1, 2, 3]", "the top level: expected an object"),
        (b'{"pid": "12"}', "pid: expected an integer"),
        (b'{"pid": 0}', "pid: 0 is not a process ID"),
        (b'{"pid": 99999999999999999999999}', "is not a process ID"),
        (b'{"pid": 1, "resources": [{"name": 3}]}', "resources[0].name: expected a string"),
        (b'{"pid": 1, "resources": [{"name": "a", "driver": "m"}]}', "resources[0].state: missing"),
        (b'{"pid": 1, "resources": "x"}', "resources: expected a list"),
        (
            b'{"pid": 1, "resources": [{"name": "a", "driver": "m", "state": "s", "counts": {"devices": "x"}}]}',
            "resources[0].counts.devices: expected an integer",
        ),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b"{not json", "Expecting property name"),
        (b'{"pid": 1, "config": "\xff"}', "can't decode"),
    ],
    ids=[
        "list",
        "pid-text",
        "pid-zero",
        "pid-huge",
        "name-int",
        "missing-state",
        "resources-text",
        "count-text",
        "deep",
        "not-json",
        "not-utf8",
    ],
)
def test_status_on_a_malformed_file_says_what_is_wrong(bench: Bench, content: bytes, said: str) -> None:
    bench.state_dir.mkdir(mode=0o700)
    (bench.state_dir / "status.json").write_bytes(content)
    result = bench.cli("status", "--state-dir", str(bench.state_dir))
    assert result.returncode == EXIT_STATE, result.stderr
    assert "Traceback" not in result.stderr
    assert "status.json: not a devplug status file" in result.stderr and said in result.stderr, result.stderr


def test_status_on_a_fifo_does_not_block(bench: Bench) -> None:
    bench.state_dir.mkdir(mode=0o700)
    os.mkfifo(bench.state_dir / "status.json")
    result = bench.cli("status", "--state-dir", str(bench.state_dir), timeout=30)
    assert result.returncode == EXIT_STATE and "not a regular file" in result.stderr, result.stderr


def test_status_escapes_control_characters_it_prints(bench: Bench) -> None:
    bench.state_dir.mkdir(mode=0o700)
    status = {"pid": 1, "stopped": True, "resources": [{"name": "a\x1b[2Jb", "driver": "m", "state": "s\nX"}]}
    (bench.state_dir / "status.json").write_text(json.dumps(status))
    result = bench.cli("status", "--state-dir", str(bench.state_dir))
    assert result.returncode == EXIT_STATE  # not running
    assert "\x1b" not in result.stdout and "a\\x1b[2Jb" in result.stdout and "state=s\\nX" in result.stdout


# --- a ledger that vanishes under the running daemon (issue 36, item 1)


def test_a_ledger_deleted_under_the_daemon_is_a_warning_and_refuses_allocate_naming_it(bench: Bench) -> None:
    bench.start()
    pod = bench.kubelet.admit_pod(PodSpec("p", [ContainerSpec("app", {RESOURCE: 1})]))
    device = pod.container("app").devices[RESOURCE][0]
    ledger = bench.resource_dir() / "ledger.json"
    bench.wait(ledger.exists, "the ledger's snapshot written (compaction)")
    ledger.unlink()
    free = next(f"mock{n}" for n in range(4) if f"mock{n}" != device)
    request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=[free])])
    error = bench.refused("Allocate", request, dp.AllocateResponse)
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert f"the allocation ledger's file {ledger} vanished" in (error.details() or "")
    assert "refused until the daemon is restarted" in (error.details() or "")
    assert f"WARNING devplug.engine: [{RESOURCE}] the allocation ledger's file {ledger} vanished" in bench.log()
    # the records held are written back (a restart finds pod p's device held), and the status says why it refuses
    bench.wait(ledger.exists, "the ledger written back")
    assert [r["devices"] for r in _ledger(bench)] == [[device]]
    bench.wait(lambda: "vanished" in (bench.resource_status().get("state_error") or ""), "the refusal in the status")
    assert "vanished" in bench.cli("status", "--state-dir", str(bench.state_dir)).stdout
