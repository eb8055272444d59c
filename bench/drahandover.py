"""A DRA node's rolling update (issue 30): the new daemon's start to the old one's exit, and the longest prepare.

``python -m bench.drahandover`` (``--quick``, ``--json``); ``make bench`` reports its figures as the
``dra_handover_*`` keys. One mock resource served through DRA with ``[handover] enabled``: ``devplug run`` as a
child process, the API server stand-in on loopback and the dev kubelet's DRA side (which calls a driver's newest
connected instance, PR #129832). A client thread prepares and unprepares claims back to back, one claim per call,
each call to the instance the dev kubelet would call then. After ``steady`` rounds (the floor: their prepare p99,
measured in the same run), ``handovers`` times a second ``devplug run`` on the same config takes the node over;
each sample runs from just before its process is created to the old process's exit. The prepares whose call
overlapped such a window give the longest wait. A call that fails is an error of the run, never a sample.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from bench.dra import DEVICES, DraStub, allocated_claims
from bench.scenarios.handover import handover_figures
from bench.stats import percentile

__all__ = ["measure"]

RESOURCE = "example.com/mock"
DRIVER = "mock.example.com"


class _PrepareLoop:
    """Prepares then unprepares each claim in turn, at the instance the kubelet would call, until stopped."""

    def __init__(self, endpoint: Any, claims: list[tuple[str, str]], namespace: str) -> None:
        self._endpoint = endpoint  # () -> the current instance's socket path
        self.claims, self.namespace = claims, namespace
        self.prepares: list[tuple[float, float]] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        stubs: dict[str, DraStub] = {}
        try:
            i = 0
            while not self.stop.is_set():
                name, uid = self.claims[i % len(self.claims)]
                i += 1
                for prepare in (True, False):
                    sock = self._endpoint()
                    stub = stubs.get(sock) or stubs.setdefault(sock, DraStub(Path(sock)))
                    start = time.time()
                    try:
                        if prepare:
                            stub.prepare(self.namespace, name, uid)
                        else:
                            stub.unprepare(self.namespace, name, uid)
                    except Exception as exc:  # a refused or failed call is a result: reported
                        self.errors.append(f"{'prepare' if prepare else 'unprepare'} {name}: {exc}")
                        return
                    if prepare:
                        self.prepares.append((start, time.time()))
        finally:
            for stub in stubs.values():
                stub.close()


async def _measure(root: Path, handovers: int, steady: int, daemon_env: Mapping[str, str]) -> dict[str, float]:
    from devplug.testing.apiserver import ApiServer
    from devplug.testing.dranode import NS, dra_node
    from devplug.testing.process import DaemonProcess

    folder = root / "mock"
    folder.mkdir()
    for i in range(DEVICES):
        (folder / f"mock{i}").write_text("")
    table = {"driver": "mock", "options": {"directory": str(folder)}}
    loop = asyncio.get_running_loop()
    with ApiServer() as api:
        handover = {"enabled": True}
        async with dra_node(api, RESOURCE, table, folder, driver=DRIVER, env=daemon_env, handover=handover) as node:
            await node.published(DEVICES)
            claims = allocated_claims(node, DEVICES)

            async def newest() -> str:
                connected = [v for v in node.kubelet.dra_plugins(DRIVER) if v.connected]
                return connected[-1].endpoint if connected else node.kubelet.dra_plugins(DRIVER)[-1].endpoint

            def endpoint() -> str:
                answer: Future[str] = asyncio.run_coroutine_threadsafe(newest(), loop)
                return answer.result(30)

            calls = _PrepareLoop(endpoint, claims, NS)
            worker = threading.Thread(target=calls.run, name="bench-prepares")
            worker.start()
            windows: list[tuple[float, float]] = []
            try:
                while len(calls.prepares) < steady and worker.is_alive():
                    await asyncio.sleep(0.01)
                floor = percentile([1000.0 * (end - start) for start, end in calls.prepares], 99)
                current = node.daemon
                assert current is not None
                for hop in range(handovers):
                    successor = DaemonProcess(
                        node.config_path,
                        node.root / f"daemon-{hop}.log",
                        log_level="info",
                        env={**node.env, "DEVPLUG_INSTANCE": f"b{hop}"},
                    )
                    started = time.time()
                    successor.start()
                    code = await asyncio.to_thread(current.wait, 90.0)
                    exited = time.time()
                    node.daemon = successor  # stopped by dra_node at the end, whatever happens next
                    if code != 0:
                        tail = current.log_text()[-4000:]
                        raise RuntimeError(f"the old daemon did not hand over and exit 0:\n{tail}")
                    windows.append((started, exited))
                    current = successor
                    await node.registered()
            finally:
                calls.stop.set()
                await asyncio.to_thread(worker.join, 60)
    if calls.errors:
        raise RuntimeError(f"{len(calls.errors)} DRA call(s) failed during the handovers: {calls.errors[:3]}")
    return handover_figures(calls.prepares, windows, floor, call="prepare", prefix="dra_")


def measure(handovers: int, steady: int, daemon_env: Mapping[str, str] | None = None) -> dict[str, float]:
    """The figures of ``handovers`` handovers after ``steady`` prepares, in a fresh folder under /tmp (socket paths
    hold 107 bytes); ``daemon_env``: added to every daemon's environment (``bench.compare``'s other tree)."""
    with tempfile.TemporaryDirectory(prefix="devplug-bench-drahand-", dir="/tmp") as tmp:
        return asyncio.run(_measure(Path(tmp), handovers, steady, dict(daemon_env or {})))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.drahandover")
    parser.add_argument("--quick", action="store_true", help="a tiny run (checks the benchmark works)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    from bench.settings import FULL, QUICK

    s = QUICK if args.quick else FULL
    figures = measure(s.handovers, s.handover_steady_calls)
    if args.json:
        print(json.dumps(figures, indent=1))
        return
    for key, value in figures.items():
        print(f"{key:40} {value:10.2f}")


if __name__ == "__main__":
    main()
