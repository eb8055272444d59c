"""Running vendor tools: argument lists, no shell, a timeout, output captured.

A tool that exits non-zero, times out or cannot be started raises
:class:`ToolError`, whose message names the command and shows its stderr and
whose ``output`` keeps everything it printed, for the log and the quarantine
note.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
from collections.abc import Callable, Sequence

from devplug import DriverError

__all__ = ["FpgaError", "PidRecorder", "ToolError", "kill_orphan", "run_tool"]

#: Called with the PID and program of a tool as soon as it runs.
PidRecorder = Callable[[int, str], None]

_SHOWN = 2000  # characters of stderr in a message


class FpgaError(DriverError):
    """A failure of the FPGA driver; ``output`` holds what the hardware or tool said, for the log."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output


class ToolError(FpgaError):
    """A vendor tool failed."""


def _tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _SHOWN else "..." + text[-_SHOWN:]


def run_tool(argv: Sequence[str], timeout: float, on_start: PidRecorder | None = None) -> str:
    """Run ``argv`` and return its stdout; :class:`ToolError` when it fails.

    ``on_start`` gets the child's PID and program as soon as it runs (the driver records it,
    so a daemon killed meanwhile can stop the tool it left behind). The tool
    runs in a session of its own: signals sent to the daemon's process group
    do not reach it half-way.
    """
    shown = shlex.join(argv)
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        raise ToolError(f"command `{shown}` could not start: {exc}") from exc
    if on_start is not None:
        on_start(proc.pid, argv[0])
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        output = _decode(out) + _decode(err)
        raise ToolError(
            f"command `{shown}` timed out after {timeout:g} s (killed); stderr: {_tail(_decode(err)) or '(none)'}",
            output,
        ) from None
    stdout, stderr = _decode(out), _decode(err)
    if proc.returncode != 0:
        how = f"exited {proc.returncode}" if proc.returncode > 0 else f"was killed by signal {-proc.returncode}"
        raise ToolError(f"command `{shown}` {how}; stderr: {_tail(stderr) or '(none)'}", stdout + stderr)
    return stdout


def _decode(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")


def kill_orphan(pid: int, program: str) -> bool:
    """Kill a tool a killed daemon left running, if ``pid`` still runs ``program``; True if it did."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = handle.read().split(b"\0")
    except OSError:
        return False
    if not any(os.path.basename(part.decode(errors="replace")) == os.path.basename(program) for part in cmdline):
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        return False
    return True
