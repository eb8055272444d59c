"""Hardening, the quarantine commands (issue 36, items 6 and 12): `devplug quarantine list|clear` read the state
files as the daemon does, and say what they did.

Before: with ``ledger.json`` (or a journal segment) a FIFO, ``list`` and ``clear --all`` hung for ever (the daemon
itself refuses it); ``clear KEY`` with a key no ledger holds exited 0 saying nothing; ``clear --all`` with nothing
quarantined and a daemon running waited its 30 s timeout and exited 3. Each command here runs as an operator runs
it, bounded: a command that does not answer within its bound is a failure, not a hang.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.hardening.conftest import Bench

RESOURCE = "example.com/mock"
EXIT_CONFIG, EXIT_STATE = 2, 3
BOUND_S = 15.0


def _cli(bench: Bench, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return bench.cli(*args, timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`devplug {' '.join(args)}` did not answer within {BOUND_S:g} s (killed)")


def _resource_dir(bench: Bench) -> Path:
    folder = bench.resource_dir()
    for part in reversed([folder, *folder.parents]):
        if part.is_relative_to(bench.root) and not part.exists():
            part.mkdir(mode=0o700)
    return folder


def _quarantined_ledger(bench: Bench) -> None:
    """A ledger whose one record is malformed (quarantined at every load), written while no daemon runs."""
    bad = {"id": "x", "devices": ["mock0"], "created": "yesterday"}
    data = {"format": 1, "resource": RESOURCE, "allocations": [bad]}
    (_resource_dir(bench) / "ledger.json").write_text(json.dumps(data))


@pytest.mark.parametrize("planted", ["ledger.json", "ledger.journal.1"])
@pytest.mark.parametrize("command", [("list",), ("clear", "--all"), ("clear", "0123456789abcdef")])
def test_a_fifo_in_the_ledgers_place_is_refused_not_waited_on(
    bench: Bench, planted: str, command: tuple[str, ...]
) -> None:
    config = str(bench.write_config())
    fifo = _resource_dir(bench) / planted
    os.mkfifo(fifo, 0o600)
    result = _cli(bench, "quarantine", *command, "--config", config)
    assert result.returncode == EXIT_STATE, (result.returncode, result.stdout, result.stderr)
    assert str(fifo) in result.stderr and "not a regular file" in result.stderr, result.stderr
    assert fifo.exists(), "the command moved the FIFO away"


def test_a_link_in_the_ledgers_place_is_refused(bench: Bench, tmp_path: Path) -> None:
    config = str(bench.write_config())
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("{}")
    (_resource_dir(bench) / "ledger.json").symlink_to(elsewhere)
    result = _cli(bench, "quarantine", "list", "--config", config)
    assert result.returncode == EXIT_STATE and "symbolic link" in result.stderr, result.stderr


def test_with_no_daemon_an_unknown_key_is_an_error_listing_the_known_ones(bench: Bench) -> None:
    config = str(bench.write_config())
    _quarantined_ledger(bench)
    listed = _cli(bench, "quarantine", "list", "--config", config)
    key = re.search(r"key (\w+)", listed.stdout)
    assert listed.returncode == 0 and key is not None, listed
    refused = _cli(bench, "quarantine", "clear", "--config", config, "nosuchkey")
    assert refused.returncode == EXIT_CONFIG, (refused.returncode, refused.stdout, refused.stderr)
    assert "nosuchkey" in refused.stderr and key.group(1) in refused.stderr and RESOURCE in refused.stderr
    assert "nothing was cleared" in refused.stderr
    # Nothing was cleared: a known key next to the unknown one is refused too.
    refused = _cli(bench, "quarantine", "clear", "--config", config, key.group(1), "nosuchkey")
    assert refused.returncode == EXIT_CONFIG, refused.stderr
    assert key.group(1) in _cli(bench, "quarantine", "list", "--config", config).stdout
    # A good key still clears.
    cleared = _cli(bench, "quarantine", "clear", "--config", config, key.group(1))
    assert cleared.returncode == 0 and f"cleared key {key.group(1)} (mock0)" in cleared.stdout, cleared
    assert "no quarantined ledger records" in _cli(bench, "quarantine", "list", "--config", config).stdout


def test_with_no_daemon_clear_all_with_nothing_quarantined_says_so(bench: Bench) -> None:
    config = str(bench.write_config())
    cleared = _cli(bench, "quarantine", "clear", "--all", "--config", config)
    assert cleared.returncode == 0 and "no quarantined ledger records" in cleared.stdout, cleared


def test_with_a_daemon_running_nothing_quarantined_is_said_at_once(bench: Bench) -> None:
    daemon = bench.start()
    config = str(daemon.config_path)
    cleared = _cli(bench, "quarantine", "clear", "--all", "--config", config)
    assert cleared.returncode == 0 and "no quarantined ledger records" in cleared.stdout, cleared
    refused = _cli(bench, "quarantine", "clear", "--config", config, "0123456789abcdef")
    assert refused.returncode == EXIT_CONFIG, (refused.returncode, refused.stdout, refused.stderr)
    assert "0123456789abcdef" in refused.stderr and "quarantined: none" in refused.stderr, refused.stderr
    assert not (bench.resource_dir() / "clear-quarantine.json").exists(), "a request was left for the daemon"
