"""The ``devplug`` command. The only place that turns errors into exit codes and prints for the user.

Exit codes: 0 success, 1 the demo's lifecycle went wrong, 2 bad config or
usage (a reload the daemon refused, a name new-driver cannot use), 3 the
state dir is taken or unusable (no daemon to reload or show), 4 a driver could not be loaded,
5 the daemon stopped but abandoned driver hooks that had not returned (or a
shutdown that overran ``[shutdown] timeout``), 6 ``devplug status`` found a
resource of a running daemon degraded or failed. ``devplug kubelet admit|remove|restart|show`` exit 1 when
the dev kubelet refused the request, 3 when no dev kubelet answers.

``devplug demo`` and ``devplug kubelet`` are the test kit's (the ``devplug-testing`` distribution,
:mod:`devplug.testing.cli`): other distributions add commands through the entry-point group ``devplug.cli``
(:func:`devplug.drivers.discovery.cli_extensions`), loaded below. Without the kit, each of its commands
says that it needs it and exits 2.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from devplug.cli.run import (
    EXIT_CONFIG,
    LOG_FORMATS,
    LOG_LEVELS,
    exit_code,
    run_command,
)
from devplug.contract import HOOK_CONTRACT
from devplug.errors import DevplugError, DriverLoadError

if TYPE_CHECKING:
    from devplug.config import Config, ResourceConfig

#: The distribution that brings the test kit's commands, and those commands: named when one is missing.
TEST_KIT_DISTRIBUTION = "devplug-testing"
TEST_KIT_COMMANDS = {
    "demo": "Watch the whole device lifecycle with a dev kubelet (needs devplug-testing).",
    "kubelet": "Run the dev kubelet, or talk to one (needs devplug-testing).",
}
#: ``devplug status``: the daemon runs, but a resource is degraded or failed.
EXIT_UNHEALTHY = 6


def _fail(exc: DevplugError) -> NoReturn:
    click.echo(f"devplug: error: {exc}", err=True)
    sys.exit(exit_code(exc))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="devplug", message=f"devplug %(version)s (hook contract {HOOK_CONTRACT})")
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
@click.option(
    "--offline",
    is_flag=True,
    help="Off the node (a CI pipeline): check the keys and the values only, skipping every check that looks at "
    "the node (files the options name, its NICs, NODE_NAME).",
)
def check_config(config_path: Path, offline: bool) -> None:
    """Validate a config file (drivers and their options included) without starting anything.

    On the node (the default) the checks that look at it run too: what `devplug run` would refuse there."""
    import contextlib

    from devplug.config import load_config
    from devplug.options import without_node_checks

    try:
        with without_node_checks() if offline else contextlib.nullcontext():
            config = load_config(config_path)
    except DevplugError as exc:
        _fail(exc)
    click.echo(f"{config_path}: ok{' (offline: keys and values; nothing of the node checked)' if offline else ''}")
    for resource in config.resources:
        click.echo(f"  {_describe_resource(resource)}")
    if config.profiles.profiles:
        _check_profiles(config)


def _describe_resource(resource: ResourceConfig) -> str:
    shared = f", {resource.replicas} replicas per device" if resource.replicas > 1 else ""
    renamed = f" (configured as {resource.configured_name})" if resource.configured_name else ""
    api = ", through DRA" if resource.api == "dra" else ""
    return f"{resource.name}{renamed}: driver {resource.driver}{shared}{api}"


def _check_profiles(config: Config) -> None:
    """Every profile composed on its own over the base: what it changes, or its error; exit 2 if any fails."""
    from devplug.config.profiles import NAME_SEPARATOR, PROFILE_LABEL
    from devplug.profiles.compose import check_pairs, check_profiles

    checks = check_profiles(config)
    click.echo(
        f"profiles ({len(checks)}), each checked on its own over the base; a node chooses them with the label "
        f"{PROFILE_LABEL}=<name>[{NAME_SEPARATOR}<name>...] or by a profile's match_labels:"
    )
    base = {rc.name: rc for rc in config.resources}
    failed: list[DevplugError] = []
    for check in checks:
        profile = check.profile
        selector = ", ".join(f"{k}={v}" for k, v in profile.match_labels.items())
        about = "".join(
            f" ({part})" for part in (profile.description, f"match_labels {selector}" if selector else "") if part
        )
        if check.config is None or check.error is not None:
            click.echo(f"  {profile.name}{about}: INVALID")
            failed.append(check.error or DevplugError(f"profile {profile.name}: invalid"))
            continue
        click.echo(f"  {profile.name}{about}: ok")
        composed = {rc.name: rc for rc in check.config.resources}
        for name, rc in composed.items():
            if name not in base or base[name] != rc:
                click.echo(f"    {'added' if name not in base else 'changed'} {_describe_resource(rc)}")
        for name in base.keys() - composed.keys():
            click.echo(f"    removed {name}")
    conflicts = [
        (a.profile.name, b.profile.name, sorted(a.profile.touches() & b.profile.touches()))
        for i, a in enumerate(checks)
        for b in checks[i + 1 :]
        if a.profile.touches() & b.profile.touches()
    ]
    for first, second, shared in conflicts:
        changes = ", ".join(shared)
        click.echo(f"  note: {first} and {second} conflict (both change {changes}): a node choosing both is refused")
    valid = [check.profile for check in checks if check.config is not None]
    for first_p, second_p, error in check_pairs(config, valid):
        click.echo(f"  {first_p.name} with {second_p.name}: INVALID together")
        failed.append(error)
    for problem in failed:
        click.echo(f"devplug: error: {problem}", err=True)
    if failed:
        sys.exit(EXIT_CONFIG)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def drivers(as_json: bool) -> None:
    """List the installed drivers: distribution, version, hook contract, and the hooks each implements.

    A driver that declares no hook contract is listed as the contract it is called as (1.0), with the warning
    that says what line to add (in ``warnings`` with ``--json``).
    """
    from devplug.contract import declared_contract, undeclared_contract_warning
    from devplug.drivers.discovery import driver_hook_names, installed_drivers

    rows: list[dict[str, Any]] = []
    for name, info in installed_drivers().items():
        row: dict[str, Any] = {"name": name, "distribution": info.distribution, "version": info.version}
        try:
            cls = info.load(warn=False)  # its warning is part of the listing
            row["hook_contract"] = declared_contract(cls)  # checked by load()
            row["hooks"] = driver_hook_names(cls)
            warning = undeclared_contract_warning(cls, name, info.distribution, info.version)
            if warning is not None:
                row["warnings"] = [warning]
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
        contract = f" (hook contract {row['hook_contract']})" if "hook_contract" in row else ""
        click.echo(f"{row['name']:<10} {row['distribution']} {row['version']}{contract}\n           hooks: {hooks}")
        for warning in row.get("warnings", ()):
            click.echo(f"           warning: {warning}")


@main.command("new-driver")
@click.argument("name")
@click.option(
    "--into",
    "parent",
    type=click.Path(path_type=Path),
    default=Path("."),
    show_default=True,
    help="The folder to create devplug-NAME in.",
)
def new_driver(name: str, parent: Path) -> None:
    """Write a driver distribution's skeleton, devplug-NAME: entry point, Options, every hook, README, tests."""
    from devplug.sdk import new_driver as write_skeleton

    try:
        target = write_skeleton(name, parent)
    except DevplugError as exc:
        _fail(exc)
    click.echo(f"wrote {target}")
    for path in sorted(p for p in target.rglob("*") if p.is_file()):
        click.echo(f"  {path.relative_to(target)}")
    shown = target if target.is_absolute() else f"./{target}"  # pip reads a bare name as a package to download
    click.echo(f"next: pip install -e '{shown}[test]' && (cd {shown} && pytest)")


