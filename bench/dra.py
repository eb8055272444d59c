"""DRA prepare and unprepare round trips: devplug's DRA front end against bare grpcio DRAPlugin floors, same run.

``python -m bench.dra`` (``--quick`` for a tiny run; ``--json`` for the figures
as JSON; ``--profile PATH`` to profile the daemon's event loop as well); ``make
bench`` (``python -m bench``) runs it too and reports its figures as the
``dra_*`` keys (:func:`results_keys`). devplug's side is the real thing:
``devplug run`` serving the mock driver through DRA (a child process, at the log
level an operator runs it with, ``info``), the API server stand-in over HTTP on
loopback (each prepare reads its claim from it, as on a node), claims allocated
as the scheduler writes them, each call a ``v1.DRAPlugin`` call over the
daemon's unix socket, one claim per call. Each round prepares one claim then
unprepares it (so the ledger holds one claim at most; the devices cycle
through 8 mock devices).

**The floors**, each a bare server in its own process, called from the same
client (a process of its own, as the kubelet is), interleaved call by call with
devplug's so that all see the same machine load:

* ``lightkube``, **the floor** the ratios are against: a grpc.aio plugin that, for
  each claim of a prepare, GETs it from the same API server stand-in with
  lightkube (the client and HTTP stack devplug uses), checks its UID, and answers
  its devices of the driver with the claim's CDI ID: what any plugin pays. Its
  unprepare reads nothing (the kubelet's request names the claim, and a plugin
  forgets what it prepared), so that floor is a bare answer;
* ``raw``: the same with a plain httpx2 GET and ``json.loads`` (lightkube's model
  and its request building left out);
* ``nowork``: a sync grpcio server answering a precomputed answer, reading
  nothing (the floor before issue 37; context).

**Where devplug's time goes** (:mod:`bench.spans`): the daemon runs through
:mod:`bench.ablate`, which times its prepare and unprepare path stage by stage
(the handler, the claim's read and its HTTP part, the admission, the ledger's
writes and their fdatasync, the driver's hook and its thread hop, the CDI spec,
the event loop's CPU time) in the same run; each call's stages are the spans
that started while the client waited for it. The figures are p50 and p99 in
milliseconds and the ratios to the floor's; nothing is asserted.

**Health.** The time from a device's health changing (its mock device file
rewritten: ``unhealthy=<reason>``, then healthy again) to the kubelet's health
cache showing it (the dev kubelet's DRA side, fed by ``NodeWatchResources``),
and to the node's ResourceSlice showing the device tainted (or no longer). The
health floor: a bare plugin in its own process, registered with the same dev
kubelet under another driver name, that watches a folder with the same inotify
watcher the mock uses (:class:`devplug.host.watch.DirectoryWatcher`) and sends a
``NodeWatchResourcesResponse`` on each change: the trigger and the kubelet's side
are the same, only devplug's path (the mock's hot-plug, the device table, the
health service) differs. In the runs so far this bare plugin was slower than
devplug's path (about 6 ms against 2 to 3 ms, not yet explained), so its ratio
is a comparison with a plain implementation, not a lower bound. The slice
figure has no floor (it includes the
publisher's 0.2 s debounce, a write to the API server stand-in, and its
notification); it is given in milliseconds only.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc

from bench.stats import summary_ms

DEVICES = 8
FLOOR_DRIVER = "floor.example.com"


def _floor_handler(prepare: Any, unprepare: Any) -> Any:
    """The floors' ``v1.DRAPlugin`` service: ``prepare`` and ``unprepare`` behind the generated (de)serializers."""
    from devplug.api.gen.dra.v1 import api_pb2 as v1

    return grpc.method_handlers_generic_handler(
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
        {
            "NodePrepareResources": grpc.unary_unary_rpc_method_handler(
                prepare, v1.NodePrepareResourcesRequest.FromString, v1.NodePrepareResourcesResponse.SerializeToString
            ),
            "NodeUnprepareResources": grpc.unary_unary_rpc_method_handler(
                unprepare,
                v1.NodeUnprepareResourcesRequest.FromString,
                v1.NodeUnprepareResourcesResponse.SerializeToString,
            ),
        },
    )


