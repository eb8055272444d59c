"""Observability (issue 3): ``devplug status`` on a running daemon (text and JSON; non-zero without
one), and log lines about a device that carry the resource name and the device ID."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest

if TYPE_CHECKING:
    from tests.lifecycle.conftest import Lab

RESOURCE = "example.com/mock"


def _status_cli(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devplug", "status", "--state-dir", str(state_dir), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _busy_daemon(lab: Lab) -> tuple[str, str]:
    """A daemon with one released device, one allocated to pod q, one unhealthy; returns (released, held)."""
    lab.start()
    (released,) = lab.admit("p", 1)
    lab.wait_seen(released, "p")
    lab.kubelet.remove_pod("p")
    lab.wait_released(released)
    (held,) = lab.admit("q", 1)
    unhealthy = next(d for d in ("mock0", "mock1", "mock2", "mock3") if d not in (released, held))
    lab.write_device(unhealthy, "unhealthy")
    lab.wait(
        lambda: (
            (res := lab.resource_status())["counts"]["unhealthy"] == 1
            and res["counts"]["allocated"] == 1
            and any(d["pod"] == "default/q" for d in res["devices"])
            and len(res["recent_releases"]) == 1
        ),
        what="the status file to show the unhealthy device, q's allocation and p's release",
    )
    return released, held


def test_status_shows_resources_devices_and_recent_releases(lab: Lab) -> None:
    released, held = _busy_daemon(lab)
    result = _status_cli(lab.state_dir())
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"devplug daemon pid {lab.daemon.process.pid if lab.daemon else '?'}: running" in out
    assert f"{RESOURCE}  driver=mock  state=registered  registrations=1" in out
    assert "devices: 4 (3 healthy, 1 unhealthy), 1 allocated, 0 releasing" in out
    assert re.search(rf"^\s+{held}\s+Healthy\s+.*allocated to default/q$", out, re.MULTILINE), out
    assert "recent releases:" in out
    assert re.search(rf"^\s+.*\b{released}\s+\(pod default/p no longer holds them; took \d+ ms\)$", out, re.MULTILINE)


def test_status_json_is_machine_readable(lab: Lab) -> None:
    released, held = _busy_daemon(lab)
    result = _status_cli(lab.state_dir(), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["running"] is True
    (res,) = data["resources"]
    assert res["name"] == RESOURCE
    assert res["driver"] == "mock"
    assert res["state"] == "registered"
    assert res["counts"] == {"devices": 4, "healthy": 3, "unhealthy": 1, "allocated": 1, "releasing": 0}
    assert [d["id"] for d in res["devices"] if d["allocated"]] == [held]
    (release,) = res["recent_releases"]
    assert release["devices"] == [released]
    assert release["pod"] == "default/p"


def test_status_exits_non_zero_without_a_running_daemon(lab: Lab, tmp_path: Path) -> None:
    never = _status_cli(tmp_path / "no-daemon-here")
    assert never.returncode != 0
    assert "no devplug daemon status" in never.stderr

    daemon = lab.start()
    lab.status()
    assert daemon.process.stop() == 0
    stopped = _status_cli(lab.state_dir())
    assert stopped.returncode != 0
    assert "NOT RUNNING" in stopped.stdout


def test_device_log_lines_carry_resource_and_device_id(lab: Lab) -> None:
    lab.start()
    (dev,) = lab.admit("p", 1)
    lab.wait_seen(dev, "p")
    lab.kubelet.remove_pod("p")
    lab.wait_released(dev)
    lab.wait(lambda: f"released {dev}" in lab.log(), what="the release's log line")
    failing = "mock3" if dev != "mock3" else "mock2"
    lab.write_device(failing, "fail=allocate")
    with pytest.raises(grpc.RpcError):
        lab.allocate(failing)

    log = lab.log().splitlines()
    lines = [line for line in log if re.search(rf"\b{dev}\b", line)]
    kinds = {k for k in ("allocated", "releasing", "released") if any(f"{k} {dev}" in line for line in lines)}
    assert kinds == {"allocated", "releasing", "released"}, lines
    failed = [line for line in log if re.search(rf"\b{failing}\b", line)]
    assert any("failed" in line for line in failed), failed
    for line in lines + failed:
        assert RESOURCE in line, f"a log line about a device does not name its resource: {line}"


def test_status_exits_6_naming_a_failed_resource_and_shows_the_snapshots_age(lab: Lab) -> None:
    """Issue 25: a monitoring script can tell from the exit code alone that a resource is not served."""
    blocker = lab.root / "not-a-folder"
    blocker.write_text("a file where the mock's device folder should be made\n")
    broken = {"driver": "mock", "options": {"directory": str(blocker / "mock"), "count": 2}}
    lab.factory({RESOURCE: lab.resource_table(), "example.com/broken": broken}, wait=False)
    lab.daemon = None
    state_dir = lab.root / "state"

    def failed_shown() -> subprocess.CompletedProcess[str] | None:
        result = _status_cli(state_dir)  # 6 from the start (not registered, as /readyz says), then the failure
        return result if result.returncode == 6 and "example.com/broken: failed:" in result.stdout else None

    result = lab.wait(failed_shown, what="devplug status to exit 6 for the failed resource")
    assert "PROBLEM: example.com/broken: failed:" in result.stdout
    assert "cannot set up the device folder" in result.stdout
    assert re.search(r"status as of \d+s ago", result.stdout), result.stdout
