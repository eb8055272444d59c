"""``devplug reload``: find the daemon running on a state dir, send it SIGHUP, and wait for its verdict.

The daemon's PID comes from its lock (``<state dir>/devplug.lock``) and must
match the status file's, which must say it is running. The verdict is the
status file's ``reload`` entry: its ``attempts`` count moves once the daemon
handled the signal, and ``last_result`` says whether the new config was applied
or refused (with the reason, the running config staying).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from devplug.configfile import read_config_bytes
from devplug.engine.lock import StateLock
from devplug.engine.status import read_status
from devplug.errors import ConfigError, StateError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["ReloadRefusedError", "daemon_pid", "request_reload", "state_dir_of"]

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


def daemon_pid(state_dir: Path) -> int:
    """The PID of the daemon holding ``state_dir``; :class:`StateError` when no daemon runs there."""
    lock = StateLock(state_dir).path
    try:
        text = lock.read_text().strip()
    except FileNotFoundError:
        raise StateError(
            f"no devplug daemon runs with the state dir {state_dir} ({lock} does not exist); if the config now "
            "names another [state] dir, pass the running daemon's with --state-dir"
        ) from None
    except OSError as exc:
        raise StateError(f"{lock}: cannot read the daemon lock: {exc.strerror or exc}") from exc
    if not text.isdigit():
        raise StateError(f"no devplug daemon runs with the state dir {state_dir} ({lock} names no process)")
    pid = int(text)
    status = read_status(state_dir)
    if status["pid"] != pid or not status["running"]:
        raise StateError(
            f"no devplug daemon runs with the state dir {state_dir}: {lock} names pid {pid}, whose status "
            f"{'says it stopped' if status['pid'] == pid else 'was not written yet (is it starting?)'}"
        )
    return pid


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
    pid = daemon_pid(state_dir)
    before = _reload_entry(state_dir, pid).get("attempts", 0)
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        raise StateError(f"the devplug daemon (pid {pid}) is gone") from None
    except PermissionError:
        raise StateError(f"not allowed to signal the devplug daemon (pid {pid}): run as its user") from None
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