def _floor_main(sock: Path) -> None:
    """The no-work floor: v1.DRAPlugin with precomputed answers (a prepared device with its CDI ID; an empty error)."""
    from concurrent import futures

    from devplug.api.gen.dra.v1 import api_pb2 as v1

    prepared = v1.NodePrepareResourceResponse(
        devices=[
            v1.Device(
                request_names=["dev"],
                pool_name="node-a",
                device_name="mock0",
                cdi_device_ids=["mock.example.com/claim=00000000-0000-0000-0000-000000000000"],
            )
        ]
    )

    def prepare(request: Any, context: Any) -> Any:
        response = v1.NodePrepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].CopyFrom(prepared)
        return response

    def unprepare(request: Any, context: Any) -> Any:
        response = v1.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].error = ""
        return response

    handler = _floor_handler(prepare, unprepare)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix:{sock}")
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    server.start()
    signal.sigwait({signal.SIGTERM})
    server.stop(None)


def _reading_floor_main(sock: Path, client: str, api: str, driver: str) -> None:
    """A floor that reads each claim from the API server, as any DRA plugin must: a bare grpc.aio v1.DRAPlugin
    that GETs the claim (``client``: ``lightkube``'s typed get, or ``raw``, httpx2 and ``json.loads``), checks its
    UID, takes its devices of ``driver`` in the node's pool and answers them with the claim's CDI ID.
    NodeUnprepareResources reads nothing (the kubelet's request names the claim; a plugin forgets what it
    prepared), so it answers as the no-work floor does."""
    import json as jsonlib

    import grpc.aio
    import httpx2

    from devplug.api.gen.dra.v1 import api_pb2 as v1
    from devplug.testing.dranode import NODE

    async def serve() -> None:
        if client == "lightkube":
            from lightkube import AsyncClient
            from lightkube.config.kubeconfig import KubeConfig
            from lightkube.config.models import Cluster, User
            from lightkube.resources.resource_v1 import ResourceClaim

            kube = AsyncClient(KubeConfig.from_one(cluster=Cluster(server=api), user=User()), trust_env=False)

            async def devices(namespace: str, name: str, uid: str) -> list[tuple[str, str]]:
                claim = await kube.get(ResourceClaim, name, namespace=namespace)
                if claim.metadata is None or claim.metadata.uid != uid:
                    raise ValueError(f"claim {namespace}/{name} was replaced")
                allocation = claim.status.allocation if claim.status is not None else None
                if allocation is None or allocation.devices is None:
                    raise ValueError(f"claim {namespace}/{name} is not allocated")
                results = allocation.devices.results or []
                return [(r.request, r.device) for r in results if r.driver == driver and r.pool == NODE]

        else:
            http = httpx2.AsyncClient(base_url=api, trust_env=False)

            async def devices(namespace: str, name: str, uid: str) -> list[tuple[str, str]]:
                answer = await http.get(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}")
                answer.raise_for_status()
                claim = jsonlib.loads(answer.content)
                if claim["metadata"]["uid"] != uid:
                    raise ValueError(f"claim {namespace}/{name} was replaced")
                results = claim["status"]["allocation"]["devices"]["results"]
                return [(r["request"], r["device"]) for r in results if r["driver"] == driver and r["pool"] == NODE]

        async def prepare(request: Any, context: Any) -> Any:
            response = v1.NodePrepareResourcesResponse()
            for claim in request.claims:
                entry = response.claims[claim.uid]
                try:
                    found = await devices(claim.namespace, claim.name, claim.uid)
                except Exception as exc:
                    entry.error = f"{claim.namespace}/{claim.name}: {exc}"
                    continue
                for request_name, device in found:
                    entry.devices.add(
                        request_names=[request_name],
                        pool_name=NODE,
                        device_name=device,
                        cdi_device_ids=[f"{driver}/claim={claim.uid}-{request_name}"],
                    )
            return response

        async def unprepare(request: Any, context: Any) -> Any:
            response = v1.NodeUnprepareResourcesResponse()
            for claim in request.claims:
                response.claims[claim.uid].error = ""
            return response

        handler = _floor_handler(prepare, unprepare)
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"unix:{sock}")
        await server.start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await server.stop(None)

    asyncio.run(serve())


