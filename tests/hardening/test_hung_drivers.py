"""Hardening, hung drivers (issue 9, item 1): SIGTERM finishes whatever the hooks do.

A driver hook stuck in a call that never returns (here: reading a FIFO
nobody writes, as a read of ``/proc/kmsg`` would) used to keep the daemon
alive forever after SIGTERM. Now the shutdown ends within ``[shutdown]
timeout``, logs each hook it abandoned, and exits 5. The driver is a real
installed distribution (an entry point in a throw-away site folder the
daemon process sees through PYTHONPATH).

(A hook that hangs past ``hook_timeout`` while serving, and SIGTERM during a
slow hook that does return, are tested in tests/lifecycle/test_driver_faults.py
and tests/engine/test_streams_and_shutdown.py.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.hardening.conftest import Bench

RESOURCE = "example.com/stuck"
EXIT_ABANDONED = 5
#: The bound of every SIGTERM below: the shutdown timeout (1 s) with a wide margin for a loaded machine.
EXIT_WITHIN = 30.0

DRIVER = """
from dataclasses import dataclass
from pathlib import Path

from devplug import Device, hookimpl


@dataclass(frozen=True)
class Options:
    fifo: Path
    stuck_in: str  # the hook that reads the FIFO: "start" or "stop"


class Driver:
    Options = Options
    hook_contract = "1.0"

    def __init__(self, options):
        self.options = options

    def _read_fifo(self):
        with open(self.options.fifo, "rb") as fifo:  # blocks in the kernel until a writer writes
            fifo.read(1)

    @hookimpl
    def start(self, ctx):
        if self.options.stuck_in == "start":
            self._read_fifo()

    @hookimpl
    def stop(self):
        if self.options.stuck_in == "stop":
            self._read_fifo()

    @hookimpl
    def list_devices(self):
        return [Device("s0")]
"""


@pytest.fixture
def stuck_driver(fake_distribution: Callable[[str, str, str], Path]) -> None:
    fake_distribution("devplug-test-stuck", DRIVER, "[devplug.drivers]\nstuck = devplug_test_stuck:Driver\n")


@contextlib.contextmanager
def _fifo_reader_waits(fifo: Path, bench: Bench) -> Iterator[None]:
    """Wait until a hook opened ``fifo`` for reading, then hold it open without writing: the read never returns."""
    os.mkfifo(fifo)

    def opened() -> int | None:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO while no reader has it open
        except OSError:
            return None

    writer: int = bench.wait(opened, f"a driver hook to open {fifo}", timeout=15.0)
    try:
        yield
    finally:
        os.close(writer)


def _table(fifo: Path, stuck_in: str) -> dict[str, object]:
    return {"driver": "stuck", "options": {"fifo": str(fifo), "stuck_in": stuck_in}, "hook_timeout": 600}


def _sigterm_exit_code(bench: Bench) -> int:
    """SIGTERM, and the exit code (a daemon still running after EXIT_WITHIN fails the test)."""
    assert bench.daemon is not None and bench.daemon.process.process is not None
    bench.daemon.process.process.send_signal(signal.SIGTERM)
    try:
        return bench.daemon.process.wait(EXIT_WITHIN)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the daemon was still running {EXIT_WITHIN:g} s after SIGTERM\n{bench.log()}", pytrace=False)


def test_sigterm_with_start_stuck_ends_within_the_timeout_exits_5_and_names_the_hook(
    bench: Bench, stuck_driver: None
) -> None:
    fifo = bench.root / "kmsg"
    bench.start({RESOURCE: _table(fifo, "start")}, wait=False, shutdown_timeout=1.0)
    with _fifo_reader_waits(fifo, bench):
        code = _sigterm_exit_code(bench)
    assert code == EXIT_ABANDONED, bench.log()
    assert "abandoned at shutdown: [example.com/stuck] driver hook start (running for" in bench.log()
    assert "devplug: error: stopped, abandoning [example.com/stuck] driver hook start" in bench.log()


def test_sigterm_with_stop_stuck_ends_within_the_timeout_exits_5_and_names_the_hook(
    bench: Bench, stuck_driver: None
) -> None:
    fifo = bench.root / "hung-device"
    os.mkfifo(fifo)  # nobody ever writes: the stop hook's open blocks for good
    bench.start({RESOURCE: _table(fifo, "stop")}, shutdown_timeout=1.0)  # registered, so start returned
    code = _sigterm_exit_code(bench)
    assert code == EXIT_ABANDONED, bench.log()
    assert "the shutdown did not finish within 1 s ([shutdown] timeout)" in bench.log()
    assert "abandoned at shutdown: [example.com/stuck] driver hook stop (running for" in bench.log()
