"""``devplug reload``: find the daemon running on a state dir, send it SIGHUP, and wait for its verdict.

The daemon is the process proven to hold the state dir's lock
(``<state dir>/devplug.lock``; :mod:`devplug.daemon.lockholder`: its pid, its
start time and the kernel's record of the lock agree), and must match the
status file's pid, which must say it is running. The signal goes through a
pidfd, so it reaches that process or nobody: never a process that got the pid
of a daemon that died. The verdict is the
status file's ``reload`` entry: its ``attempts`` count moves once the daemon
handled the signal, and ``last_result`` says whether the new config was applied
or refused (with the reason, the running config staying).
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any

from devplug.config.file import read_config_bytes
from devplug.daemon.lock import StateLock
from devplug.daemon.lockholder import LockHolder, prove_holder
from devplug.daemon.status import read_status
from devplug.errors import ConfigError, StateError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["ReloadRefusedError", "request_reload", "state_dir_of"]

#: How often the status file is read while waiting for the daemon's verdict.
POLL_S = 0.1


class ReloadRefusedError(ConfigError):
    """The daemon refused the new config (it keeps running the old one); the message is the daemon's reason."""


def state_dir_of(config_path: Path) -> Path:
    """The ``[state] dir`` a config file names, read without checking the rest: checking the new config is the
    daemon's job (it says what is wrong, in its status), and a config with a bad option must still reach it."""
    raw = read_config_bytes(config_path)
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{config_path}: not valid TOML, nothing was sent to the daemon: {exc}") from exc
    state = data.get("state", {})
    value = state.get("dir", "/var/lib/devplug") if isinstance(state, dict) else None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{config_path}: state.dir: expected a path (a non-empty string), got {value!r}")
    path = Path(value)
    return path if path.is_absolute() else config_path.resolve().parent / path


def _daemon(state_dir: Path) -> LockHolder:
    """The daemon holding ``state_dir``, proven to hold its lock (:func:`prove_holder`) and running by its status
    file; :class:`StateError` naming what was found when no daemon runs there. Close it when done."""
    lock = StateLock(state_dir).path
    holder = prove_holder(state_dir, lock)
    try:
        status = read_status(state_dir)
        if status["pid"] != holder.pid or not status["running"]:
            said = "says it stopped" if status["pid"] == holder.pid else "was not written yet (is it starting?)"
            raise StateError(
                f"no devplug daemon runs with the state dir {state_dir}: {lock} is held by pid {holder.pid}, whose "
                f"status {said}"
            )
    except BaseException:
        holder.close()
        raise
    return holder


def _reload_entry(state_dir: Path, pid: int) -> dict[str, Any]:
    status = read_status(state_dir)
    if status["pid"] != pid or not status["running"]:
        raise StateError(f"the devplug daemon (pid {pid}) stopped before it reported the reload")
    entry: dict[str, Any] = status.get("reload") or {}
    return entry


def request_reload(state_dir: Path, timeout: float = 30.0) -> dict[str, Any]:
    """Ask the daemon on ``state_dir`` to reload its config; return its ``reload`` status entry once applied.

    Raises :class:`ReloadRefusedError` with the daemon's reason when it refused
    the new config, :class:`StateError` when no daemon runs there or it did not
    answer within ``timeout`` seconds.
    """
    with _daemon(state_dir) as holder:
        pid = holder.pid
        before = _reload_entry(state_dir, pid).get("attempts", 0)
        holder.send(signal.SIGHUP)
    deadline = time.monotonic() + timeout
    while True:
        entry = _reload_entry(state_dir, pid)
        if entry.get("attempts", 0) > before:
            break
        if time.monotonic() >= deadline:
            raise StateError(f"the devplug daemon (pid {pid}) did not report the reload within {timeout:g} s")
        time.sleep(POLL_S)
    if entry.get("last_result") != "ok":
        raise ReloadRefusedError(f"reload refused, the daemon keeps its running config: {entry.get('last_error')}")
    return entry
