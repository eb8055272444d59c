"""The devplug daemon as a real child process (``python -m devplug run``).

Used by ``devplug demo``, by the benchmarks and, through :mod:`devplug.testing`,
by tests; it imports nothing of the engine, so starting a daemon costs no gRPC import.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, ClassVar

__all__ = ["DaemonProcess"]


class DaemonProcess:
    """``python -m devplug run --config CONFIG`` in a child process, its log in ``log_path``.

    ``env`` is added to this process's environment for the child (for example a
    ``PYTHONPATH`` that makes a test driver's entry point visible).
    """

    #: Every daemon started in this process that may still run (see :meth:`left_running`).
    _started: ClassVar[list[DaemonProcess]] = []

    @classmethod
    def left_running(cls) -> list[DaemonProcess]:
        """The daemons this process started that still run: a test suite checks none outlives it."""
        cls._started[:] = [d for d in cls._started if d.running()]
        return list(cls._started)

    def __init__(
        self, config_path: Path, log_path: Path, *, log_level: str = "debug", env: Mapping[str, str] | None = None
    ) -> None:
        self.config_path = config_path
        self.log_path = log_path
        self.log_level = log_level
        self.env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None, "daemon not started"
        return self.process.pid

    def command(self) -> list[str]:
        """The child's command line (a subclass may run the daemon through a wrapper of its own)."""
        return [sys.executable, "-m", "devplug", *self.run_arguments()]

    def run_arguments(self) -> list[str]:
        """The arguments of ``devplug``: ``run --config CONFIG --log-level LEVEL``."""
        return ["run", "--config", str(self.config_path), "--log-level", self.log_level]

    def start(self) -> DaemonProcess:
        """Start the daemon (returns at once; wait for registration through the dev kubelet)."""
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the child's lifetime
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        self.process = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            env=env,
        )
        if self not in DaemonProcess.left_running():  # those that ended forgotten; a restart listed once
            DaemonProcess._started.append(self)
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stopped(self) -> bool:
        """Whether the process is stopped by a signal (state ``T`` in ``/proc/<pid>/stat``), as a test's daemon stops
        itself at a handover step (see :func:`devplug.daemon.handover.observe_steps`)."""
        text = Path(f"/proc/{self.pid}/stat").read_text()
        return text[text.rfind(")") + 2 :].split()[0] == "T"

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, then wait; returns the exit code (SIGKILL after ``timeout``, and raises)."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL: the crash the daemon must survive."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._close_log()

    def wait(self, timeout: float) -> int:
        assert self.process is not None
        code = self.process.wait(timeout)
        self._close_log()
        return code

    def _close_log(self) -> None:
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()
            self._log = None

    def log_text(self) -> str:
        """Everything the daemon logged so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def __enter__(self) -> DaemonProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.running():
            self.stop()
