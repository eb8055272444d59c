"""``devplug kubelet`` for trying a driver by hand: a real dev kubelet process, a real daemon on the mock driver,
and ``devplug kubelet admit|remove|restart|show`` as real processes talking to it through its control socket."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devplug.testing.configs import dev_config, write_toml
from devplug.testing.plugin import REQUIRE_CGROUPS_ENV
from devplug.testing.recorder import read_hook_calls
from devplug.testing.waiting import poll_until

RESOURCE = "example.com/mock"


def _devplug(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "devplug", *args], capture_output=True, text=True, timeout=timeout)


def _wait(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    __tracebackhide__ = True
    return poll_until(predicate, what, timeout, interval=0.05)


class Node:
    """A ``devplug kubelet --dir DIR`` process and a ``devplug run`` daemon on the mock driver (two devices)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.plugin_dir = root / "device-plugins"
        self.mock_dir = root / "mock"
        self.kubelet_log = root / "kubelet.log"
        self.kubelet = subprocess.Popen(
            [sys.executable, "-m", "devplug", "kubelet", "--dir", str(self.plugin_dir)],
            stdout=self.kubelet_log.open("w"),
            stderr=subprocess.STDOUT,
        )
        self.daemon: subprocess.Popen[bytes] | None = None

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``devplug kubelet SUBCOMMAND --dir DIR ARGS...``."""
        command, *rest = args
        return _devplug("kubelet", command, "--dir", str(self.plugin_dir), *rest)

    def ctl_json(self, *args: str) -> Any:
        done = self.ctl(*args, "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)

    def show(self) -> dict[str, Any]:
        shown: dict[str, Any] = self.ctl_json("show")
        return shown

    def resource(self) -> dict[str, Any] | None:
        return next((r for r in self.show()["resources"] if r["name"] == RESOURCE), None)

    def start_daemon(self, liveness: dict[str, Any]) -> None:
        table = {"driver": "mock", "options": {"directory": str(self.mock_dir), "count": 2}}
        config = write_toml(self.root / "devplug.toml", dev_config(self.root, {RESOURCE: table}, liveness=liveness))
        self.daemon = subprocess.Popen(
            [sys.executable, "-m", "devplug", "run", "--config", str(config)],
            stdout=(self.root / "daemon.log").open("w"),
            stderr=subprocess.STDOUT,
        )

    def deallocated(self, device: str) -> int:
        return len([c for c in read_hook_calls(self.mock_dir, hook="deallocate", device=device) if c.ok])

    def close(self) -> None:
        for process in (self.daemon, self.kubelet):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)


@pytest.fixture
def node(devplug_root: Path) -> Iterator[Node]:
    node = Node(devplug_root)
    try:
        _wait((devplug_root / "devkubelet.sock").is_socket, "the control socket")
        yield node
    finally:
        node.close()


def _cgroup_folders(liveness: dict[str, Any]) -> list[Path]:
    """Every folder of the dev kubelet's cgroup root, in each hierarchy under the cgroup mount."""
    mount, root = Path(liveness["cgroup_mount"]), liveness["cgroup_root"].strip("/")
    return [p for p in (mount / root, *(h / root for h in mount.iterdir() if h.is_dir())) if p.is_dir()]