def _health_floor_main(root: Path) -> None:
    """The health floor (see the module's docstring): registration, the health stream, a watched folder."""
    import grpc.aio

    from devplug.api.gen.drahealth.v1alpha1 import api_pb2 as health_pb
    from devplug.api.gen.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
    from devplug.api.gen.pluginregistration.v1 import api_pb2 as reg_pb
    from devplug.api.gen.pluginregistration.v1 import api_pb2_grpc as reg_grpc
    from devplug.host.watch import DirectoryWatcher

    folder, service = root / "floor-devices", root / "plugins" / FLOOR_DRIVER / "dra.sock"

    def report() -> Any:
        devices = []
        for name in sorted(n for n in os.listdir(folder) if not n.startswith(".")):
            text = (folder / name).read_text()
            status = health_pb.UNHEALTHY if text.startswith("unhealthy") else health_pb.HEALTHY
            devices.append(
                health_pb.DeviceHealth(
                    device=health_pb.DeviceIdentifier(pool_name="node-a", device_name=name),
                    health=status,
                    last_updated_time=int(time.time()),
                    health_check_timeout_seconds=30,
                    message=text.partition("=")[2].strip(),
                )
            )
        return health_pb.NodeWatchResourcesResponse(devices=devices)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        queues: list[asyncio.Queue[None]] = []

        def changed(_names: frozenset[str]) -> None:
            for queue in queues:
                loop.call_soon_threadsafe(queue.put_nowait, None)

        class Health(health_grpc.DRAResourceHealthServicer):  # type: ignore[misc]
            async def NodeWatchResources(self, request: Any, context: Any) -> Any:
                queue: asyncio.Queue[None] = asyncio.Queue()
                queues.append(queue)
                while True:
                    yield report()
                    await queue.get()

        class Registration(reg_grpc.RegistrationServicer):  # type: ignore[misc]
            async def GetInfo(self, request: Any, context: Any) -> Any:
                return reg_pb.PluginInfo(
                    type="DRAPlugin",
                    name=FLOOR_DRIVER,
                    endpoint=str(service),
                    supported_versions=["v1.DRAPlugin", "v1alpha1.DRAResourceHealth"],
                )

            async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
                return reg_pb.RegistrationStatusResponse()

        service.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.aio.server()
        health_grpc.add_DRAResourceHealthServicer_to_server(Health(), server)
        server.add_insecure_port(f"unix:{service}")
        await server.start()
        registration = grpc.aio.server()
        reg_grpc.add_RegistrationServicer_to_server(Registration(), registration)
        registration.add_insecure_port(f"unix:{root / 'plugins_registry' / f'{FLOOR_DRIVER}-reg.sock'}")
        await registration.start()
        with DirectoryWatcher(folder, changed, each_write=False):  # as the mock's: a file once its writer closed it
            await asyncio.Event().wait()

    asyncio.run(serve())


class DraStub:
    """A sync v1.DRAPlugin client on a unix socket."""

    def __init__(self, sock: Path) -> None:
        from devplug.api.gen.dra.v1 import api_pb2 as v1
        from devplug.api.gen.dra.v1 import api_pb2_grpc as v1_grpc

        self.v1 = v1
        self.channel = grpc.insecure_channel(f"unix:{sock}")
        self.stub = v1_grpc.DRAPluginStub(self.channel)

    def prepare(self, namespace: str, name: str, uid: str) -> Any:
        claim = self.v1.Claim(namespace=namespace, name=name, uid=uid)
        answer = self.stub.NodePrepareResources(self.v1.NodePrepareResourcesRequest(claims=[claim]), timeout=30)
        if answer.claims[uid].error:
            raise RuntimeError(f"prepare {name}: {answer.claims[uid].error}")
        return answer

    def unprepare(self, namespace: str, name: str, uid: str) -> Any:
        claim = self.v1.Claim(namespace=namespace, name=name, uid=uid)
        answer = self.stub.NodeUnprepareResources(self.v1.NodeUnprepareResourcesRequest(claims=[claim]), timeout=30)
        if answer.claims[uid].error:
            raise RuntimeError(f"unprepare {name}: {answer.claims[uid].error}")
        return answer

    def close(self) -> None:
        self.channel.close()


