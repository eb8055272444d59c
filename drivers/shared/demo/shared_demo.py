"""``python drivers/shared/demo/shared_demo.py``: two nodes share one device with ``capacity = 2``; a third pod waits.

Everything runs on this machine, in a temporary folder, without a cluster:
two nodes, each a dev kubelet (devplug's stand-in for the kubelet's device
manager) and a real ``devplug run`` daemon serving ``example.com/camera`` with
the shared driver; the device ``camera`` is found by the ``static`` handler and
its two slots are coordinated through the ``local`` backend (one SQLite file
both daemons use), or through etcd with ``--etcd http://127.0.0.1:2379``.

1. pod-1 on node-a gets a slot; node-b's kubelet sees that slot unhealthy;
2. pod-2 on node-b gets the other slot;
3. pod-3 on node-a waits: no slot is free anywhere (admission is retried, as
   the scheduler would keep the pod pending);
4. pod-2 ends on node-b: its claim is deleted at once and pod-3 gets the slot
   on node-a, with the time from deletion to admission.

It runs on devplug's test kit (the devplug-testing distribution), so it lives beside the driver's package, not in
it: the driver's wheel and the image carry no demo (issue 39).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from devplug.devkubelet import KubeletError
from devplug.testing.demos import run_in_folder
from devplug.testing.nodes import LocalNode, wait_for
from devplug_shared.status import render, status_files

__all__ = ["RESOURCE", "SharedNode", "main", "run_demo"]

RESOURCE = "example.com/camera"


class SharedNode(LocalNode):
    """One node on this machine serving :data:`RESOURCE` with the shared driver (the demo's and the benchmark's).

    A :class:`devplug.testing.nodes.LocalNode`: its own dev kubelet and ``devplug run``.
    """

    def __init__(
        self,
        name: str,
        root: Path,
        coordination: dict[str, Any],
        *,
        capacity: int = 2,
        refresh_interval: float = 0.2,
        release_interval: float = 0.2,
    ) -> None:
        options = {
            "node_name": name,
            "capacity": capacity,
            "refresh_interval": refresh_interval,
            "discovery": {"handler": "static", "devices": ["camera"]},
            "coordination": coordination,
        }
        resources = {RESOURCE: {"driver": "shared", "options": options}}
        super().__init__(name, root, resources, release_interval=release_interval)

    def view(self) -> str:
        """The kubelet's view of the slots, as text."""
        return ", ".join(f"{slot} {health}" for slot, health in self.devices(RESOURCE).items())

    def take(self, pod: str) -> str:
        """Admit a one-container pod asking one slot; its slot (KubeletError when rejected)."""
        return ", ".join(self.admit(pod, {RESOURCE: 1})[RESOURCE])

    def status(self) -> str:
        """What ``python -m devplug_shared.status`` prints for this node."""
        path = status_files(self.config_path)[RESOURCE]
        return render(json.loads(path.read_text()))

    def holder_of(self, slot: str) -> str | None:
        """The holder of ``slot`` in this node's status file (what it last read from the store)."""
        try:
            data = json.loads(status_files(self.config_path)[RESOURCE].read_text())
        except (OSError, ValueError):
            return None
        return next((s.get("holder") for s in data.get("slots", []) if s.get("slot") == slot), None)


def _holds(node: SharedNode, slot: str, holder: str) -> Callable[[], bool]:
    return lambda: node.holder_of(slot) == holder


def _say(text: str) -> None:
    print(text, flush=True)


def run_demo(root: Path, etcd: str | None = None) -> dict[str, Any]:
    """Run the demo in ``root``; returns what happened (slots per pod, the wait, the hand-over time)."""
    if etcd is None:
        coordination: dict[str, Any] = {"backend": "local", "path": str(root / "slots.sqlite"), "lease_ttl": 10.0}
    else:
        coordination = {"backend": "etcd", "endpoints": [etcd], "prefix": f"/devplug-demo/{root.name}"}
    nodes = [SharedNode(name, root / name, coordination) for name in ("node-a", "node-b")]
    a, b = nodes
    result: dict[str, Any] = {}
    try:
        for node in nodes:
            node.start()
            _say(f"{node.name}: daemon registered {RESOURCE}; kubelet sees {node.view()}")
        result["pod-1"] = a.take("pod-1")
        _say(f"node-a: pod-1 admitted with slot {result['pod-1']}")
        wait_for(lambda: f"{result['pod-1']} Unhealthy" in b.view(), "node-b to see pod-1's slot taken")
        _say(f"node-b: kubelet sees {b.view()}  (held by node-a)")
        result["pod-2"] = b.take("pod-2")
        _say(f"node-b: pod-2 admitted with slot {result['pod-2']}")
        wait_for(lambda: f"{result['pod-2']} Unhealthy" in a.view(), "node-a to see pod-2's slot taken")
        waits = 0
        reason = ""
        while waits < 3:  # pod-3 stays pending while both slots are held
            try:
                a.take(f"pod-3-try{waits}")
                raise RuntimeError("demo: pod-3 got a slot while both were held")
            except KubeletError as exc:
                reason = str(exc)
            waits += 1
            time.sleep(0.2)
        result["pod-3-waited"] = reason
        _say(f"node-a: pod-3 waits (no free slot): {reason.split(': ', 1)[-1][:140]}")
        _say("node-b: pod-2 ends")
        ended = time.monotonic()
        b.remove("pod-2")
        tries = 0
        while True:
            tries += 1
            try:
                result["pod-3"] = a.take(f"pod-3-{tries}")
                break
            except KubeletError:
                if time.monotonic() - ended > 20:
                    raise
                time.sleep(0.02)
        result["handover_ms"] = (time.monotonic() - ended) * 1000
        _say(
            f"node-a: pod-3 admitted with slot {result['pod-3']}, {result['handover_ms']:.0f} ms after pod-2 ended "
            "on node-b (Akri's reclaimer: 10-30 s)"
        )
        wait_for(lambda: f"{result['pod-3']} Unhealthy" in b.view(), "node-b to see pod-3's slot taken")
        for node in nodes:
            wait_for(_holds(node, result["pod-3"], "node-a"), f"{node.name}'s status file")
            _say(f"\n$ python -m devplug_shared.status --config {node.config_path}\n{node.status()}")
    finally:
        for node in nodes:
            node.close()
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shared_demo.py", description=__doc__.splitlines()[0])
    parser.add_argument("--etcd", metavar="URL", help="coordinate through this etcd instead of a local SQLite file")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (configs, logs)")
    args = parser.parse_args(argv)
    return run_in_folder(
        "dp-shared-demo-",
        lambda root: run_demo(root, args.etcd),
        keep=args.keep,
        logs="*/daemon.log",
        echo=print,
        complain=lambda line: print(line, file=sys.stderr),
        failures=(KubeletError, TimeoutError, RuntimeError),
    )


if __name__ == "__main__":
    sys.exit(main())
