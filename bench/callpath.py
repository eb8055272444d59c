"""Which files an Allocate and a release pass through: ``python -m bench.callpath [--json PATH]``.

Runs a daemon with the mock driver in this process beside the dev kubelet, and
records, with a profile function on every thread, each call into a devplug
module (the core, the front end, the daemon, the driver; not the dev kubelet,
the test kit or generated code) while

- the kubelet's Allocate of one device is answered (from the gRPC handler to the answer), and
- the release of that allocation runs, from the reconciliation pass that finds it over to the ledger's last write.

For each it reports the files in the order they are first entered, how many
there are, and the *returns*: calls into a file that is already on the call
stack below the caller (a callback into the caller's caller: ``A -> B -> A``).
Only calls of the path itself count: frames of the gRPC handler (Allocate), of
the reconciliation pass and the release task (release), and of the driver's
hook thread. Returns into the core (``devplug/engine``) are a front end using
it; the architecture document counts the others (issue 26: "an Allocate's path
and a release's path ... with fewer files and no returns to a file already
left except into the core"). A diagnostic, not a timing: nothing here is a goal.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import grpc

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.config import parse_config
from devplug.devkubelet import DevKubeletThread
from devplug.testing.configs import dev_config
from devplug.testing.daemon import DaemonThread

RESOURCE = "example.com/mock"
#: Files under these parts of the tree are not the path (the stand-ins, the test kit, generated code).
_EXCLUDED = ("/devplug/devkubelet/", "/devplug/testing/", "/devplug/api/gen/", "/devplug/cli/logs.py")
#: The core: returns into it are a front end using it.
CORE = "devplug/engine/"


def _short(filename: str) -> str | None:
    """``devplug/engine/ledger.py`` for a devplug file on the path, or None."""
    for marker in ("/devplug/", "/devplug_mock/"):
        at = filename.rfind(marker)
        if at >= 0 and not any(part in filename for part in _EXCLUDED):
            return filename[at + 1 :]
    return None


@dataclass
class PathTrace:
    """The devplug files entered by calls, in order (consecutive calls within one file counted once)."""

    entered: list[str] = field(default_factory=list)
    #: (file, called from) of each call back into a file further down the call stack.
    returns: list[tuple[str, str]] = field(default_factory=list)

    def files(self) -> list[str]:
        return list(dict.fromkeys(self.entered))

    def reentries(self) -> int:
        """How often the sequence of files (each stretch in one file counted once) comes back to a file it had
        left, whether by a callback or by a callee returning (an orchestrator's ``A -> B -> A``)."""
        return len(self.entered) - len(self.files())

    def summary(self) -> dict[str, Any]:
        outside_core = [(f, c) for f, c in self.returns if not f.startswith(CORE)]
        return {
            "files": self.files(),
            "file_count": len(self.files()),
            "returns": len(self.returns),
            "returns_outside_core": len(outside_core),
            "returns_by_file": dict(Counter(f for f, _ in self.returns).most_common()),
            "reentries": self.reentries(),
            "returns_outside_core_detail": [f"{c} -> {f}" for f, c in outside_core],
        }


class _Recorder:
    """A profile function for every thread; records the calls of the path while :attr:`roots` is set."""

    def __init__(self) -> None:
        #: The files whose frames start the path (a call counts when one is on its stack, or in a hook thread).
        self.roots: tuple[str, ...] = ()
        self._lock = threading.Lock()
        self.trace = PathTrace()

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if not self.roots or event != "call":
            return
        target = _short(frame.f_code.co_filename)
        if target is None:
            return
        stack: list[str] = []  # the devplug files below this call, nearest first
        caller = frame.f_back
        while caller is not None:
            name = _short(caller.f_code.co_filename)
            if name is not None and (not stack or stack[-1] != name):
                stack.append(name)
            caller = caller.f_back
        in_hook_thread = threading.current_thread().name.startswith("hooks[")
        if not in_hook_thread and not any(root in stack or root == target for root in self.roots):
            return  # another task's work meanwhile
        with self._lock:
            if target in stack[1:] and stack[0] != target:
                self.trace.returns.append((target, stack[0]))
            if not self.trace.entered or self.trace.entered[-1] != target:
                self.trace.entered.append(target)

    @contextmanager
    def recording(self, *roots: str) -> Iterator[PathTrace]:
        self.trace = PathTrace()
        self.roots = roots
        try:
            yield self.trace
        finally:
            self.roots = ()


def _allocate(socket: Path, device_id: str) -> None:
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        stub = channel.unary_unary(
            "/v1beta1.DevicePlugin/Allocate",
            request_serializer=dp.AllocateRequest.SerializeToString,
            response_deserializer=dp.AllocateResponse.FromString,
        )
        stub(dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=[device_id])]), timeout=30)


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"bench.callpath: timed out waiting for {what}")
        time.sleep(0.01)


def trace_paths(root: Path) -> dict[str, PathTrace]:
    """The Allocate path and the release path of one device, on a daemon under ``root``."""
    recorder = _Recorder()
    threading.setprofile(recorder)
    sys.setprofile(recorder)
    try:
        with DevKubeletThread(root / "device-plugins") as kubelet:
            mock_dir = root / "mock"
            mock_dir.mkdir()
            tables = {RESOURCE: {"driver": "mock", "options": {"directory": str(mock_dir), "count": 4}}}
            # No pass of its own: the releases are found by the pass this runs (no grace: at once).
            config = parse_config(
                dev_config(root, tables, release_interval=3600.0, grace_period=0.0, liveness={"unknown_grace": 0.0})
            )
            with DaemonThread(config) as daemon:
                kubelet.wait_registered(RESOURCE, timeout=15)
                (resource,) = daemon.daemon.resources
                _allocate(Path(resource.endpoint), "mock1")  # warm: imports and first-call caches
                _wait(lambda: resource.lifecycle is not None and len(list(resource.lifecycle.records())) == 1, "mock1")
                with recorder.recording("devplug/frontends/deviceplugin/servicer.py") as allocate:
                    _allocate(Path(resource.endpoint), "mock0")
                core = resource.lifecycle
                assert core is not None
                with recorder.recording(
                    "devplug/frontends/deviceplugin/reconciler.py", "devplug/engine/releasequeue.py"
                ) as release:
                    asyncio.run_coroutine_threadsafe(daemon.daemon.reconciler.reconcile_once(), daemon.loop).result(30)
                    _wait(lambda: not list(core.records()), "both releases")
    finally:
        threading.setprofile(None)
        sys.setprofile(None)
    return {"allocate": allocate, "release": release}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.callpath", description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="devplug-callpath-") as tmp:
        paths = trace_paths(Path(tmp))
    report = {name: trace.summary() for name, trace in paths.items()}
    for name, summary in report.items():
        print(
            f"{name}: {summary['file_count']} files, {summary['returns']} returns to a file already left "
            f"({summary['returns_outside_core']} outside the core); the sequence of files comes back "
            f"{summary['reentries']} times"
        )
        for path in summary["files"]:
            print(f"  {path}")
        for detail in summary["returns_outside_core_detail"]:
            print(f"  return outside the core: {detail}")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