def allocated_claims(node: Any, count: int) -> list[tuple[str, str]]:
    """``count`` claims, each allocated one mock device as the scheduler writes it (round robin): the device, and
    the node selector of a node-local device (``metadata.name`` of the node, which devplug checks)."""
    from devplug.testing.dranode import NODE, NS

    here = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}
    made = []
    for i in range(count):
        claim = node.make_claim(f"bench-{i}")
        status = {
            "allocation": {
                "devices": {
                    "results": [{"request": "dev", "driver": node.driver, "pool": NODE, "device": f"mock{i % DEVICES}"}]
                },
                "nodeSelector": here,
            }
        }
        stored = node.api.update("resourceclaims", {**claim, "status": status}, NS, "kube-scheduler", "status")
        made.append((stored["metadata"]["name"], stored["metadata"]["uid"]))
    return made


#: The floors, each a server of its own (see the module's docstring).
FLOORS = ("nowork", "raw", "lightkube")
#: The floor the ratios are against (see the module's docstring).
FLOOR = "lightkube"


def _start_floor(name: str, sock: Path, api: str, driver: str) -> subprocess.Popen[bytes]:
    args = ["--floor", str(sock)]
    if name != "nowork":
        args += ["--read", name, "--api", api, "--driver", driver]
    return subprocess.Popen(
        [sys.executable, "-m", "bench.dra", *args],
        env=dict(os.environ, GRPC_VERBOSITY="ERROR"),
        stdin=subprocess.DEVNULL,
    )


