"""The ``devplug`` command. The only place that turns errors into exit codes and prints for the user.

Exit codes: 0 success, 1 the demo's lifecycle went wrong, 2 bad config or
usage, 3 the state dir is taken or unusable, 4 a driver could not be loaded,
5 the daemon stopped but abandoned driver hooks that had not returned (or a
shutdown that overran ``[shutdown] timeout``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from devplug.cli_run import (
    EXIT_STATE,
    LOG_FORMATS,
    LOG_LEVELS,
    exit_code,
    run_command,
)
from devplug.errors import DevplugError, DriverLoadError

EXIT_DEMO_FAILED = 1


def _fail(exc: DevplugError) -> NoReturn:
    click.echo(f"devplug: error: {exc}", err=True)
    sys.exit(exit_code(exc))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="devplug")
def main() -> None:
    """devplug: Kubernetes device plugins with the whole device lifecycle."""
    # gRPC's C core logs routine connection events (GOAWAY on a kubelet restart) at INFO to stderr.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


@main.command()
@click.option("--config", "config_path", type=click.Path(path_type=Path), required=True, help="The TOML config.")
@click.option("--log-format", type=click.Choice(LOG_FORMATS), default="text", show_default=True)
@click.option("--log-level", type=click.Choice(LOG_LEVELS), default="info", show_default=True)
def run(config_path: Path, log_format: str, log_level: str) -> None:
    """Run the daemon: serve every configured resource to the kubelet until SIGTERM/SIGINT."""
    run_command(config_path, log_format, log_level)


@main.command("check-config")
@click.argument("config_path", type=click.Path(path_type=Path))
def check_config(config_path: Path) -> None:
    """Validate a config file (drivers and their options included) without starting anything."""
    from devplug.config import load_config

    try:
        config = load_config(config_path)
    except DevplugError as exc:
        _fail(exc)
    click.echo(f"{config_path}: ok")
    for resource in config.resources:
        click.echo(f"  {resource.name}: driver {resource.driver}")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def drivers(as_json: bool) -> None:
    """List the installed drivers: distribution, version, and the hooks each implements."""
    from devplug.drivers import driver_hook_names, installed_drivers

    rows: list[dict[str, Any]] = []
    for name, info in installed_drivers().items():
        row: dict[str, Any] = {"name": name, "distribution": info.distribution, "version": info.version}
        try:
            row["hooks"] = driver_hook_names(info.load())
        except DriverLoadError as exc:
            row["error"] = str(exc)
        rows.append(row)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    if not rows:
        click.echo("no drivers installed (pip install devplug-<name>)")
        return
    for row in rows:
        hooks = ", ".join(row.get("hooks", [])) or f"BROKEN: {row.get('error')}"
        click.echo(f"{row['name']:<10} {row['distribution']} {row['version']}\n           hooks: {hooks}")


@main.command()
@click.option(
    "--dir",
    "directory",
    type=click.Path(path_type=Path),
    required=True,
    help="The device-plugin folder to serve kubelet.sock in.",
)
@click.option("--kep", is_flag=True, help="Call PostStopContainer/Deallocate on pod removal (KEP mode).")
@click.option(
    "--pod-resources-socket",
    type=click.Path(path_type=Path),
    default=None,
    help="Where to serve PodResources (default: DIR/../pod-resources/kubelet.sock).",
)
def kubelet(directory: Path, kep: bool, pod_resources_socket: Path | None) -> None:
    """Run the dev kubelet in the foreground (a stand-in for the kubelet's device manager)."""
    from devplug.devkubelet import run_foreground
    from devplug.logs import setup_logging

    setup_logging("info")
    try:
        asyncio.run(run_foreground(directory, kep_mode=kep, pod_resources_socket=pod_resources_socket))
    except KeyboardInterrupt:
        pass
    except DevplugError as exc:
        _fail(exc)


@main.command()
@click.option("--kep", is_flag=True, help="Have the dev kubelet call the KEP's PostStopContainer/Deallocate.")
@click.option("--keep", is_flag=True, help="Keep the temporary folder and print its path.")
def demo(kep: bool, keep: bool) -> None:
    """Watch the whole device lifecycle on config.example.toml, with a dev kubelet, in a temporary folder."""
    from devplug.demo import run_demo

    try:
        ok = run_demo(kep_mode=kep, keep=keep, echo=click.echo)
    except DevplugError as exc:
        _fail(exc)
    sys.exit(0 if ok else EXIT_DEMO_FAILED)


@main.command()
@click.option("--config", "config_path", type=click.Path(path_type=Path), help="Read the state dir from this config.")
@click.option("--state-dir", type=click.Path(path_type=Path), help="The daemon's state dir (default /var/lib/devplug).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(config_path: Path | None, state_dir: Path | None, as_json: bool) -> None:
    """Show a running daemon's resources, devices and recent releases."""
    from devplug.engine.status import read_status
    from devplug.statusview import format_status

    try:
        if state_dir is None:
            if config_path is not None:
                from devplug.config import load_config

                state_dir = load_config(config_path).state.dir
            else:
                state_dir = Path("/var/lib/devplug")
        data = read_status(state_dir)
    except DevplugError as exc:
        _fail(exc)
    if as_json:
        click.echo(json.dumps(data, indent=1))
    else:
        click.echo(format_status(data))
    if not data.get("running"):
        sys.exit(EXIT_STATE)
