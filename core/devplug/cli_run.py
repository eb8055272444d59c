"""``devplug run`` without click: the daemon is the one long-lived process, and click would stay resident in it
(about 1.3 MiB). The options, defaults and exit codes are those of the click command in :mod:`devplug.cli`,
which runs the same :func:`run_command`; ``devplug run --help`` is click's."""

from __future__ import annotations

import argparse
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
    from devplug.config import load_config
    from devplug.logs import setup_logging

    setup_logging(log_level, "json" if log_format == "json" else "text")
    try:
        config = load_config(config_path)
        from devplug.engine.daemon import run_daemon

        abandoned = run_daemon(config)
    except DevplugError as exc:
        fail(exc)
    if abandoned:
        print(f"devplug: error: stopped, abandoning {'; '.join(abandoned)}", file=sys.stderr)
        sys.exit(EXIT_ABANDONED)


def main(argv: list[str]) -> None:
    """``devplug run`` with ``argv`` the arguments after ``run``."""
    parser = argparse.ArgumentParser(prog="devplug run", add_help=False)
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="text")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    args = parser.parse_args(argv)  # exits 2 on a usage error, as click does
    run_command(args.config, args.log_format, args.log_level)
