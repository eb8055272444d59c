"""The results table (each goal beside its figure; goals are shown, never asserted) and results.json."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CONTEXT_KEYS", "GOAL_KEYS", "format_markdown", "format_table", "verdicts", "write_results"]

Results = Mapping[str, Any]


@dataclass(frozen=True)
class Key:
    name: str
    what: str
    goal: str = ""
    check: Callable[[Results], bool] | None = None


def _at_most(key: str, bound: float) -> Callable[[Results], bool]:
    return lambda r: float(r[key]) <= bound


#: The issue's keys, in its order; every one must be in results.json and positive.
GOAL_KEYS: tuple[Key, ...] = (
    Key("allocate_p50_ms", "Allocate, 1k devices, p50 (ms)", "floor ~0.27"),
    Key("allocate_p99_ms", "Allocate, 1k devices, p99 (ms)", "<= 1", _at_most("allocate_p99_ms", 1.0)),
    Key("allocate_floor_p99_ms", "bare grpcio floor, p99 (ms)", "~0.45-0.6"),
    Key("allocate_ratio_p50", "devplug / floor, p50", "<= 1.5", _at_most("allocate_ratio_p50", 1.5)),
    Key("allocate_ratio_p99", "devplug / floor, p99", "<= 2.5", _at_most("allocate_ratio_p99", 2.5)),
    Key(
        "allocate_p99_ms_10k",
        "Allocate, 10k devices, p99 (ms)",
        "<= 1.1 x 1k p99",
        lambda r: float(r["allocate_p99_ms_10k"]) <= 1.1 * float(r["allocate_p99_ms"]),
    ),
    Key(
        "allocate_p99_ms_churn", "Allocate, 10k, churn 20 ms, p99 (ms)", "<= 2", _at_most("allocate_p99_ms_churn", 2.0)
    ),
    Key(
        "allocate_held_ratio_p99",
        "Allocate p99, 1,000 allocations held / none held",
        "<= 1.2",
        _at_most("allocate_held_ratio_p99", 1.2),
    ),
    Key("preferred_p99_ms", "GetPreferredAllocation 1k/4 NUMA/8, p99 (ms)"),
    Key(
        "preferred_ratio_p99", "devplug / floor, GetPreferredAllocation p99", "<= 3", _at_most("preferred_ratio_p99", 3)
    ),
    Key("law_push_ms_10", "ListAndWatch push, 10 devices (ms)"),
    Key("law_push_ms_1k", "ListAndWatch push, 1k devices (ms)"),
    Key("law_push_ms_10k", "ListAndWatch push, 10k devices (ms)", "<= 3", _at_most("law_push_ms_10k", 3.0)),
    Key("law_push_floor_ms_10k", "bare grpcio push, 10k devices (ms)"),
    Key("law_push_ratio_10k", "devplug / floor, 10k push", "<= 1.5", _at_most("law_push_ratio_10k", 1.5)),
    Key("reregister_p50_ms", "kubelet restart to re-registered, p50 (ms)"),
    Key(
        "reregister_p99_ms",
        "kubelet restart to re-registered, p99 (ms)",
        "<= 1000",
        _at_most("reregister_p99_ms", 1000),
    ),
    Key("release_p50_ms", "pod gone to deallocate done, p50 (ms)"),
    Key("release_p99_ms", "pod gone to deallocate done, p99 (ms)", "<= 3000", _at_most("release_p99_ms", 3000)),
    Key(
        "exit_release_p99_ms_v2",
        "pod forgotten, its container's exit to deallocate done, cgroup v2, p99 (ms)",
        "<= 100",
        _at_most("exit_release_p99_ms_v2", 100),
    ),
    Key(
        "hold_rejected_max_ms",
        "Allocate held, right after a pod the kubelet rejected at admission, max (ms)",
        "<= 100",
        _at_most("hold_rejected_max_ms", 100),
    ),
    Key(
        "hold_short_pod_max_ms",
        "Allocate held, right after a pod that finished before any release pass, max (ms)",
        "<= 100",
        _at_most("hold_short_pod_max_ms", 100),
    ),
    Key(
        "hold_beside_busy_max_ms",
        "Allocate held, 2 free devices beside 2 a forgotten pod's running container keeps, max (ms)",
        "<= 100",
        _at_most("hold_beside_busy_max_ms", 100),
    ),
    Key(
        "withhold_max_ms",
        "forced removal to its running pod's device advertised unhealthy, max (ms)",
        "<= 100",
        _at_most("withhold_max_ms", 100),
    ),
    Key(
        "startup_to_registered_ms",
        "process start to all registered (ms)",
        "<= 250",
        _at_most("startup_to_registered_ms", 250),
    ),
    Key("idle_rss_mb", "idle RSS, 3 x 100 devices (MiB)", "<= 42", _at_most("idle_rss_mb", 42)),
    Key("idle_cpu_percent", "idle CPU (% of a core)", "<= 0.1", _at_most("idle_cpu_percent", 0.1)),
    Key(
        "flood_allocate_ratio_p99",
        "Allocate p99 with 1,300 slow metrics clients / without",
        "<= 1.5",
        _at_most("flood_allocate_ratio_p99", 1.5),
    ),
    Key(
        "flood_threads",
        "daemon threads with 1,300 slow metrics clients (before the bounded server: 1,327)",
        "<= quiet + 4",
        lambda r: float(r["flood_threads"]) <= float(r["flood_threads_quiet"]) + 4,
    ),
    Key(
        "flood_rss_mb",
        "daemon RSS with 1,300 slow metrics clients (MiB; before the bounded server: 85 MB more)",
        "<= quiet + 5",
        lambda r: float(r["flood_rss_mb"]) <= float(r["flood_rss_mb_quiet"]) + 5,
    ),
    Key("handover_ms", "rolling update: new daemon's start to the old one's exit, p50 (ms)"),
    Key("handover_allocate_wait_max_ms", "rolling update: longest Allocate during a handover (ms)"),
    # issue 28: DRA, one claim per call, interleaved with bare grpcio DRAPlugin floors; issue 37: the ratios are to
    # the floor that reads the claim from the same API server stand-in (lightkube), as any plugin must
    Key("dra_prepare_p50_ms", "DRA NodePrepareResources, one claim, p50 (ms)"),
    Key("dra_prepare_p99_ms", "DRA NodePrepareResources, one claim, p99 (ms)"),
    Key(
        "dra_prepare_ratio_p50",
        "devplug / floor reading the claim, prepare p50",
        "<= 2",
        _at_most("dra_prepare_ratio_p50", 2.0),
    ),
    Key(
        "dra_prepare_ratio_p99",
        "devplug / floor reading the claim, prepare p99",
        "<= 2",
        _at_most("dra_prepare_ratio_p99", 2.0),
    ),
    Key("dra_unprepare_p50_ms", "DRA NodeUnprepareResources, one claim, p50 (ms)"),
    Key("dra_unprepare_p99_ms", "DRA NodeUnprepareResources, one claim, p99 (ms)"),
    Key(
        "dra_unprepare_ratio_p50",
        "devplug / that floor (whose unprepare reads nothing), unprepare p50",
        "<= 2",
        _at_most("dra_unprepare_ratio_p50", 2.0),
    ),
    Key(
        "dra_unprepare_ratio_p99",
        "devplug / that floor, unprepare p99",
        "<= 2",
        _at_most("dra_unprepare_ratio_p99", 2.0),
    ),
    Key("dra_health_to_kubelet_p99_ms", "DRA device health change to the kubelet's health stream, p99 (ms)"),
    Key("dra_health_to_slice_p99_ms", "DRA device health change to its updated ResourceSlice, p99 (ms)"),
    Key("dra_handover_ms", "DRA rolling update: new daemon's start to the old one's exit, p50 (ms)"),
    Key("dra_handover_prepare_wait_max_ms", "DRA rolling update: longest NodePrepareResources during a handover (ms)"),
)

#: Floors and diagnostics measured in the same run, shown under the goals.
CONTEXT_KEYS: tuple[Key, ...] = (
    Key("hold_plain_ms", "Allocate held, a device no tenancy had (the holds' floor), p50 (ms)"),
    Key("hold_window_max_ms", "Allocate held, a forced removal's container exiting 0.3 s later (waited), max (ms)"),
    Key("hold_outside_window_ratio", "longest hold outside that window / the holds' floor"),
    Key("withhold_p50_ms", "forced removal to its running pod's device advertised unhealthy, p50 (ms)"),
    Key("allocate_floor_p50_ms", "bare grpcio floor, p50 (ms)"),
    Key("allocate_floor_aio_p99_ms", "floor: grpc.aio server, p99 (ms)"),
    Key("allocate_floor_sync_p99_ms", "floor: sync grpc server, p99 (ms)"),
    Key("unix_rtt_p50_ms", "raw unix-socket round trip, p50 (ms)"),
    Key("unix_rtt_p99_ms", "raw unix-socket round trip, p99 (ms)"),
    Key("allocate_zero_work_p50_ms", "floor: devplug's own server, zero-work reply, p50 (ms)"),
    Key("allocate_zero_work_p99_ms", "floor: devplug's own server, zero-work reply, p99 (ms)"),
    Key("allocate_p50_ms_threaded", "Allocate, 1k, the mock's hooks in the hook thread, p50 (ms)"),
    Key("allocate_p99_ms_threaded", "Allocate, 1k, the mock's hooks in the hook thread, p99 (ms)"),
    Key("allocate_p99_ms_held_0", "Allocate, 10k devices, none held, p99 (ms)"),
    Key("allocate_p99_ms_held_1000", "Allocate, 10k devices, 1,000 held, p99 (ms)"),
    Key("allocate_p50_ms_empty_ledger", "Allocate, ledger kept empty, p50 (ms)"),
    Key("allocate_p99_ms_empty_ledger", "Allocate, ledger kept empty, p99 (ms)"),
    Key("allocate_p50_ms_replicas8", "Allocate, 125 devices x 8 replicas, p50 (ms)"),
    Key("allocate_p99_ms_replicas8", "Allocate, 125 devices x 8 replicas, p99 (ms)"),
    Key("allocate_floor_p99_ms_replicas8", "floor during the replicas series, p99 (ms)"),
    Key("allocate_p50_ms_10k", "Allocate, 10k devices, p50 (ms)"),
    Key("allocate_floor_p99_ms_10k", "floor during the 10k series, p99 (ms)"),
    Key("allocate_p50_ms_churn", "Allocate, churn, p50 (ms)"),
    Key("allocate_floor_p99_ms_churn", "floor during the churn series, p99 (ms)"),
    Key("churn_flips_per_s", "churn: device flips per second"),
    Key("churn_lists_per_s", "churn: 10k lists received per second"),
    Key("preferred_p50_ms", "GetPreferredAllocation, p50 (ms)"),
    Key("preferred_floor_p99_ms", "floor answering GetPreferredAllocation, p99 (ms)"),
    Key(
        "shared_handover_p50_ms_default", "devplug-shared: slot freed to taken on another node, p50 (ms; Akri 10-30 s)"
    ),
    Key("shared_handover_p50_ms_fast", "the same with both intervals at 0.1 s, p50 (ms)"),
    Key("exit_release_p50_ms_v2", "container exit to deallocate done, cgroup v2 (inotify), p50 (ms)"),
    Key("exit_release_p50_ms_v1", "container exit to deallocate done, cgroup v1 (50 ms poll), p50 (ms)"),
    Key("exit_release_p99_ms_v1", "container exit to deallocate done, cgroup v1 (50 ms poll), p99 (ms)"),
    Key("handover_max_ms", "rolling update: new daemon's start to the old one's exit, worst (ms)"),
    Key("handover_allocate_steady_p99_ms", "floor: the same client's Allocate before the handovers, p99 (ms)"),
    Key("handover_allocate_wait_ratio", "longest Allocate during a handover / that floor"),
    Key("handovers", "handovers measured"),
    Key("dra_handover_max_ms", "DRA rolling update: new daemon's start to the old one's exit, worst (ms)"),
    Key("dra_handover_prepare_steady_p99_ms", "floor: the same client's prepare before the handovers, p99 (ms)"),
    Key("dra_handover_prepare_wait_ratio", "longest prepare during a DRA handover / that floor"),
    Key("dra_handovers", "DRA handovers measured"),
    Key("reregister_restarts", "kubelet restarts measured"),
    Key("reregister_failures", "restarts after which a resource never registered again (10 s)"),
    Key("startup_to_registered_min_ms", "start to registered, best run (ms)"),
    Key("startup_floor_ms", "bare grpcio process start to first answer (ms)"),
    Key("idle_cpu_percent_ticks", "idle CPU from /proc/pid/stat ticks (%)"),
    Key("idle_wakeups_per_s", "idle context switches per second, daemon"),
    Key("idle_rss_anon_mb", "idle RSS, daemon: anonymous memory (MiB)"),
    Key("idle_rss_file_mb", "idle RSS, daemon: mapped files' resident pages (MiB; moves with the page cache)"),
    Key("idle_floor_rss_mb", "idle RSS, bare grpc.aio server (MiB)"),
    Key("idle_floor_rss_anon_mb", "idle RSS, bare grpc.aio server: anonymous memory (MiB)"),
    Key("idle_floor_rss_file_mb", "idle RSS, bare grpc.aio server: mapped files' resident pages (MiB)"),
    Key("idle_floor_cpu_percent", "idle CPU, bare grpc.aio server (%)"),
    Key("idle_floor_wakeups_per_s", "idle context switches per second, floor"),
    Key("flood_allocate_p50_ms_quiet", "Allocate, 100 devices, no slow clients, p50 (ms)"),
    Key("flood_allocate_p99_ms_quiet", "Allocate, 100 devices, no slow clients, p99 (ms)"),
    Key("flood_allocate_p50_ms", "Allocate, 100 devices, 1,300 slow metrics clients, p50 (ms)"),
    Key("flood_allocate_p99_ms", "Allocate, 100 devices, 1,300 slow metrics clients, p99 (ms)"),
    Key("flood_threads_quiet", "daemon threads, no slow clients"),
    Key("flood_rss_mb_quiet", "daemon RSS, no slow clients (MiB)"),
    Key("flood_rss_growth_mb", "daemon RSS growth with 1,300 slow clients open (MiB)"),
    Key("flood_tracebacks", "tracebacks in the daemon's log after both floods (before the bounded server: 178)"),
    Key("flood_probe_ms_quiet", "slowest /healthz answer, no slow clients (ms)"),
    Key("flood_probe_ms", "slowest /healthz answer during the flood (ms)"),
    Key("flood_closed_per_s", "slow connections the server closed per second, held flood"),
    Key(
        "flood_allocate_ratio_p99_reopening",
        "Allocate p99, slow clients reopened as soon as closed / none (the closing shares the interpreter)",
    ),
    Key("flood_allocate_p99_ms_reopening", "Allocate p99 with reopening slow clients (ms)"),
    Key("flood_threads_reopening", "daemon threads with reopening slow clients"),
    Key("flood_rss_growth_mb_reopening", "daemon RSS growth with reopening slow clients (MiB)"),
    Key("flood_probe_ms_reopening", "slowest /healthz answer with reopening slow clients (ms)"),
    Key("flood_closed_per_s_reopening", "slow connections the server closed per second, reopening flood"),
    Key("dra_prepare_floor_p50_ms", "DRA floor: bare grpc.aio plugin GETting the claim (lightkube), prepare, p50 (ms)"),
    Key("dra_prepare_floor_p99_ms", "DRA floor reading the claim (lightkube), prepare, p99 (ms)"),
    Key("dra_unprepare_floor_p50_ms", "DRA floor reading the claim, unprepare (reads nothing), p50 (ms)"),
    Key("dra_unprepare_floor_p99_ms", "DRA floor reading the claim, unprepare, p99 (ms)"),
    Key("dra_prepare_floor_raw_p50_ms", "DRA floor reading the claim with httpx2 and json.loads, prepare, p50 (ms)"),
    Key("dra_prepare_floor_raw_p99_ms", "DRA floor reading the claim with httpx2 and json.loads, prepare, p99 (ms)"),
    Key("dra_unprepare_floor_raw_p50_ms", "the same floor, unprepare, p50 (ms)"),
    Key("dra_unprepare_floor_raw_p99_ms", "the same floor, unprepare, p99 (ms)"),
    Key("dra_prepare_floor_nowork_p50_ms", "DRA no-work floor (sync grpcio, reads nothing), prepare, p50 (ms)"),
    Key("dra_prepare_floor_nowork_p99_ms", "DRA no-work floor, prepare, p99 (ms)"),
    Key("dra_unprepare_floor_nowork_p50_ms", "DRA no-work floor, unprepare, p50 (ms)"),
    Key("dra_unprepare_floor_nowork_p99_ms", "DRA no-work floor, unprepare, p99 (ms)"),
    Key("dra_prepare_grpc_p50_ms", "DRA prepare: gRPC and the loop's turn (the call less devplug's handler), p50 (ms)"),
    Key("dra_prepare_read_p50_ms", "DRA prepare: reading the claim from the API server, p50 (ms)"),
    Key("dra_prepare_admission_p50_ms", "DRA prepare: the core's admission (locks, ledger, driver hook), p50 (ms)"),
    Key("dra_prepare_ledger_p50_ms", "DRA prepare: the admission's ledger writes (two journal appends), p50 (ms)"),
    Key("dra_prepare_hook_p50_ms", "DRA prepare: the driver's allocate hook, thread hop included, p50 (ms)"),
    Key("dra_prepare_cdi_p50_ms", "DRA prepare: the claim's CDI spec and its kept copy written, p50 (ms)"),
    Key("dra_prepare_loop_cpu_p50_ms", "DRA prepare: the event loop's CPU time during the handler, p50 (ms)"),
    Key("dra_unprepare_grpc_p50_ms", "DRA unprepare: gRPC and the loop's turn, p50 (ms)"),
    Key("dra_unprepare_release_p50_ms", "DRA unprepare: the core's release (post_stop, deallocate, ledger), p50 (ms)"),
    Key("dra_unprepare_ledger_p50_ms", "DRA unprepare: the release's ledger writes (fdatasync'ed), p50 (ms)"),
    Key("dra_unprepare_hook_p50_ms", "DRA unprepare: the driver's post_stop and deallocate, p50 (ms)"),
    Key("dra_unprepare_cdi_p50_ms", "DRA unprepare: the claim's CDI spec removed, p50 (ms)"),
    Key("dra_unprepare_loop_cpu_p50_ms", "DRA unprepare: the event loop's CPU time during the handler, p50 (ms)"),
    Key("dra_health_to_kubelet_p50_ms", "DRA health change to the kubelet's health stream, p50 (ms)"),
    Key(
        "dra_health_floor_p50_ms",
        "bare health plugin (inotify to NodeWatchResources), p50 (ms; a plain implementation, not a lower bound)",
    ),
    Key("dra_health_floor_p99_ms", "bare health plugin, p99 (ms)"),
    Key("dra_health_to_slice_p50_ms", "DRA health change to its ResourceSlice, p50 (ms; includes a 0.2 s debounce)"),
    Key("dra_rounds", "DRA prepare/unprepare rounds measured"),
)


def verdicts(results: Results) -> dict[str, bool]:
    """Which goals the figures meet (for the table only)."""
    return {k.name: k.check(results) for k in GOAL_KEYS if k.check is not None and k.name in results}


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def _rows(results: Results) -> list[tuple[str, str, str, str, str]]:
    met = verdicts(results)
    rows = []
    for key in GOAL_KEYS:
        verdict = "" if key.name not in met else ("met" if met[key.name] else "MISSED")
        rows.append((key.name, _fmt(results.get(key.name, "-")), key.goal, verdict, key.what))
    return rows


def _context_rows(results: Results) -> list[tuple[str, str, str]]:
    return [(k.name, _fmt(results[k.name]), k.what) for k in CONTEXT_KEYS if k.name in results]


def _machine_line(results: Results) -> str:
    m = results.get("machine", {})
    return (
        f"{m.get('cpu_model')}, {m.get('cores')} cores, Python {m.get('python')}, grpcio {m.get('grpcio')}, "
        f"protobuf {m.get('protobuf')}, Linux {m.get('kernel')}"
    )


def format_table(results: Results) -> str:
    """The plain-text table printed at the end of a run."""
    rows = [("key", "figure", "goal", "", "what"), *_rows(results)]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    context = _context_rows(results)
    if context:
        cw = [max(len(r[i]) for r in context) for i in range(3)]
        lines += ["", "floors and diagnostics (same run):"]
        lines += ["  ".join(cell.ljust(cw[i]) for i, cell in enumerate(row)).rstrip() for row in context]
    lines += ["", f"machine: {_machine_line(results)}"]
    if results.get("quick"):
        lines.append("QUICK MODE: few iterations; figures are not meaningful.")
    return "\n".join(lines)


def format_markdown(results: Results) -> str:
    """The tables as Markdown (for the Performance page, docs/performance/index.md)."""
    out = ["| key | figure | goal | | what |", "| --- | ---: | --- | --- | --- |"]
    out += [f"| `{k}` | {v} | {g} | {m} | {w} |" for k, v, g, m, w in _rows(results)]
    out += ["", "| floor or diagnostic | figure | what |", "| --- | ---: | --- |"]
    out += [f"| `{k}` | {v} | {w} |" for k, v, w in _context_rows(results)]
    out += ["", f"Machine: {_machine_line(results)}."]
    return "\n".join(out)


def write_results(results: Results, path: Path) -> None:
    data = dict(results)
    data["goals"] = {k.name: k.goal for k in GOAL_KEYS if k.goal}
    data["met"] = verdicts(results)
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")


if __name__ == "__main__":  # python -m bench.report [results.json]: the Markdown tables
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("results.json")
    print(format_markdown(json.loads(source.read_text())))
