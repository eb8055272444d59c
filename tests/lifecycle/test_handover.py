"""Two daemon instances hand a node over (issue 30): real ``devplug run`` processes on one state dir, the dev kubelet.

The new instance asks through the state dir, the old one holds new calls,
flushes its ledger, lets the lock go and, once the new one serves, answers
what it held through it and exits 0 without registering again.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.daemon.handover import NEW_INSTANCE_STEPS, OLD_INSTANCE_STEPS
from devplug.devkubelet import ContainerSpec, ContainerStartError, DevKubeletThread, KubeletError, PodSpec
from devplug.kube.names import instance_tag, socket_file_name
from devplug.testing.configs import write_toml
from devplug.testing.plugin import cgroup_layout_for
from devplug.testing.process import DaemonProcess
from devplug_mock import read_calls
from tests.support.handoverstop import StoppingDaemon

if TYPE_CHECKING:
    from devplug.testing.plugin import RunningDaemon
    from tests.lifecycle.conftest import Lab

RESOURCE = "example.com/mock"
HANDOVER = {"enabled": True, "timeout": 10.0}


#: Every daemon a test of this module started itself (the ``devplug_daemon`` fixture stops its own).
_SPAWNED: list[DaemonProcess] = []


@pytest.fixture(autouse=True)
def _no_daemon_left_behind() -> Iterator[None]:
    """Kill what a test started and left running (a failed test never reached its own stop)."""
    yield
    while _SPAWNED:
        _SPAWNED.pop().kill()


def successor(
    lab: Lab, old: RunningDaemon, instance: str, env: dict[str, str] | None = None, stop_at: str | None = None
) -> DaemonProcess:
    """A second ``devplug run`` on the old one's config (its state dir), as instance ``instance``; one stopping
    itself right after handover step ``stop_at`` if given (:class:`~tests.support.handoverstop.StoppingDaemon`)."""
    log = old.root / f"daemon-{instance}.log"
    env = {**old.env, "DEVPLUG_INSTANCE": instance, **(env or {})}
    process = (
        DaemonProcess(old.config_path, log, env=env)
        if stop_at is None
        else StoppingDaemon(stop_at, old.config_path, log, env=env)
    )
    _SPAWNED.append(process)
    return process


def socket_of(old: RunningDaemon, instance: str) -> str:
    plugin_dir = Path(old.config["kubelet"]["device_plugin_dir"])
    return socket_file_name(RESOURCE, len(str(plugin_dir)), instance_tag(instance))


def old_instance(old: RunningDaemon) -> str:
    """The old instance's id, from the last handover's record (``pid-<pid>-<random>`` without ``DEVPLUG_INSTANCE``)."""
    data = json.loads((old.state_dir / "handover-last.json").read_text())
    found: str = data["from"]
    assert found.startswith(f"pid-{old.process.pid}-")
    return found


def old_instance_of(data: dict[str, Any]) -> str:
    """The instance a status file was written by."""
    found: str = data["handover"]["instance"]
    return found


def status(old: RunningDaemon) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((old.state_dir / "status.json").read_text())
    return data


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def scrape(port: int) -> str:
    """``/metrics`` on ``port``; "" while nothing listens there (between the old instance's exit and the new one's
    server)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            text: str = reply.read().decode()
            return text
    except OSError:
        return ""