async def _measure(
    rounds: int,
    warmup: int,
    root: Path,
    health_rounds: int,
    profile: Path | None = None,
    daemon_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    from bench.ablate import AblatedDaemonProcess
    from bench.spans import breakdown, read_spans
    from devplug.testing.apiserver import ApiServer
    from devplug.testing.dranode import NS, dra_node
    from devplug.testing.process import DaemonProcess

    folder = root / "mock"
    folder.mkdir()
    for i in range(DEVICES):
        (folder / f"mock{i}").write_text("")
    spans = root / "spans.txt"
    floors: dict[str, subprocess.Popen[bytes]] = {}
    try:
        with ApiServer() as api:
            table = {"driver": "mock", "options": {"directory": str(folder)}}
            async with dra_node(
                api, "example.com/mock", table, folder, driver="mock.example.com", env=daemon_env, start=False
            ) as node:
                if daemon_env is None:
                    # the daemon as an operator runs it (log level info), its stages timed (bench.spans)
                    node.daemon = AblatedDaemonProcess(
                        node.config_path, node.root / "daemon.log", spans=spans, profile=profile
                    ).start()
                else:  # another tree's daemon (bench.compare): as it is, its stages untimed (no breakdown)
                    log = node.root / "daemon.log"
                    node.daemon = DaemonProcess(node.config_path, log, log_level="info", env=daemon_env).start()
                await node.registered()
                await node.published(DEVICES)
                claims = allocated_claims(node, rounds + warmup)
                [sock] = sorted((node.root / "plugins" / node.driver).glob("dra-*.sock"))
                sockets = {name: root / f"floor-{name}.sock" for name in FLOORS}
                for name in FLOORS:
                    floors[name] = _start_floor(name, sockets[name], api.url, node.driver)
                for name in FLOORS:
                    while not sockets[name].exists():
                        if floors[name].poll() is not None:
                            raise RuntimeError(f"the {name} floor server did not start")
                        await asyncio.sleep(0.01)
                figures, windows = await _series(sock, sockets, claims, warmup, NS, root)
                figures.update(await _health_series(node, root, health_rounds))
            if daemon_env is None:
                figures["breakdown"] = breakdown(read_spans(spans), windows)  # written as the daemon exited
            return figures
    finally:
        for floor in floors.values():
            floor.send_signal(signal.SIGTERM)
        for floor in floors.values():
            floor.wait(10)


def _calls(
    sock: Path, floor_socks: dict[str, Path], claims: list[tuple[str, str]], warmup: int, ns: str
) -> tuple[dict[str, list[int]], dict[str, list[tuple[int, int]]]]:
    """Each round prepares one claim on every floor then on devplug, and unprepares it the same way; each kind of
    call's times (ns), and when each measured devplug call started and ended (``perf_counter_ns``, for
    :func:`bench.spans.breakdown`)."""
    devplug = DraStub(sock)
    stubs = {name: DraStub(path) for name, path in floor_socks.items()}
    order = [*((f"floor_{n}", stubs[n]) for n in FLOORS), ("devplug", devplug)]
    samples: dict[str, list[int]] = {}
    windows: dict[str, list[tuple[int, int]]] = {"prepare": [], "unprepare": []}
    try:
        for i, (name, uid) in enumerate(claims):
            for op in ("prepare", "unprepare"):
                for who, stub in order:
                    start = time.perf_counter_ns()
                    if op == "prepare":
                        stub.prepare(ns, name, uid)
                    else:
                        stub.unprepare(ns, name, uid)
                    end = time.perf_counter_ns()
                    if i >= warmup:
                        key = op if who == "devplug" else f"{who}_{op}"
                        samples.setdefault(key, []).append(end - start)
                        if who == "devplug":
                            windows[op].append((start, end))
    finally:
        for stub in (devplug, *stubs.values()):
            stub.close()
    return samples, windows


def _client_main(plan: Path) -> None:
    """The calls of :func:`_calls`, as ``plan`` (JSON) names them; their times as JSON on stdout."""
    given = json.loads(plan.read_text())
    floor_socks = {name: Path(path) for name, path in given["floors"].items()}
    claims = [(name, uid) for name, uid in given["claims"]]
    samples, windows = _calls(Path(given["devplug"]), floor_socks, claims, given["warmup"], given["namespace"])
    print(json.dumps({"samples": samples, "windows": windows}))


async def _series(
    sock: Path, floor_socks: dict[str, Path], claims: list[tuple[str, str]], warmup: int, ns: str, root: Path
) -> tuple[dict[str, Any], dict[str, list[tuple[int, int]]]]:
    """:func:`_calls` in a process of its own, as the kubelet is: its answers are not held up by this process's
    threads (the API server stand-in, the dev kubelet handling the health stream); the figures, and the windows."""
    plan = root / "calls.json"
    floors = {name: str(path) for name, path in floor_socks.items()}
    plan.write_text(
        json.dumps({"devplug": str(sock), "floors": floors, "claims": claims, "warmup": warmup, "namespace": ns})
    )
    client = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.dra",
        "--client",
        str(plan),
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=dict(os.environ, GRPC_VERBOSITY="ERROR"),
    )
    out, _ = await client.communicate()
    if client.returncode != 0:
        raise RuntimeError(f"the DRA bench's client failed (exit {client.returncode}); its error is above")
    result = json.loads(out)
    samples: dict[str, list[int]] = result["samples"]
    windows = {op: [(start, end) for start, end in spans] for op, spans in result["windows"].items()}
    figures = {key: summary_ms(values) for key, values in samples.items()}
    for op in ("prepare", "unprepare"):
        figures[f"floor_{op}"] = figures[f"floor_{FLOOR}_{op}"]
        figures[op]["ratio_p50"] = figures[op]["p50"] / figures[f"floor_{op}"]["p50"]
        figures[op]["ratio_p99"] = figures[op]["p99"] / figures[f"floor_{op}"]["p99"]
    return figures, windows


