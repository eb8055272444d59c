"""The driver kit's command runner (issue 24, item 5), on real processes.

Each case runs real programs (Python children, and ``sh`` standing in for a
vendor's wrapper script) and checks what happened to every process they
started through ``/proc``: a wrapper whose child keeps the output pipes open,
a hung tool with children, a tool that prints a megabyte, a tool that leaves a
child behind when it exits. No sleeps: waits are on pipes and ``/proc``.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from devplug import DriverError
from devplug.kit import CommandError, CommandResult, run_command
from devplug.kit.command import DEFAULT_OUTPUT_LIMIT, EXCERPT_CHARS
from devplug.testing.conformance import poll_until

PY = sys.executable


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not: it is dead and waits for its parent)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _all_dead(pids: list[int]) -> None:
    """Wait until none of ``pids`` runs (a SIGKILL takes effect when the process is next scheduled; its pipes close
    a moment before it turns into a zombie)."""
    poll_until(lambda: not any(_alive(p) for p in pids), f"processes {pids} to be dead", 10.0)


def _pids(text: str) -> list[int]:
    return [int(line.split("=", 1)[1]) for line in text.splitlines() if line.startswith("pid=")]


def _reap_leftovers(pids: list[int]) -> None:
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_output_and_exit_status_of_a_command() -> None:
    result = run_command([PY, "-c", "import sys; print('out'); sys.stderr.write('err\\n')"], timeout=30)
    assert result == CommandResult(result.argv, 0, "out\n", "err\n", 0)
    assert result.excerpt == "stderr: err"


def test_arguments_go_to_the_program_as_they_are_never_through_a_shell(tmp_path: Path) -> None:
    marker = tmp_path / "not-created"
    result = run_command(["echo", "$(touch", f"{marker})", ";", "rm", "-rf", "/", "&&", "`id`"], timeout=30)
    assert result.stdout == f"$(touch {marker}) ; rm -rf / && `id`\n"
    assert not marker.exists()
    with pytest.raises(TypeError, match="not one string"):
        run_command("echo hello", timeout=30)
    with pytest.raises(ValueError, match="empty"):
        run_command([], timeout=30)


def test_it_runs_in_a_session_of_its_own_and_says_its_pid_as_it_starts() -> None:
    started: list[tuple[int, str]] = []
    code = "import os; print(os.getpid(), os.getpgid(0), os.getsid(0))"
    result = run_command([PY, "-c", code], timeout=30, on_start=lambda pid, program: started.append((pid, program)))
    pid, pgid, sid = (int(x) for x in result.stdout.split())
    assert started == [(pid, PY)]
    assert pid == pgid == sid != os.getsid(0)


def test_a_failure_names_the_command_and_shows_the_end_of_stderr() -> None:
    with pytest.raises(CommandError) as info:
        run_command([PY, "-c", "import sys; print('working'); sys.exit('ERROR: no such card')"], timeout=30)
    error = info.value
    assert isinstance(error, DriverError) and error.returncode == 1 and not error.timed_out
    assert str(error).endswith("` exited 1; stderr: ERROR: no such card")
    assert error.output == "working\nERROR: no such card\n"
    unchecked = run_command([PY, "-c", "raise SystemExit(4)"], timeout=30, check=False)
    assert unchecked.returncode == 4


def test_a_program_that_cannot_start_is_a_command_error(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match=r"could not start: No such file or directory"):
        run_command([str(tmp_path / "missing-tool")], timeout=30)


def test_a_killed_command_says_by_which_signal() -> None:
    with pytest.raises(CommandError, match=r"was killed by signal 9"):
        run_command([PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], timeout=30)


WRAPPER_HANGS = textwrap.dedent(
    """
    # a vendor's wrapper: it starts the tool, which inherits stdout, and waits for it (both hang)
    {py} -c 'import os, time; print("pid=%d" % os.getpid(), flush=True); time.sleep(3600)' &
    echo "pid=$$"
    wait
    """
)


@pytest.mark.timeout(60)
def test_at_the_timeout_the_whole_group_is_killed_not_only_the_wrapper() -> None:
    script = WRAPPER_HANGS.format(py=PY)
    with pytest.raises(CommandError) as info:
        run_command(["sh", "-c", script], timeout=0.5)
    error = info.value
    assert error.timed_out and error.returncode is None
    assert "timed out after 0.5 s (its process group was killed)" in str(error)
    pids = _pids(error.stdout)
    try:
        assert len(pids) == 2, error.stdout
        _all_dead(pids)
    finally:
        _reap_leftovers(pids)


WRAPPER_LEAVES_A_CHILD = textwrap.dedent(
    """
    # the wrapper is done once the tool it started is running, but that tool keeps running and keeps stdout open
    {py} -c 'import os, time; print("pid=%d" % os.getpid(), flush=True); open("{ready}", "w"); time.sleep(3600)' &
    while [ ! -e "{ready}" ]; do :; done
    echo done
    """
)


@pytest.mark.timeout(60)
def test_what_a_command_leaves_in_its_group_when_it_exits_is_killed(tmp_path: Path) -> None:
    script = WRAPPER_LEAVES_A_CHILD.format(py=PY, ready=tmp_path / "ready")
    result = run_command(["sh", "-c", script], timeout=600)
    assert result.returncode == 0 and "done" in result.stdout
    pids = _pids(result.stdout)
    try:
        assert len(pids) == 1, result.stdout
        _all_dead(pids)
    finally:
        _reap_leftovers(pids)


@pytest.mark.timeout(60)
def test_a_child_that_left_the_group_cannot_hold_the_runner() -> None:
    # setsid: a process of its own session, out of reach of the group kill, holding the pipe: the runner stops
    # reading after a short grace instead of waiting for the pipe's end.
    code = "import os, time; print('pid=%d' % os.getpid(), flush=True); time.sleep(3600)"
    script = f"setsid {PY} -c '{code}' & echo started"
    result = run_command(["sh", "-c", script], timeout=600)
    pids = _pids(result.stdout)
    _reap_leftovers(pids)
    assert result.returncode == 0 and "started" in result.stdout


def test_a_megabyte_of_output_is_kept_to_the_cap_and_the_excerpt_to_its_bound() -> None:
    code = "import sys; sys.stdout.write('o' * 1_000_000); sys.stderr.write('e' * 1_000_000 + 'END'); sys.exit(2)"
    with pytest.raises(CommandError) as info:
        run_command([PY, "-c", code], timeout=60)
    error = info.value
    for stream in (error.stdout, error.stderr):
        assert len(stream) < DEFAULT_OUTPUT_LIMIT + 100
        assert "bytes of output dropped" in stream
    assert error.stderr.endswith("END") and error.stdout.startswith("o" * 1000)
    assert len(str(error)) < EXCERPT_CHARS + 300, len(str(error))
    assert str(error).endswith("eeeEND")
    result = run_command([PY, "-c", "print('x' * 100_000)"], timeout=60, output_limit=1000)
    assert result.dropped == 100_001 - 1000 and len(result.stdout) < 1100


def test_the_excerpt_is_escaped_onto_one_line() -> None:
    with pytest.raises(CommandError) as info:
        run_command([PY, "-c", "import sys; sys.stderr.write('line 1\\n\\x1b[2Jline 2'); sys.exit(1)"], timeout=30)
    message = str(info.value)
    assert "\n" not in message and "\x1b" not in message
    assert message.endswith("stderr: line 1\\n\\x1b[2Jline 2")
