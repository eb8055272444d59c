"""The kubelet's calls go down the layers and never come back into a module they left (issue 39).

An Allocate (the kubelet's gRPC call -> the device-plugin servicer -> the call
gate -> the engine's admission -> the driver's hooks -> the answer) and a
NodePrepareResources (the DRA service -> the gate -> the claim's read -> the
admission -> the driver -> the claim's CDI spec -> the answer) are traced
through a real daemon in this process, called by the dev kubelet over its unix
sockets, with a profile function on the daemon's threads (:class:`ModuleTrace`,
here only: the daemon carries no tracing). A *return* is a call into a devplug
module that is already on the call stack below the caller's module: a callback
into a caller (``servicer -> callgate -> servicer``), or a coroutine resumed
through such a chain, counted each time it resumes. Modules are
``frame.f_globals["__name__"]``: devplug's and its drivers' (``devplug_*``),
not the test kit's, the dev kubelet's nor generated code. The architecture page
(docs/internals/architecture.md, "Ways through it") writes both paths down with
0 returns; until issue 39 an Allocate came back from the call gate into the
servicer three times.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from devplug.config import load_config, parse_config
from devplug.devkubelet import ContainerSpec, DevKubeletThread, PodSpec, ResourceView
from devplug.testing.apiserver import ApiServer
from devplug.testing.configs import dev_config
from devplug.testing.daemon import DaemonThread
from tests.frontends.dra.conftest import run
from tests.frontends.dra.dranode import dra_node

RESOURCE = "example.com/mock"
SERVICER = "devplug.frontends.deviceplugin.servicer"
DRA_SERVICE = "devplug.frontends.dra.service"
#: Modules that are not the path: the stand-ins, the test kit, generated code.
NOT_THE_PATH = ("devplug.devkubelet", "devplug.testing", "devplug.demo", "devplug.api.gen")


def path_module(frame: FrameType) -> str | None:
    """The devplug module (or a driver's, ``devplug_*``) a frame runs in, or None when it is not on the path."""
    name = frame.f_globals.get("__name__")
    if not isinstance(name, str) or not (name == "devplug" or name.startswith(("devplug.", "devplug_"))):
        return None
    if any(name == part or name.startswith(part + ".") for part in NOT_THE_PATH):
        return None
    return name


@dataclass
class CallPath:
    """What one traced call went through."""

    #: (module, function) of each call, in order, consecutive calls of one function counted once.
    calls: list[tuple[str, str]] = field(default_factory=list)
    #: (module called, from module) of each call into a module already on the stack below the caller's.
    returns: list[tuple[str, str]] = field(default_factory=list)

    def modules(self) -> list[str]:
        """The modules in the order they were first entered."""
        return list(dict.fromkeys(module for module, _ in self.calls))

    def called(self, module: str, function: str) -> bool:
        return (module, function) in self.calls


class ModuleTrace:
    """A profile function for the daemon's threads: while :meth:`recording`, each call of a devplug module with a
    frame of ``root`` below it (or in the resource's hook thread, where the driver's hooks run) is noted."""

    def __init__(self) -> None:
        self._root: str | None = None
        self._lock = threading.Lock()
        self.path = CallPath()

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if self._root is None or event != "call":
            return
        target = path_module(frame)
        if target is None:
            return
        below: list[str] = []  # the path's modules under this call, nearest first, each stretch once
        caller = frame.f_back
        while caller is not None:
            module = path_module(caller)
            if module is not None and (not below or below[-1] != module):
                below.append(module)
            caller = caller.f_back
        in_hook_thread = threading.current_thread().name.startswith("hooks[")
        if not in_hook_thread and self._root != target and self._root not in below:
            return  # other work of the daemon meanwhile
        with self._lock:
            if below and below[0] != target and target in below[1:]:
                self.path.returns.append((target, below[0]))
            call = (target, frame.f_code.co_name)
            if not self.path.calls or self.path.calls[-1] != call:
                self.path.calls.append(call)

    @contextmanager
    def recording(self, root: str) -> Iterator[CallPath]:
        """Note the calls under frames of the module ``root`` until the block ends."""
        self.path = CallPath()
        self._root = root
        try:
            yield self.path
        finally:
            self._root = None

    @contextmanager
    def installed(self) -> Iterator[ModuleTrace]:
        """Profile every thread started in the block (start the daemon inside it)."""
        threading.setprofile(self)
        try:
            yield self
        finally:
            threading.setprofile(None)


def _devices(resource: ResourceView | None) -> int:
    return 0 if resource is None else len(resource.devices)


def _pod(name: str) -> PodSpec:
    return PodSpec(name, [ContainerSpec("app", {RESOURCE: 1})])


def test_an_allocate_comes_back_to_no_module_it_left(dev_kubelet: DevKubeletThread, devplug_root: Path) -> None:
    mock_dir = devplug_root / "mock"
    mock_dir.mkdir()
    tables = {RESOURCE: {"driver": "mock", "options": {"directory": str(mock_dir), "count": 4}}}
    config = parse_config(dev_config(devplug_root, tables, release_interval=3600.0, grace_period=3600.0))
    trace = ModuleTrace()
    with trace.installed(), DaemonThread(config):
        dev_kubelet.wait_registered(RESOURCE, timeout=15)
        dev_kubelet.wait_for(lambda k: _devices(k.resource(RESOURCE)) == 4, timeout=15, what="4 devices listed")
        dev_kubelet.admit_pod(_pod("warm"))  # imports and first-call caches
        with trace.recording(SERVICER) as path:
            dev_kubelet.admit_pod(_pod("traced"))
    assert path.called(SERVICER, "allocate") and path.called("devplug.engine.admission", "allocate"), path.modules()
    assert any(module.startswith("devplug_mock") for module in path.modules()), "the driver's hook was not traced"
    assert path.returns == [], f"the Allocate came back to modules it had left: {path.returns}"


def test_a_node_prepare_resources_comes_back_to_no_module_it_left() -> None:
    trace = ModuleTrace()

    async def scenario(api: ApiServer) -> None:
        async with dra_node(api, start=False) as node:
            daemon = DaemonThread(load_config(node.config_path))
            with trace.installed():
                daemon.start()
                try:
                    await node.registered()
                    await node.published(3)
                    for name in ("warm", "traced"):  # the first for imports and first-call caches
                        node.make_claim(name)
                        pod, _ = node.schedule_pod(name, [name])
                        with trace.recording(DRA_SERVICE) if name == "traced" else nullcontext():
                            await node.kubelet.admit_pod(pod)
                finally:
                    await asyncio.to_thread(daemon.stop)

    with ApiServer() as api:
        run(lambda: scenario(api))
    path = trace.path
    assert path.called(DRA_SERVICE, "NodePrepareResources"), path.modules()
    assert path.called("devplug.frontends.dra.claims", "read") and path.called("devplug.engine.admission", "allocate")
    assert path.called("devplug.frontends.dra.claimcdi", "write"), path.modules()
    assert path.returns == [], f"the NodePrepareResources came back to modules it had left: {path.returns}"
