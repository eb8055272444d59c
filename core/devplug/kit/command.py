"""Running an external command from a driver: the one runner every shipped driver's tools go through.

:func:`run_command` runs an argument list (never a shell) and bounds everything
about it:

* **its processes** -- it runs in a session of its own (``setsid``), so it is
  its own process group and signals sent to the daemon's group do not reach it
  half-way; and, where the node allows it (a writable cgroup v2), in a
  transient cgroup of its own (:mod:`devplug.kit.cgroupjail`), which a child
  that calls ``setsid()`` itself cannot leave. When its first process exits,
  whatever it left in its group and its cgroup is killed (systemd's
  ``KillMode=control-group``): a wrapper whose child keeps running, or keeps
  the output pipes open, cannot hold the driver. At the deadline the whole
  group and cgroup are killed (``SIGKILL``), not only the first process. The
  group is always killed before that process is reaped, so its id cannot have
  been reused by then; the cgroup is removed once empty. Which of the two
  (cgroup, or process group only) the node allows is said once in the log;
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
import logging
import os
import selectors
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from devplug.errors import DriverError
from devplug.kit.cgroupjail import CommandCgroup, command_cgroup, command_failed_to_join, kill_cgroup_of
from devplug.text.logsafe import escape

__all__ = [
    "DEFAULT_OUTPUT_LIMIT",
    "EXCERPT_CHARS",
    "CommandError",
    "CommandResult",
    "StartRecorder",
    "kill_left_behind",
    "process_stamp",
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


class _Killer:
    """Kills what a command left: its process group and, when it has one, its transient cgroup."""

    def __init__(self, pgid: int, cgroup: CommandCgroup | None) -> None:
        self.pgid = pgid
        self.cgroup = cgroup

    def __call__(self) -> None:
        _kill_group(self.pgid)
        if self.cgroup is not None:
            self.cgroup.kill()


#: The shim that moves a command into its cgroup, then becomes it (:mod:`devplug.kit.cgroupjail`).
_JOIN_SHIM = ("/bin/sh", "-c", 'echo 0 > "$0" 2>/dev/null || exit 125; exec "$@"')
#: How long the shim may take to become the command.
_JOIN_WAIT_S = 5.0


def _popen(args: list[str], env: Mapping[str, str] | None, cwd: Path | None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
        env=dict(env) if env is not None else None,
        cwd=cwd,
    )


def _joined(proc: subprocess.Popen[bytes], cgroup: CommandCgroup) -> str | None:
    """Wait until the shim moved itself into the cgroup (it then execs the command at once); None once it did,
    else why not. Never reaps the process (its pid stays its own for the kills)."""
    deadline = time.monotonic() + _JOIN_WAIT_S
    while time.monotonic() < deadline:
        if cgroup.holds(proc.pid):  # a zombie still shows its cgroup
            return None
        ended = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if ended is not None and not cgroup.holds(proc.pid):
            return f"cannot write {cgroup.procs} (the shim exited {ended.si_status})"
        time.sleep(0.0005)
    return f"it did not join within {_JOIN_WAIT_S:g} s"


def _start(
    args: list[str], env: Mapping[str, str] | None, cwd: Path | None, shown: str
) -> tuple[subprocess.Popen[bytes], CommandCgroup | None]:
    """The command started, in a transient cgroup of its own where the node allows it (and the program is found
    and ``/bin/sh`` is there for the shim), else in its own process group only."""
    cgroup = None
    path = (env or os.environ).get("PATH", os.defpath)
    if os.access(_JOIN_SHIM[0], os.X_OK) and shutil.which(args[0], path=path) is not None:
        cgroup = command_cgroup()
    try:
        if cgroup is not None:
            proc = _popen([*_JOIN_SHIM, str(cgroup.procs), *args], env, cwd)
            problem = _joined(proc, cgroup)
            if problem is None:
                return proc, cgroup
            _kill_group(proc.pid)
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
            command_failed_to_join(cgroup, problem)
        return _popen(args, env, cwd), None
    except OSError as exc:
        if cgroup is not None:
            cgroup.remove()
        raise CommandError(f"command `{shown}` could not start: {exc.strerror or exc}", argv=args) from exc


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
    proc, cgroup = _start(args, env, cwd, shown)
    out, err = _Capture(output_limit), _Capture(output_limit)
    timed_out = True
    kill = _Killer(proc.pid, cgroup)
    try:
        if on_start is not None:
            on_start(proc.pid, args[0])
        timed_out = _supervise(proc, timeout, out, err, kill)
    finally:
        kill()  # nothing of it outlives the call (a no-op when all is gone)
        try:
            proc.wait(PIPE_GRACE_S)
        except subprocess.TimeoutExpired:  # SIGKILL cannot end a process stuck in the kernel (state D)
            stuck = True
        else:
            stuck = False
        if cgroup is not None:
            cgroup.remove()
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


def _supervise(
    proc: subprocess.Popen[bytes], timeout: float, out: _Capture, err: _Capture, kill: Callable[[], None]
) -> bool:
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
                kill()
                grace_end = now + PIPE_GRACE_S
            if grace_end is not None and now >= grace_end:
                break  # a process outside the group holds the pipes: stop reading them
            for key, _ in selector.select(max(0.0, (grace_end or deadline) - now)):
                fd = int(key.fd)
                if fd == pidfd:
                    exited = True
                    selector.unregister(pidfd)
                    kill()  # what it left behind in its group and cgroup
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


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")

log = logging.getLogger("devplug.kit")


def _start_ticks(pid: int) -> int | None:
    """``/proc/<pid>/stat`` field 22, ``starttime``: when the process started, in clock ticks since boot
    (``proc(5)``); None when it is gone. Fields are counted after the ``)`` ending the command name, which may
    hold spaces and parentheses itself."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])  # field 22; fields[0] is field 3 (state)
    except (IndexError, ValueError):
        return None


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def _runs(pid: int, program: str) -> bool:
    """Whether the process ``pid`` runs ``program`` exactly: its executable is that file, or (a script) its
    interpreter was given that file (``argv[1]``, or ``argv[2]`` after one interpreter option). Paths are
    compared whole once resolved (a bare name through ``PATH``), never by their last part."""
    wanted = shutil.which(program) if os.sep not in program else program
    if wanted is None:
        return False
    wanted = os.path.realpath(wanted)
    exe = _exe(pid)
    if exe is not None and os.path.realpath(exe.removesuffix(" (deleted)")) == wanted:
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
    except OSError:
        return False
    return any(os.path.realpath(os.fsdecode(arg)) == wanted for arg in argv[1:3] if arg.startswith(b"/"))


