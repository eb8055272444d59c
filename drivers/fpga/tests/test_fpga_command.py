"""Running a vendor tool: no shell, a timeout, output captured, failures naming the command with its stderr."""

from __future__ import annotations

from typing import Any

import pytest

from devplug import DriverError
from devplug_fpga.command import run_tool


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
        DriverError, match=r"command `.*fpga-tool deprogram --card x` exited 3; stderr: ERROR: no such card"
    ) as caught:
        run_tool([str(tool.path), "deprogram", "--card", "x"], 10)
    assert "deprogram: working on x" in getattr(caught.value, "output", "")  # stdout kept for the log


def test_a_hung_tool_is_killed_at_its_timeout(tool: Any) -> None:
    tool.behave(verify={"hang": True})
    with pytest.raises(DriverError, match=r"timed out after 0.3 s \(killed\)"):
        run_tool([str(tool.path), "verify", "--card", "x"], 0.3)
    assert tool.calls("verify", "start")
    assert not tool.calls("verify", "done")


def test_a_tool_that_cannot_start_is_a_driver_error(tool: Any) -> None:
    with pytest.raises(DriverError, match="could not start"):
        run_tool([str(tool.folder / "missing-tool"), "x"], 10)
