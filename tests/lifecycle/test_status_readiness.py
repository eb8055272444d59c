"""``devplug status`` and ``/readyz`` never contradict each other (issue 40, item 4).

One real daemon with ``[metrics] enabled``, driven through the outages an operator meets: PodResources
unreadable (shorter, then longer than the grace period), every device unhealthy, a release that keeps failing.
Throughout, both are asked again and again: whenever ``/readyz`` answered the same just before and just after,
``devplug status`` (the status file, read as the command reads it) gives the same reasons and the exit code that
goes with them (0 exactly when ``/readyz`` says ready; 6 a problem; 7 nothing can be served). The real command is
run at each stage for its exit code and what it prints.
"""

from __future__ import annotations

import http.client
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devplug.cli.statusview import status_exit_code, status_problems
from devplug.daemon.status import read_status
from devplug.errors import StateError

RESOURCE = "example.com/mock"
GRACE = 3.0  # [release] grace_period: PodResources unreadable longer than this is a problem (interval 0.1 s)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _readyz(port: int) -> tuple[int, list[str]]:
    """/readyz's status and its reasons (one per ``;``-separated part of ``not ready: ...``)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/readyz")
        response = conn.getresponse()
        body = response.read().decode().strip()
    finally:
        conn.close()
    if response.status == 200:
        assert body == "ready"
        return 200, []
    assert body.startswith("not ready: "), body
    return response.status, body.removeprefix("not ready: ").split("; ")


def _status(state_dir: Path) -> tuple[int, list[str]] | None:
    """``devplug status``'s exit code and PROBLEM reasons, computed as the command does (None: no file yet)."""
    try:
        data = read_status(state_dir)
    except StateError:
        return None
    return status_exit_code(data), status_problems(data)


def _same(reasons: list[str]) -> list[str]:
    """Reasons without their figures of seconds (``/readyz`` and status measure a duration a moment apart)."""
    return [re.sub(r"\d+ s\b", "N s", r) for r in reasons]


class Observer:
    """Asks /readyz, then status, then /readyz; checks they agree whenever /readyz did not change in between."""

    def __init__(self, port: int, state_dir: Path) -> None:
        self.port = port
        self.state_dir = state_dir
        self.compared = 0
        self.seen: set[int] = set()

    def sample(self) -> tuple[int, list[str], int] | None:
        before = _readyz(self.port)
        status = _status(self.state_dir)
        after = _readyz(self.port)
        if status is None or (before != after and _same(before[1]) != _same(after[1])):
            return None  # /readyz changed meanwhile: nothing to compare
        code, problems = status
        ready, reasons = after
        if _same(problems) != _same(reasons) or (code == 0) != (ready == 200):
            # the status file is written within a second of a change: give it that second before calling it
            return None
        self.compared += 1
        self.seen.add(code)
        return ready, reasons, code

    def until(self, predicate: Callable[[int, list[str], int], bool], what: str, timeout: float = 20.0) -> Any:
        """Sample until both agree and ``predicate(readyz status, reasons, status exit code)`` holds; fail if they
        disagree for longer than the status file's second (twice over)."""
        deadline = time.monotonic() + timeout
        disagreeing_since: float | None = None
        while True:
            got = self.sample()
            now = time.monotonic()
            if got is None:
                disagreeing_since = disagreeing_since or now
                status = _status(self.state_dir)
                data = read_status(self.state_dir)
                assert now - disagreeing_since < 2.5, (
                    f"/readyz {_readyz(self.port)} and devplug status {status} disagree for "
                    f"[{time.time() - data['written_at']:.1f} s old: {[r.get('counts') for r in data['resources']]}] "
                    f"{now - disagreeing_since:.1f} s (waiting for {what})"
                )
            else:
                disagreeing_since = None
                if predicate(*got):
                    return got
            assert now < deadline, f"timed out waiting for {what}; last: {got}"
            time.sleep(0.05)


def test_status_and_readyz_agree_through_outages_and_failures(lab: Any) -> None:
    port = _free_port()
    lab.start(
        {RESOURCE: lab.resource_table(count=2)},
        release_interval=0.1,
        grace_period=GRACE,
        metrics={"enabled": True, "port": port},
    )
    state_dir = lab.state_dir()
    seen = Observer(port, state_dir)

    seen.until(lambda ready, reasons, code: ready == 200 and code == 0, "ready, and status exit 0")
    (device,) = lab.admit("tenant")  # an allocation: the reconciler reads PodResources while it is held
    lab.wait(lambda: (lab.status().get("release") or {}).get("last_success"), what="a PodResources read")
    assert lab.status_command().returncode == 0

    # 1. PodResources unreadable: reported at once, a problem once it lasts past the grace period.
    lab.kubelet.pod_resources_available = False
    early = lab.wait(
        lambda: (r := lab.status_command()) and "PodResources ERROR" in r.stdout and r,
        what="status to report the outage",
    )
    assert "unreadable since" in early.stdout and "failed read" in early.stdout, early.stdout
    data = read_status(state_dir)
    assert data["release"]["failures"] > 0 and data["release"]["failing_since"] is not None
    if time.time() - data["release"]["failing_since"] < GRACE - 1:  # still within the grace period
        assert early.returncode == 0, early.stdout
    _, reasons, code = seen.until(lambda ready, reasons, code: ready == 503, "/readyz 503 for PodResources")
    assert code == 6 and [r for r in reasons if r.startswith("PodResources unreadable for")], reasons
    shown = lab.status_command()
    assert shown.returncode == 6 and "PROBLEM: PodResources unreadable for" in shown.stdout, shown.stdout
    lab.kubelet.pod_resources_available = True
    seen.until(lambda ready, reasons, code: ready == 200 and code == 0, "ready again once PodResources answers")
    assert "PodResources ok" in lab.status_command().stdout

    # 2. Every device unhealthy: nothing can be served (exit 7).
    for dev in ("mock0", "mock1"):
        lab.write_device(dev, "unhealthy=fan failure")
    _, reasons, code = seen.until(lambda ready, reasons, code: ready == 503, "/readyz 503 with every device unhealthy")
    assert code == 7 and reasons == [f"{RESOURCE}: no device can be served: all 2 unhealthy"], reasons
    shown = lab.status_command()
    assert shown.returncode == 7 and "PROBLEM: example.com/mock: no device can be served" in shown.stdout
    for dev in ("mock0", "mock1"):
        lab.write_device(dev)
    seen.until(lambda ready, reasons, code: ready == 200 and code == 0, "ready again with healthy devices")

    # 3. A release that keeps failing: a problem (exit 6) until it succeeds.
    lab.write_device(device, "fail=deallocate")
    lab.kubelet.remove_pod("tenant")
    _, reasons, code = seen.until(lambda ready, reasons, code: ready == 503, "/readyz 503 with a release failing")
    assert code == 6 and [r for r in reasons if "1 release failing" in r], reasons
    shown = lab.wait(lambda: (r := lab.status_command()).returncode == 6 and r, what="devplug status to exit 6")
    assert f"release of {device} failing: deallocate:" in shown.stdout, shown.stdout
    lab.write_device(device)
    lab.wait_released(device, timeout=30.0)
    seen.until(lambda ready, reasons, code: ready == 200 and code == 0, "ready once the release succeeded")

    assert seen.seen == {0, 6, 7} and seen.compared > 10
