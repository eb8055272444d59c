"""Fixtures for the end-to-end lifecycle suite (issue 3): a real ``devplug run`` child process,
the dev kubelet over real unix sockets, the mock driver's device files and call log.

Test modules cannot import helper modules (``--import-mode=importlib``), so
everything shared lives here, reached through the ``lab`` and ``wait_until``
fixtures.

Timing rule of the suite: waits are polls until a condition holds
(:func:`poll_until`), never sleeps. The one exception is
:meth:`Lab.quiet`, the window a *negative* assertion needs ("nothing was
released"), which is always paired with evidence that the daemon was active
during it where such evidence exists.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.devkubelet import ContainerSpec, DevKubeletThread, KubeletEvent, PodSpec, ResourceView
from devplug.engine.journal import segments
from devplug.engine.ledger import FORMAT_VERSION, read_ledger_records
from devplug.kube.names import resource_state_dir, socket_file_name
from devplug.testing.plugin import RunningDaemon
from devplug.testing.waiting import poll_until as kit_poll_until
from devplug_mock import read_calls

#: The resource every test serves (a second one, when needed, is ``RESOURCE_B``).
RESOURCE = "example.com/mock"
RESOURCE_B = "example.com/other"

#: Reconciler interval for the suite: short, so releases are quick; far under the kubelet's rate limit.
INTERVAL = 0.1
#: Default grace period; tests about the grace period set their own.
GRACE = 1.0


def poll_until(
    predicate: Callable[[], Any],
    timeout: float = 10.0,
    what: str = "",
    *,
    interval: float = 0.02,
    details: Callable[[], str] | None = None,
) -> Any:
    """The kit's :func:`devplug.testing.waiting.poll_until`, with this suite's argument order and a 10 s default."""
    __tracebackhide__ = True
    return kit_poll_until(predicate, what or repr(predicate), timeout, details, interval=interval)


@pytest.fixture
def wait_until() -> Callable[..., Any]:
    """``wait_until(predicate, timeout=10, what="...")``: poll until true, or fail naming what was awaited."""
    return poll_until


class Lab:
    """One test's bench: the dev kubelet, a daemon factory, mock device folders, and what to observe."""

    def __init__(self, root: Path, kubelet: DevKubeletThread, factory: Callable[..., RunningDaemon]) -> None:
        self.root = root
        self.kubelet = kubelet
        self.factory = factory
        self.daemon: RunningDaemon | None = None
        self.dirs: dict[str, Path] = {RESOURCE: root / "mock", RESOURCE_B: root / "mock-b"}

    # --- configuring and starting

    def mock_dir(self, resource: str = RESOURCE) -> Path:
        return self.dirs[resource]

    def device_file(self, device: str, resource: str = RESOURCE) -> Path:
        return self.mock_dir(resource) / device

    def write_device(self, device: str, *lines: str, resource: str = RESOURCE) -> None:
        """Set a mock device file's directives (read by the mock at each hook call)."""
        path = self.device_file(device, resource)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{line}\n" for line in lines))

    def resource_table(self, resource: str = RESOURCE, count: int = 4, **extra: Any) -> dict[str, Any]:
        return {"driver": "mock", "options": {"directory": str(self.mock_dir(resource)), "count": count}, **extra}

    def start(
        self,
        resources: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        release_interval: float = INTERVAL,
        grace_period: float = GRACE,
        **options: Any,
    ) -> RunningDaemon:
        """Start ``devplug run`` (default: one mock resource of 4 devices) and wait for its registration."""
        if resources is None:
            resources = {RESOURCE: self.resource_table()}
        daemon = self.factory(resources, release_interval=release_interval, grace_period=grace_period, **options)
        self.daemon = daemon
        for name in resources:
            self.wait_advertised(name)
        return daemon

    def _current(self, daemon: RunningDaemon | None) -> RunningDaemon:
        daemon = daemon or self.daemon
        assert daemon is not None, "no daemon started"
        return daemon

    def restart_process(self, daemon: RunningDaemon | None = None) -> None:
        """Start the (stopped or killed) daemon again on the same config; wait until it registered again."""
        daemon = self._current(daemon)
        assert not daemon.process.running(), "the daemon is still running"
        names = list(daemon.config["resources"])
        counts = {name: self.kubelet.registrations(name) for name in names}
        daemon.process.start()
        for name in names:
            try:
                self.kubelet.wait_registered(name, timeout=15.0, after=counts[name])
            except TimeoutError as exc:
                pytest.fail(f"{exc}\n--- daemon log ---\n{daemon.process.log_text()}", pytrace=False)
        for name in names:
            self.wait_advertised(name)

    def kill(self, daemon: RunningDaemon | None = None) -> None:
        """SIGKILL the daemon process: the crash it must survive."""
        self._current(daemon).process.kill()

    # --- the kubelet's side

    def view(self, resource: str = RESOURCE) -> ResourceView:
        view = self.kubelet.resource(resource)
        assert view is not None, f"{resource} never registered"
        return view

    def wait_advertised(self, resource: str = RESOURCE) -> None:
        """Wait until the latest registration's ListAndWatch delivered its first device list."""

        def listed() -> bool:
            kinds = [e.kind for e in self.kubelet.events if e.resource == resource]
            if "register" not in kinds:
                return False
            last = len(kinds) - 1 - kinds[::-1].index("register")
            return "list-and-watch" in kinds[last:]

        self.wait(listed, what=f"{resource}'s first device list after its registration")

    def health(self, device: str, resource: str = RESOURCE) -> str | None:
        dev = self.view(resource).device(device)
        return None if dev is None else dev.health

    def admit(self, pod: str, count: int = 1, resource: str = RESOURCE) -> tuple[str, ...]:
        """Admit a one-container pod asking ``count`` devices; return the devices it got."""
        admitted = self.kubelet.admit_pod(PodSpec(pod, [ContainerSpec("app", {resource: count})]))
        return admitted.container("app").devices[resource]

    def events(self, kind: str, resource: str = RESOURCE, since: float = 0.0) -> list[KubeletEvent]:
        return [e for e in self.kubelet.events if e.kind == kind and e.resource == resource and e.time >= since]

    # --- the driver's side (the mock's call log)

    def calls(
        self, hook: str | None = None, device: str | None = None, *, ok: bool | None = True, resource: str = RESOURCE
    ) -> list[dict[str, Any]]:
        """Recorded calls of ``hook`` touching ``device``; ``ok``: True successes, False failures, None all."""
        return [
            c
            for c in read_calls(self.mock_dir(resource))
            if (hook is None or c["hook"] == hook)
            and (device is None or device in c["device_ids"])
            and (ok is None or ok == ("error" not in c))
        ]

    def count(self, hook: str, device: str, resource: str = RESOURCE) -> int:
        """How many successful calls of ``hook`` touched ``device``."""
        return len(self.calls(hook, device, resource=resource))

    def driver_holds(self, device: str, resource: str = RESOURCE) -> bool:
        """Whether the driver's last completed allocate/deallocate of ``device`` was an allocate."""
        last = None
        for call in self.calls(device=device, resource=resource):
            if call["hook"] in ("allocate", "deallocate"):
                last = call["hook"]
        return last == "allocate"

    def wait_released(self, device: str, times: int = 1, resource: str = RESOURCE, timeout: float = 10.0) -> None:
        """Wait until ``device`` had ``times`` successful deallocates."""
        self.wait(
            lambda: self.count("deallocate", device, resource) >= times,
            timeout,
            what=f"{device} of {resource} to be deallocated {times} time(s)",
        )

    def wait_seen(self, device: str, pod: str | None = None, resource: str = RESOURCE) -> None:
        """Wait until the reconciler saw ``device`` in PodResources: its ledger record names the pod."""

        def seen() -> bool:
            record = self.ledger_record(device, resource)
            if record is None or record["pod"] is None:
                return False
            return pod is None or record["pod"] == f"default/{pod}"

        self.wait(seen, what=f"the ledger to record {device} of {resource} as held by {pod or 'a pod'}")

    # --- the daemon's files

    def state_dir(self, daemon: RunningDaemon | None = None) -> Path:
        return self._current(daemon).state_dir

    def ledger_path(self, resource: str = RESOURCE, daemon: RunningDaemon | None = None) -> Path:
        return resource_state_dir(self._current(daemon).state_dir, resource) / "ledger.json"

    def ledger(self, resource: str = RESOURCE) -> list[dict[str, Any]]:
        """The allocation records on disk, snapshot and journal (empty when there is no ledger yet)."""
        return read_ledger_records(self.ledger_path(resource), resource)

    def rewrite_ledger(self, records: list[dict[str, Any]], resource: str = RESOURCE) -> None:
        """Replace the (stopped) daemon's ledger by a snapshot of ``records`` and no journal."""
        for _, segment in segments(self.ledger_path(resource)):
            segment.unlink()
        data = {"format": FORMAT_VERSION, "resource": resource, "journal_seq": 0, "allocations": records}
        self.ledger_path(resource).write_text(json.dumps(data))

    def delete_ledger(self, resource: str = RESOURCE) -> None:
        """Lose the (stopped) daemon's ledger: the snapshot and every journal segment."""
        for _, segment in segments(self.ledger_path(resource)):
            segment.unlink()
        self.ledger_path(resource).unlink(missing_ok=True)

    def ledger_record(self, device: str, resource: str = RESOURCE) -> dict[str, Any] | None:
        for record in self.ledger(resource):
            if device in record["devices"] or device in record["pending"]:
                return record
        return None

    def status(self) -> dict[str, Any]:
        """The running daemon's status file (what ``devplug status`` reads), once this process wrote it.

        The daemon writes it shortly after start and after changes (debounced), so
        right after a restart the file may be missing or still the dead process's.
        """
        path = self.state_dir() / "status.json"
        pid = self._current(None).process.pid

        def read() -> dict[str, Any] | None:
            try:
                data: dict[str, Any] = json.loads(path.read_text())
            except FileNotFoundError:
                return None
            return data if data.get("pid") == pid else None

        found: dict[str, Any] = self.wait(read, what=f"{path} written by pid {pid}")
        return found

    def resource_status(self, resource: str = RESOURCE) -> dict[str, Any]:
        for res in self.status()["resources"]:
            if res["name"] == resource:
                found: dict[str, Any] = res
                return found
        raise AssertionError(f"{resource} not in the status file")

    def status_command(self) -> subprocess.CompletedProcess[str]:
        """``devplug status --state-dir`` of the running daemon, as an operator runs it (a new Python process)."""
        return subprocess.run(
            [sys.executable, "-m", "devplug", "status", "--state-dir", str(self.state_dir())],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def log(self) -> str:
        return self._current(None).process.log_text()

    # --- plugin socket (what the kubelet dials), for direct gRPC calls

    def plugin_socket(self, resource: str = RESOURCE) -> Path:
        daemon = self._current(None)
        plugin_dir = Path(daemon.config["kubelet"]["device_plugin_dir"])
        return plugin_dir / socket_file_name(resource, len(str(plugin_dir)))

    def grpc_call(self, method: str, request: Any, response_type: Any, resource: str = RESOURCE) -> Any:
        """Call ``/v1beta1.DevicePlugin/<method>`` on the plugin's socket, as the kubelet would."""
        with grpc.insecure_channel(f"unix:{self.plugin_socket(resource)}") as channel:
            call = channel.unary_unary(
                f"/v1beta1.DevicePlugin/{method}",
                request_serializer=type(request).SerializeToString,
                response_deserializer=response_type.FromString,
            )
            return call(request, timeout=15.0)

    def allocate(self, *devices: str, resource: str = RESOURCE) -> Any:
        """A direct Allocate for one container (no pod behind it)."""
        request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=list(devices))])
        return self.grpc_call("Allocate", request, dp.AllocateResponse, resource)

    # --- waiting

    def wait(self, predicate: Callable[[], Any], timeout: float = 10.0, what: str = "") -> Any:
        """:func:`poll_until`, with the kubelet's view, the ledger and the daemon log's tail on failure."""

        def details() -> str:
            lines: list[str] = []
            for name in self.dirs:
                view = self.kubelet.resource(name)
                if view is not None:
                    lines.append(f"kubelet view of {name}: {view.devices} in_use={sorted(view.in_use)}")
            if self.daemon is not None:
                lines.append(f"ledger: {self.ledger()}")
                try:
                    lines.append(f"calls: {read_calls(self.mock_dir())[-12:]}")
                except OSError as exc:  # a test may have replaced the mock's folder
                    lines.append(f"calls: unreadable ({exc})")
                lines.append("--- daemon log (tail) ---")
                lines.extend(self.log().splitlines()[-40:])
            return "\n".join(lines)

        return poll_until(predicate, timeout, what, details=details)

    @staticmethod
    def quiet(seconds: float) -> None:
        """Let time pass for a negative assertion (nothing happened meanwhile); never used to synchronise."""
        time.sleep(seconds)


@pytest.fixture
def lab(devplug_root: Path, dev_kubelet: DevKubeletThread, devplug_daemon: Callable[..., RunningDaemon]) -> Lab:
    """The bench; daemons it started are stopped (SIGTERM, must exit 0) by ``devplug_daemon``."""
    return Lab(devplug_root, dev_kubelet, devplug_daemon)