async def _health_series(node: Any, root: Path, rounds: int) -> dict[str, Any]:
    """Flip one device's health ``rounds`` times in devplug's mock folder and in the floor's; how long each took
    to reach the kubelet's health cache (and, for devplug, the ResourceSlice)."""
    from devplug.devkubelet.dra.model import HealthStatus
    from devplug.testing.dranode import NODE, eventually

    floor_dir = node.root / "floor-devices"
    floor_dir.mkdir()
    (floor_dir / "dev0").write_text("")
    floor = subprocess.Popen(
        [sys.executable, "-m", "bench.dra", "--health-floor", str(node.root)],
        env=dict(os.environ, GRPC_VERBOSITY="ERROR"),
        stdin=subprocess.DEVNULL,
    )
    samples: dict[str, list[int]] = {"health": [], "floor_health": [], "slice": []}

    def kubelet_sees(driver: str, device: str, unhealthy: bool) -> bool:
        wanted = HealthStatus.UNHEALTHY if unhealthy else HealthStatus.HEALTHY
        return bool(node.kubelet.device_health(driver, NODE, device).health is wanted)

    def tainted(device: str, wanted: bool) -> bool:
        found = any(d["name"] == device and d.get("taints") for s in node.slices() for d in s["spec"]["devices"])
        return found is wanted

    async def until(predicate: Any, start: int) -> int:
        while not predicate():
            await asyncio.sleep(0.0005)
        return time.perf_counter_ns() - start

    try:
        await eventually(lambda: kubelet_sees(FLOOR_DRIVER, "dev0", False), "the health floor registered")
        await eventually(lambda: kubelet_sees(node.driver, "mock0", False), "mock0 healthy at the kubelet")
        for i in range(2 * rounds):
            sick = i % 2 == 0
            text = f"unhealthy=bench {i}\n" if sick else ""
            start = time.perf_counter_ns()
            (floor_dir / "dev0").write_text(text)
            samples["floor_health"].append(
                await until(functools.partial(kubelet_sees, FLOOR_DRIVER, "dev0", sick), start)
            )
            start = time.perf_counter_ns()
            (node.folder / "mock0").write_text(text)
            samples["health"].append(await until(functools.partial(kubelet_sees, node.driver, "mock0", sick), start))
            now = time.perf_counter_ns()
            samples["slice"].append(samples["health"][-1] + await until(functools.partial(tainted, "mock0", sick), now))
    finally:
        floor.send_signal(signal.SIGTERM)
        floor.wait(10)
    figures = {key: summary_ms(values) for key, values in samples.items()}
    figures["health"]["ratio_p50"] = figures["health"]["p50"] / figures["floor_health"]["p50"]
    figures["health"]["ratio_p99"] = figures["health"]["p99"] / figures["floor_health"]["p99"]
    return figures


