"""Where an Allocate's time goes in service: ``python -m bench.decompose [--quick] [--json PATH] [--keep]``.

``make bench`` says how far Allocate is from the bare grpcio floor; this says
which part of the handler the gap is made of. It runs the 1k Allocate series
of ``make bench`` (4 distinct devices per call from a 1,000-device pool, the
pool freed untimed when used up) against several daemons at once, each with
parts of its Allocate path taken out by :mod:`bench.ablate`, interleaved in
blocks with the bare grpcio floors (aio and sync) and the shipped daemon's
zero-work reply, so every variant sees the same moments of the machine:

- ``shipped``: the daemon as it is;
- ``no-call-record``: without the mock's record of its hook calls;
- ``no-driver``: without the driver's ``allocate`` hook;
- ``core-only``: without the driver's hook, the journal and the answer's encoding: what is left is the core's
  in-memory bookkeeping (checks, device locks, the ledger's records and index, the answer's merge).

Each variant's figure is its p50 and p99 against the floor ``make bench`` uses
(the one of aio and sync with the lower p99), and its handler's on-CPU time
per call (the event loop's thread, around ``DevicePluginService.allocate``).
Before reporting, it checks that each part it took out really was out (no
call-record line, no journal byte, an empty answer), and fails otherwise. A
diagnostic, not a goal: nothing here is compared with a target.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.ablate import AblatedDaemonProcess
from bench.client import ListWatcher, PluginClient
from bench.kubelet import MiniKubelet
from bench.payloads import allocate_request, device_ids
from bench.scenarios.allocate import chosen_floor, devplug_series, floor_clients, floor_series, free_pool, settler
from bench.scenarios.series import CallSeries, interleave
from bench.settings import FULL, QUICK, Settings
from bench.stats import percentile, summary_ms
from bench.workspace import Node, Workspace
from devplug.engine.ledger import read_ledger_records
from devplug.kit.hookrecord import read_hook_calls
from devplug.kube.names import resource_state_dir

__all__ = [
    "VARIANTS",
    "RunningVariant",
    "Variant",
    "check_parts_out",
    "decompose",
    "format_table",
    "main",
    "start_variant",
]

RESOURCE = "bench.dev/d1k"


@dataclass(frozen=True)
class Variant:
    """A daemon with ``parts`` (names of :data:`bench.ablate.PARTS`) taken out."""

    name: str
    parts: tuple[str, ...]
    what: str


VARIANTS = (
    Variant("shipped", (), "the daemon as shipped"),
    Variant("no-call-record", ("call-record",), "without the mock's record of its hook calls"),
    Variant("no-driver", ("driver",), "without the driver's allocate hook"),
    Variant("core-only", ("driver", "journal", "encoding"), "the core's bookkeeping only (no hook, journal, encoding)"),
)


@dataclass
class RunningVariant:
    """A variant's daemon, started and registered, with the channel the series calls through."""

    variant: Variant
    node: Node
    client: PluginClient
    watcher: ListWatcher
    handler_cpu: Path


def start_variant(ws: Workspace, stack: ExitStack, variant: Variant, settings: Settings) -> RunningVariant:
    """Start the daemon of ``variant`` on a node of its own (closed by ``stack``) and wait for its first device list."""
    node = ws.node(variant.name, {RESOURCE: (settings.devices_1k, settings.numa_nodes)}, grace_period=3600)
    handler_cpu = node.root / "handler-cpu.txt"
    node.process = AblatedDaemonProcess(
        node.config_path, node.root / "daemon.log", parts=variant.parts, handler_cpu=handler_cpu
    )
    kubelet = stack.enter_context(MiniKubelet(node.root))
    stack.callback(node.stop)
    node.start()
    registration = kubelet.wait_registered(RESOURCE)
    registration.watcher.wait(0, timeout=60)
    return RunningVariant(variant, node, registration.client, registration.watcher, handler_cpu)


