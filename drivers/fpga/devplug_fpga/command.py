"""Running vendor tools through the driver kit's runner (:func:`devplug.kit.run_command`): argument lists, no
shell, a session of their own, ``command_timeout`` killing the whole process group, output read with a cap.

A tool that exits non-zero, times out or cannot be started raises
:class:`ToolError`, whose message names the command and shows a bounded
excerpt of its stderr and whose ``output`` keeps what it printed (capped), for
the log and the quarantine note.
"""

from __future__ import annotations

from collections.abc import Sequence

from devplug import DriverError
from devplug.kit import CommandError, StartRecorder, run_command

__all__ = ["FpgaError", "PidRecorder", "ToolError", "run_tool", "shown_output"]

#: Called with the PID and program of a tool as soon as it runs.
PidRecorder = StartRecorder

#: Lines and characters of a tool's output a log message shows.
SHOWN_LINES = 40
SHOWN_CHARS = 4000


class FpgaError(DriverError):
    """A failure of the FPGA driver; ``output`` holds what the hardware or tool said, for the log."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output


class ToolError(FpgaError):
    """A vendor tool failed."""


def run_tool(argv: Sequence[str], timeout: float, on_start: PidRecorder | None = None) -> str:
    """Run ``argv`` and return its stdout; :class:`ToolError` when it fails.

    ``on_start`` gets the child's PID and program as soon as it runs (the driver
    records it, so a daemon killed meanwhile can stop the tool it left behind).
    """
    try:
        return run_command(argv, timeout=timeout, on_start=on_start).stdout
    except CommandError as exc:
        raise ToolError(str(exc), exc.output) from exc


def shown_output(output: str) -> str:
    """A tool's output for the log, indented below the message: its last :data:`SHOWN_LINES` lines, at most
    :data:`SHOWN_CHARS` characters of them."""
    text = output.strip()
    if not text:
        return ""
    tail = "\n".join(text.splitlines()[-SHOWN_LINES:])
    if len(tail) > SHOWN_CHARS:
        tail = "..." + tail[-SHOWN_CHARS:]
    return "\n  " + "\n  ".join(tail.splitlines())
