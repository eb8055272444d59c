"""devplug-shared: a slot freed on one node until it is claimable (admitted) on another, against Akri's 10-30 s.

Part of ``python -m bench`` (its last phase); run it alone with::

    .venv/bin/python -m bench.scenarios.shared [--handovers N] [--etcd URL]

Two nodes (dev kubelet + ``devplug run`` each) share one device of capacity 1
through the local SQLite store (or etcd). Each hand-over: a pod on one node
holds the slot; the clock starts when the pod is deleted (``remove_pod``
returned: it is gone from PodResources); the other node then tries to admit a
pod every 5 ms (after the first node's daemon saw the pod in PodResources, so
no grace period applies), and the clock stops when one is admitted with the slot. The
path measured is the engine's release (a PodResources poll every
``[release] interval``, then ``deallocate`` deleting the claim) plus the other
node's next read of the store (``refresh_interval``) and its ListAndWatch
update. Measured with the defaults (both 1.0 s) and with both at 0.1 s.
Akri's anchor: its reclaimer polls every 10 s with a 20 s grace.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.stats import percentile
from devplug.engine.ledger import read_ledger_records
from devplug.errors import KubeletError
from devplug.kube.names import resource_state_dir

# The shared driver's demo, whose nodes this measures, runs on the test kit, so it sits beside the driver's package
# (drivers/shared/demo), not in it, and is not installed: found from the checkout, however bench is started.
_DEMO = Path(__file__).resolve().parents[2] / "drivers" / "shared" / "demo"
if str(_DEMO) not in sys.path:
    sys.path.append(str(_DEMO))

from shared_demo import RESOURCE, SharedNode  # noqa: E402

__all__ = ["measure"]


def _seen(node: SharedNode) -> bool:
    """Whether the node's ledger shows every allocation seen in PodResources."""
    records = read_ledger_records(resource_state_dir(node.state_dir, RESOURCE) / "ledger.json", RESOURCE)
    return bool(records) and all(r.get("seen_at") is not None for r in records)


def _handover(giver: SharedNode, taker: SharedNode, pod: str, timeout: float = 30.0) -> tuple[float, str]:
    """One hand-over from ``giver`` to ``taker``: (milliseconds, the taker's admitted pod)."""
    giver.take(f"{pod}-held")
    deadline = time.monotonic() + timeout
    while "Unhealthy" not in taker.view():  # the taker knows the slot is taken before the clock starts
        if time.monotonic() > deadline:
            raise TimeoutError(f"{taker.name} never saw the slot taken")
        time.sleep(0.005)
    while not _seen(giver):  # as in release.py: the daemon saw the pod in PodResources (no grace period left)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{giver.name}'s ledger never saw {pod}-held")
        time.sleep(0.005)
    started = time.monotonic()
    giver.remove(f"{pod}-held")
    tries = 0
    while True:
        tries += 1
        try:
            taker.take(f"{pod}-take-{tries}")
            return (time.monotonic() - started) * 1000, f"{pod}-take-{tries}"
        except KubeletError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def measure(handovers: int = 10, etcd: str | None = None) -> dict[str, Any]:
    """The results.json keys: hand-over p50/p99 (ms) with default and fast intervals."""
    out: dict[str, Any] = {}
    for label, interval in (("default", 1.0), ("fast", 0.1)):
        root = Path(tempfile.mkdtemp(prefix="dp-bench-shared-", dir="/tmp"))
        if etcd is None:
            coordination: dict[str, Any] = {"backend": "local", "path": str(root / "slots.sqlite")}
        else:
            coordination = {"backend": "etcd", "endpoints": [etcd], "prefix": f"/devplug-bench/{root.name}"}
        nodes = [
            SharedNode(n, root / n, coordination, capacity=1, refresh_interval=interval, release_interval=interval)
            for n in ("node-a", "node-b")
        ]
        try:
            for node in nodes:
                node.start()
            samples = []
            for i in range(handovers):
                giver, taker = nodes[i % 2], nodes[(i + 1) % 2]
                millis, taken = _handover(giver, taker, f"h{i}")
                samples.append(millis)
                taker.remove(taken)
        finally:
            for node in nodes:
                node.close()
            shutil.rmtree(root, ignore_errors=True)
        out[f"shared_handover_p50_ms_{label}"] = round(percentile(samples, 50), 1)
        out[f"shared_handover_p99_ms_{label}"] = round(percentile(samples, 99), 1)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scenarios.shared", description=__doc__.splitlines()[0])
    parser.add_argument("--handovers", type=int, default=10)
    parser.add_argument("--etcd", metavar="URL")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.handovers, args.etcd), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
