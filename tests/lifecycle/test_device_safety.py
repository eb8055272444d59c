"""Device safety (issue 23), the parts a dev kubelet without container processes can show: one destructive call
per device at a time, a slow device never taking out the resource, quarantined records' devices withheld until
released through the driver (or cleared by the operator), and failing releases that back off and log a bounded
number of lines. (The container-liveness cases are in test_container_exit.py.)"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from devplug_mock import read_calls

if TYPE_CHECKING:
    from tests.lifecycle.conftest import Lab

RESOURCE = "example.com/mock"
HOOK_TIMEOUT = 0.5
SLOW = 3.0  # a secure erase: far longer than hook_timeout


def _started(lab: Lab, hook: str, device: str) -> list[dict[str, Any]]:
    """The calls of ``hook`` on ``device`` that started (finished or not)."""
    return [c for c in read_calls(lab.mock_dir(), started=True) if c["hook"] == hook and device in c["device_ids"]]


def _overlaps(lab: Lab, hooks: tuple[str, ...] = ("post_stop", "deallocate", "allocate")) -> list[str]:
    """Devices on which two of ``hooks`` ran at once: at no moment may more of them have started than finished."""
    events: list[tuple[float, int, str]] = []
    for call in read_calls(lab.mock_dir(), started=True):
        if call["hook"] in hooks:
            events.extend((call["time"], +1, d) for d in call["device_ids"])
    for call in read_calls(lab.mock_dir()):
        if call["hook"] in hooks:
            events.extend((call["time"], -1, d) for d in call["device_ids"])
    running: dict[str, int] = {}
    overlapping = set()
    for _, step, device in sorted(events, key=lambda e: (e[0], e[1])):  # an end before a start at the same time
        running[device] = running.get(device, 0) + step
        if running[device] > 1:
            overlapping.add(device)
    return sorted(overlapping)


def _retry_delays(log: str) -> dict[tuple[str, int], float]:
    """The release queue's decided delay after each failed attempt, by (device, attempt), from its debug lines."""
    found = re.finditer(r"release of (\S+): attempt (\d+) failed; next attempt in ([\d.]+) s", log)
    return {(m[1], int(m[2])): float(m[3]) for m in found}


def test_a_release_hook_outliving_hook_timeout_is_waited_for_never_doubled_and_stays_on_its_device(lab: Lab) -> None:
    lab.start({RESOURCE: lab.resource_table(hook_timeout=HOOK_TIMEOUT)})
    (slow,) = lab.admit("eraser", 1)
    lab.wait_seen(slow, "eraser")
    lab.write_device(slow, f"delay=deallocate:{SLOW}")
    since = time.time()
    lab.kubelet.remove_pod("eraser")
    lab.wait(lambda: _started(lab, "deallocate", slow), what=f"the slow deallocate of {slow} to start")
    lab.wait(lambda: lab.health(slow) == "Unhealthy", what=f"{slow} advertised unhealthy while it is erased")
    lab.quiet(HOOK_TIMEOUT * 3)  # well past hook_timeout: the call still runs
    assert len(_started(lab, "deallocate", slow)) == 1, "a second deallocate started while the first still ran"
    assert lab.count("deallocate", slow) == 0, "the slow deallocate cannot have finished yet"

    # A kubelet offering it anyway is refused, naming it and what runs on it; nothing is called.
    with pytest.raises(grpc.RpcError) as refused:
        lab.allocate(slow)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert slow in str(refused.value.details()) and "past hook_timeout" in str(refused.value.details())
    assert len(_started(lab, "allocate", slow)) == 1  # the first pod's only

    # The other devices keep serving meanwhile: the resource is not degraded.
    (other,) = lab.admit("neighbour", 1)
    assert other != slow
    assert lab.resource_status()["degraded"] is None
    assert lab.view().allocatable == 3  # only the device being erased is out

    lab.wait_released(slow, timeout=SLOW + 10)
    lab.wait(lambda: lab.health(slow) == "Healthy", what=f"{slow} back after its deallocate returned")
    assert len(_started(lab, "deallocate", slow)) == 1 and lab.count("deallocate", slow) == 1
    assert [c["retry"] for c in lab.calls("deallocate", slow) if "retry" in c] == []  # its one call: retry=False
    assert _overlaps(lab) == []
    for event in lab.events("list-and-watch", since=since):
        assert set(event.device_ids) <= {slow}, f"another device reported unhealthy: {event}"
    log = lab.log()
    assert "driver failing" not in log
    assert re.search(rf"deallocate of {slow} did not return within hook_timeout", log)
    assert re.search(rf"deallocate of {slow} returned after", log)