def check_parts_out(run: RunningVariant, settings: Settings) -> None:
    """Fail unless every part the variant took out left no trace, and the shipped daemon left every trace.

    One probe Allocate (the pool must be free): its answer, the ledger on disk
    while it is held (snapshot and journal, read as a restarted daemon would),
    and the mock's record of its calls."""
    parts = set(run.variant.parts)
    probe = device_ids(settings.per_call)
    answer = run.client.allocate(allocate_request(probe))
    ledger = resource_state_dir(Path(run.node.config["state"]["dir"]), RESOURCE) / "ledger.json"
    on_disk = any(set(probe) & set(r.get("devices", ())) for r in read_ledger_records(ledger, RESOURCE))
    free_pool(run.client, settings, run.watcher)
    problems = []
    recorded = read_hook_calls(run.node.mock_folder(RESOURCE), hook="allocate")
    if parts & {"call-record", "driver"} and recorded:
        problems.append(f"the mock recorded {len(recorded)} allocate calls")
    if not parts and not recorded:
        problems.append("the mock recorded no allocate call")
    if "journal" in parts and on_disk:
        problems.append(f"the ledger on disk holds {', '.join(probe)}")
    if "journal" not in parts and not on_disk:
        problems.append(f"the ledger on disk does not hold {', '.join(probe)}")
    if "encoding" in parts and answer.container_responses:
        problems.append(f"the answer is not empty: {answer}")
    if "encoding" not in parts and list(answer.container_responses[0].envs) != ["MOCK_DEVICES"]:
        problems.append(f"the answer lacks the mock's MOCK_DEVICES env: {answer}")
    if problems:
        raise RuntimeError(f"bench.decompose: variant {run.variant.name}: " + "; ".join(problems))


def _handler_cpu_us(path: Path, skip: int) -> float:
    """The p50 of the handler CPU times the stopped daemon wrote, in microseconds (warm-up calls skipped)."""
    spent = [int(line) for line in path.read_text().split()][skip:]
    if not spent:
        raise RuntimeError(f"bench.decompose: no handler time in {path}")
    return percentile(spent, 50) / 1e3


def decompose(settings: Settings, *, keep: bool = False) -> dict[str, Any]:
    """Run every variant and the floors; the figures by variant, and the floors'."""
    n, block, warm = settings.allocate_calls, settings.block, settings.warmup
    out: dict[str, Any] = {"calls": n, "variants": {}}
    with Workspace(keep=keep) as ws, ExitStack() as stack:
        runs = [start_variant(ws, stack, v, settings) for v in VARIANTS]
        folder = ws.path("f")
        host_dir = str(runs[0].node.mock_folder(RESOURCE))
        aio, sync = floor_clients(stack, folder, host_dir)
        series = [devplug_series(r.variant.name, r.client, settings, settler(r.watcher)) for r in runs]
        shipped = runs[0].client
        extra = [
            floor_series("floor-aio", aio, settings),
            floor_series("floor-sync", sync, settings),
            CallSeries("zero-work", lambda _: shipped.options()),
        ]
        for one in series + extra:
            one.warm_up(warm)
        interleave(series + extra, n, block)
        for run in runs:
            free_pool(run.client, settings, run.watcher)
            check_parts_out(run, settings)
        fa, fs, zero = (summary_ms(s.samples) for s in extra)
        used, floor = chosen_floor(fa, fs)
        out["floor"] = {"aio": fa, "sync": fs, "used": used, "zero_work": zero}
        for run, one in zip(runs, series, strict=True):
            figures = summary_ms(one.samples)
            out["variants"][run.variant.name] = {
                "what": run.variant.what,
                "parts": list(run.variant.parts),
                "p50_ms": figures["p50"],
                "p99_ms": figures["p99"],
                "ratio_p50": figures["p50"] / floor["p50"],
                "ratio_p99": figures["p99"] / floor["p99"],
            }
        for run in runs:
            run.node.stop()  # the daemon writes its handler times as it exits
            out["variants"][run.variant.name]["handler_cpu_p50_us"] = _handler_cpu_us(run.handler_cpu, warm)
    return out


def format_table(result: dict[str, Any]) -> str:
    """The figures as a Markdown table, the floors below it."""
    floor = result["floor"]
    used = floor[floor["used"]]
    lines = [
        f"Allocate, 1k devices, {result['calls']} calls per series, interleaved; floor: bare grpcio "
        f"{floor['used']} (p50 {used['p50']:.3f} ms, p99 {used['p99']:.3f} ms)",
        "",
        "| variant | p50 (ms) | p99 (ms) | p50 / floor | p99 / floor | handler CPU p50 (us) | what |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, v in result["variants"].items():
        lines.append(
            f"| `{name}` | {v['p50_ms']:.3f} | {v['p99_ms']:.3f} | {v['ratio_p50']:.2f} | {v['ratio_p99']:.2f} "
            f"| {v['handler_cpu_p50_us']:.0f} | {v['what']} |"
        )
    zero = floor["zero_work"]
    lines += ["", f"devplug's zero-work reply: p50 {zero['p50']:.3f} ms, p99 {zero['p99']:.3f} ms"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.decompose", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few calls per series (for tests)")
    parser.add_argument("--calls", type=int, help="timed calls per series (default 2,000; --quick 40)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (daemon logs, call records)")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    if args.calls is not None:
        settings = replace(settings, allocate_calls=args.calls)
    result = decompose(settings, keep=args.keep)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