def test_a_new_instance_takes_the_node_over_and_the_old_one_leaves(lab: Lab) -> None:
    port = free_port()
    old = lab.start(handover=HANDOVER, metrics={"enabled": True, "port": port})
    first = lab.admit("before", 1)
    registrations = lab.kubelet.registrations(RESOURCE)
    new = successor(lab, old, "instance-b").start()
    try:
        assert old.process.wait(20.0) == 0, old.log_text()
        lab.wait(lambda: lab.kubelet.registrations(RESOURCE) > registrations, what="the new instance registered")
        view = lab.view()
        assert view.endpoint == socket_of(old, "instance-b")
        assert view.registered and len([d for d in view.devices if d.healthy]) == 4
        second = lab.admit("after", 2)  # served by the new instance, which owns the ledger now
        assert not set(first) & set(second)
        held = {d for r in lab.ledger() for d in r["devices"]}
        assert set(first) | set(second) <= held
        lab.wait(lambda: status(old).get("pid") == new.pid, what="the new instance's status")
        took = status(old)["handover"]["took_over"]
        assert (took["from"], took["to"]) == (old_instance(old), "instance-b")
        lab.wait(lambda: status(old)["handover"]["took_over"]["state"] == "done", what="the handover done")
        assert status(old)["handover"]["took_over"]["resources"][RESOURCE]["held_allocations"] == 1
        shown = subprocess.run(
            [sys.executable, "-m", "devplug", "status", "--state-dir", str(old.state_dir)],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        assert f"took the node over: {old_instance(old)} -> instance-b, done in " in shown, shown
        assert f"{RESOURCE}: 1 allocation(s) held" in shown, shown
        # the new instance serves the metrics on the same address once the old one left (a host's network)
        lab.wait(lambda: 'devplug_handovers_total{outcome="done",role="to"} 1.0' in scrape(port), what="the count")
        assert 'role="from"' not in scrape(port)  # this instance took over; it handed nothing over
        assert "handed over to instance-b" in old.log_text()
        assert "took the node over from" in new.log_text()
    finally:
        assert new.stop() == 0, new.log_text()


# --- rolling upgrades under churn -------------------------------------------------------------------------------

UPGRADES = 3
#: At most this many pods admitted in one rolling test, and this many seconds of churn after the last upgrade.
PODS_MAX = 300
DEVICES = 4


@pytest.fixture
def dev_kubelet(devplug_root: Path, request: pytest.FixtureRequest) -> Iterator[DevKubeletThread]:
    """The suite's dev kubelet, keying endpoints as the test's parameter says (default: by socket path)."""
    layout = cgroup_layout_for(request.node)
    kubelet = DevKubeletThread(
        devplug_root / "device-plugins",
        pod_resources_socket=devplug_root / "pod-resources" / "kubelet.sock",
        cgroups=layout,
        endpoints_by=getattr(request, "param", "socket-path"),
    )
    try:
        kubelet.start()
        yield kubelet
    finally:
        kubelet.close()


class Churn:
    """Admits and removes one-container pods until stopped or ``PODS_MAX`` were admitted. It asks only for devices
    that are free, and after each removal waits until the daemon released the pod's devices (released devices are
    advertised unhealthy meanwhile), so every refusal is one the handover caused, never a full node's."""

    def __init__(self, lab: Lab, rng: random.Random) -> None:
        self.lab = lab
        self.rng = rng
        self.running: dict[str, tuple[str, ...]] = {}
        self.admitted = 0
        self.refused: list[tuple[float, str]] = []
        self.failed_starts: list[tuple[float, str]] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def _released(self, devices: tuple[str, ...]) -> bool:
        held = {d for r in self.lab.ledger() for d in (*r["devices"], *r["pending"])}
        view = self.lab.kubelet.resource(RESOURCE)
        healthy = {d.id for d in view.devices if d.healthy} if view is not None else set()
        return not held & set(devices) and set(devices) <= healthy

    def _remove(self, name: str) -> None:
        devices = self.running.pop(name)
        self.lab.kubelet.remove_pod(name)
        self.lab.wait(lambda: self._released(devices), 20.0, f"{name}'s devices {devices} released")

    def run(self) -> None:
        try:
            while not self.stop.is_set() and self.admitted < PODS_MAX:
                free = DEVICES - sum(len(d) for d in self.running.values())
                if self.running and (free == 0 or self.rng.random() < 0.45):
                    self._remove(self.rng.choice(sorted(self.running)))
                    continue
                name, count = f"churn{self.admitted}", self.rng.randint(1, min(2, free))
                self.admitted += 1
                try:
                    pod = self.lab.kubelet.admit_pod(PodSpec(name, [ContainerSpec("app", {RESOURCE: count})]))
                except ContainerStartError as exc:  # admitted, holding its devices, but its container did not start
                    self.failed_starts.append((time.time(), str(exc)))
                    self.running[name] = self._held_by(name)
                    continue
                except KubeletError as exc:
                    self.refused.append((time.time(), str(exc)))
                    continue
                self.running[name] = pod.container("app").devices[RESOURCE]
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def _held_by(self, name: str) -> tuple[str, ...]:
        return tuple(d for d, (pod, _) in self.lab.kubelet.attributed(RESOURCE).items() if pod == f"default/{name}")

    def drain(self) -> None:
        for name in sorted(self.running):
            self._remove(name)


def _churned(churn: Churn, more: int) -> Callable[[], bool]:
    """True once ``more`` pods were admitted after this call (or the churn failed)."""
    start = churn.admitted
    return lambda: churn.admitted > start + more or churn.error is not None


def releases_balanced(lab: Lab) -> bool:
    """Every device allocated through the driver was deallocated once after each allocation, never twice."""
    for device in (f"mock{i}" for i in range(DEVICES)):
        hooks = [c["hook"] for c in lab.calls(device=device) if c["hook"] in ("allocate", "deallocate")]
        if hooks.count("allocate") != hooks.count("deallocate"):
            return False
    return True


def check_alternating(lab: Lab) -> None:
    for device in (f"mock{i}" for i in range(DEVICES)):
        hooks = [c["hook"] for c in lab.calls(device=device) if c["hook"] in ("allocate", "deallocate")]
        for before, after in itertools.pairwise(hooks):
            assert (before, after) != ("deallocate", "deallocate"), f"{device} released twice: {hooks}"
            assert (before, after) != ("allocate", "allocate"), f"{device} allocated twice unreleased: {hooks}"


def healthy_gaps(lab: Lab) -> list[float]:
    """Seconds from each stream end (every device marked unhealthy) to the next device list with healthy devices."""
    gaps, ended = [], None
    for event in lab.kubelet.events:
        if event.resource != RESOURCE:
            continue
        if event.kind == "stream-ended" and ended is None:
            ended = event.time
        elif event.kind == "list-and-watch" and ended is not None and not event.detail.endswith(", 0 healthy"):
            gaps.append(event.time - ended)
            ended = None
    assert ended is None, "a stream ended and no healthy device list followed: capacity did not come back"
    return gaps


@pytest.mark.parametrize("dev_kubelet", ["socket-path", "resource-name"], indirect=True)
def test_rolling_upgrades_under_pod_churn(lab: Lab, dev_kubelet: DevKubeletThread) -> None:
    seed = int(os.environ.get("DEVPLUG_HANDOVER_SEED", random.SystemRandom().randrange(1 << 30)))
    print(f"rolling upgrade seed {seed} (replay: DEVPLUG_HANDOVER_SEED={seed})")
    keying = dev_kubelet.kubelet.endpoints_by
    old = lab.start({RESOURCE: lab.resource_table(count=DEVICES)}, handover=HANDOVER)
    churn = Churn(lab, random.Random(seed))
    worker = threading.Thread(target=churn.run, name="churn")
    worker.start()
    current, processes = old.process, []
    try:
        for hop in range(UPGRADES):
            lab.wait(_churned(churn, 3), what="pods churning")
            nxt = successor(lab, old, f"rolling-{hop}").start()
            processes.append(nxt)
            assert current.wait(30.0) == 0, current.log_text()
            current = nxt
        lab.wait(_churned(churn, 5), what="churn after")
    except BaseException:
        for process in [old.process, *processes]:
            print(f"--- {process.log_path.name} ---\n{process.log_text()[-3000:]}")
        print("--- kubelet events ---\n" + "\n".join(str(e) for e in lab.kubelet.events[-30:]))
        raise
    finally:
        churn.stop.set()
        worker.join(60)
    assert churn.error is None, churn.error
    churn.drain()
    try:
        lab.wait(lambda: releases_balanced(lab), timeout=30.0, what="every allocation released once")
    except BaseException:
        left = {r["pod"] for r in lab.ledger()}
        print(f"left in the ledger: {left}; refused: {churn.refused}; failed starts: {churn.failed_starts}")
        for process in [old.process, *processes]:
            lines = [
                line
                for line in process.log_text().splitlines()
                if any(f"{p} " in line or f"{p})" in line for p in left)
            ]
            print(f"--- {process.log_path.name} ---\n" + "\n".join(lines))
        raise
    check_alternating(lab)
    lab.wait(lambda: lab.ledger() == [], what="an empty ledger")
    listed = [e for e in lab.kubelet.events if e.resource == RESOURCE and e.kind == "list-and-watch"]
    assert all(not e.detail.startswith("0 device(s)") for e in listed), "capacity went to zero"
    assert lab.kubelet.events_of("resource-dropped", RESOURCE) == []
    endpoints = [e.detail.split(",")[0].removeprefix("endpoint ") for e in lab.kubelet.events_of("register", RESOURCE)]
    for i, endpoint in enumerate(endpoints[1:], 1):  # once superseded, an instance never registers again
        assert endpoint == endpoints[i - 1] or endpoint not in endpoints[:i], endpoints
    assert len(set(endpoints)) == 1 + UPGRADES
    gaps = healthy_gaps(lab)
    print(
        f"{keying}: {churn.admitted} pods, {len(churn.refused)} refused, {len(churn.failed_starts)} failed starts, "
        f"{UPGRADES} upgrades, "
        f"allocatable-zero gaps (s): {[round(g, 4) for g in gaps]}"
    )
    if keying == "socket-path":
        assert churn.refused == []
        assert churn.failed_starts == []
        assert gaps == []  # no stream end ever made the devices unhealthy
        assert lab.kubelet.registrations(RESOURCE) == 1 + UPGRADES
    else:  # each old instance's end zeroed the new registration, which registered once more
        assert len(gaps) == UPGRADES
        assert lab.kubelet.registrations(RESOURCE) == 1 + 2 * UPGRADES
        for when, why in churn.refused:
            print(f"refused at {when:.3f}: {why}")
    assert current.stop() == 0, current.log_text()


# --- kill -9 at each step ---------------------------------------------------------------------------------------

#: (which instance dies, right after which step); see tests.support.handoverstop.
KILL_POINTS = [*(("old", step) for step in OLD_INSTANCE_STEPS), *(("new", step) for step in NEW_INSTANCE_STEPS)]
KILL_HANDOVER = {"enabled": True, "timeout": 4.0}


def pods_in_ledger(lab: Lab) -> set[str]:
    return {r["pod"] for r in lab.ledger() if r["pod"]}


@pytest.mark.parametrize(("victim", "step"), KILL_POINTS, ids=[f"{v}-at-{s}" for v, s in KILL_POINTS])
def test_kill_9_at_each_step_of_a_handover_loses_nothing(lab: Lab, victim: str, step: str) -> None:
    old = lab.start(handover=KILL_HANDOVER)
    if victim == "old":  # the same daemon again, stopping itself at the step
        old.process.stop()
        old.process = StoppingDaemon.like(old.process, step)
        lab.restart_process()
    held = [lab.admit("a", 1), lab.admit("b", 1)]
    lab.wait(lambda: pods_in_ledger(lab) == {"default/a", "default/b"}, what="both pods in the ledger")
    registrations = lab.kubelet.registrations(RESOURCE)
    new = successor(lab, old, "kill-b", stop_at=step if victim == "new" else None).start()
    dying = old.process if victim == "old" else new
    lab.wait(dying.stopped, what=f"the {victim} instance stopped at {step}")
    dying.kill()
    survivor = new if victim == "old" else old.process
    try:
        if victim == "new" and step == "request":  # before the commit: the old instance serves on
            lab.wait(lambda: status(old).get("handover", {}).get("handing_over", {}).get("state") == "failed")
            assert survivor.running()
            assert lab.view().endpoint == socket_of(old, old_instance_of(status(old)))
        else:
            if victim == "new":  # after the commit: the old one leaves, and the new one's restart serves
                assert old.process.wait(20.0) == 0, old.log_text()
                new = successor(lab, old, "kill-b").start()  # the same instance, stopping nowhere
                survivor = new
            lab.wait(
                lambda: (
                    lab.view().endpoint == socket_of(old, "kill-b")
                    and lab.view().registered
                    and all(d.healthy for d in lab.view().devices)
                ),
                timeout=20.0,
                what="the new instance serving its device list",
            )
            assert lab.kubelet.registrations(RESOURCE) > registrations
        assert pods_in_ledger(lab) == {"default/a", "default/b"}  # nothing lost
        third = lab.admit("c", 1)
        assert not set(third) & {d for devices in held for d in devices}
        for pod in ("a", "b", "c"):
            lab.kubelet.remove_pod(pod)
        lab.wait(lambda: releases_balanced(lab), timeout=20.0, what="every allocation released once")
        check_alternating(lab)
        lab.wait(lambda: lab.ledger() == [], what="an empty ledger")
    finally:
        print(f"--- surviving instance ---\n{survivor.log_text()[-4000:]}")
    assert survivor.stop() == 0, survivor.log_text()


def test_a_handover_nobody_answers_times_out_and_the_running_daemon_serves_on(lab: Lab) -> None:
    old = lab.start()  # handover off: like a devplug from before handovers, it never answers a request
    config = {**old.config, "handover": {"enabled": True, "timeout": 1.0}}
    path = write_toml(old.root / "newer.toml", config)
    new = DaemonProcess(path, old.root / "daemon-newer.log", env={"DEVPLUG_INSTANCE": "newer"})
    _SPAWNED.append(new)
    new.start()
    assert new.wait(30.0) == 3, new.log_text()
    assert (
        "no handover: the running instance did not hand over within 1 s ([handover] timeout) and 2 s more for its "
        "answer" in new.log_text()
    )
    assert "the running instance goes on serving, this one exits" in new.log_text()
    assert not (old.state_dir / "handover-request.json").exists()
    assert old.process.running()
    assert lab.admit("still-served", 1)
    assert lab.view().endpoint == socket_file_name(RESOURCE, len(str(old.config["kubelet"]["device_plugin_dir"])))


def test_the_cdi_spec_is_handed_over_whole(lab: Lab) -> None:
    spec_dir = lab.root / "cdi"
    old = lab.start(handover=HANDOVER, cdi={"enabled": True, "spec_dir": str(spec_dir)})
    (spec,) = spec_dir.iterdir()
    before = json.loads(spec.read_text())
    assert len(before["devices"]) == 4
    held = lab.admit("cdi-pod", 1)
    new = successor(lab, old, "cdi-b").start()
    try:
        assert old.process.wait(20.0) == 0, old.log_text()
        lab.wait(lambda: status(old).get("pid") == new.pid, what="the new instance's status")
        assert [p.name for p in spec_dir.iterdir()] == [spec.name]
        assert json.loads(spec.read_text()) == before  # rewritten by the new instance as it was, never removed
        status_facts = status(old)["handover"]["took_over"]["resources"][RESOURCE]
        assert status_facts["cdi_spec"] == str(spec)
        (after,) = lab.admit("cdi-after", 1)
        assert after not in held
    finally:
        assert new.stop() == 0, new.log_text()


def test_an_instance_that_handed_over_never_asks_the_node_back(lab: Lab) -> None:
    old = lab.start(handover=HANDOVER)
    first = successor(lab, old, "first").start()
    assert old.process.wait(20.0) == 0, old.log_text()
    second = successor(lab, old, "second").start()
    try:
        assert first.wait(20.0) == 0, first.log_text()
        first.start()  # its container restarted before the pod was deleted
        assert first.wait(20.0) == 3, first.log_text()
        assert "instance first already handed this node over to second" in first.log_text()
        assert second.running()
        assert lab.view().endpoint == socket_of(old, "second")
    finally:
        assert second.stop() == 0, second.log_text()


def allocate_at(socket: Path, device: str) -> dp.AllocateResponse:
    """An Allocate of one device on ``socket``, as the kubelet sends it (no deadline)."""
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        call = channel.unary_unary(
            "/v1beta1.DevicePlugin/Allocate",
            request_serializer=dp.AllocateRequest.SerializeToString,
            response_deserializer=dp.AllocateResponse.FromString,
        )
        request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=[device])])
        reply: dp.AllocateResponse = call(request, timeout=60.0)
        return reply


