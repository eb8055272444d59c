"""The command runner's processes after the call and after a crash (issue 36, items 7 and 13), with real processes.

Item 13: a grandchild that calls ``setsid()`` left the command's process group and outlived the call; where the
node allows it (a writable cgroup v2, as root), each command runs in a transient cgroup and nothing escapes.

Item 7: ``kill_left_behind`` killed an unrelated process that got a recorded pid (it matched any argument's
basename, checked no start time, killed the whole group). Pid reuse is made real through
``/proc/sys/kernel/ns_last_pid`` (root only); each test skips, saying why, where it cannot.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devplug.kit import command as runner
from devplug.kit import kill_left_behind, run_command
from devplug.testing.waiting import poll_until

NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")
CGROUP2 = Path("/sys/fs/cgroup/unified") if Path("/sys/fs/cgroup/unified/cgroup.procs").exists() else None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cgroups_usable() -> bool:
    cgroup2 = CGROUP2 or (Path("/sys/fs/cgroup") if Path("/sys/fs/cgroup/cgroup.controllers").exists() else None)
    if cgroup2 is None or os.geteuid() != 0:
        return False
    probe = cgroup2 / f"devplug-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError:
        return False
    return True


def _require_cgroups() -> None:
    if not _cgroups_usable():
        if os.environ.get("DEVPLUG_REQUIRE_CGROUPS") == "1":
            pytest.fail("cannot make cgroups in a cgroup v2 hierarchy (DEVPLUG_REQUIRE_CGROUPS=1)")
        pytest.skip("SKIPPED LOUDLY: no writable cgroup v2 here (not root?): the runner falls back to process groups")


@pytest.fixture
def reaped() -> Iterator[list[int]]:
    """Pids a test started outside the runner; killed at the end whatever happened."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(60)
