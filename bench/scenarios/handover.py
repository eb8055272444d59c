"""A rolling update's handover (issue 30): the new daemon's start to the old one's exit, and the longest Allocate wait.

Calls are held from the old daemon's pause until the new one serves: that wait is the new daemon's driver start,
ledger load and registration (drivers of two instances never run at once).

One mock resource served with ``[handover] enabled``, behind the dev kubelet (endpoints keyed by socket path, as
kubelets with Kubernetes PR #135437). A client thread sends one-device Allocates back to back (each followed by the
KEP's Deallocate of that device, so 1,000 devices last), each to the socket the kubelet registered last (what the
kubelet would call). Then, ``settings.handovers`` times, a second ``devplug
run`` on the same config starts as a new instance and takes the node over; the sample runs from just before its
process is created to the old process's exit (seen by a thread waiting on it). The Allocates whose call overlapped
that window give the longest wait; the same client's Allocates before the first handover give the floor (their
p99), measured in the same run.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from bench.client import PluginClient
from bench.scenarios import lifecycle
from bench.settings import Settings
from bench.stats import percentile
from bench.workspace import Node
from devplug.devkubelet import DevKubeletThread
from devplug.testing.process import DaemonProcess

__all__ = ["handover_figures", "measure"]


class _AllocateLoop:
    """Allocates one device per call, to the kubelet's current endpoint, until stopped; (start, end) per call."""

    def __init__(self, node: Node, kubelet: DevKubeletThread, resource: str, devices: int) -> None:
        self.node, self.kubelet, self.resource = node, kubelet, resource
        self.next_device = 0
        self.devices = devices
        self.calls: list[tuple[float, float]] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def _socket(self) -> Path:
        view = self.kubelet.resource(self.resource)
        if view is None:
            raise RuntimeError(f"{self.resource} is not registered")
        return self.node.plugin_dir / view.endpoint

    def run(self) -> None:
        clients: dict[Path, PluginClient] = {}
        try:
            while not self.stop.is_set():
                socket = self._socket()
                client = clients.get(socket) or clients.setdefault(socket, PluginClient(socket))
                device = f"mock{self.next_device % self.devices}"
                self.next_device += 1
                start = time.time()
                try:
                    client.allocate_ids([device])
                except Exception as exc:  # a refused Allocate is a result: counted, reported
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                self.calls.append((start, time.time()))
                self._give_back(clients, device)
        finally:
            for client in clients.values():
                client.close()

    def _give_back(self, clients: dict[Path, PluginClient], device: str) -> None:
        """The KEP's Deallocate of ``device`` at the current endpoint, so the supply never runs out. Not what a
        kubelet calls: tried again (at most 3 times) when the instance it reached left meanwhile."""
        for attempt in range(3):
            socket = self._socket()
            client = clients.get(socket) or clients.setdefault(socket, PluginClient(socket))
            try:
                client.deallocate([device])
                return
            except Exception as exc:
                if attempt == 2:
                    self.errors.append(f"Deallocate: {type(exc).__name__}: {exc}")
                time.sleep(0.05)


def _note_exit(process: DaemonProcess, exited: list[float]) -> None:
    """Wait for ``process`` to exit; append when (``time.time()``)."""
    process.wait(60)
    exited.append(time.time())


def measure(settings: Settings, node: Node, kubelet: DevKubeletThread) -> dict[str, float]:
    resource = next(iter(node.config["resources"]))
    loop = _AllocateLoop(node, kubelet, resource, settings.handover_devices)
    worker = threading.Thread(target=loop.run, name="bench-allocates")
    worker.start()
    windows: list[tuple[float, float]] = []
    try:
        while len(loop.calls) < settings.handover_steady_calls and worker.is_alive():
            time.sleep(0.01)
        steady = [1000.0 * (end - start) for start, end in loop.calls]
        current = node.process
        for hop in range(settings.handovers):
            successor = DaemonProcess(
                node.config_path,
                node.root / f"daemon-{hop}.log",
                log_level="info",
                env={**current.env, "DEVPLUG_INSTANCE": f"b{hop}"},  # the same tree's code as the node's daemon
            )
            exited: list[float] = []
            waiter = threading.Thread(target=_note_exit, args=(current, exited))
            started = time.time()
            successor.start()
            waiter.start()
            waiter.join(90)
            if not exited or current.process is None or current.process.returncode != 0:
                successor.kill()  # never left running: the workspace stops only node.process
                raise RuntimeError(f"the old daemon did not hand over and exit 0:\n{current.log_text()[-4000:]}")
            windows.append((started, exited[0]))
            node.process = current = successor  # the workspace stops it at the end
            lifecycle.wait_streams(kubelet, [resource])
    finally:
        loop.stop.set()
        worker.join(60)
    if loop.errors:
        raise RuntimeError(f"{len(loop.errors)} Allocate(s) failed during the handovers: {loop.errors[:3]}")
    return handover_figures(loop.calls, windows, percentile(steady, 99), call="allocate")


def handover_figures(
    calls: list[tuple[float, float]],
    windows: list[tuple[float, float]],
    floor_ms: float,
    *,
    call: str,
    prefix: str = "",
) -> dict[str, float]:
    """The figures of handovers (``windows``: each one's start and end, ``time.time()``) timed beside a client's
    ``calls`` (start and end of each), whose p99 before the first handover was ``floor_ms``: keys
    ``<prefix>handover_ms``, ``..._max_ms``, ``<prefix>handover_<call>_wait_max_ms`` (the longest call overlapping
    a handover), its ``steady_p99_ms`` and ``wait_ratio``, and ``<prefix>handovers``."""
    waits = [
        1000.0 * (end - start)
        for start, end in calls
        if any(start < window_end and end > window_start for window_start, window_end in windows)
    ]
    if not waits:
        raise RuntimeError(f"no {call} call overlapped a handover: the client was too slow to measure it")
    spans = [1000.0 * (end - start) for start, end in windows]
    longest = max(waits)
    return {
        f"{prefix}handover_ms": percentile(spans, 50),
        f"{prefix}handover_max_ms": max(spans),
        f"{prefix}handover_{call}_wait_max_ms": longest,
        f"{prefix}handover_{call}_steady_p99_ms": floor_ms,
        f"{prefix}handover_{call}_wait_ratio": longest / floor_ms,
        f"{prefix}handovers": float(len(windows)),
    }
