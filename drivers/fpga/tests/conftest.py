"""Fixtures for devplug-fpga's tests: the DFL model, a fake vendor tool, and a lab around the real daemon.

The daemon under test is a real ``devplug run`` child process (the
``devplug_daemon`` fixture of devplug's pytest plugin) talking to the dev
kubelet over unix sockets. Its fpga driver reaches the machine through the
DFL model in a temporary folder (``model_root``), which this process shapes
and inspects through its own :class:`~devplug.testing.dflsysfs.DflModel` on the
same files; the ``command`` backend runs :data:`FAKE_TOOL`, a real executable.

Waits are polls until a condition holds (:meth:`Lab.wait`), never sleeps.
Test modules cannot import helpers, so they reach everything through the
``lab`` fixture.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.devkubelet import ContainerSpec, DevKubeletThread, PodSpec
from devplug.engine.ledger import read_ledger_records
from devplug.resource_names import resource_state_dir, socket_file_name
from devplug.testing.devnodes import make_char_device
from devplug.testing.dflsysfs import DflModel, model_image
from devplug.testing.plugin import RunningDaemon

RESOURCE = "example.com/fpga"
CARD = "0000:3b:00.0"
CARD_B = "0000:5e:00.0"
BLANK_AFU = "0b1a4c0000000000000000000000b1a4"
DEFAULT_AFU = "d5fa0100000000000000000000000d5f"
TENANT_AFU = "7e4a47000000000000000000000007e4"
WAIT = 20.0

#: The fake vendor tool: ``fpga-tool <verb> --card A --region R [--image I]``.
#: It appends ``{"verb", "args", "event", "pid"}`` to ``calls.jsonl`` beside it (events: ``start``, ``hanging``,
#: ``orphaned``, ``failed``, ``done``, and ``child`` with the pid of a child it started) and keeps
#: each region's content in ``cards/<address>-<region>``: ``program`` writes the image's name, ``deprogram``
#: writes ``blank``, ``verify`` fails unless the region is blank. ``behaviour.json`` beside it may say, per
#: verb (or ``"<verb>:<region>"``): ``{"exit": 3, "stderr": "..."}`` to fail, ``{"hang": true}`` to wait until
#: ``release-<verb>`` exists (then go on) or its parent (the daemon) dies (then exit 137), ``{"child": true}`` to
#: act as a vendor's wrapper first: start a child that inherits stdout and stderr and runs until ``release-child``
#: exists, ``{"output": n}`` to print ``n`` bytes on stdout and on stderr (one line each) before going on.
FAKE_TOOL = r"""
import json, os, sys, time
from pathlib import Path

here = Path(__file__).resolve().parent
verb, rest = sys.argv[1], sys.argv[2:]
args = dict(zip(rest[::2], rest[1::2]))
parent = os.getppid()

def log(event):
    with open(here / "calls.jsonl", "a") as handle:
        handle.write(json.dumps({"verb": verb, "args": args, "event": event, "pid": os.getpid()}) + "\n")

log("start")
try:
    table = json.loads((here / "behaviour.json").read_text())
    behaviour = table.get(f"{verb}:{args.get('--region')}", table.get(verb, {}))
except FileNotFoundError:
    behaviour = {}
if behaviour.get("child"):
    import subprocess
    wait = f"import os, time\nwhile not os.path.exists({str(here / 'release-child')!r}): time.sleep(0.01)"
    child = subprocess.Popen([sys.executable, "-c", wait])
    with open(here / "calls.jsonl", "a") as handle:
        handle.write(json.dumps({"verb": verb, "args": args, "event": "child", "pid": child.pid}) + "\n")
if behaviour.get("output"):
    sys.stdout.write("o" * behaviour["output"] + "\n")
    sys.stderr.write("e" * behaviour["output"] + "\n")
    sys.stdout.flush()
if behaviour.get("hang"):
    log("hanging")
    while not (here / f"release-{verb}").exists():
        if os.getppid() != parent:
            log("orphaned")
            sys.exit(137)
        time.sleep(0.01)
if "exit" in behaviour:
    print(f"{verb}: working on {args.get('--card')}")
    sys.stderr.write(behaviour.get("stderr", "failed") + "\n")
    log("failed")
    sys.exit(behaviour["exit"])
cards = here / "cards"
cards.mkdir(exist_ok=True)
slot = cards / f"{args.get('--card')}-{args.get('--region', 'all')}"
if verb == "program":
    slot.write_text(Path(args["--image"]).name)
elif verb == "deprogram":
    slot.write_text("blank")
elif verb == "verify":
    content = slot.read_text() if slot.exists() else "blank"
    if content != "blank":
        sys.stderr.write(f"region holds {content}, not the blank image\n")
        log("failed")
        sys.exit(1)
