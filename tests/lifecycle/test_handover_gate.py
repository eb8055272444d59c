"""Only the instance a handover is for takes the node (issue 36, items 2 and 10): real ``devplug run`` processes.

A third instance arriving during a handover exits naming it, and never takes
the state lock the old instance lets go; a ``handover-request.json`` written by
a process that does not hold the gate (``handover.lock``) freezes nothing; and
the old instance serves on the moment the new one dies before taking the lock,
not at ``[handover] timeout``.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.daemon.lockholder import process_start_ticks
from devplug.kube.names import instance_tag, socket_file_name
from devplug.testing.process import DaemonProcess
from tests.support.handoverstop import StoppingDaemon

if TYPE_CHECKING:
    from devplug.testing.plugin import RunningDaemon
    from tests.lifecycle.conftest import Lab

RESOURCE = "example.com/mock"

_SPAWNED: list[DaemonProcess] = []


@pytest.fixture(autouse=True)
def _no_daemon_left_behind() -> Iterator[None]:
    yield
    while _SPAWNED:
        process = _SPAWNED.pop()
        if process.running():
            os.kill(process.pid, signal.SIGCONT)
        process.kill()


def instance(old: RunningDaemon, name: str, stop_at: str | None = None) -> DaemonProcess:
    """Another ``devplug run`` on the old one's config (its state dir), as instance ``name``; one stopping itself
    right after handover step ``stop_at`` if given (:class:`~tests.support.handoverstop.StoppingDaemon`)."""
    log = old.root / f"daemon-{name}.log"
    env = {**old.env, "DEVPLUG_INSTANCE": name}
    process = (
        DaemonProcess(old.config_path, log, env=env)
        if stop_at is None
        else StoppingDaemon(stop_at, old.config_path, log, env=env)
    )
    _SPAWNED.append(process)
    return process


def stop_old_at(lab: Lab, old: RunningDaemon, step: str) -> None:
    """Restart the old daemon so that it stops itself (SIGSTOP) right after handover step ``step``."""
    old.process.stop()
    old.process = StoppingDaemon.like(old.process, step)
    lab.restart_process()


def served_socket(lab: Lab, old: RunningDaemon) -> Path:
    """The socket the kubelet dials now (with handovers on, its name carries the instance)."""
    return Path(old.config["kubelet"]["device_plugin_dir"]) / lab.view().endpoint


def allocate_at(socket: Path, device: str) -> dp.AllocateResponse:
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        call = channel.unary_unary(
            "/v1beta1.DevicePlugin/Allocate",
            request_serializer=dp.AllocateRequest.SerializeToString,
            response_deserializer=dp.AllocateResponse.FromString,
        )
        request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=[device])])
        reply: dp.AllocateResponse = call(request, timeout=60.0)
        return reply


def test_a_third_instance_during_a_handover_exits_naming_it_and_never_takes_the_lock(lab: Lab) -> None:
    old = lab.start(handover={"enabled": True, "timeout": 4.0})
    stop_old_at(lab, old, "holding")
    held = lab.admit("before", 1)
    b = instance(old, "instance-b", stop_at="request").start()  # asks, then is slow (stopped)
    lab.wait(b.stopped, what="instance-b stopped right after its request")
    lab.wait(old.process.stopped, what="the old instance stopped holding the calls for instance-b")
    c = instance(old, "instance-c").start()
    lab.wait(lambda: not c.running() or "asking it to hand over" in c.log_text(), what="instance-c asking or leaving")
    os.kill(old.process.pid, signal.SIGCONT)  # the old instance flushes and lets the lock go: for instance-b only
    assert c.wait(20.0) == 3, c.log_text()
    text = c.log_text()
    assert "a handover is in progress" in text and "(instance instance-b) is taking the node over" in text, text
    assert "took the state lock" not in text and "driver mock started" not in text, text
    os.kill(b.pid, signal.SIGCONT)
    assert old.process.wait(20.0) == 0, old.log_text()
    plugin_dir = Path(old.config["kubelet"]["device_plugin_dir"])
    b_socket = socket_file_name(RESOURCE, len(str(plugin_dir)), instance_tag("instance-b"))
    lab.wait(lambda: lab.view().endpoint == b_socket and lab.view().registered, what="instance-b serving")
    assert "took the state lock from pid-" in b.log_text(), b.log_text()  # granted to it, from the old instance
    registered = [e.detail for e in lab.kubelet.events_of("register", RESOURCE)]
    assert not any(instance_tag("instance-c") in detail for detail in registered), registered
    assert {d for r in lab.ledger() for d in r["devices"]} == set(held)
    after = lab.admit("after", 1)
    assert not set(after) & set(held)
    assert b.stop() == 0, b.log_text()


def forge_request(state_dir: Path, to: str) -> None:
    """A request written by this test process, which does not hold the gate."""
    now = time.time()
    body = {"to": to, "pid": os.getpid(), "start": process_start_ticks(os.getpid()), "requested_at": now}
    (state_dir / "handover-request.json").write_text(json.dumps({**body, "deadline": now + 60.0}))


def test_a_forged_handover_request_freezes_nothing(lab: Lab) -> None:
    old = lab.start(handover={"enabled": True, "timeout": 3.0})
    for attempt in range(2):
        forge_request(old.state_dir, f"forged-{attempt}")
        lab.wait(
            lambda: (
                "ignoring a handover request" in old.process.log_text() or "asks to take over" in old.process.log_text()
            ),
            what="the old instance reading the request",
        )
        started = time.monotonic()
        allocate_at(served_socket(lab, old), f"mock{attempt}")
        took = time.monotonic() - started
        assert took < 1.0, f"an Allocate after a forged request took {took:.2f} s"
    text = old.process.log_text()
    assert text.count("ignoring a handover request for instance 'forged-") == 2, text
    assert "asks to take over" not in text and "state lock released" not in text, text
    assert old.process.running()
    assert lab.admit("still-served", 1)


def test_the_old_instance_serves_on_the_moment_the_new_one_dies_before_taking_the_lock(lab: Lab) -> None:
    old = lab.start(handover={"enabled": True, "timeout": 15.0})
    socket = served_socket(lab, old)
    b = instance(old, "dies", stop_at="request").start()
    lab.wait(b.stopped, what="the new instance stopped right after its request")
    lab.wait(lambda: "state lock released for dies" in old.process.log_text(), what="the old instance granting")
    answers: dict[str, Any] = {}

    def allocate() -> None:
        try:
            answers["reply"] = allocate_at(socket, "mock0")
        except grpc.RpcError as exc:
            answers["reply"] = exc
        answers["at"] = time.monotonic()

    held = threading.Thread(target=allocate)
    held.start()  # held: the old instance holds new calls during the handover
    time.sleep(0.3)
    assert "reply" not in answers
    killed = time.monotonic()
    b.kill()
    held.join(20.0)
    assert isinstance(answers.get("reply"), dp.AllocateResponse), answers  # served here, not refused
    waited = answers["at"] - killed
    assert waited < 3.0, f"the held Allocate was answered {waited:.2f} s after the new instance died"
    text = old.process.log_text()
    assert "handover to dies failed, serving on: the new instance (pid" in text, text
    assert "let handover.lock go: it exited or gave up" in text, text
    assert lab.admit("after", 1)