@main.command()
@click.option("--config", "config_path", type=click.Path(path_type=Path), help="Read the state dir from this config.")
@click.option("--state-dir", type=click.Path(path_type=Path), help="The daemon's state dir (default /var/lib/devplug).")
@click.option("--timeout", type=float, default=30.0, show_default=True, help="Seconds to wait for the daemon.")
def reload(config_path: Path | None, state_dir: Path | None, timeout: float) -> None:
    """Make the running daemon re-read its config file (SIGHUP) and report whether it applied it.

    Exits 2 when the daemon refused the new config (it keeps the old one), 3 when no daemon runs on the state dir
    or it did not answer in time.
    """
    from devplug.cli.reload import request_reload, state_dir_of

    try:
        if state_dir is None:
            state_dir = state_dir_of(config_path) if config_path is not None else Path("/var/lib/devplug")
        entry = request_reload(state_dir, timeout)
    except DevplugError as exc:
        _fail(exc)
    click.echo(f"reload applied: config generation {entry.get('generation')}")
    for what in ("added", "changed", "removed", "unchanged"):
        click.echo(f"  {what}: {', '.join(entry.get(what) or []) or '-'}")


@main.command()
@click.option("--config", "config_path", type=click.Path(path_type=Path), help="Read the state dir from this config.")
@click.option("--state-dir", type=click.Path(path_type=Path), help="The daemon's state dir (default /var/lib/devplug).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(config_path: Path | None, state_dir: Path | None, as_json: bool) -> None:
    """Show a running daemon's resources, devices and recent releases.

    Exits 0 when the daemon runs and its /readyz would answer 200; 6 when it runs with a problem /readyz reports
    too (a resource not registered or failed, a release failing, PodResources unreadable past the grace period,
    container liveness unknown while required), named under PROBLEM:; 7 when a resource can serve nothing (every
    device unhealthy); 3 when no daemon runs with that state dir.
    """
    from devplug.cli.statusview import format_status, status_exit_code
    from devplug.daemon.status import read_status

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
    code = status_exit_code(data)
    if code:
        sys.exit(code)


@main.group()
def quarantine() -> None:
    """Quarantined ledger records: their devices are withheld until released through the driver."""


def _quarantine_targets(config_path: Path, resource: str | None) -> tuple[Path, list[str]]:
    from devplug.config import load_config
    from devplug.errors import ConfigError

    config = load_config(config_path)
    names = [rc.name for rc in config.resources]
    if resource is not None:
        if resource not in names:
            raise ConfigError(f"{config_path}: no resource {resource!r} (configured: {', '.join(names)})")
        names = [resource]
    return config.state.dir, names


@quarantine.command("list")
@click.option("--config", "config_path", type=click.Path(path_type=Path), required=True, help="The TOML config.")
@click.option("--resource", help="Only this resource.")
def quarantine_list(config_path: Path, resource: str | None) -> None:
    """List the quarantined ledger records (key, devices, why), as the ledgers on disk hold them."""
    from devplug.engine import read_quarantined

    try:
        state_dir, names = _quarantine_targets(config_path, resource)
        found = [(name, bad) for name in names for bad in read_quarantined(state_dir, name)]
    except DevplugError as exc:
        _fail(exc)
    if not found:
        click.echo("no quarantined ledger records")
    for name, bad in found:
        click.echo(f"{name}  key {bad.key}  devices {', '.join(bad.devices()) or '-'}: {bad.reason}")


@quarantine.command("clear")
@click.option("--config", "config_path", type=click.Path(path_type=Path), required=True, help="The TOML config.")
@click.option("--resource", help="Only this resource.")
@click.option("--all", "clear_all", is_flag=True, help="Every quarantined record (of --resource, or of all).")
@click.option("--timeout", type=float, default=30.0, show_default=True, help="Seconds to wait for a running daemon.")
@click.argument("keys", nargs=-1)
def quarantine_clear(
    config_path: Path, resource: str | None, clear_all: bool, timeout: float, keys: tuple[str, ...]
) -> None:
    """Drop quarantined ledger records (by KEY, from `devplug quarantine list`) without calling the driver: their
    devices go back into service as they are. Only when you know they are clean.

    A running daemon takes the request at its next release pass; with none running, the ledger is changed here.
    A KEY no ledger holds is an error (exit 2) listing the keys there are, and nothing is cleared; --all with
    nothing quarantined says so and exits 0. Exits 3 when a running daemon did not take it within --timeout.
    """
    import time as clock

    from devplug.daemon.lock import StateLock
    from devplug.engine import Ledger, clear_offline, read_quarantined, write_clear_request
    from devplug.errors import AlreadyRunningError, ConfigError, StateError
    from devplug.kube.names import resource_state_dir
    from devplug.text.logsafe import shorten

    try:
        if not keys and not clear_all:
            raise ConfigError("name the records to clear (their keys, from `devplug quarantine list`), or --all")
        state_dir, names = _quarantine_targets(config_path, resource)
        held = {name: [bad.key for bad in read_quarantined(state_dir, name)] for name in names}
        if clear_all:
            names = [name for name in names if held[name]]
            if not names:
                click.echo("no quarantined ledger records: nothing to clear")
                return
        else:
            unknown = [key for key in dict.fromkeys(keys) if not any(key in found for found in held.values())]
            if unknown:
                there = "; ".join(f"{name}: {', '.join(found)}" for name, found in held.items() if found)
                raise ConfigError(
                    f"no quarantined ledger record with key {', '.join(shorten(k) for k in unknown)}"
                    + (f" in {resource}" if resource is not None else "")
                    + f" (quarantined: {there or 'none'}); nothing was cleared"
                )
            names = [name for name in names if any(key in held[name] for key in keys)]
        wanted = None if clear_all else list(keys)
        lock = StateLock(state_dir)
        try:
            lock.acquire()
        except AlreadyRunningError:
            requests = [write_clear_request(state_dir, name, wanted) for name in names]
            deadline = clock.monotonic() + timeout
            while any(r.exists() for r in requests):
                if clock.monotonic() > deadline:
                    raise StateError(
                        f"the running daemon did not take the request within {timeout:g} s (it does at its next "
                        "release pass, while PodResources answers); the request stays: "
                        + ", ".join(str(r) for r in requests if r.exists())
                    ) from None
                clock.sleep(0.05)
            click.echo("the running daemon took the request; `devplug status` shows what is left")
            return
        try:
            for name in names:
                ledger = Ledger(name, resource_state_dir(state_dir, name) / "ledger.json")
                for bad in asyncio.run(clear_offline(ledger, wanted)):
                    click.echo(f"{name}: cleared key {bad.key} ({', '.join(bad.devices()) or 'no devices'})")
        finally:
            lock.release()
    except DevplugError as exc:
        _fail(exc)


def _missing_test_kit(name: str, summary: str, reason: str) -> click.Command:
    """A stand-in for the test kit's command ``name``: says why it cannot run and how to get it, exits 2."""

    @click.command(
        name,
        help=summary,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
        add_help_option=False,
    )
    def missing() -> None:
        click.echo(
            f"devplug {name}: {reason}: it comes with the test kit, a distribution of its own "
            f"(pip install {TEST_KIT_DISTRIBUTION}); the runtime and the image do not carry it",
            err=True,
        )
        sys.exit(EXIT_CONFIG)

    return missing


def _add_commands(group: click.Group) -> None:
    """Add the commands of the entry-point group ``devplug.cli`` (the test kit's ``demo`` and ``kubelet`` when
    ``devplug-testing`` is installed); a test-kit command missing or failing to load is a stand-in that says so when
    run. A command never replaces one of the core's."""
    from devplug.drivers.discovery import cli_extensions

    for entry_point, distribution, _ in cli_extensions():
        if entry_point.name in group.commands:
            continue
        try:
            command = entry_point.load()
        except Exception as exc:  # a broken distribution must not take the core's commands down with it
            summary = f"(failed to load from {distribution})"
            command = _missing_test_kit(entry_point.name, summary, f"{distribution}: {exc!r}")
        if isinstance(command, click.Command):
            group.add_command(command, entry_point.name)
    for name, summary in TEST_KIT_COMMANDS.items():
        if name not in group.commands:
            group.add_command(_missing_test_kit(name, summary, f"{TEST_KIT_DISTRIBUTION} is not installed"))


_add_commands(main)
