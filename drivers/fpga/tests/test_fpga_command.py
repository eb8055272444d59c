"""Running a vendor tool: no shell, a timeout, output captured, failures naming the command with its stderr; a
wrapper's child and a flood of output bound like the tool itself (issue 24 item 5), in the tool alone and through
the real daemon."""

from __future__ import annotations

import os
from typing import Any

import pytest

from devplug import DriverError
from devplug.testing.conformance import poll_until
from devplug_fpga.command import run_tool

CARD = "0000:3b:00.0"


def test_a_tool_runs_with_its_arguments_as_given_without_a_shell(tool: Any) -> None:
    pids: list[tuple[int, str]] = []
    run_tool(
        [str(tool.path), "deprogram", "--card", "0000:3b:00.0; reboot &&", "--region", "$HOME"],
        10,
        lambda *a: pids.append(a),
    )
    (call,) = tool.calls("deprogram", "done")
    assert call["args"] == {"--card": "0000:3b:00.0; reboot &&", "--region": "$HOME"}
    assert pids == [(call["pid"], str(tool.path))]


def test_a_non_zero_exit_names_the_command_and_shows_stderr(tool: Any) -> None:
    tool.behave(deprogram={"exit": 3, "stderr": "ERROR: no such card"})
    with pytest.raises(
        DriverError, match=r"command `.*fpga-tool deprogram --card x` exited 3; stderr: ERROR: no such card$"
    ) as caught:
        run_tool([str(tool.path), "deprogram", "--card", "x"], 10)
    assert "deprogram: working on x" in getattr(caught.value, "output", "")  # stdout kept for the log


def test_a_hung_tool_is_killed_at_its_timeout(tool: Any) -> None:
    tool.behave(verify={"hang": True})
    with pytest.raises(DriverError, match=r"timed out after 0.3 s \(its process group was killed\)"):
        run_tool([str(tool.path), "verify", "--card", "x"], 0.3)
    assert tool.calls("verify", "start")
    assert not tool.calls("verify", "done")


def test_a_tool_that_cannot_start_is_a_driver_error(tool: Any) -> None:
    with pytest.raises(DriverError, match="could not start"):
        run_tool([str(tool.folder / "missing-tool"), "x"], 10)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _child_pids(tool: Any) -> list[int]:
    return [c["pid"] for c in tool.calls(event="child")]


@pytest.mark.timeout(60)
def test_a_wrappers_child_holding_the_output_is_killed_with_it_at_the_timeout(tool: Any) -> None:
    tool.behave(verify={"child": True, "hang": True})
    try:
        with pytest.raises(DriverError, match=r"timed out after 0.5 s \(its process group was killed\)"):
            run_tool([str(tool.path), "verify", "--card", "x"], 0.5)
        (child,) = _child_pids(tool)
        poll_until(lambda: not _alive(child), f"the wrapper's child (pid {child}) to be dead", 10.0)
    finally:
        tool.release("child")


def test_a_flood_of_output_is_capped_in_the_error(tool: Any) -> None:
    tool.behave(deprogram={"output": 1_000_000, "exit": 1, "stderr": "ERROR: flash failed"})
    with pytest.raises(DriverError) as caught:
        run_tool([str(tool.path), "deprogram", "--card", "x"], 30)
    assert len(str(caught.value)) < 3000
    assert str(caught.value).endswith("ERROR: flash failed")
    assert len(getattr(caught.value, "output", "")) < 2 * 65536 + 200


@pytest.mark.timeout(120)
def test_a_hung_wrapper_fails_its_release_at_command_timeout_and_leaves_nothing_running(lab: Any) -> None:
    lab.tool.behave(deprogram={"child": True, "hang": True})
    lab.start(lab.command_options(mode="whole", command_timeout=1.0), hook_timeout=60.0)
    try:
        lab.admit("tenant")
        lab.kubelet.remove_pod("tenant")
        marker = lab.driver_dir() / "quarantine" / CARD
        lab.wait(marker.exists, what="the deprogram to fail at command_timeout (the device quarantined)")
        assert "timed out after 1 s (its process group was killed)" in lab.log()
        assert "did not return within hook_timeout" not in lab.log(), "the hook ran to hook_timeout"
        (child,) = _child_pids(lab.tool)
        lab.wait(lambda: not _alive(child), what=f"the wrapper's child (pid {child}) to be dead")
    finally:
        lab.tool.release("child")
    assert lab._daemon().stop() == 0, "the daemon stops cleanly: no driver hook left running"


def test_a_tool_printing_a_megabyte_makes_no_megabyte_log_line(lab: Any) -> None:
    lab.tool.behave(deprogram={"output": 1_000_000, "exit": 3, "stderr": "ERROR: flash controller timeout"})
    lab.start(lab.command_options(mode="whole"))
    lab.admit("tenant")
    lab.kubelet.remove_pod("tenant")
    lab.wait((lab.driver_dir() / "quarantine" / CARD).exists, what="the quarantine marker")
    lab.wait(lambda: "ERROR: flash controller timeout" in lab.log(), what="the failure in the log")
    longest = max(len(line) for line in lab.log().splitlines())
    assert longest < 10_000, f"a log line of {longest} characters"
    assert os.path.getsize(lab.driver_dir() / "quarantine" / CARD) < 200_000