def process_stamp(pid: int) -> str | None:
    """What tells the process ``pid`` from any other that may get its pid later: the boot's id
    (``/proc/sys/kernel/random/boot_id``) and its start time in clock ticks since boot (``/proc/<pid>/stat``
    field 22), as one string to keep beside the pid; None when it is gone.

    Call it from ``on_start`` (the command is then the runner's child, not reaped yet: the pid is still its) and
    record it with the pid for :func:`kill_left_behind`."""
    try:
        boot = BOOT_ID.read_text().strip()
    except OSError:
        return None
    ticks = _start_ticks(pid)
    return None if ticks is None else f"{boot} {ticks}"


def kill_left_behind(pid: int, program: str, stamp: str | None = None) -> bool:
    """Kill a command a killed daemon left running, if ``pid`` is still that very process; True if it did.

    Record what ``on_start`` is given and :func:`process_stamp` of the pid (in
    ``on_start``, before the work the command does, in the driver's records)
    and call this at the next ``start`` for each record. It kills only when the
    process now at ``pid`` has the recorded boot id and start time and runs
    ``program`` exactly (its executable, or the script its interpreter was
    given, by whole resolved path): a pid reused by another process, after the
    tool ended or across a reboot, is left alone. It then kills the transient cgroup the runner made
    for the command when it has one (everything the command started, whatever
    its session), else the process group when the process leads the session
    the runner made for it (its pid is its session's and group's id), else the
    process alone.

    Without ``stamp`` (a record written before the kit kept stamps, or by a
    driver that does not record one) nothing is killed: a pid alone cannot be
    told from a process that got the same pid since. A WARNING names the pid and
    the program so the operator can look (``ps -o lstart,args -p PID``), and it
    returns False.
    """
    if stamp is None:
        log.warning(
            "not killing pid %d (recorded as %s): its record has no start time, so it cannot be told from another "
            "process that got the same pid since; if `ps -o lstart,args -p %d` shows the tool still running, "
            "stop it by hand",
            pid,
            escape(program),
            pid,
        )
        return False
    boot, _, ticks = stamp.partition(" ")
    try:
        pidfd = os.pidfd_open(pid)  # from here on the pid cannot be reused under us
    except OSError:
        return False
    try:
        now_boot = BOOT_ID.read_text().strip()
        if now_boot != boot or str(_start_ticks(pid)) != ticks or not _runs(pid, program):
            return False
        if kill_cgroup_of(pid):
            return True
        try:
            leads = os.getsid(pid) == pid and os.getpgid(pid) == pid
        except OSError:
            return False
        if leads:
            os.killpg(pid, signal.SIGKILL)
        else:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        return False
    finally:
        os.close(pidfd)
    return True