def measure(
    rounds: int,
    warmup: int,
    health_rounds: int,
    profile: Path | None = None,
    daemon_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The figures (as ``--json`` prints them) of ``rounds`` prepare and unprepare rounds after ``warmup`` ones, and
    ``health_rounds`` health flips, in a fresh folder under /tmp (socket paths hold 107 bytes); ``profile``: the
    daemon's event loop profiled, its statistics written there (a diagnostic: the figures are then slower).
    ``daemon_env``: the daemon runs plain ``devplug run`` with this environment added (``bench.compare``'s other
    tree), without the stage timing: the figures then have no ``breakdown``."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="devplug-bench-dra-", dir="/tmp") as tmp:
        return asyncio.run(_measure(rounds, warmup, Path(tmp), health_rounds, profile, daemon_env))


#: The stages of the breakdown (:mod:`bench.spans`) given as results.json keys, by the name in their key.
BREAKDOWN_KEYS = {
    "grpc": "grpc",
    "read": "read",
    "admission": "admission",
    "release": "release",
    "ledger": "ledger",
    "hook": "hook",
    "cdi": "cdi",
    "handler.cpu": "loop_cpu",
}


def results_keys(figures: dict[str, Any]) -> dict[str, float]:
    """The figures as ``make bench``'s results.json keys (``dra_*``; see bench/report.py)."""
    out: dict[str, float] = {}
    for op in ("prepare", "unprepare"):
        f, floor = figures[op], figures[f"floor_{op}"]
        out.update(
            {
                f"dra_{op}_p50_ms": f["p50"],
                f"dra_{op}_p99_ms": f["p99"],
                f"dra_{op}_ratio_p50": f["ratio_p50"],
                f"dra_{op}_ratio_p99": f["ratio_p99"],
                f"dra_{op}_floor_p50_ms": floor["p50"],
                f"dra_{op}_floor_p99_ms": floor["p99"],
            }
        )
        for name in FLOORS:
            if name != FLOOR:
                other = figures[f"floor_{name}_{op}"]
                out[f"dra_{op}_floor_{name}_p50_ms"] = other["p50"]
                out[f"dra_{op}_floor_{name}_p99_ms"] = other["p99"]
        stages = figures["breakdown"][op] if "breakdown" in figures else {}
        for stage, key in BREAKDOWN_KEYS.items():
            if stage in stages:
                out[f"dra_{op}_{key}_p50_ms"] = stages[stage]["p50"]
    health, floor, sliced = figures["health"], figures["floor_health"], figures["slice"]
    out.update(
        dra_health_to_kubelet_p50_ms=health["p50"],
        dra_health_to_kubelet_p99_ms=health["p99"],
        dra_health_floor_p50_ms=floor["p50"],
        dra_health_floor_p99_ms=floor["p99"],
        dra_health_to_slice_p50_ms=sliced["p50"],
        dra_health_to_slice_p99_ms=sliced["p99"],
        dra_rounds=figures["prepare"]["n"],
    )
    return out


def _table(figures: dict[str, Any], rounds: int) -> str:
    lines = [
        f"DRA calls, one claim each, {rounds} rounds, interleaved with bare grpcio DRAPlugin floors; the ratios are "
        f"against the {FLOOR} floor (it reads the claim)",
        "",
        "| call | p50 (ms) | p99 (ms) | floor p50 | floor p99 | p50 / floor | p99 / floor |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for op in ("prepare", "unprepare", "health"):
        f, g = figures[op], figures[f"floor_{op}"]
        lines.append(
            f"| {op} | {f['p50']:.3f} | {f['p99']:.3f} | {g['p50']:.3f} | {g['p99']:.3f} | "
            f"{f['ratio_p50']:.2f} | {f['ratio_p99']:.2f} |"
        )
    f = figures["slice"]
    lines.append(f"| slice | {f['p50']:.3f} | {f['p99']:.3f} | - | - | - | - |")
    lines += [
        "",
        "| floor | prepare p50 | prepare p99 | unprepare p50 | unprepare p99 |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in FLOORS:
        p, u = figures[f"floor_{name}_prepare"], figures[f"floor_{name}_unprepare"]
        lines.append(f"| {name} | {p['p50']:.3f} | {p['p99']:.3f} | {u['p50']:.3f} | {u['p99']:.3f} |")
    lines += ["", "Where devplug's time goes (each stage's p50 and p99 over the calls, ms; runs per call):", ""]
    lines += [
        "| stage | prepare p50 | p99 | runs | unprepare p50 | p99 | runs |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    prepare, unprepare = figures["breakdown"]["prepare"], figures["breakdown"]["unprepare"]
    for stage in dict.fromkeys([*prepare, *unprepare]):
        cells = []
        for side in (prepare, unprepare):
            got = side.get(stage)
            cells.append(f"{got['p50']:.3f} | {got['p99']:.3f} | {got['runs']:.0f}" if got else "- | - | -")
        lines.append(f"| {stage} | {cells[0]} | {cells[1]} |")
    lines.append("")
    lines.append(
        "health: a device's health change to the kubelet's health cache; slice: to its ResourceSlice (no floor)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dra")
    parser.add_argument("--quick", action="store_true", help="a tiny run (checks the benchmark works)")
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--profile", type=Path, help="profile the daemon's event loop (cProfile stats to this file)")
    parser.add_argument("--floor", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--read", choices=("raw", "lightkube"), help=argparse.SUPPRESS)
    parser.add_argument("--api", help=argparse.SUPPRESS)
    parser.add_argument("--driver", help=argparse.SUPPRESS)
    parser.add_argument("--health-floor", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--client", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client is not None:
        _client_main(args.client)
        return
    if args.floor is not None:
        if args.read is None:
            _floor_main(args.floor)
        else:
            _reading_floor_main(args.floor, args.read, args.api, args.driver)
        return
    if args.health_floor is not None:
        _health_floor_main(args.health_floor)
        return
    from bench.settings import FULL, QUICK

    s = QUICK if args.quick else FULL
    rounds = s.dra_rounds if args.quick else args.rounds
    figures = measure(rounds, s.dra_warmup, s.dra_health_rounds, args.profile and args.profile.resolve())
    print(json.dumps(figures, indent=1) if args.json else _table(figures, rounds))


if __name__ == "__main__":
    main()
