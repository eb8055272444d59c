"""Running an external command from a driver: the one runner every shipped driver's tools go through.

:func:`run_command` runs an argument list (never a shell) and bounds everything
about it:

* **its processes** -- it runs in a session of its own (``setsid``), so it is
  its own process group and signals sent to the daemon's group do not reach it
  half-way. When its first process exits, whatever it left in its group is
  killed (systemd's ``KillMode=control-group``): a wrapper whose child keeps
  running, or keeps the output pipes open, cannot hold the driver. At the
  deadline the whole group is killed (``SIGKILL``), not only the first process.
  The group is always killed before that process is reaped, so its id cannot
  have been reused by then;
* **its time** -- ``timeout`` seconds from the start to the end of its output;
* **its output** -- each of stdout and stderr is read as it comes (a full pipe
  never blocks the tool) and at most ``output_limit`` bytes of it are kept: the
  first and the last half, with how much was dropped in between;
* **what is said about it** -- errors carry a bounded, escaped excerpt
  (:data:`EXCERPT_CHARS`) of what it printed, fit for one log line.

Why our own and not a library: ``bounded-subprocess`` (PyPI) does the first
three, but the kit ships with the core, whose dependencies are pluggy, grpcio,
protobuf and click only; it also polls in 0.1 s sleeps with whole-second
timeouts and offers no way to learn the child's pid as it starts, which a
driver needs to stop a tool a killed daemon left running (``on_start``).
``subprocess.run(timeout=...)`` kills only the first process and then waits
for the pipes' end, which a surviving child can hold open for ever.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from devplug.errors import DriverError
from devplug.logsafe import escape

__all__ = [
    "DEFAULT_OUTPUT_LIMIT",
    "EXCERPT_CHARS",
    "CommandError",
    "CommandResult",
    "StartRecorder",
    "kill_left_behind",
    "run_command",
]

#: Bytes of each of stdout and stderr kept by default (the first and the last half).
DEFAULT_OUTPUT_LIMIT = 64 * 1024
#: Characters of output an error message or log line shows: the end of stderr (or of stdout when stderr is empty).
EXCERPT_CHARS = 2000
#: How long the output pipes are read once the command's group was killed (or its first process exited): a process
#: that left the group (its own ``setsid``) may hold them open for ever.
PIPE_GRACE_S = 1.0
_READ = 65536

#: Called with the pid and the program of a command as soon as it runs.
StartRecorder = Callable[[int, str], None]


class _Capture:
    """One stream's bytes: the first and the last ``limit // 2`` kept, the count of those dropped between."""

    def __init__(self, limit: int) -> None:
        self.half = max(1, limit // 2)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail += data
        extra = len(self.tail) - self.half
        if extra > 0:
            del self.tail[:extra]
            self.dropped += extra

    def text(self) -> str:
        head = self.head.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        if self.dropped:
            return f"{head}\n[... {self.dropped} bytes of output dropped ...]\n{tail}"
        return head + tail


def _excerpt(stdout: str, stderr: str) -> str:
    """``stderr: <its end>`` (or ``stdout: ...`` when stderr is empty), escaped onto one line, the text at most
    :data:`EXCERPT_CHARS` characters; ``no output`` when there was none."""
    for name, text in (("stderr", stderr.strip()), ("stdout", stdout.strip())):
        if text:
            cut = "..." if len(text) > EXCERPT_CHARS else ""
            return f"{name}: {cut}{escape(text[-EXCERPT_CHARS:])}"
    return "no output"


def _shown(argv: Sequence[str]) -> str:
    joined = shlex.join(argv)
    return escape(joined if len(joined) <= 300 else joined[:300] + "...")


@dataclass(frozen=True)
class CommandResult:
    """A command that ran to its end: its exit status and its output (each stream capped)."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    #: Bytes of output dropped beyond the cap (both streams).
    dropped: int = 0

    @property
    def excerpt(self) -> str:
        """``stderr: <its end>`` (or stdout's), escaped and bounded: for a log line."""
        return _excerpt(self.stdout, self.stderr)


class CommandError(DriverError):
    """A command could not start, timed out (its group killed) or exited non-zero; the message names it and
    shows a bounded excerpt of its output. ``output`` is what it printed (stdout then stderr, each capped)."""

    def __init__(
        self,
        message: str,
        *,
        argv: Sequence[str] = (),
        returncode: int | None = None,
        timed_out: bool = False,
        stdout: str = "",
        stderr: str = "",
    ) -> None:
        super().__init__(message)
        self.argv = tuple(argv)
        #: The exit status (negative: killed by that signal); None when it did not start or timed out.
        self.returncode = returncode
        self.timed_out = timed_out
        self.stdout = stdout
        self.stderr = stderr

    @property
    def output(self) -> str:
        """Everything kept of what it printed: stdout, then stderr."""
        return self.stdout + self.stderr

    @property
    def excerpt(self) -> str:
        """The end of what it printed, escaped and bounded (as in the message)."""
        return _excerpt(self.stdout, self.stderr)


def _kill_group(pgid: int) -> None:
    """SIGKILL the process group ``pgid`` (its leader not reaped yet, so the id is still that group's)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def run_command(
    argv: Sequence[str],
    *,
    timeout: float,
    output_limit: int = DEFAULT_OUTPUT_LIMIT,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    on_start: StartRecorder | None = None,
    check: bool = True,
) -> CommandResult:
    """Run ``argv`` (a program and its arguments, no shell) as the module docstring says; its result.

    Raises :class:`CommandError` when it cannot start, runs past ``timeout``
    seconds (its whole process group is killed), or, with ``check``, exits
    non-zero. ``on_start(pid, program)`` is called as soon as it runs (record
    the pid to stop a tool a killed daemon left behind: the group's id is the
    pid). Blocks the calling thread; drivers call it from their hooks.
    """
    if isinstance(argv, (str, bytes)):
        raise TypeError("run_command: argv must be a list of arguments, not one string (no shell is used)")
    args = [str(a) for a in argv]
    if not args:
        raise ValueError("run_command: argv is empty")
    shown = _shown(args)
    try:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
            env=dict(env) if env is not None else None,
            cwd=cwd,
        )
    except OSError as exc:
        raise CommandError(f"command `{shown}` could not start: {exc.strerror or exc}", argv=args) from exc
    out, err = _Capture(output_limit), _Capture(output_limit)
    timed_out = True
    try:
        if on_start is not None:
            on_start(proc.pid, args[0])
        timed_out = _supervise(proc, timeout, out, err)
    finally:
        _kill_group(proc.pid)  # nothing of it outlives the call (a no-op when all is gone)
        try:
            proc.wait(PIPE_GRACE_S)
        except subprocess.TimeoutExpired:  # SIGKILL cannot end a process stuck in the kernel (state D)
            stuck = True
        else:
            stuck = False
    stdout, stderr = out.text(), err.text()
    if stuck:
        raise CommandError(
            f"command `{shown}` (pid {proc.pid}) timed out after {timeout:g} s and did not die when killed "
            f"(stuck in the kernel?); {_excerpt(stdout, stderr)}",
            argv=args,
            timed_out=True,
            stdout=stdout,
            stderr=stderr,
        )
    if timed_out:
        raise CommandError(
            f"command `{shown}` timed out after {timeout:g} s (its process group was killed); "
            f"{_excerpt(stdout, stderr)}",
            argv=args,
            timed_out=True,
            stdout=stdout,
            stderr=stderr,
        )
    code = proc.returncode
    if code != 0 and check:
        how = f"exited {code}" if code > 0 else f"was killed by signal {-code}"
        raise CommandError(
            f"command `{shown}` {how}; {_excerpt(stdout, stderr)}",
            argv=args,
            returncode=code,
            stdout=stdout,
            stderr=stderr,
        )
    return CommandResult(tuple(args), code, stdout, stderr, out.dropped + err.dropped)


def _supervise(proc: subprocess.Popen[bytes], timeout: float, out: _Capture, err: _Capture) -> bool:
    """Read the output until the command is over; True when it ran past ``timeout`` (its group then killed).

    Never reaps the process: its exit is seen on a pidfd, so its group's id stays
    reserved for the kills here and the caller's.
    """
    assert proc.stdout is not None and proc.stderr is not None
    pidfd = os.pidfd_open(proc.pid)
    captures = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    selector = selectors.DefaultSelector()
    try:
        for fd in captures:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        selector.register(pidfd, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        grace_end: float | None = None
        exited = timed_out = False
        while not (exited and not captures):
            now = time.monotonic()
            if not exited and not timed_out and now >= deadline:
                timed_out = True
                _kill_group(proc.pid)
                grace_end = now + PIPE_GRACE_S
            if grace_end is not None and now >= grace_end:
                break  # a process outside the group holds the pipes: stop reading them
            for key, _ in selector.select(max(0.0, (grace_end or deadline) - now)):
                fd = int(key.fd)
                if fd == pidfd:
                    exited = True
                    selector.unregister(pidfd)
                    _kill_group(proc.pid)  # what it left behind in its group
                    grace_end = min(grace_end or float("inf"), time.monotonic() + PIPE_GRACE_S)
                    continue
                try:
                    data = os.read(fd, _READ)
                except BlockingIOError:
                    continue
                if data:
                    captures[fd].feed(data)
                else:
                    selector.unregister(fd)
                    del captures[fd]
        return timed_out
    finally:
        selector.close()
        os.close(pidfd)
        for stream in (proc.stdout, proc.stderr):
            stream.close()


def kill_left_behind(pid: int, program: str) -> bool:
    """Kill a command a killed daemon left running, if ``pid`` still runs ``program``; True if it did.

    Record what ``on_start`` is given (before the work the command does, in the
    driver's records) and call this at the next ``start`` for each recorded pid:
    the command ran in a session of its own, so its process group is its pid and
    the whole group goes (a wrapper's children too). A pid now running another
    program (reused) is left alone.
    """
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = handle.read().split(b"\0")
    except OSError:
        return False
    if not any(os.path.basename(part.decode(errors="replace")) == os.path.basename(program) for part in cmdline):
        return False
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except OSError:
        return False
    return True
