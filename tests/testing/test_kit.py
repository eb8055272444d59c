"""The test kit for driver authors: the plugin's cost and errors, the hook-call recorder, the recording sink."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from devplug import Device, DriverContext, Health
from devplug.testing.plugin import RunningDaemon
from devplug.testing.recorder import CALLS_FILE, HookCall, HookRecorder, read_call_log, read_hook_calls
from devplug.testing.sink import Push, RecordingSink
from devplug_mock import read_calls

# --- the pytest plugin ----------------------------------------------------------------------


def test_importing_the_plugin_imports_neither_grpc_nor_the_dev_kubelet() -> None:
    # pytest imports the plugin in every project where devplug is installed: it must stay cheap.
    code = (
        "import sys, devplug.testing.plugin\n"
        "print([m for m in ('grpc', 'devplug.devkubelet', 'devplug.engine') if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_driver_that_is_not_installed_fails_at_once_naming_the_installed_ones(
    devplug_daemon: Callable[..., RunningDaemon], devplug_root: Path
) -> None:
    with pytest.raises(pytest.fail.Exception) as failed:
        devplug_daemon({"example.com/nosuch": {"driver": "nosuch", "options": {}}})
    message = str(failed.value)
    assert "'nosuch'" in message
    listed = re.search(r"installed: ([^)]*)\)", message)
    assert listed is not None, message
    assert {"mock", "vfio"} <= set(listed.group(1).split(", ")), message  # every driver of this checkout
    assert "pip install -e ." in message
    assert not list(devplug_root.glob("daemon-*.log")), "no daemon may be started"


def test_the_timing_knobs_reach_the_config(devplug_daemon: Callable[..., RunningDaemon], devplug_root: Path) -> None:
    table = {"driver": "mock", "options": {"directory": str(devplug_root / "mock"), "count": 1}}
    daemon = devplug_daemon(
        {"example.com/mock": table},
        release_interval=0.5,
        grace_period=3.0,
        shutdown_timeout=7.0,
        health_interval=0.25,
        hook_timeout=4.0,
    )
    assert daemon.config["release"] == {"interval": 0.5, "grace_period": 3.0, "max_retry_interval": 2.0}
    assert daemon.config["shutdown"] == {"timeout": 7.0}
    resource = daemon.config["resources"]["example.com/mock"]
    assert (resource["health_interval"], resource["hook_timeout"]) == (0.25, 4.0)
    assert daemon.state_dir == devplug_root / "state"
    daemon.kill()
    daemon.restart()  # starts a killed daemon again, and waits until it serves
    assert daemon.process.running()


_FAILING_WITH_A_DAEMON = """
def test_it(devplug_daemon, devplug_root):
    table = {"driver": "mock", "options": {"directory": str(devplug_root / "mock"), "count": 1}}
    devplug_daemon({"example.com/mock": table})
    assert False, "the test's own failure"
