"""The daemon with parts of its Allocate path taken out: a diagnostic of where an Allocate's time goes.

``python -m bench.ablate --parts call-record,journal -- run --config C`` runs
``devplug run`` in this process after replacing the named parts with stand-ins
that do nothing, so ``bench.decompose`` can set the same calls against the
daemon as shipped and learn what each part costs in service (cold caches, a
real gRPC round trip), which a profiler cannot say without changing it.
Nothing here is ever used by a daemon that serves a node: an ablated daemon
answers wrongly (no journal, no driver, or an empty answer) by design.

With ``--handler-cpu PATH`` each Allocate handler's on-CPU time (the event-loop
thread's ``thread_time_ns`` around ``DevicePluginService.allocate``; it never
suspends) is written to ``PATH``, one integer per line, when the daemon exits.
With ``--spans PATH`` the DRA prepare and unprepare path is timed stage by stage
(:mod:`bench.spans`), written to ``PATH`` when the daemon exits. With
``--profile PATH`` the event loop's thread runs under ``cProfile``, its
statistics dumped to ``PATH`` at exit (read them with ``pstats``).

The parts (every one names the code it replaces, and fails loudly when that
code has moved, rather than measure a daemon it did not change):

- ``call-record``: the mock's record of its hook calls (two appended JSON lines per hook);
- ``driver``: the driver's ``allocate`` hook (the core still merges in what the devices describe; the mock's
  ``MOCK_DEVICES`` env is added as the mock would);
- ``journal``: the ledger's journal appends and the JSON of their records (the ledger stays in memory only);
- ``encoding``: the answer's protobuf encoding (the kubelet gets an empty ``AllocateResponse``).
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import runpy
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from devplug.testing.process import DaemonProcess

__all__ = ["PARTS", "AblatedDaemonProcess", "apply", "main", "replace_attribute"]


def replace_attribute(module_name: str, attribute: str, stand_in: Callable[..., Any]) -> None:
    """Set ``module.attribute`` (``Class.method`` when dotted) to ``stand_in``; the original must exist."""
    owner: Any = importlib.import_module(module_name)
    *path, name = attribute.split(".")
    for step in path:
        owner = getattr(owner, step, None)  # None when a step is gone: then nothing is callable under it
    if not callable(getattr(owner, name, None)):
        raise RuntimeError(f"bench.ablate: {module_name}.{attribute} is gone: update bench/ablate.py")
    setattr(owner, name, stand_in)


def _without_call_record() -> None:
    def nothing(self: object, *args: object, **kwargs: object) -> None:
        return None

    replace_attribute("devplug.kit.hookrecord", "HookRecorder.begin", nothing)
    replace_attribute("devplug.kit.hookrecord", "HookRecorder.record", nothing)


def _without_driver() -> None:
    from devplug.types import ContainerAllocation

    async def allocate(
        self: object, device_ids: Sequence[str], replicas: object = None, claim: object = None
    ) -> ContainerAllocation:
        return ContainerAllocation(envs={"MOCK_DEVICES": ",".join(device_ids)})

    replace_attribute("devplug.engine.driver", "AsyncDriver.allocate", allocate)


def _without_journal() -> None:
    def append(self: object, frames: bytes) -> None:
        return None

    replace_attribute("devplug.engine.journal", "JournalSegment.append", append)
    replace_attribute("devplug.engine.ledger", "record_json", lambda record: "{}")


def _without_encoding() -> None:
    replace_attribute("devplug.frontends.deviceplugin.servicer", "encode_allocate_response", lambda allocations: b"")


#: Every part that can be taken out, by name.
PARTS: dict[str, Callable[[], None]] = {
    "call-record": _without_call_record,
    "driver": _without_driver,
    "journal": _without_journal,
    "encoding": _without_encoding,
}


def apply(parts: Sequence[str]) -> None:
    """Take ``parts`` out of the daemon about to run in this process (``ValueError`` for an unknown name)."""
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ValueError(f"bench.ablate: unknown part(s) {', '.join(unknown)}; known: {', '.join(PARTS)}")
    for part in parts:
        PARTS[part]()


def _time_handler(out: Path) -> None:
    """Keep each Allocate handler's on-CPU time; write them to ``out`` at exit."""
    from devplug.frontends.deviceplugin import servicer

    original = servicer.DevicePluginService.allocate
    spent: list[int] = []
    clock = time.thread_time_ns

    async def allocate(self: servicer.DevicePluginService, request: Any) -> bytes:
        start = clock()
        try:
            return await original(self, request)
        finally:
            spent.append(clock() - start)

    allocate.__name__ = original.__name__
    replace_attribute("devplug.frontends.deviceplugin.servicer", "DevicePluginService.allocate", allocate)
    atexit.register(lambda: out.write_text("".join(f"{ns}\n" for ns in spent)))


class AblatedDaemonProcess(DaemonProcess):
    """A :class:`DaemonProcess` run through ``python -m bench.ablate`` (from the checkout's root)."""

    def __init__(
        self,
        config_path: Path,
        log_path: Path,
        *,
        parts: Sequence[str] = (),
        handler_cpu: Path | None = None,
        spans: Path | None = None,
        profile: Path | None = None,
    ) -> None:
        root = str(Path(__file__).resolve().parent.parent)
        path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
        super().__init__(config_path, log_path, log_level="info", env={"PYTHONPATH": path})
        self.parts = tuple(parts)
        self.handler_cpu = handler_cpu
        self.spans = spans
        self.profile = profile

    def command(self) -> list[str]:
        wrapper = [sys.executable, "-m", "bench.ablate"]
        if self.handler_cpu is not None:
            wrapper += ["--handler-cpu", str(self.handler_cpu)]
        if self.spans is not None:
            wrapper += ["--spans", str(self.spans)]
        if self.profile is not None:
            wrapper += ["--profile", str(self.profile)]
        if self.parts:
            wrapper += ["--parts", ",".join(self.parts)]
        return [*wrapper, "--", *self.run_arguments()]


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    split = args.index("--") if "--" in args else len(args)
    parser = argparse.ArgumentParser(prog="python -m bench.ablate", description="devplug with parts taken out")
    parser.add_argument("--parts", default="", help=f"comma-separated: {', '.join(PARTS)}")
    parser.add_argument("--handler-cpu", type=Path, help="write each Allocate handler's CPU time (ns) here at exit")
    parser.add_argument("--spans", type=Path, help="write the DRA path's timing spans here at exit (bench.spans)")
    parser.add_argument("--profile", type=Path, help="profile the event loop's thread; the stats go here at exit")
    options = parser.parse_args(args[:split])
    apply([p for p in options.parts.split(",") if p])
    if options.handler_cpu is not None:
        _time_handler(options.handler_cpu)
    if options.spans is not None:
        from bench.spans import DRA_SPANS, install

        install(DRA_SPANS, options.spans)
    if options.profile is not None:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
        profile_path = options.profile

        def dump() -> None:
            profiler.disable()
            profiler.dump_stats(profile_path)

        atexit.register(dump)
    sys.argv = ["devplug", *args[split + 1 :]]
    runpy.run_module("devplug", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
