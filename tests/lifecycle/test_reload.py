"""Live reload (issue 15): SIGHUP and ``devplug reload`` re-read the config of a running ``devplug run``.

Added resources start, removed ones advertise nothing and are torn down once
their allocations are released, changed ones restart keeping their ledger,
unchanged ones do not re-register, and an invalid config is refused while the
old one keeps serving. Everything is observed from outside: the dev kubelet's
registrations and device lists, the mock's ``.calls.jsonl``, the status file,
the plugin sockets, and the ``devplug reload`` command's exit code.
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.testing.configs import write_toml

if TYPE_CHECKING:
    from tests.lifecycle.conftest import Lab

RESOURCE = "example.com/mock"
RESOURCE_B = "example.com/other"
RESOURCE_C = "example.com/third"


def _rewrite(lab: Lab, change: Any) -> dict[str, Any]:
    """Rewrite the running daemon's config file with ``change(config)`` applied to a copy; return the copy."""
    assert lab.daemon is not None
    config = copy.deepcopy(lab.daemon.config)
    change(config)
    write_toml(lab.daemon.config_path, config)
    return config


def _reload_cli(lab: Lab, *where: str) -> subprocess.CompletedProcess[str]:
    """``devplug reload`` (``where``: how it finds the daemon, by default ``--config <the config file>``)."""
    assert lab.daemon is not None
    where = where or ("--config", str(lab.daemon.config_path))
    return subprocess.run(
        [sys.executable, "-m", "devplug", "reload", *where, "--timeout", "30"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _reload_status(lab: Lab, attempts: int) -> dict[str, Any]:
    """The status file's ``reload`` entry once the daemon handled ``attempts`` reloads."""

    def handled() -> dict[str, Any] | None:
        entry: dict[str, Any] = lab.status().get("reload") or {}
        return entry if entry.get("attempts", 0) >= attempts else None

    found: dict[str, Any] = lab.wait(handled, what=f"the daemon to report reload number {attempts}")
    return found


def _socket(lab: Lab, resource: str) -> Path:
    return lab.plugin_socket(resource)


def _status_names(lab: Lab) -> dict[str, str]:
    return {r["name"]: r["state"] for r in lab.status()["resources"]}


def test_sighup_adds_removes_after_release_and_leaves_unchanged_alone(lab: Lab) -> None:
    lab.dirs[RESOURCE_C] = lab.root / "mock-c"
    lab.start({RESOURCE: lab.resource_table(), RESOURCE_B: lab.resource_table(RESOURCE_B, count=2)})
    (held,) = lab.admit("holder", 1, RESOURCE_B)
    lab.wait_seen(held, "holder", RESOURCE_B)
    assert lab.kubelet.registrations(RESOURCE) == 1

    def change(config: dict[str, Any]) -> None:
        del config["resources"][RESOURCE_B]
        config["resources"][RESOURCE_C] = lab.resource_table(RESOURCE_C, count=3)

    _rewrite(lab, change)
    assert lab.daemon is not None
    os.kill(lab.daemon.process.pid, signal.SIGHUP)
    entry = _reload_status(lab, 1)
    assert entry["last_result"] == "ok", entry
    assert entry["generation"] == 2
    assert (entry["added"], entry["removed"], entry["changed"], entry["unchanged"]) == (
        [RESOURCE_C],
        [RESOURCE_B],
        [],
        [RESOURCE],
    )

    # added: registered and advertising its devices
    lab.kubelet.wait_registered(RESOURCE_C, timeout=15.0)
    lab.wait(lambda: lab.view(RESOURCE_C).capacity == 3, what=f"{RESOURCE_C} advertising 3 devices")
    # removed: still registered, but advertising nothing (capacity 0), so no new pod gets its devices
    lab.wait(lambda: lab.view(RESOURCE_B).capacity == 0, what=f"{RESOURCE_B} advertising an empty list")
    assert lab.view(RESOURCE_B).stream_open
    # the pod holding a device of the removed resource keeps it: no release, the socket stays, state draining
    lab.admit("canary", 1, RESOURCE)  # the reconciler is busy (it polls while anything is allocated)...
    lab.wait_seen(lab.ledger(RESOURCE)[0]["devices"][0], "canary", RESOURCE)  # ...and made passes since
    assert lab.count("deallocate", held, RESOURCE_B) == 0
    assert _socket(lab, RESOURCE_B).exists()
    lab.wait(lambda: _status_names(lab).get(RESOURCE_B) == "draining", what=f"{RESOURCE_B} shown as draining")
    # ...its pod's container can still start (PreStartContainer), but nothing new is allocated from it
    pre_start = dp.PreStartContainerRequest(devices_ids=[held])
    lab.grpc_call("PreStartContainer", pre_start, dp.PreStartContainerResponse, RESOURCE_B)
    assert lab.count("pre_start", held, RESOURCE_B) == 2  # at admission, and now
    (free,) = {"mock0", "mock1"} - {held}
    with pytest.raises(grpc.RpcError) as refused:
        lab.allocate(free, resource=RESOURCE_B)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "removed from the config by a reload" in str(refused.value.details())
    # unchanged: never registered again
    assert lab.kubelet.registrations(RESOURCE) == 1
    assert lab.view(RESOURCE).capacity == 4

    # the pod ends: its device is released through the removed resource's driver, then the resource is torn down
    lab.kubelet.remove_pod("holder")
    lab.wait_released(held, resource=RESOURCE_B)
    hooks = [c["hook"] for c in lab.calls(device=held, resource=RESOURCE_B)]
    assert [h for h in hooks if h in ("allocate", "post_stop", "deallocate")] == ["allocate", "post_stop", "deallocate"]
    lab.wait(lambda: not _socket(lab, RESOURCE_B).exists(), what=f"{RESOURCE_B}'s socket removed")
    lab.wait(lambda: RESOURCE_B not in _status_names(lab), what=f"{RESOURCE_B} gone from the status")
    lab.wait(lambda: not lab.view(RESOURCE_B).stream_open, what=f"{RESOURCE_B}'s stream ended")
    log = lab.log()
    assert log.index(f"[{RESOURCE_B}] drained") < log.index(f"[{RESOURCE_B}] torn down")
    assert lab.kubelet.registrations(RESOURCE) == 1
    assert lab.kubelet.registrations(RESOURCE_C) == 1


def test_reload_command_restarts_a_changed_resource_and_its_held_allocation_is_released_later(lab: Lab) -> None:
    lab.start({RESOURCE: lab.resource_table(), RESOURCE_B: lab.resource_table(RESOURCE_B, count=2)})
    (held,) = lab.admit("holder", 1)
    lab.wait_seen(held, "holder")

    def change(config: dict[str, Any]) -> None:
        config["resources"][RESOURCE]["options"]["count"] = 6
        config["release"]["grace_period"] = 1.5  # [release] applies live

    _rewrite(lab, change)
    result = _reload_cli(lab)
    assert result.returncode == 0, result.stderr
    assert "reload applied: config generation 2" in result.stdout
    assert f"changed: {RESOURCE}" in result.stdout
    assert f"unchanged: {RESOURCE_B}" in result.stdout

    # the changed resource registered again and advertises its new devices; the unchanged one did not
    lab.kubelet.wait_registered(RESOURCE, timeout=15.0, after=1)
    lab.wait(lambda: lab.view(RESOURCE).capacity == 6, what=f"{RESOURCE} advertising 6 devices")
    assert lab.kubelet.registrations(RESOURCE_B) == 1
    # the allocation survived the restart...
    assert lab.ledger_record(held) is not None
    assert lab.count("deallocate", held) == 0
    # ...and the new instance releases it when the pod ends, once
    lab.kubelet.remove_pod("holder")
    lab.wait_released(held)
    hooks = [c["hook"] for c in lab.calls(device=held) if c["hook"] in ("allocate", "post_stop", "deallocate")]
    assert hooks == ["allocate", "post_stop", "deallocate"]
    lab.wait(lambda: lab.ledger() == [], what="the ledger empty")
    assert lab.status()["reload"]["generation"] == 2
    assert lab.status()["release"]["grace_period"] == 1.5
    lab.wait(lambda: _status_names(lab)[RESOURCE] == "registered", what=f"the status to show {RESOURCE} registered")


def test_invalid_config_is_refused_and_the_old_one_keeps_serving(lab: Lab) -> None:
    lab.start()
    assert lab.daemon is not None
    good = lab.daemon.config_path.read_text()

    def bad_option(config: dict[str, Any]) -> None:
        config["resources"][RESOURCE]["options"]["colour"] = "blue"
        config["resources"][RESOURCE_B] = lab.resource_table(RESOURCE_B)

    _rewrite(lab, bad_option)
    result = _reload_cli(lab)
    assert result.returncode == 2, result
    assert f'"{RESOURCE}".options.colour: unknown key' in result.stderr
    assert "reload refused" in result.stderr
    entry = lab.status()["reload"]
    assert entry["last_result"] == "refused"
    assert entry["generation"] == 1
    assert "options.colour" in entry["last_error"]

    def moved_state_dir(config: dict[str, Any]) -> None:
        config["state"]["dir"] = str(lab.root / "elsewhere")

    _rewrite(lab, moved_state_dir)
    result = _reload_cli(lab)  # the new config names a state dir where no daemon runs
    assert result.returncode == 3, result
    assert "pass the running daemon's with --state-dir" in result.stderr
    result = _reload_cli(lab, "--state-dir", str(lab.state_dir()))
    assert result.returncode == 2, result
    assert "state.dir: changed from" in result.stderr
    assert "restart the daemon" in result.stderr

    # the old config keeps serving: nothing re-registered, nothing added, pods still get devices
    assert lab.kubelet.registrations(RESOURCE) == 1
    assert lab.kubelet.resource(RESOURCE_B) is None
    assert len(lab.admit("after", 2)) == 2
    assert lab.status()["reload"]["attempts"] == 2
    assert "reload refused, the running config (generation 1) stays" in lab.log()
    shown = subprocess.run(
        [sys.executable, "-m", "devplug", "status", "--state-dir", str(lab.state_dir())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert "config generation 1" in shown.stdout
    assert "REFUSED: " in shown.stdout and "state.dir: changed from" in shown.stdout

    # and a good config is applied again afterwards
    lab.daemon.config_path.write_text(good)
    result = _reload_cli(lab)
    assert result.returncode == 0, result.stderr
    assert f"unchanged: {RESOURCE}" in result.stdout
    assert lab.kubelet.registrations(RESOURCE) == 1


def test_reload_without_a_daemon_says_so(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "devplug", "reload", "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 3
    assert f"no devplug daemon runs with the state dir {tmp_path}" in result.stderr


def test_a_daemon_stopped_while_a_removed_resource_drains_exits_cleanly(lab: Lab) -> None:
    lab.start({RESOURCE: lab.resource_table(), RESOURCE_B: lab.resource_table(RESOURCE_B, count=2)})
    (held,) = lab.admit("holder", 1, RESOURCE_B)
    lab.wait_seen(held, "holder", RESOURCE_B)
    _rewrite(lab, lambda config: config["resources"].pop(RESOURCE_B))
    result = _reload_cli(lab)
    assert result.returncode == 0, result.stderr
    assert f"removed: {RESOURCE_B}" in result.stdout
    lab.wait(lambda: lab.view(RESOURCE_B).capacity == 0, what=f"{RESOURCE_B} advertising an empty list")
    assert lab.daemon is not None
    assert lab.daemon.stop() == 0
    assert not _socket(lab, RESOURCE_B).exists()
    assert not _socket(lab, RESOURCE).exists()
    assert lab.count("deallocate", held, RESOURCE_B) == 0  # its pod still runs: nothing was released
    assert lab.ledger_record(held, RESOURCE_B) is not None  # and its ledger keeps the allocation


def test_a_resource_added_back_while_it_drains_restarts_and_releases_what_it_held(lab: Lab) -> None:
    lab.start({RESOURCE: lab.resource_table(), RESOURCE_B: lab.resource_table(RESOURCE_B, count=2)})
    (held,) = lab.admit("holder", 1, RESOURCE_B)
    lab.wait_seen(held, "holder", RESOURCE_B)
    _rewrite(lab, lambda config: config["resources"].pop(RESOURCE_B))
    assert _reload_cli(lab).returncode == 0
    lab.wait(lambda: lab.view(RESOURCE_B).capacity == 0, what=f"{RESOURCE_B} advertising an empty list")

    assert lab.daemon is not None
    write_toml(lab.daemon.config_path, lab.daemon.config)  # the original config: both resources
    result = _reload_cli(lab)
    assert result.returncode == 0, result.stderr
    assert f"added: {RESOURCE_B}" in result.stdout
    lab.kubelet.wait_registered(RESOURCE_B, timeout=15.0, after=1)
    lab.wait(lambda: lab.view(RESOURCE_B).capacity == 2, what=f"{RESOURCE_B} advertising its devices again")
    lab.wait(lambda: _status_names(lab).get(RESOURCE_B) == "registered", what=f"{RESOURCE_B} registered again")
    assert lab.count("deallocate", held, RESOURCE_B) == 0
    lab.kubelet.remove_pod("holder")
    lab.wait_released(held, resource=RESOURCE_B)
    assert lab.count("deallocate", held, RESOURCE_B) == 1
    assert lab.kubelet.registrations(RESOURCE) == 1
