"""DRA prepare and unprepare round trips: devplug's DRA front end against a bare grpcio DRAPlugin floor, same run.

``python -m bench.dra`` (``--quick`` for a tiny run; ``--json`` for the figures
as JSON). devplug's side is the real thing: ``devplug run`` serving the mock
driver through DRA (a child process), the API server stand-in over HTTP on
loopback (each prepare reads its claim from it, as on a node), claims allocated
as the scheduler writes them, each call a ``v1.DRAPlugin`` call over the
daemon's unix socket, one claim per call. Each round prepares one claim then
unprepares it (so the ledger holds one claim at most; the devices cycle
through 8 mock devices). The floor: a bare grpcio server in its own process
answering the same calls with a precomputed answer and no work at all, called
from the same client, interleaved call by call with devplug's so that both see
the same machine load. The figures are p50 and p99 in milliseconds and their
ratios to the floor's; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc

from bench.stats import summary_ms

DEVICES = 8


def _floor_main(sock: Path) -> None:
    """The floor: v1.DRAPlugin with precomputed answers (a prepared device with its CDI ID; an empty error)."""
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

    handler = grpc.method_handlers_generic_handler(
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
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix:{sock}")
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    server.start()
    signal.sigwait({signal.SIGTERM})
    server.stop(None)


class _Stub:
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


def _claims(node: Any, count: int) -> list[tuple[str, str]]:
    """``count`` claims, each allocated one mock device as the scheduler writes it (round robin)."""
    from devplug.testing.dranode import NODE, NS

    made = []
    for i in range(count):
        claim = node.make_claim(f"bench-{i}")
        status = {
            "allocation": {
                "devices": {
                    "results": [{"request": "dev", "driver": node.driver, "pool": NODE, "device": f"mock{i % DEVICES}"}]
                }
            }
        }
        stored = node.api.update("resourceclaims", {**claim, "status": status}, NS, "kube-scheduler", "status")
        made.append((stored["metadata"]["name"], stored["metadata"]["uid"]))
    return made


async def _measure(rounds: int, warmup: int, root: Path) -> dict[str, Any]:
    from devplug.testing.apiserver import ApiServer
    from devplug.testing.dranode import NS, dra_node

    folder = root / "mock"
    folder.mkdir()
    for i in range(DEVICES):
        (folder / f"mock{i}").write_text("")
    floor_sock = root / "floor.sock"
    floor = subprocess.Popen(
        [sys.executable, "-m", "bench.dra", "--floor", str(floor_sock)],
        env=dict(os.environ, GRPC_VERBOSITY="ERROR"),
        stdin=subprocess.DEVNULL,
    )
    try:
        with ApiServer() as api:
            table = {"driver": "mock", "options": {"directory": str(folder)}}
            async with dra_node(api, "example.com/mock", table, folder, driver="mock.example.com") as node:
                await node.published(DEVICES)
                claims = _claims(node, rounds + warmup)
                [sock] = sorted((node.root / "plugins" / node.driver).glob("dra-*.sock"))
                while not floor_sock.exists():
                    if floor.poll() is not None:
                        raise RuntimeError("the floor server did not start")
                    await asyncio.sleep(0.01)
                return await asyncio.to_thread(_series, sock, floor_sock, claims, warmup, NS)
    finally:
        floor.send_signal(signal.SIGTERM)
        floor.wait(10)


def _series(sock: Path, floor_sock: Path, claims: list[tuple[str, str]], warmup: int, ns: str) -> dict[str, Any]:
    devplug, floor = _Stub(sock), _Stub(floor_sock)
    samples: dict[str, list[int]] = {"prepare": [], "unprepare": [], "floor_prepare": [], "floor_unprepare": []}
    try:
        for i, (name, uid) in enumerate(claims):
            for key, stub, prepare in (
                ("floor_prepare", floor, True),
                ("prepare", devplug, True),
                ("floor_unprepare", floor, False),
                ("unprepare", devplug, False),
            ):
                start = time.perf_counter_ns()
                if prepare:
                    stub.prepare(ns, name, uid)
                else:
                    stub.unprepare(ns, name, uid)
                took = time.perf_counter_ns() - start
                if i >= warmup:
                    samples[key].append(took)
    finally:
        devplug.close()
        floor.close()
    figures = {key: summary_ms(values) for key, values in samples.items()}
    for op in ("prepare", "unprepare"):
        figures[op]["ratio_p50"] = figures[op]["p50"] / figures[f"floor_{op}"]["p50"]
        figures[op]["ratio_p99"] = figures[op]["p99"] / figures[f"floor_{op}"]["p99"]
    return figures


def _table(figures: dict[str, Any], rounds: int) -> str:
    lines = [
        f"DRA calls, one claim each, {rounds} rounds, interleaved with a bare grpcio DRAPlugin floor",
        "",
        "| call | p50 (ms) | p99 (ms) | floor p50 | floor p99 | p50 / floor | p99 / floor |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for op in ("prepare", "unprepare"):
        f, g = figures[op], figures[f"floor_{op}"]
        lines.append(
            f"| {op} | {f['p50']:.3f} | {f['p99']:.3f} | {g['p50']:.3f} | {g['p99']:.3f} | "
            f"{f['ratio_p50']:.1f} | {f['ratio_p99']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dra")
    parser.add_argument("--quick", action="store_true", help="a tiny run (checks the benchmark works)")
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--floor", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.floor is not None:
        _floor_main(args.floor)
        return
    rounds, warmup = (20, 5) if args.quick else (args.rounds, 50)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="devplug-bench-dra-", dir="/tmp") as tmp:
        figures = asyncio.run(_measure(rounds, warmup, Path(tmp)))
    print(json.dumps(figures, indent=1) if args.json else _table(figures, rounds))


if __name__ == "__main__":
    main()