def test_a_driver_tried_by_hand_through_the_control_socket(node: Node) -> None:
    shown = node.show()
    assert shown["kubelet_socket"] == str(node.plugin_dir / "kubelet.sock")
    assert shown["resources"] == [] and shown["pods"] == [] and shown["allocations"] == []
    containers_run = bool(shown["containers"])
    if os.environ.get(REQUIRE_CGROUPS_ENV) == "1":
        assert containers_run, f"{REQUIRE_CGROUPS_ENV}=1, but the dev kubelet runs no container processes"
    liveness = shown["liveness"]
    # what the kubelet tells a daemon's config to hold is the config this test's daemon runs on
    assert f"[liveness]\n{next(iter(liveness))} = " in shown["daemon_settings"]
    node.start_daemon(liveness)
    resource = _wait(lambda: (r := node.resource()) and r["registered"] and r["capacity"] == 2 and r, "registration")
    assert [d["id"] for d in resource["devices"]] == ["mock0", "mock1"]
    assert resource["options"]["pre_start_required"] and resource["options"]["post_stop_required"]

    # a pod with an init container: the kubelet reuses the init container's device for the app container
    pod_a = node.ctl_json("admit", "pod-a", f"{RESOURCE}=1", "--init", f"{RESOURCE}=1")
    init, main = pod_a["containers"]
    assert (init["name"], init["init"], main["name"]) == ("init", True, "main")
    (device_a,) = main["devices"][RESOURCE]
    assert init["devices"][RESOURCE] == [device_a]
    assert main["allocations"][RESOURCE]["envs"] == {"MOCK_DEVICES": device_a}
    hooks = [c.hook for c in read_hook_calls(node.mock_dir, device=device_a)]
    # Allocate for each container (the app container's reuses the init container's device: nothing released
    # between them), then PreStartContainer before each container starts
    assert hooks == ["preferred_allocation", "allocate", "allocate", "pre_start", "pre_start"]
    human = node.ctl("show", "allocations", "pods")
    assert human.returncode == 0, human.stderr
    assert f"default/pod-a  main  {RESOURCE}: {device_a}" in human.stdout
    assert "== devices" not in human.stdout and f"pod default/pod-a  uid {pod_a['uid']}  running" in human.stdout

    # a pod asking more than is free is refused with the kubelet's message: exit 1, and nothing changes
    refused = node.ctl("admit", "pod-greedy", f"{RESOURCE}=2")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "devplug: error:" in refused.stderr and RESOURCE in refused.stderr
    assert [p["name"] for p in node.show()["pods"] if p["phase"] == "running"] == ["pod-a"]

    # a force-deleted pod whose container traps SIGTERM: the kubelet forgets it at once, its container runs on
    pod_b = node.ctl_json("admit", "pod-b", f"{RESOURCE}=1", "--trap-sigterm", "--grace", "3")
    (device_b,) = pod_b["containers"][0]["devices"][RESOURCE]
    assert device_b != device_a
    removed = node.ctl_json("remove", "pod-b", "--force")
    assert (removed["pod"], removed["how"], removed["phase"]) == ("default/pod-b", "force", "deleted")
    assert not [a for a in node.show()["allocations"] if a["pod"] == "default/pod-b"]
    if containers_run:
        assert removed["running_containers"] == ["main"]
        # released only once its container is gone: a count read while the container still runs must be 0 (the
        # container outlives its 3 s grace only while this process is quick enough to look; the order of exit and
        # deallocate is checked below in any case)
        count = node.deallocated(device_b)
        exited = [e for e in node.show()["events"] if e["kind"] == "container-exited" and "pod-b/main" in e["detail"]]
        if not exited:
            assert count == 0, f"{device_b} was deallocated while pod-b's container still ran"
    _wait(lambda: node.deallocated(device_b) == 1, f"the release of {device_b}")
    if containers_run:
        exits = [e for e in node.show()["events"] if e["kind"] == "container-exited" and "pod-b/main" in e["detail"]]
        (deallocate,) = read_hook_calls(node.mock_dir, hook="deallocate", device=device_b)
        assert exits and exits[0]["time"] <= deallocate.time

    # a kubelet restart: the plugin registers again, pod-a keeps its device
    restarted = node.ctl("restart")
    assert restarted.returncode == 0 and "restarted" in restarted.stdout, restarted.stderr
    _wait(lambda: (r := node.resource()) and r["registrations"] == 2 and r["registered"], "the re-registration")
    assert [e["kind"] for e in node.show()["events"]].count("restart") == 1
    held = {d["id"]: d["held_by"] for d in node.resource()["devices"]}  # type: ignore[index]
    assert held[device_a] == "default/pod-a/main"

    # a graceful removal waits for the containers; then the daemon releases the device
    gone = node.ctl("remove", "pod-a")
    assert gone.returncode == 0, gone.stderr
    assert gone.stdout.startswith("pod default/pod-a: graceful removal, now deleted; no container runs")
    _wait(lambda: node.deallocated(device_a) == 1, f"the release of {device_a}")
    assert node.show()["allocations"] == []

    # errors name what was wrong: an unknown pod (exit 1), a bad request argument (usage, exit 2)
    unknown = node.ctl("remove", "no-such-pod")
    assert unknown.returncode == 1 and "no pod default/no-such-pod was ever admitted" in unknown.stderr
    bad = node.ctl("admit", "pod-c", "example.com/mock")
    assert bad.returncode == 2 and "'example.com/mock': expected RESOURCE=COUNT" in bad.stderr

    # SIGTERM: the dev kubelet stops, kills its containers, removes its cgroups and its sockets, exits 0
    assert node.daemon is not None
    node.daemon.send_signal(signal.SIGTERM)
    assert node.daemon.wait(30) == 0
    node.kubelet.send_signal(signal.SIGTERM)
    assert node.kubelet.wait(30) == 0, node.kubelet_log.read_text()
    assert node.kubelet_log.read_text().rstrip().endswith("dev kubelet stopped")
    assert not (node.root / "devkubelet.sock").exists() and not (node.plugin_dir / "kubelet.sock").exists()
    if containers_run:
        assert _cgroup_folders(liveness) == []
    nobody = node.ctl("show")
    assert nobody.returncode == 3 and "no dev kubelet answers on" in nobody.stderr