log("done")
"""


def poll_until(
    predicate: Callable[[], Any], timeout: float = WAIT, what: str = "", details: Callable[[], str] | None = None
) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned); fail the test clearly otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            extra = f"\n{details()}" if details is not None else ""
            pytest.fail(f"timed out after {timeout:g} s waiting for {what or predicate!r}{extra}", pytrace=False)
        time.sleep(0.02)


class FakeTool:
    """The fake vendor tool in ``folder``: its path, behaviour and the calls it recorded."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "fpga-tool"
        self.path.write_text(f"#!{sys.executable}\n{FAKE_TOOL}")
        self.path.chmod(0o755)

    def behave(self, verbs: Mapping[str, Mapping[str, Any]] | None = None, **by_verb: Mapping[str, Any]) -> None:
        """Set what each verb (or ``"verb:region"``) does (see :data:`FAKE_TOOL`); others behave normally."""
        (self.folder / "behaviour.json").write_text(json.dumps({**(verbs or {}), **by_verb}))

    def release(self, verb: str) -> None:
        """Let a hanging ``verb`` go on."""
        (self.folder / f"release-{verb}").write_text("")

    def calls(self, verb: str | None = None, event: str | None = None, card: str | None = None) -> list[dict[str, Any]]:
        try:
            lines = (self.folder / "calls.jsonl").read_text().splitlines()
        except FileNotFoundError:
            return []
        found = [json.loads(line) for line in lines if line.strip()]
        return [
            c
            for c in found
            if (verb is None or c["verb"] == verb)
            and (event is None or c["event"] == event)
            and (card is None or c["args"].get("--card") == card)
        ]

    def content(self, card: str, region: int = 0) -> str | None:
        slot = self.folder / "cards" / f"{card}-{region}"
        return slot.read_text() if slot.exists() else None

    def command(self, verb: str, *extra: str) -> list[str]:
        return [str(self.path), verb, "--card", "{address}", *extra]


