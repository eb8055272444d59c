"""``devplug demo`` and ``devplug kubelet`` come with the test kit (devplug-testing, entry-point group
``devplug.cli``); without it, each says what it needs and exits 2 (issue 39)."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from devplug.cli import commands
from devplug.drivers import discovery
from devplug.drivers.discovery import EntryPoint


def _group() -> click.Group:
    @click.group()
    def main() -> None:
        """A stand-in for devplug's group."""

    @main.command()
    def run() -> None:
        """The core's own."""

    return main


def test_the_installed_kit_brings_its_commands() -> None:
    assert "devplug-testing" in {dist for _, dist, _ in discovery.cli_extensions()}
    demo, kubelet = commands.main.commands["demo"], commands.main.commands["kubelet"]
    assert demo.callback is not None and demo.callback.__module__ == "devplug.testing.cli"
    assert isinstance(kubelet, click.Group) and {"admit", "remove", "restart", "show"} <= set(kubelet.commands)


@pytest.mark.parametrize("name", ["demo", "kubelet"])
def test_without_the_kit_its_commands_say_they_need_it(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setattr(discovery, "cli_extensions", list)
    group = _group()
    commands._add_commands(group)
    assert {"demo", "kubelet", "run"} == set(group.commands)
    result = CliRunner().invoke(group, [name, "--dir", "/tmp/x", "admit", "p"])
    assert result.exit_code == 2, result.output
    assert f"devplug {name}: devplug-testing is not installed" in result.output
    assert "pip install devplug-testing" in result.output


def test_a_broken_command_entry_point_names_its_distribution_and_never_replaces_a_core_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    points = [
        (EntryPoint("demo", "devplug_no_such_module:demo"), "devplug-testing", "0.1.0"),
        (EntryPoint("run", "devplug.testing.cli:demo"), "devplug-evil", "1.0"),
    ]
    monkeypatch.setattr(discovery, "cli_extensions", lambda: points)
    group = _group()
    run = group.commands["run"]
    commands._add_commands(group)
    assert group.commands["run"] is run
    result = CliRunner().invoke(group, ["demo"])
    assert result.exit_code == 2, result.output
    assert "devplug-testing: ModuleNotFoundError" in result.output, result.output
