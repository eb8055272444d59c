"""``devplug demo --api dra``: the mock driver served as a DRA kubelet plugin, on a machine without a cluster.

Everything runs on this machine, in a temporary folder: the API server and
scheduler stand-ins (:mod:`devplug.testing.apiserver`, over HTTP on loopback),
``devplug run`` as a child process serving the mock driver with ``api = "dra"``
(the same driver, unchanged), and the dev kubelet's DRA side
(:mod:`devplug.testing.dranode`). The demo publishes the devices, schedules a
pod with a claim, has the kubelet prepare it (the claim's CDI spec written),
turns a device unhealthy with a reason the kubelet shows, restarts the kubelet,
ends the pod (the claim unprepared: post-stop and deallocate once), and stops
the daemon. It prints what happened as a table, then the checks it made.
"""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from devplug.errors import ConfigError
from devplug.kit.hookrecord import read_hook_calls

__all__ = ["run_dra_demo"]

Echo = Callable[[str], None]

RESOURCE = "example.com/mock"
DRIVER = "mock.example.com"


class _Checks:
    def __init__(self, echo: Echo) -> None:
        self.echo = echo
        self.done: list[tuple[str, bool]] = []

    def check(self, what: str, ok: bool) -> bool:
        self.done.append((what, ok))
        return ok


def run_dra_demo(*, keep: bool = False, echo: Echo = print) -> bool:
    """Run the demo; True when every check passed. :class:`ConfigError` when lightkube is not installed."""
    if importlib.util.find_spec("lightkube") is None:
        raise ConfigError(
            "devplug demo --api dra needs the Kubernetes client lightkube: pip install 'devplug[kubernetes]'"
        )
    root = Path(tempfile.mkdtemp(prefix="devplug-dra-demo-", dir="/tmp"))
    checks = _Checks(echo)
    try:
        echo(f"devplug demo (DRA) in {root}")
        echo(f"resource {RESOURCE} served by the mock driver as the DRA driver {DRIVER}\n")
        asyncio.run(asyncio.wait_for(_demo(root, checks), 180))
        _summary(checks)
        ok = all(good for _, good in checks.done)
        if not ok:
            keep = True
        return ok
    finally:
        if keep:
            echo(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


async def _demo(root: Path, checks: _Checks) -> None:
    from devplug.devkubelet.dra.model import HealthStatus
    from devplug.testing.apiserver import ApiServer
    from devplug.testing.dranode import NODE, WaitTimeout, dra_node, eventually

    folder = root / "mock"
    folder.mkdir()
    for name in ("mock0", "mock1", "mock2"):
        (folder / name).write_text("")
    table = {"driver": "mock", "options": {"directory": str(folder)}}
    with ApiServer() as api:
        node = None
        try:
            async with dra_node(api, RESOURCE, table, folder, driver=DRIVER) as node:
                checks.check(
                    "the kubelet registered the DRA driver", any(v.connected for v in node.kubelet.dra_plugins(DRIVER))
                )
                slices = await node.published(3)
                checks.check("3 devices published in the node's ResourceSlices", len(slices) >= 1)
                node.make_claim("demo-claim", config={"mode": "demo"})
                pod, [claim] = node.schedule_pod("demo-pod", ["demo-claim"])
                uid = claim["metadata"]["uid"]
                await node.kubelet.admit_pod(pod)
                [state] = node.kubelet.dra_claims()
                checks.check("the claim prepared (NodePrepareResources)", state.prepared)
                cdi = node.kubelet.container_cdi_devices("demo-pod", "app")
                checks.check(
                    f"the container gets the claim's CDI device {DRIVER}/claim={uid}-dev",
                    cdi == [f"{DRIVER}/claim={uid}-dev"],
                )
                spec = node.spec_of(uid)
                checks.check("the claim's CDI spec names the device", bool(spec["devices"][0]["containerEdits"]))
                allocate = node.calls("allocate")
                checks.check(
                    "the driver's allocate got the claim's opaque config",
                    [c.get("claim", {}).get("config") for c in allocate]
                    == [[{"source": "claim", "requests": ["dev"], "parameters": {"mode": "demo"}}]],
                )

                (folder / "mock2").write_text("unhealthy=demo: ECC errors\n")
                await eventually(
                    lambda: node.kubelet.device_health(DRIVER, NODE, "mock2").health is HealthStatus.UNHEALTHY,
                    "mock2 unhealthy in the kubelet's health cache",
                )
                checks.check(
                    "mock2 unhealthy at the kubelet, with the driver's reason",
                    node.kubelet.device_health(DRIVER, NODE, "mock2").message == "demo: ECC errors",
                )

                await node.kubelet.restart()
                await node.registered()
                await node.published(3)
                checks.check(
                    "after a kubelet restart: registered again, slices published again",
                    any(v.connected for v in node.kubelet.dra_plugins(DRIVER)),
                )

                await node.kubelet.finish_pod("demo-pod")
                checks.check("the pod ended and its claim was unprepared", node.kubelet.dra_claims() == [])
                [device] = node.allocated_devices(claim)
                releases = [
                    (c["hook"], c["device_ids"]) for c in node.calls() if c["hook"] in ("post_stop", "deallocate")
                ]
                checks.check(
                    "post_stop then deallocate, once each",
                    releases == [("post_stop", [device]), ("deallocate", [device])],
                )
                checks.check("the ledger is empty", node.records() == [])
                _table(checks.echo, node, folder)
        except WaitTimeout as exc:
            checks.check(f"{exc}".splitlines()[0], False)
        except AssertionError as exc:  # the daemon did not exit 0
            checks.check(str(exc).splitlines()[0], False)
        else:
            checks.check("the daemon exited 0 on SIGTERM", True)
        if node is not None and not all(ok for _, ok in checks.done):
            checks.echo(f"\ndaemon log: {node.root / 'daemon.log'}")


def _table(echo: Echo, node: object, folder: Path) -> None:
    from devplug.testing.dranode import DraNode

    assert isinstance(node, DraNode)
    rows: list[tuple[float, str, str, str]] = []
    for event in node.kubelet.events:
        if event.kind.startswith("dra") or event.kind in ("restart", "pod-admitted", "pod-finished"):
            rows.append((event.time, "kubelet", event.kind, event.detail))
    for call in read_hook_calls(folder):
        if call.hook != "preferred_allocation":
            rows.append((call.time, "driver", call.hook, ",".join(call.device_ids)))
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0] if rows else time.time()
    echo(f"{'time':>8}  {'who':<7}  {'event':<24}  detail")
    echo(f"{'-' * 8}  {'-' * 7}  {'-' * 24}  {'-' * 40}")
    for stamp, who, kind, detail in rows:
        echo(f"{stamp - t0:8.3f}  {who:<7}  {kind:<24}  {detail[:80]}")


def _summary(checks: _Checks) -> None:
    checks.echo("")
    for what, ok in checks.done:
        checks.echo(f"  [{'ok' if ok else 'FAILED'}] {what}")
    passed = sum(ok for _, ok in checks.done)
    checks.echo(f"\n{passed}/{len(checks.done)} checks passed")