def test_the_control_socket_answers_a_malformed_request_and_keeps_serving(node: Node) -> None:
    cases = {
        b"not json\n": "not one line of JSON",
        b"[1, 2]\n": "expected a JSON object",
        b'{"op": "explode"}\n': "unknown op 'explode' (admit, remove, restart, show)",
        b'{"op": "admit", "pod": "p"}\n': "'containers' must be a non-empty list",
        b'{"op": "admit", "pod": "p", "containers": [{"name": "c", "requests": {"x/y": -1}}]}\n': "cannot admit",
        b'{"op": "remove", "pod": "p", "how": "sideways"}\n': "'how' must be one of graceful, force, static, finish",
    }
    for line, error in cases.items():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(str(node.root / "devkubelet.sock"))
            sock.sendall(line)
            answer = json.loads(sock.makefile().readline())
        assert answer["ok"] is False and error in answer["error"], (line, answer)
    assert node.show()["pods"] == []


def test_a_second_dev_kubelet_on_the_same_control_socket_is_refused(node: Node) -> None:
    second = subprocess.run(
        [sys.executable, "-m", "devplug", "kubelet", "--dir", str(node.plugin_dir), "--cgroups", "off"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 2, second.stdout + second.stderr
    assert f"another dev kubelet serves the control socket {node.root / 'devkubelet.sock'}" in second.stderr
    assert node.show()["kubelet_socket"] == str(node.plugin_dir / "kubelet.sock")  # the first one serves on
    assert (node.plugin_dir / "kubelet.sock").is_socket()


def test_subcommands_take_their_options_after_the_subcommand(devplug_root: Path) -> None:
    done = _devplug("kubelet", "--dir", str(devplug_root), "show")
    assert done.returncode == 2 and "give the options after the subcommand" in done.stderr


def test_names_the_api_server_refuses_and_unbounded_delays_are_refused(node: Node) -> None:
    """Issue 36, item 12: ``../../etc``, escape sequences, ``pod_list_delay 1e9`` and ``stop_delay 1e308`` were
    accepted; each is refused with the API server's rule or the bound, naming the parameter, and nothing is
    admitted."""

    def ask(request: dict[str, Any]) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(str(node.root / "devkubelet.sock"))
            sock.sendall(json.dumps(request).encode() + b"\n")
            answer: dict[str, Any] = json.loads(sock.makefile().readline())
        return answer

    main = {"name": "main", "requests": {}}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"op": "admit", "pod": "../../etc", "containers": [main]}, "pod name '../../etc' is not a DNS-1123 subdomain"),
        ({"op": "admit", "pod": "p\x1b[31mred", "containers": [main]}, "pod name 'p\\x1b[31mred' is not a DNS-1123"),
        ({"op": "admit", "pod": "p", "namespace": "a.b", "containers": [main]}, "pod namespace 'a.b' is not a DNS"),
        ({"op": "admit", "pod": "p", "containers": [{"name": "../c"}]}, "container name '../c' is not a DNS-1123"),
        (
            {"op": "admit", "pod": "p", "containers": [{"name": "main", "stop_delay": 1e308}]},
            "stop_delay must be a number of seconds from 0 to 3600, or math.inf (ignore SIGTERM), got 1e+308",
        ),
        ({"op": "restart", "pod_list_delay": 1e9}, "'pod_list_delay' must be a number of seconds from 0 to 3600"),
        ({"op": "remove", "pod": "../../etc"}, "pod name '../../etc' is not a DNS-1123 subdomain"),
    ]
    for request, error in cases:
        answer = ask(request)
        assert answer["ok"] is False and error in answer["error"], (request, answer)
        assert "\x1b" not in answer["error"]
    assert node.show()["pods"] == [] and node.show()["sources_ready"]
    refused = node.ctl("admit", "../../etc")
    assert refused.returncode == 1 and "pod name '../../etc' is not a DNS-1123 subdomain" in refused.stderr
    for args, option in [
        (("admit", "p", "--stop-delay", "1e308"), "--stop-delay"),
        (("restart", "--pod-list-delay", "1e9"), "--pod-list-delay"),
    ]:
        done = node.ctl(*args)
        assert done.returncode == 2 and option in done.stderr and "0<=x<=3600" in done.stderr, done.stderr
    # Good input as before: a dotted pod name (a subdomain), a delay within the bound.
    admitted = node.ctl_json("admit", "web-0.shard-1", "--namespace", "team-a", "--stop-delay", "0.5")
    assert (admitted["namespace"], admitted["name"], admitted["phase"]) == ("team-a", "web-0.shard-1", "running")
    assert node.ctl("restart", "--pod-list-delay", "0.1").returncode == 0
