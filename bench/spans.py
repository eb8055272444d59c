"""Timing spans inside a daemon run by :mod:`bench.ablate`: where a DRA prepare's and unprepare's time goes.

``python -m bench.ablate --spans PATH -- run ...`` wraps each function of
:data:`DRA_SPANS` (found by module and attribute, as :func:`bench.ablate.replace_attribute`
finds them: a function that moved fails loudly) with a timer that notes its
name, start and end (``time.perf_counter_ns``, ``CLOCK_MONOTONIC``: one clock for
every process of the machine), and writes them to ``PATH`` when the daemon
exits, one span a line. The daemon itself has no timer and pays nothing: only a
daemon started through the wrapper is timed.

The bench notes when each call it made started and ended on the same clock,
and :func:`breakdown` gives every call the spans that started inside it (calls
are made one at a time). A span's figure per call is the sum of its runs in
that call (a prepare saves the ledger twice). What no span covers is derived:
``grpc`` (the call as the client timed it, less the handler: both ends' gRPC and
the event loop's turn), and the ``*.rest`` of a span (its time outside the
spans it contains, those that overlap counted once). A ``*.cpu`` figure is the
CPU time of the span's thread meanwhile (:class:`Span`). A wrapper costs a few
microseconds per run (two clock reads, four with the CPU time), within the
figures it wraps: about 0.05 ms of a prepare or unprepare in all.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.stats import ms, percentile

__all__ = ["DRA_SPANS", "STAGES", "Span", "breakdown", "install", "read_spans"]


@dataclass(frozen=True)
class Span:
    """The function ``module.attribute`` (``Class.method`` when dotted), timed as ``name``; with ``cpu``, also
    the CPU time its thread spent meanwhile, as ``<name>.cpu`` (on the event loop: this call's work and whatever
    else the loop ran while it waited)."""

    name: str
    module: str
    attribute: str
    cpu: bool = False


_SERVICE = "devplug.frontends.dra.service"
_CLAIMS = "devplug.frontends.dra.claims"
_LIGHTKUBE = "lightkube.core.generic_client"

#: The prepare and unprepare path, outermost first.
DRA_SPANS: tuple[Span, ...] = (
    Span("handler", _SERVICE, "DraPluginV1.NodePrepareResources", cpu=True),
    Span("handler", _SERVICE, "DraPluginV1.NodeUnprepareResources", cpu=True),
    Span("read", _CLAIMS, "ClaimReader.read", cpu=True),
    Span("read.http", _LIGHTKUBE, "GenericAsyncClient.send"),
    Span("read.decode", _LIGHTKUBE, "GenericClient.handle_response"),
    Span("read.to_dict", "lightkube.core.dictmixin", "DictMixin.to_dict"),
    Span("read.allocation", _CLAIMS, "ClaimReader.allocation_of"),
    Span("admission", "devplug.engine.lifecycle", "DeviceLifecycle.allocate", cpu=True),
    Span("release", "devplug.engine.lifecycle", "DeviceLifecycle.release", cpu=True),
    Span("ledger", "devplug.engine.ledger", "Ledger.save", cpu=True),
    Span("ledger.sync", "devplug.engine.ledgerfile", "sync_and_close"),
    Span("hook", "devplug.engine.driver", "AsyncDriver.allocate", cpu=True),
    Span("hook", "devplug.engine.driver", "AsyncDriver.post_stop", cpu=True),
    Span("hook", "devplug.engine.driver", "AsyncDriver.deallocate", cpu=True),
    Span("hook.driver", "devplug.drivers.facade", "DriverFacade.call_allocate"),
    Span("hook.driver", "devplug.drivers.facade", "DriverFacade.call_post_stop"),
    Span("hook.driver", "devplug.drivers.facade", "DriverFacade.call_deallocate"),
    Span("cdi", "devplug.frontends.dra.claimcdi", "ClaimCdiSpecs.write", cpu=True),
    Span("cdi", "devplug.frontends.dra.claimcdi", "ClaimCdiSpecs.remove", cpu=True),
    Span("cdi.files", "devplug.frontends.dra.claimcdi", "_write_both"),
)

#: The stages of the breakdown, in the order shown (a dotted name is a part of the stage its name starts with).
STAGES: tuple[str, ...] = (
    "grpc",
    "handler",
    "handler.cpu",
    "read",
    "read.cpu",
    "read.http",
    "read.decode",
    "read.to_dict",
    "read.allocation",
    "read.rest",
    "admission",
    "admission.cpu",
    "release",
    "release.cpu",
    "ledger",
    "ledger.cpu",
    "ledger.sync",
    "ledger.rest",
    "hook",
    "hook.cpu",
    "hook.driver",
    "hook.rest",
    "admission.rest",
    "release.rest",
    "cdi",
    "cdi.cpu",
    "cdi.files",
    "cdi.rest",
    "handler.rest",
)
#: Each ``*.rest`` stage: the span it is the rest of, and the spans inside that span.
_RESTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "read.rest": ("read", ("read.http", "read.decode", "read.to_dict", "read.allocation")),
    "hook.rest": ("hook", ("hook.driver",)),
    "ledger.rest": ("ledger", ("ledger.sync",)),
    "cdi.rest": ("cdi", ("cdi.files",)),
    "admission.rest": ("admission", ("ledger", "hook")),
    "release.rest": ("release", ("ledger", "hook")),
    "handler.rest": ("handler", ("read", "admission", "release", "cdi")),
}


def _timed(span: Span, original: Callable[..., Any], out: list[tuple[str, int, int]]) -> Callable[..., Any]:
    clock, cpu_clock, name, cpu_name = time.perf_counter_ns, time.thread_time_ns, span.name, f"{span.name}.cpu"
    if inspect.iscoroutinefunction(original):
        if span.cpu:

            @functools.wraps(original)
            async def timed_async_cpu(*args: Any, **kwargs: Any) -> Any:
                start, cpu = clock(), cpu_clock()
                try:
                    return await original(*args, **kwargs)
                finally:
                    out.append((cpu_name, start, start + cpu_clock() - cpu))
                    out.append((name, start, clock()))

            return timed_async_cpu

        @functools.wraps(original)
        async def timed_async(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return await original(*args, **kwargs)
            finally:
                out.append((name, start, clock()))

        return timed_async

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = clock()
        try:
            return original(*args, **kwargs)
        finally:
            out.append((name, start, clock()))

    return timed


def install(spans: Iterable[Span], path: Path) -> None:
    """Time every span's function in this process from now on; write the spans to ``path`` at exit."""
    import importlib

    from bench.ablate import replace_attribute

    out: list[tuple[str, int, int]] = []
    for span in spans:
        owner: Any = importlib.import_module(span.module)
        *steps, attribute = span.attribute.split(".")
        for step in steps:
            owner = getattr(owner, step, None)
        original = getattr(owner, attribute, None)
        if original is None:
            raise RuntimeError(f"bench.spans: {span.module}.{span.attribute} is gone: update bench/spans.py")
        replace_attribute(span.module, span.attribute, _timed(span, original, out))
    atexit.register(lambda: path.write_text("".join(f"{n} {s} {e}\n" for n, s, e in out)))