"""


def test_a_failing_test_shows_its_daemons_log_and_keeps_the_whole_log_where_asked(tmp_path: Path) -> None:
    # A test run in the VM leaves nothing behind but its JUnit report and the results share: the failure's text
    # must say what the daemon did, and DEVPLUG_DAEMON_LOGS must keep the whole log.
    (tmp_path / "test_inner.py").write_text(_FAILING_WITH_A_DAEMON)
    logs = tmp_path / "daemon-logs"
    junit = tmp_path / "junit.xml"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", "/dev/null", "--rootdir", str(tmp_path), "-p", "no:cacheprovider",
         f"--junitxml={junit}", str(tmp_path / "test_inner.py")],
        capture_output=True, text=True, timeout=120, check=False, env={**os.environ, "DEVPLUG_DAEMON_LOGS": str(logs)},
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    (kept,) = logs.glob("*-daemon-0.log")
    whole = kept.read_text()
    assert "[example.com/mock] registered with the kubelet" in whole, whole
    failure = next(ET.parse(junit).getroot().iter("failure")).text or ""
    assert "the test's own failure" in failure
    assert f"daemon 0's log (all {len(whole.splitlines())} lines; the whole log: {kept})" in failure, failure
    assert whole.splitlines()[-1] in failure
    assert "daemon 0's log" in done.stdout  # the terminal shows it too


# --- the hook-call recorder -------------------------------------------------------------------


def test_the_recorder_writes_typed_calls_compatible_with_the_mock_call_log(tmp_path: Path) -> None:
    recorder = HookRecorder(tmp_path)
    recorder.record("allocate", ["d0", "d1"])
    recorder.record("post_stop", ["d0"], retry=True, error="boom", extra={"note": 1})
    lines = [json.loads(line) for line in (tmp_path / CALLS_FILE).read_text().splitlines()]
    assert [sorted(line) for line in lines] == [
        ["device_ids", "hook", "time"],
        ["device_ids", "error", "hook", "note", "retry", "time"],
    ]
    assert read_calls(tmp_path) == read_call_log(tmp_path) == lines
    first, second = read_hook_calls(tmp_path)
    assert first == HookCall("allocate", ("d0", "d1"), lines[0]["time"])
    assert first.ok
    assert (second.retry, second.error, dict(second.extra), second.ok) == (True, "boom", {"note": 1}, False)
    assert read_hook_calls(tmp_path, hook="post_stop", device="d0", ok=False) == [second]
    assert recorder.calls() == [first, second]


def test_call_notes_the_start_and_records_the_outcome(tmp_path: Path) -> None:
    recorder = HookRecorder(tmp_path)
    with recorder.call("deallocate", ["d0"], retry=True):
        assert [c.hook for c in read_hook_calls(tmp_path, started=True)] == ["deallocate"]
        assert read_hook_calls(tmp_path) == []  # still running
    with pytest.raises(ValueError, match="bad"), recorder.call("allocate", ["d1"]):
        raise ValueError("bad")
    done = read_hook_calls(tmp_path)
    assert [(c.hook, c.retry, c.error) for c in done] == [("deallocate", True, None), ("allocate", False, "bad")]


def test_the_recorder_is_whole_lines_under_concurrency(tmp_path: Path) -> None:
    recorder = HookRecorder(tmp_path)
    threads = [
        threading.Thread(target=lambda: [recorder.record("pre_start", [f"d{i}"]) for i in range(50)]) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(read_hook_calls(tmp_path, hook="pre_start")) == 400


def test_a_call_that_cannot_be_recorded_does_not_fail(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    HookRecorder(tmp_path / "gone").record("allocate", ["d0"])
    assert "cannot record the allocate call" in caplog.text


# --- the recording sink -----------------------------------------------------------------------


def test_the_sink_keeps_pushes_and_the_table(tmp_path: Path) -> None:
    sink = RecordingSink()
    ctx = DriverContext("example.com/x", tmp_path, sink)
    ctx.set_devices([Device("a"), Device("b")])
    ctx.update_devices([Device("c", Health.UNHEALTHY)], ["a"])
    ctx.request_relist()
    assert [p.kind for p in sink.pushes] == ["replace", "update", "relist"]
    assert [d.id for d in sink.pushes[0]] == ["a", "b"]  # a push is the devices it sent
    assert sink.pushes[1] == Push("update", (Device("c", Health.UNHEALTHY),), ("a",))
    assert sink.wait_for(lambda table: set(table) == {"b", "c"})


def test_the_sink_refuses_pushes_a_test_does_not_expect() -> None:
    sink = RecordingSink(kinds=("replace",))
    with pytest.raises(AssertionError, match="'update' push"):
        sink.update_devices([], ["a"])


def test_hook_recorder_starts_a_new_file_when_its_file_was_removed(tmp_path: Path) -> None:
    recorder = HookRecorder(tmp_path)
    recorder.record("allocate", ["dev0"])
    (tmp_path / CALLS_FILE).unlink()  # a test resetting the record: the kept descriptor must not write into the void
    recorder.record("deallocate", ["dev0"], retry=True)
    assert [(c.hook, c.retry) for c in read_hook_calls(tmp_path)] == [("deallocate", True)]
    recorder.close()
    recorder.record("pre_start", ["dev1"])
    assert [c.hook for c in read_hook_calls(tmp_path)] == ["deallocate", "pre_start"]