class Lab:
    """One test's bench: the dev kubelet, the daemon, the DFL model, images and the fake tool."""

    def __init__(self, root: Path, kubelet: DevKubeletThread, factory: Callable[..., RunningDaemon]) -> None:
        self.root = root
        self.kubelet = kubelet
        self.factory = factory
        self.model = DflModel(root / "machine")
        self.model_root = root / "machine"
        kubelet.dev_root = self.model.dev_root  # the model is the node: the runtime finds the devices there
        images = root / "images"
        images.mkdir()
        self.blank = model_image(images / "blank.gbs", BLANK_AFU)
        self.default = model_image(images / "default.gbs", DEFAULT_AFU)
        self.tool = FakeTool(root / "tool")
        self.daemon: RunningDaemon | None = None

    # --- configs

    def dfl_options(self, **extra: Any) -> dict[str, Any]:
        options: dict[str, Any] = {
            "backend": "dfl",
            "model_root": str(self.model_root),
            "blank_image": str(self.blank),
            "blank_afu_id": BLANK_AFU,
        }
        options.update(extra)
        return options

    def command_options(self, **extra: Any) -> dict[str, Any]:
        region = ["--region", "{region}"]
        options: dict[str, Any] = {
            "backend": "command",
            "cards": [CARD],
            "deprogram_command": self.tool.command("deprogram", *region, "--image", "{bitstream}"),
            "verify_command": self.tool.command("verify", *region),
            "blank_image": str(self.blank),
            "device_nodes": ["/dev/xfpga/{address}/{region}"],
            "command_timeout": 30.0,
        }
        options.update(extra)
        return options

    def start(self, options: Mapping[str, Any], **table: Any) -> RunningDaemon:
        table.setdefault("hook_timeout", 60.0)
        if options.get("backend") == "command":  # the vendor's driver made its regions' character devices
            for card in options["cards"]:
                for region in range(options.get("regions_per_card", 1)):
                    node = self.model.dev_root / "xfpga" / card / str(region)
                    node.parent.mkdir(parents=True, exist_ok=True)
                    make_char_device(node)
        daemon = self.factory(
            {RESOURCE: {"driver": "fpga", "options": dict(options), **table}}, release_interval=0.1, grace_period=1.0
        )
        self.daemon = daemon
        return daemon

    def restart(self) -> None:
        """Start the killed daemon again on its config; wait until it registered and listed its devices."""
        daemon = self._daemon()
        count = self.kubelet.registrations(RESOURCE)
        daemon.process.start()
        self.kubelet.wait_registered(RESOURCE, timeout=WAIT, after=count)
        self.wait(self.listed_since_last_register, what="the first device list after restart")

    def listed_since_last_register(self) -> bool:
        kinds = [e.kind for e in self.kubelet.events if e.resource == RESOURCE]
        if "register" not in kinds:
            return False
        last = len(kinds) - 1 - kinds[::-1].index("register")
        return "list-and-watch" in kinds[last:]

    def kill(self) -> None:
        self._daemon().process.kill()

    def _daemon(self) -> RunningDaemon:
        assert self.daemon is not None, "no daemon started"
        return self.daemon

    # --- the kubelet's side

    def admit(self, pod: str, count: int = 1) -> tuple[str, ...]:
        admitted = self.kubelet.admit_pod(PodSpec(pod, [ContainerSpec("app", {RESOURCE: count})]))
        return admitted.container("app").devices[RESOURCE]

    def admit_pod(self, pod: str, count: int = 1) -> Any:
        return self.kubelet.admit_pod(PodSpec(pod, [ContainerSpec("app", {RESOURCE: count})]))

    def health(self, device: str) -> str | None:
        view = self.kubelet.resource(RESOURCE)
        dev = None if view is None else view.device(device)
        return None if dev is None else dev.health

    def healths(self) -> dict[str, str]:
        view = self.kubelet.resource(RESOURCE)
        return {} if view is None else {d.id: d.health for d in view.devices}

    def allocate(self, *devices: str) -> Any:
        """A direct Allocate for one container on the plugin's socket, as the kubelet sends it."""
        plugin_dir = Path(self._daemon().config["kubelet"]["device_plugin_dir"])
        socket = plugin_dir / socket_file_name(RESOURCE, len(str(plugin_dir)))
        request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=list(devices))])
        with grpc.insecure_channel(f"unix:{socket}") as channel:
            call = channel.unary_unary(
                "/v1beta1.DevicePlugin/Allocate",
                request_serializer=dp.AllocateRequest.SerializeToString,
                response_deserializer=dp.AllocateResponse.FromString,
            )
            return call(request, timeout=WAIT)

    # --- the daemon's files

    def driver_dir(self) -> Path:
        return resource_state_dir(self._daemon().state_dir, RESOURCE) / "driver"

    def driver_state(self) -> dict[str, Any]:
        path = self.driver_dir() / "fpga-state.json"
        devices: dict[str, Any] = json.loads(path.read_text())["devices"] if path.exists() else {}
        return devices

    def ledger(self) -> list[dict[str, Any]]:
        """The engine's allocation records on disk (its snapshot and journal)."""
        return read_ledger_records(resource_state_dir(self._daemon().state_dir, RESOURCE) / "ledger.json", RESOURCE)

    def released(self, device: str) -> bool:
        """The engine dropped every allocation of ``device`` and the driver holds it no more."""
        held = any(device in r["devices"] or device in r["pending"] for r in self.ledger())
        return not held and device not in self.driver_state()

    def status(self) -> dict[str, Any]:
        path = self._daemon().state_dir / "status.json"
        pid = self._daemon().process.pid

        def read() -> dict[str, Any] | None:
            try:
                data: dict[str, Any] = json.loads(path.read_text())
            except (FileNotFoundError, ValueError):
                return None
            return data if data.get("pid") == pid else None

        found: dict[str, Any] = self.wait(read, what="the status file of the running daemon")
        return found

    def reason(self, device: str) -> str | None:
        """Why ``device`` is unhealthy, as ``devplug status`` shows it (``None``: no reason given)."""
        for dev in self.status()["resources"][0]["devices"]:
            if dev["id"] == device:
                found: str | None = dev.get("reason")
                return found
        return None

    def log(self) -> str:
        return self._daemon().process.log_text()

    # --- waiting

    def wait(self, predicate: Callable[[], Any], timeout: float = WAIT, what: str = "") -> Any:
        def details() -> str:
            lines = [f"kubelet view: {self.healths()}"]
            if self.daemon is not None:
                lines.append(f"ledger: {self.ledger()}")
                lines.append(f"driver state: {self.driver_state()}")
                lines.append(f"tool calls: {self.tool.calls()[-10:]}")
                lines.append("--- daemon log (tail) ---")
                lines.extend(self.log().splitlines()[-40:])
            return "\n".join(lines)

        return poll_until(predicate, timeout, what, details)


@pytest.fixture
def lab(devplug_root: Path, dev_kubelet: DevKubeletThread, devplug_daemon: Callable[..., RunningDaemon]) -> Lab:
    """The bench; daemons it started are stopped (SIGTERM, must exit 0) by ``devplug_daemon``."""
    return Lab(devplug_root, dev_kubelet, devplug_daemon)


@pytest.fixture
def tool(tmp_path: Path) -> FakeTool:
    """The fake vendor tool alone, in ``tmp_path/tool``."""
    return FakeTool(tmp_path / "tool")