def read_spans(path: Path) -> list[tuple[str, int, int]]:
    """The spans a daemon wrote (name, start, end in ns), by start."""
    spans = []
    for line in path.read_text().splitlines():
        name, start, end = line.split()
        spans.append((name, int(start), int(end)))
    return sorted(spans, key=lambda s: s[1])


def _covered(intervals: list[tuple[int, int]]) -> int:
    """How long the union of ``intervals`` lasts (spans that overlap, as a removal beside a release, count once)."""
    total, end = 0, None
    for begun, ended in sorted(intervals):
        if end is None or begun > end:
            total += ended - begun
            end = ended
        elif ended > end:
            total += ended - end
            end = ended
    return total


def _per_call(
    spans: Sequence[tuple[str, int, int]], calls: Sequence[tuple[int, int]]
) -> tuple[list[dict[str, int]], dict[str, int]]:
    """Each call's time (``call``) and its spans' (summed by name), a span counted in the call it started in; and
    how many runs of each span the calls made in all."""
    out: list[dict[str, int]] = []
    runs: dict[str, int] = {}
    at = 0
    for start, end in calls:
        figures: dict[str, int] = {"call": end - start}
        intervals: dict[str, list[tuple[int, int]]] = {}
        while at < len(spans) and spans[at][1] < start:
            at += 1
        for name, begun, ended in spans[at:]:
            if begun > end:
                break
            figures[name] = figures.get(name, 0) + ended - begun
            intervals.setdefault(name, []).append((begun, ended))
            runs[name] = runs.get(name, 0) + 1
        figures["grpc"] = figures["call"] - figures.get("handler", 0)
        for rest, (outer, inner) in _RESTS.items():
            if outer in figures:
                figures[rest] = figures[outer] - _covered([i for name in inner for i in intervals.get(name, ())])
        out.append(figures)
    return out, runs


def breakdown(
    spans: Sequence[tuple[str, int, int]], calls: Mapping[str, Sequence[tuple[int, int]]]
) -> dict[str, dict[str, dict[str, float]]]:
    """By kind of call (``prepare``, ``unprepare``: the start and end of each, ns), the call's and each stage's p50
    and p99 over the calls (ms) and its runs per call; a stage that some call did not run is left out."""
    result: dict[str, dict[str, dict[str, float]]] = {}
    ordered = sorted(spans, key=lambda s: s[1])
    for kind, windows in calls.items():
        per_call, runs = _per_call(ordered, sorted(windows))
        stages: dict[str, dict[str, float]] = {}
        for name in ("call", *STAGES):
            values = [f[name] for f in per_call if name in f]
            if not values or len(values) < len(per_call):
                continue
            stages[name] = {
                "p50": ms(percentile(values, 50)),
                "p99": ms(percentile(values, 99)),
                "runs": runs.get(name, len(per_call)) / len(per_call),
            }
        result[kind] = stages
    return result
