"""Fixtures for devplug-fpga's tests: the DFL model, a fake vendor tool, and a lab around the real daemon.

The daemon under test is a real ``devplug run`` child process (the
``devplug_daemon`` fixture of devplug's pytest plugin) talking to the dev
kubelet over unix sockets. Its fpga driver reaches the machine through the
DFL model in a temporary folder (``model_root``), which this process shapes
and inspects through its own :class:`~devplug.testing.dflsysfs.DflModel` on the
same files; the ``command`` backend runs :class:`FakeTool`, a real executable (the kit's fake command).

Waits are polls until a condition holds (:meth:`Lab.wait`), never sleeps.
Test modules cannot import helpers, so they reach everything through the
``lab`` fixture.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.devkubelet import ContainerSpec, DevKubeletThread, PodSpec
from devplug.engine.ledger import read_ledger_records
from devplug.kube.names import resource_state_dir, socket_file_name
from devplug.testing.devnodes import make_char_device
from devplug.testing.dflsysfs import DflModel, model_image
from devplug.testing.fakecommand import FakeCommand
from devplug.testing.plugin import RunningDaemon
from devplug.testing.waiting import poll_until

RESOURCE = "example.com/fpga"
CARD = "0000:3b:00.0"
CARD_B = "0000:5e:00.0"
BLANK_AFU = "0b1a4c0000000000000000000000b1a4"
DEFAULT_AFU = "d5fa0100000000000000000000000d5f"
TENANT_AFU = "7e4a47000000000000000000000007e4"
WAIT = 20.0

#: What the fake vendor tool (``fpga-tool <verb> --card A --region R [--image I]``, the kit's
#: :class:`~devplug.testing.fakecommand.FakeCommand`) does to a card: each region's content is kept in
#: ``cards/<address>-<region>``: ``program`` writes the image's name, ``deprogram`` writes ``blank``, ``verify``
#: fails unless the region is blank.
CARD_EFFECT = """
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
        fail(f"region holds {content}, not the blank image")
"""


class FakeTool(FakeCommand):
    """The fake vendor tool in ``folder``: the kit's fake command with the cards' content (:data:`CARD_EFFECT`)."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder, "fpga-tool", effect=CARD_EFFECT)

    def calls(  # type: ignore[override]
        self, verb: str | None = None, event: str | None = None, card: str | None = None
    ) -> list[dict[str, Any]]:
        """The recorded calls of ``verb``, ``event`` and ``card`` (each when given), oldest first."""
        return super().calls(verb, event, {"--card": card} if card is not None else None)

    def content(self, card: str, region: int = 0) -> str | None:
        slot = self.folder / "cards" / f"{card}-{region}"
        return slot.read_text() if slot.exists() else None

    def command(self, verb: str, *extra: str) -> list[str]:
        return self.argv(verb, "--card", "{address}", *extra)


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

        return poll_until(predicate, what or repr(predicate), timeout, details)


@pytest.fixture
def lab(devplug_root: Path, dev_kubelet: DevKubeletThread, devplug_daemon: Callable[..., RunningDaemon]) -> Lab:
    """The bench; daemons it started are stopped (SIGTERM, must exit 0) by ``devplug_daemon``."""
    return Lab(devplug_root, dev_kubelet, devplug_daemon)


@pytest.fixture
def tool(tmp_path: Path) -> FakeTool:
    """The fake vendor tool alone, in ``tmp_path/tool``."""
    return FakeTool(tmp_path / "tool")