def test_a_grandchild_that_calls_setsid_does_not_outlive_its_command(reaped: list[int]) -> None:
    _require_cgroups()
    result = run_command(["/bin/sh", "-c", "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!"], timeout=10)
    grandchild = int(result.stdout)
    reaped.append(grandchild)
    poll_until(lambda: not _alive(grandchild), f"the setsid grandchild (pid {grandchild}) to be dead", 5.0)
    # Good input is untouched: output, exit status, and a command that runs its course.
    assert run_command(["/bin/sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10, check=False).returncode == 3


@pytest.mark.timeout(60)
def test_the_log_says_once_how_commands_are_held(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import logging, sys
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(message)s")
        from devplug.kit import run_command
        for _ in range(3):
            run_command(["/bin/true"], timeout=10)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=True)
    lines = [line for line in done.stderr.splitlines() if line.startswith("devplug.kit external commands run")]
    assert len(lines) == 1, done.stderr
    if _cgroups_usable():
        assert "transient cgroup" in lines[0] and "cgroup.kill" in lines[0], lines
    else:
        assert "process group only" in lines[0], lines


def _at_pid(pid: int, argv: list[str]) -> subprocess.Popen[bytes] | None:
    """``argv`` started as process ``pid`` (through ns_last_pid; other processes on the machine may take it
    first, so a few tries), or None."""
    for _ in range(50):
        NS_LAST_PID.write_text(str(pid - 1))
        process = subprocess.Popen(argv, start_new_session=True)
        if process.pid == pid:
            return process
        process.kill()
        process.wait()
    return None


def _require_pid_reuse() -> None:
    if os.geteuid() != 0 or not os.access(NS_LAST_PID, os.W_OK):
        pytest.skip(f"SKIPPED LOUDLY: cannot write {NS_LAST_PID} (root in the pid namespace is needed for pid reuse)")


def _tool(tmp_path: Path) -> Path:
    tool = tmp_path / "usr" / "local" / "bin" / "deprogram"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\nexec sleep 300\n")
    tool.chmod(0o755)
    return tool


@pytest.mark.timeout(120)
def test_a_reused_pid_is_never_killed(tmp_path: Path, reaped: list[int]) -> None:
    """The issue's case: a recorded deprogram's pid now runs ``sh -c 'sleep 300' /home/op/notes/deprogram``."""
    _require_pid_reuse()
    tool = _tool(tmp_path)
    recorded: list[tuple[int, str, str | None]] = []

    def on_start(pid: int, program: str) -> None:
        recorded.append((pid, program, runner.process_stamp(pid) if hasattr(runner, "process_stamp") else None))

    run_command(["/bin/sh", "-c", "exit 0"], timeout=10, on_start=on_start)  # a tool that ran and ended
    pid, _, stamp = recorded[0]
    notes = tmp_path / "home" / "op" / "notes" / "deprogram"
    # A start time is counted in clock ticks (/proc/<pid>/stat field 22): a process with the same pid, program and
    # boot started within the same tick cannot be told from the recorded one, by design; pid reuse takes longer.
    time.sleep(2 / os.sysconf("SC_CLK_TCK"))
    victim = _at_pid(pid, ["/bin/sh", "-c", "sleep 300", str(notes)])
    if victim is None:
        pytest.skip(f"SKIPPED LOUDLY: could not get pid {pid} again through {NS_LAST_PID} (a busy machine)")
    reaped.append(victim.pid)
    try:
        assert not kill_left_behind(pid, str(tool)), "an old record (no start time) killed an unverified process"
        assert _alive(pid), "the unrelated process was killed"
        assert stamp is not None
        assert not kill_left_behind(pid, str(tool), stamp)
        assert not kill_left_behind(pid, "/bin/sh", stamp)  # its own program, not its time
        assert _alive(pid), "the unrelated process was killed"
    finally:
        os.killpg(victim.pid, signal.SIGKILL)  # its session's: the shell and its sleep
        victim.wait()


DAEMON = """
import json, sys
from devplug.kit import process_stamp, run_command

def on_start(pid, program):
    with open(sys.argv[1], "w") as out:
        json.dump({"pid": pid, "program": program, "stamp": process_stamp(pid)}, out)

run_command([sys.argv[2]], timeout=600, on_start=on_start)
"""


@pytest.mark.timeout(120)
def test_a_tool_left_by_a_killed_daemon_is_killed_with_all_it_started(tmp_path: Path, reaped: list[int]) -> None:
    """Good input: the recorded tool still runs after its daemon was SIGKILLed; it and its setsid grandchild go,
    and only when the record matches (a different boot id leaves it)."""
    tool = _tool(tmp_path)
    grandchild_file = tmp_path / "grandchild"
    tool.write_text(
        f'#!/bin/sh\nsetsid sleep 300 </dev/null >/dev/null 2>&1 &\necho $! > "{grandchild_file}"\nsleep 300\n'
    )
    record_file = tmp_path / "record.json"
    daemon = subprocess.Popen([sys.executable, "-c", DAEMON, str(record_file), str(tool)])
    poll_until(
        lambda: (
            record_file.exists()
            and record_file.read_text()
            and grandchild_file.exists()
            and grandchild_file.read_text().strip()
        ),
        "the tool to start and record itself",
        20.0,
    )
    daemon.kill()
    daemon.wait()
    record = json.loads(record_file.read_text())
    pid, grandchild = record["pid"], int(grandchild_file.read_text())
    reaped.extend([pid, grandchild])
    assert _alive(pid), "the tool died with its daemon (it runs in its own session)"
    boot, _, ticks = record["stamp"].partition(" ")
    assert not kill_left_behind(pid, record["program"], f"{'0' * len(boot)} {ticks}")  # another boot's record
    assert not kill_left_behind(pid, str(tmp_path / "other" / "deprogram"), record["stamp"])  # another program
    assert _alive(pid)
    assert kill_left_behind(pid, record["program"], record["stamp"])
    poll_until(lambda: not _alive(pid), f"the tool (pid {pid}) to be dead", 5.0)
    if _cgroups_usable():
        poll_until(lambda: not _alive(grandchild), f"its setsid grandchild (pid {grandchild}) to be dead", 5.0)