def test_fifty_failing_releases_back_off_and_log_a_bounded_number_of_lines(lab: Lab) -> None:
    count = 50
    lab.start({RESOURCE: lab.resource_table(count=count)}, max_retry_interval=1.0)
    devices = [lab.admit(f"p{i}", 1)[0] for i in range(count)]
    for i, dev in enumerate(devices):
        lab.wait_seen(dev, f"p{i}")
        lab.write_device(dev, "fail=deallocate")
    began = time.time()
    for i in range(count):
        lab.kubelet.remove_pod(f"p{i}")
    lab.wait(
        lambda: all(len(lab.calls("deallocate", d, ok=False)) >= 4 for d in devices),
        timeout=30,
        what="every release to fail a few times",
    )
    window = time.time() - began
    lab.quiet(1.0)
    attempts = {d: [c["time"] for c in lab.calls("deallocate", d, ok=False)] for d in devices}
    decided = _retry_delays(lab.log())
    # Without backoff, the release interval (0.1 s) would have made about window / 0.1 attempts each.
    for dev, times in attempts.items():
        assert len(times) <= (window + 1.0) / 0.1 / 2, f"{dev}: {len(times)} attempts in {window + 1:.1f} s"
        gaps = [b - a for a, b in itertools.pairwise(times)]
        # The gap after attempt n is the backoff's delay after it plus the wait for the next reconciliation pass,
        # the ledger's writes and the hook thread shared by 50 releases, which CPU load stretches to most of a
        # second: so the backoff is judged by the delays it decided, and each gap must hold its delay.
        delays = [decided[dev, n] for n in range(1, len(times)) if (dev, n) in decided]
        assert len(delays) == len(gaps), f"{dev}: a retry after {len(gaps)} failed attempts, {len(delays)} scheduled"
        for n, (gap, delay) in enumerate(zip(gaps, delays, strict=True), 1):  # the log rounds delays to the ms
            assert gap >= delay - 0.001, f"{dev}: attempt {n + 1} came {gap:.3f} s after attempt {n}, before {delay} s"
        assert max(delays[-2:]) > 2 * delays[0], f"{dev}: the delays between attempts do not grow: {delays}"
    # retry=True only when the hook may already have run: every attempt after the first.
    for dev in devices:
        flags = [bool(c.get("retry")) for c in lab.calls("deallocate", dev, ok=None)]
        said = [line for line in lab.log().splitlines() if re.search(rf"\b{dev}\b", line)]
        assert flags[0] is False and all(flags[1:]), (dev, flags, lab.calls(device=dev, ok=None), said)

    log = lab.log()
    failing = [line for line in log.splitlines() if "failed (attempt" in line]
    assert len(failing) == count, f"{len(failing)} 'failed' lines for {count} failing releases"
    assert all("mock: deallocate failed for device" in line for line in failing)
    assert "finishing an interrupted release" not in log  # nothing was interrupted
    assert len([line for line in log.splitlines() if "still failing after" in line]) <= count
    shown = lab.resource_status()["release_failures"]
    assert len(shown) == count
    for text in shown.values():
        assert text.startswith("deallocate: mock: deallocate failed for device"), text
        assert "example.com/mock:" not in text and re.search(r"\(\d+ attempts since \d\d:\d\d:\d\d\)$", text), text

    for dev in devices:
        lab.write_device(dev)  # fixed
    for dev in devices:
        lab.wait_released(dev, timeout=20)

    def recovered() -> list[str]:
        return [line for line in lab.log().splitlines() if "recovered" in line]

    # A release is logged as recovered after its deallocate returned and the ledger was written (fsync'd): under
    # load that comes a while after the mock recorded the call.
    lab.wait(lambda: len(recovered()) >= count, what=f"{count} releases logged as recovered")
    assert len(recovered()) == count
    lab.wait(lambda: lab.resource_status()["release_failures"] == {}, what="no release failure left in the status")


def _quarantine(lab: Lab, field: str = "created", value: object = "yesterday") -> str:
    """A pod holding a device whose ledger record gets a malformed field while the daemon is down; its device."""
    lab.start()
    (dev,) = lab.admit("held")
    lab.wait_seen(dev, "held")
    lab.kill()
    records = lab.ledger()
    for record in records:
        if dev in record["devices"]:
            record[field] = value
    lab.rewrite_ledger(records)
    lab.restart_process()
    return dev