def test_a_hook_outlasting_the_timeout_fails_the_handover_and_the_held_calls_run_here(lab: Lab) -> None:
    old = lab.start(handover={"enabled": True, "timeout": 1.0})
    socket = Path(old.config["kubelet"]["device_plugin_dir"]) / lab.view().endpoint
    lab.write_device("mock0", "delay=allocate:4")
    answers: dict[str, Any] = {}

    def allocate(device: str) -> None:
        try:
            answers[device] = allocate_at(socket, device)
        except grpc.RpcError as exc:
            answers[device] = exc

    slow = threading.Thread(target=allocate, args=("mock0",))
    slow.start()
    lab.wait(
        lambda: any(c["hook"] == "allocate" for c in read_calls(lab.mock_dir(), started=True)),
        what="the slow allocate running",
    )
    new = successor(lab, old, "impatient").start()
    lab.wait(lambda: "asks to take over; holding new calls" in old.log_text(), what="the old instance holding calls")
    held = threading.Thread(target=allocate, args=("mock1",))  # arrives while calls are held: waits, then runs here
    held.start()
    assert new.wait(30.0) == 3, new.log_text()
    assert "refused: hooks or releases of example.com/mock still ran after 1 s" in new.log_text()
    slow.join(30)
    held.join(30)
    assert isinstance(answers["mock0"], dp.AllocateResponse), answers
    assert isinstance(answers["mock1"], dp.AllocateResponse), answers  # not refused: held, then served here
    assert old.process.running()
    assert {d for r in lab.ledger() for d in r["devices"]} == {"mock0", "mock1"}
    lab.wait(lambda: status(old)["handover"]["handing_over"]["state"] == "failed", what="the failed handover shown")
    lab.write_device("mock0")
    assert lab.admit("after", 1)  # the old instance serves on
