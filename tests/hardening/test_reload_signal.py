"""Hardening, second round (issue 24, item 2): ``devplug reload`` signals the daemon and nothing else.

It used to trust the pid in the lock file (and a status file naming the same
pid): after the daemon died and the pid was reused, SIGHUP went to whatever
process had it. Now it signals only a process proven to hold the state dir's
lock (:mod:`devplug.daemon.lockholder`), through a pidfd, and otherwise exits 3
naming what it found.

The victims are real processes that block SIGHUP, so a signal sent to them
stays pending and can be read in ``/proc/<pid>/status`` (``ShdPnd``, the
process-wide pending set, as ``kill(2)`` leaves it before returning) instead of
being raced for. Pid reuse is real too: the victim is started at the dead
daemon's pid by writing ``/proc/sys/kernel/ns_last_pid`` (root only; skipped
otherwise), retried a bounded number of times when another process on the
machine takes the pid first.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from devplug.daemon.lockholder import process_start_ticks

if TYPE_CHECKING:
    from tests.hardening.conftest import Bench

EXIT_STATE = 3
NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")
#: How many times the victim is started again when another process took the pid first.
REUSE_TRIES = 200
VICTIM = (
    "import signal, sys, time\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})\n"
    "print('ready', flush=True)\n"
    "sys.stdin.read()\n"  # until the test closes its stdin
)


def _start_victim() -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", VICTIM], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, close_fds=True
    )


def _ready(victim: subprocess.Popen[str]) -> subprocess.Popen[str]:
    assert victim.stdout is not None
    assert victim.stdout.readline().strip() == "ready", "the victim did not start"
    return victim


def _end(victim: subprocess.Popen[str]) -> None:
    with contextlib.suppress(OSError):
        victim.kill()
    victim.wait(10)


def _victim_at(pid: int) -> subprocess.Popen[str]:
    """A victim process with exactly ``pid`` (the kernel hands out ``ns_last_pid + 1`` next, if free)."""
    if os.geteuid() != 0 or not os.access(NS_LAST_PID, os.W_OK):
        pytest.skip("reusing a pid needs root (write access to /proc/sys/kernel/ns_last_pid)")
    for _ in range(REUSE_TRIES):
        with NS_LAST_PID.open("w") as handle:
            handle.write(str(pid - 1))
        victim = _start_victim()
        if victim.pid == pid:
            return _ready(victim)
        _end(victim)
    pytest.skip(f"pid {pid} was taken by other processes {REUSE_TRIES} times in a row")


def _sighup_pending(pid: int) -> bool:
    """Whether SIGHUP is pending for the whole process (``ShdPnd`` in ``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("ShdPnd:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGHUP - 1)))
    raise AssertionError(f"/proc/{pid}/status has no ShdPnd line")


def _reload(bench: Bench) -> subprocess.CompletedProcess[str]:
    return bench.cli("reload", "--state-dir", str(bench.state_dir), "--timeout", "5", timeout=60)


def _dead_daemon(bench: Bench) -> int:
    """Start a daemon, let it write its status, ``kill -9`` it: its lock file and status file still name it."""
    daemon = bench.start()
    pid = daemon.process.pid
    assert bench.status()["pid"] == pid
    daemon.kill()
    assert (bench.state_dir / "devplug.lock").read_text().split()[0] == str(pid)
    return pid


def test_a_dead_daemons_reused_pid_is_not_signalled(bench: Bench) -> None:
    pid = _dead_daemon(bench)
    victim = _victim_at(pid)
    try:
        result = _reload(bench)
        assert not _sighup_pending(victim.pid), "devplug reload signalled the process that reused the daemon's pid"
        assert victim.poll() is None
        assert result.returncode == EXIT_STATE, result.stderr
        assert f"devplug.lock: it names pid {pid}, which is now another process, pid {pid} (" in result.stderr
        assert "its pid was reused); nothing was signalled" in result.stderr
        status = bench.cli("status", "--state-dir", str(bench.state_dir), "--json", timeout=60)
        assert status.returncode == EXIT_STATE and json.loads(status.stdout)["running"] is False
    finally:
        _end(victim)


def test_a_dead_daemons_pid_that_nobody_took_is_reported_gone(bench: Bench) -> None:
    pid = _dead_daemon(bench)
    with contextlib.suppress(ProcessLookupError):  # taken meanwhile by some other process: then this case is moot
        os.kill(pid, 0)
        pytest.skip(f"pid {pid} was taken at once by another process")
    result = _reload(bench)
    assert result.returncode == EXIT_STATE
    assert f"it names pid {pid}, which is gone (the daemon died?); nothing was signalled" in result.stderr


@contextlib.contextmanager
def _forged(bench: Bench, victim: subprocess.Popen[str]) -> Iterator[None]:
    """The lock and status files of a dead daemon rewritten to name ``victim``, start time included: a perfect
    forgery of the files, which only the kernel's record of the lock can tell from the truth."""
    lock = bench.state_dir / "devplug.lock"
    lock.write_text(f"{victim.pid} {process_start_ticks(victim.pid)}\n")
    status_path = bench.state_dir / "status.json"
    status = json.loads(status_path.read_text())
    status["pid"] = victim.pid
    status_path.write_text(json.dumps(status))
    yield


def test_a_lock_file_naming_a_live_process_that_holds_no_lock_is_refused(bench: Bench) -> None:
    _dead_daemon(bench)
    victim = _ready(_start_victim())
    try:
        with _forged(bench, victim):
            result = _reload(bench)
        assert not _sighup_pending(victim.pid)
        assert result.returncode == EXIT_STATE, result.stderr
        assert f"it names pid {victim.pid}, but nobody holds the lock (pid {victim.pid} (" in result.stderr
    finally:
        _end(victim)


def test_a_lock_held_by_another_process_than_the_one_named_is_refused(bench: Bench) -> None:
    _dead_daemon(bench)
    victim = _ready(_start_victim())
    holder = _ready(
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import fcntl, os, sys\n"
                f"fd = os.open({str(bench.state_dir / 'devplug.lock')!r}, os.O_RDWR)\n"
                "fcntl.flock(fd, fcntl.LOCK_EX)\n"
                "print('ready', flush=True)\n"
                "sys.stdin.read()\n",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
    )
    try:
        with _forged(bench, victim):
            result = _reload(bench)
        assert not _sighup_pending(victim.pid)
        assert result.returncode == EXIT_STATE, result.stderr
        assert f"it names pid {victim.pid}, but the lock is held by pid {holder.pid} (" in result.stderr
    finally:
        _end(victim)
        _end(holder)


def test_a_running_daemon_is_still_found_and_reloaded(bench: Bench) -> None:
    daemon = bench.start()
    lock_words = (bench.state_dir / "devplug.lock").read_text().split()
    assert lock_words == [str(daemon.process.pid), str(process_start_ticks(daemon.process.pid))]
    with open(bench.state_dir / "devplug.lock") as handle, pytest.raises(BlockingIOError):
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the daemon's flock excludes others
    result = _reload(bench)
    assert result.returncode == 0, result.stderr
    assert "reload applied: config generation 2" in result.stdout