def test_a_quarantined_records_device_is_withheld_until_released_through_the_driver(lab: Lab) -> None:
    dev = _quarantine(lab)
    lab.wait(lambda: lab.health(dev) == "Unhealthy", what=f"{dev} withheld (its record is quarantined)")
    busy = lab.wait(lambda: lab.resource_status()["busy_devices"], what="the status to name the withheld device")
    assert list(busy) == [dev] and "quarantined ledger record #0" in busy[dev]
    (quarantined,) = lab.resource_status()["quarantined_records"]
    assert quarantined["devices"] == [dev] and "created" in quarantined["reason"] and quarantined["key"]
    with pytest.raises(grpc.RpcError) as refused:
        lab.allocate(dev)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "quarantined ledger record" in str(refused.value.details())
    before = len(read_calls(lab.mock_dir()))

    lab.quiet(1.0)  # its pod still holds it: nothing is released
    assert [c for c in read_calls(lab.mock_dir())[before:] if c["hook"] in ("post_stop", "deallocate")] == []

    lab.kubelet.remove_pod("held")
    lab.wait_released(dev)
    released = [c for c in read_calls(lab.mock_dir())[before:] if dev in c["device_ids"]]
    assert [(c["hook"], c.get("retry", False)) for c in released] == [("post_stop", True), ("deallocate", True)]
    lab.wait(lambda: lab.health(dev) == "Healthy", what=f"{dev} back in service")
    lab.wait(lambda: lab.resource_status()["quarantined_records"] == [], what="the quarantine entry gone")
    # Gone for good: a restart finds no quarantine and no record of the device.
    assert lab.daemon is not None
    lab.daemon.restart()
    assert lab.resource_status()["quarantined_records"] == []
    assert lab.ledger_record(dev) is None


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devplug", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_operator_clears_a_quarantined_record_and_the_device_returns_without_a_driver_call(lab: Lab) -> None:
    dev = _quarantine(lab, "kep_at", "soon")
    lab.wait(lambda: lab.health(dev) == "Unhealthy", what=f"{dev} withheld")
    config = str(lab.daemon.config_path) if lab.daemon else ""
    listed = _cli("quarantine", "list", "--config", config)
    assert listed.returncode == 0, listed.stderr
    key = re.search(r"key (\w+)", listed.stdout)
    assert key is not None and dev in listed.stdout and "kep_at" in listed.stdout, listed.stdout

    refused = _cli("quarantine", "clear", "--config", config)
    assert refused.returncode == 2 and "--all" in refused.stderr  # neither keys nor --all: nothing done

    before = len(read_calls(lab.mock_dir()))
    cleared = _cli("quarantine", "clear", "--config", config, key.group(1))
    assert cleared.returncode == 0, cleared.stderr
    lab.wait(lambda: lab.health(dev) == "Healthy", what=f"{dev} back in service after the operator cleared it")
    lab.wait(lambda: lab.resource_status()["quarantined_records"] == [], what="the quarantine entry gone")
    assert [c for c in read_calls(lab.mock_dir())[before:] if dev in c["device_ids"]] == []  # no driver call
    assert "cleared by the operator" in lab.log()

    assert lab.daemon is not None and lab.daemon.stop() == 0
    assert "no quarantined ledger records" in _cli("quarantine", "list", "--config", config).stdout


def test_with_no_daemon_running_the_operator_clears_the_ledger_on_disk(lab: Lab) -> None:
    dev = _quarantine(lab, "post_stopped", dev_placeholder := "mockX")
    assert dev_placeholder not in dev
    assert lab.daemon is not None and lab.daemon.stop() == 0
    config = str(lab.daemon.config_path)
    cleared = _cli("quarantine", "clear", "--config", config, "--all")
    assert cleared.returncode == 0, cleared.stderr
    assert re.search(rf"{RESOURCE}: cleared key \w+ \({dev}\)", cleared.stdout), cleared.stdout
    assert "no quarantined ledger records" in _cli("quarantine", "list", "--config", config).stdout
    before = len(read_calls(lab.mock_dir()))
    lab.restart_process()
    lab.wait(lambda: lab.health(dev) == "Healthy", what=f"{dev} in service from the start")
    assert lab.resource_status()["quarantined_records"] == []
    assert [c for c in read_calls(lab.mock_dir())[before:] if dev in c["device_ids"]] == []
