"""``devplug run`` without click or argparse: the daemon is the one long-lived process, and what it imports stays
resident (click about 1.3 MiB; argparse pulls in gettext, locale and shutil, which loads the zlib, bz2 and lzma
modules). The options, defaults and exit codes are those of the click command in :mod:`devplug.cli.commands`, which runs
the same :func:`run_command`; ``devplug run --help`` is click's."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

from devplug.errors import DevplugError, DriverLoadError, StateError

__all__ = ["EXIT_ABANDONED", "EXIT_CONFIG", "EXIT_DRIVER", "EXIT_STATE", "exit_code", "fail", "main", "run_command"]

EXIT_CONFIG = 2
EXIT_STATE = 3
EXIT_DRIVER = 4
EXIT_ABANDONED = 5

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")


def exit_code(exc: DevplugError) -> int:
    """2 bad config or usage, 3 the state dir is taken or unusable, 4 a driver could not be loaded."""
    if isinstance(exc, StateError):
        return EXIT_STATE
    if isinstance(exc, DriverLoadError):
        return EXIT_DRIVER
    return EXIT_CONFIG


def fail(exc: DevplugError) -> NoReturn:
    print(f"devplug: error: {exc}", file=sys.stderr)
    sys.exit(exit_code(exc))


def run_command(config_path: Path, log_format: str, log_level: str) -> None:
    """Run the daemon until SIGTERM/SIGINT; exits non-zero on a bad config, a taken state dir, abandoned hooks."""
    from devplug.cli.logs import setup_logging
    from devplug.config import load_config

    setup_logging(log_level, "json" if log_format == "json" else "text")
    try:
        config = load_config(config_path)
        from devplug.daemon.process import run_daemon

        abandoned = run_daemon(config)
    except DevplugError as exc:
        fail(exc)
    if abandoned:
        print(f"devplug: error: stopped, abandoning {'; '.join(abandoned)}", file=sys.stderr)
        sys.exit(EXIT_ABANDONED)


#: ``devplug run``'s options: name -> (allowed values or None for any, default or None when required).
RUN_OPTIONS: dict[str, tuple[tuple[str, ...] | None, str | None]] = {
    "--config": (None, None),
    "--log-format": (LOG_FORMATS, "text"),
    "--log-level": (LOG_LEVELS, "info"),
}
USAGE = "usage: devplug run --config FILE [--log-format {text,json}] [--log-level {debug,info,warning,error}]"


class UsageError(Exception):
    """A ``devplug run`` command line that cannot be run; the message says which option and why."""


def parse_run_args(argv: list[str]) -> dict[str, str]:
    """``--name value`` or ``--name=value`` for each of :data:`RUN_OPTIONS`; :class:`UsageError` otherwise."""
    values: dict[str, str] = {}
    rest = list(argv)
    while rest:
        arg = rest.pop(0)
        name, sep, value = arg.partition("=")
        if name not in RUN_OPTIONS:
            raise UsageError(f"unknown argument {arg!r}")
        if not sep:
            if not rest:
                raise UsageError(f"{name} needs a value")
            value = rest.pop(0)
        allowed = RUN_OPTIONS[name][0]
        if allowed is not None and value not in allowed:
            raise UsageError(f"{name}: {value!r} is not one of {', '.join(allowed)}")
        values[name] = value
    for name, (_, default) in RUN_OPTIONS.items():
        if name not in values:
            if default is None:
                raise UsageError(f"{name} is required")
            values[name] = default
    return values


def main(argv: list[str]) -> None:
    """``devplug run`` with ``argv`` the arguments after ``run``; exits 2 on a usage error, as click does."""
    try:
        args = parse_run_args(argv)
    except UsageError as exc:
        print(f"{USAGE}\ndevplug run: error: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    run_command(Path(args["--config"]), args["--log-format"], args["--log-level"])
