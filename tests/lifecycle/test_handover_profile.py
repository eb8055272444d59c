"""A handover's profile (issue 42): both instances' steps, timed, in the new instance's record of it.

Real ``devplug run`` processes on one state dir and the dev kubelet: the old instance sends its steps with its last
word, the new one adds its own and keeps them in ``handover-last.json`` (and the status), in ms after the request
(JSON objects written with sorted keys: the order is the times').
Each step is marked before the word the other side waits for, so their order is the protocol's whatever the timing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from devplug.testing.process import DaemonProcess

if TYPE_CHECKING:
    from tests.lifecycle.conftest import Lab

RESOURCE = "example.com/mock"

#: The steps in the order the protocol takes them (devplug.daemon.handover's docstring).
PROTOCOL_ORDER = [
    "new:process-start",
    "new:request",
    "old:holding",
    "old:quiet",
    "old:flushed",
    "old:granted",
    "new:taken",
    "old:saw-taken",
    "old:drivers-stopped",
    "new:saw-drivers-stopped",
    "new:serving",
    "old:saw-serving",
    "old:held-calls-answered",
    "new:saw-done",
]

_SPAWNED: list[DaemonProcess] = []


def in_protocol_order(steps: dict[str, float]) -> bool:
    """Every step of :data:`PROTOCOL_ORDER` and no other, each at or after the one before (times in ms, to 0.1 ms:
    two steps may round to one time)."""
    times = [steps.get(name) for name in PROTOCOL_ORDER]
    return set(steps) == set(PROTOCOL_ORDER) and times == sorted(t for t in times if t is not None)


@pytest.fixture(autouse=True)
def _no_daemon_left_behind() -> Iterator[None]:
    yield
    while _SPAWNED:
        _SPAWNED.pop().kill()


def test_the_new_instance_records_both_instances_steps_in_the_protocols_order(lab: Lab) -> None:
    old = lab.start(handover={"enabled": True, "timeout": 10.0})
    lab.admit("before", 1)
    new = DaemonProcess(old.config_path, old.root / "daemon-b.log", env={**old.env, "DEVPLUG_INSTANCE": "instance-b"})
    _SPAWNED.append(new)
    new.start()
    assert old.process.wait(20.0) == 0, old.log_text()
    last = old.state_dir / "handover-last.json"
    lab.wait(last.exists, what="the new instance's record of the handover", timeout=20.0)
    record = json.loads(last.read_text())
    assert record["state"] == "done", record
    steps = record["steps_ms"]
    assert in_protocol_order(steps), steps
    assert steps["new:request"] == 0.0
    assert steps["new:process-start"] < 0.0  # the process started before it asked
    assert steps["new:saw-done"] == pytest.approx(1000.0 * record["took_s"], abs=0.2)
    status = old.state_dir / "status.json"

    def took_over() -> dict[str, Any] | None:
        data = json.loads(status.read_text())
        section: dict[str, Any] = data.get("handover", {}).get("took_over") or {}
        return section if data.get("pid") == new.pid and section.get("state") == "done" else None

    shown = lab.wait(took_over, what="the handover done in the new instance's status")["steps_ms"]
    assert in_protocol_order(shown), shown
    assert "steps (ms after the request)" in new.log_text()
    new.stop(20.0)
