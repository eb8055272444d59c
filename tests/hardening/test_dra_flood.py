"""Hardening, the DRA socket (issue 36 item 3): a call naming more claims than a node can prepare is refused whole.

Through the real thing: ``devplug run`` serving the mock driver through DRA, the
dev kubelet, the API server stand-in, and a raw gRPC client on the daemon's DRA
socket. 20,000 claims in one NodePrepareResources were all read from the API
server at once (a real claim's prepare sent 3 s later waited 45 s, and RSS grew
63 -> 117 MB). Now a call may name one claim per published device (at least 32:
the kubelet sends one pod's claims of a driver per call, and each claim holds a
device of its own); a larger one gets INVALID_ARGUMENT naming the bound before
anything is read, and the reads of all calls together are bounded.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import grpc.aio
import pytest

from devplug.api.gen.dra.v1 import api_pb2 as v1
from devplug.api.gen.dra.v1 import api_pb2_grpc as v1_grpc
from devplug.testing.apiserver import ApiServer
from tests.frontends.dra.conftest import run
from tests.frontends.dra.dranode import DRIVER, NS, dra_node

FLOOD = 20_000
#: Claims in a call under the byte cap but over the claims bound.
LARGE = 5_000


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _claims(count: int) -> list[v1.Claim]:
    return [v1.Claim(namespace=NS, name=f"flood-{i}", uid=str(uuid.uuid4())) for i in range(count)]


async def _prepare(channel: grpc.aio.Channel, claims: list[v1.Claim]) -> v1.NodePrepareResourcesResponse:
    stub = v1_grpc.DRAPluginStub(channel)
    answer: v1.NodePrepareResourcesResponse = await stub.NodePrepareResources(
        v1.NodePrepareResourcesRequest(claims=claims), timeout=60.0
    )
    return answer


def test_an_over_large_prepare_is_refused_whole_and_a_good_claim_is_not_held_up(api: ApiServer) -> None:
    async def scenario() -> None:
        async with dra_node(api) as lab:
            await lab.published(3)
            assert lab.daemon is not None
            pid = lab.daemon.pid
            reads_before = api.count(verb="get", resource="resourceclaims")
            async with grpc.aio.insecure_channel(
                lab.service_target(), options=[("grpc.max_send_message_length", -1)]
            ) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await _prepare(ch, _claims(FLOOD))
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # over 1 MiB: never parsed
                assert "larger than max" in (refused.value.details() or ""), refused.value.details()
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await _prepare(ch, _claims(LARGE))
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                details = refused.value.details() or ""
                assert f"NodePrepareResources names {LARGE} claims; driver {DRIVER} prepares at most 32 per call" in (
                    details
                ), details
                assert api.count(verb="get", resource="resourceclaims") == reads_before  # nothing was read

                # a flood: over-large calls, and calls of the most claims allowed (none exists: a read each)
                rss_before = _rss_mb(pid)
                flood = [
                    asyncio.ensure_future(_prepare(ch, _claims((FLOOD, LARGE)[i % 4 // 2] if i % 2 else 32)))
                    for i in range(20)
                ]
                await asyncio.sleep(0.5)
                lab.make_claim("good")
                spec, _ = lab.schedule_pod("p1", ["good"])
                started = time.monotonic()
                await lab.kubelet.admit_pod(spec)
                good_s = time.monotonic() - started
                answers = await asyncio.gather(*flood, return_exceptions=True)
                rss_after = _rss_mb(pid)
            refusals = [a for a in answers if isinstance(a, grpc.aio.AioRpcError)]
            assert len(refusals) == 10
            codes = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
            assert {r.code() for r in refusals} == codes
            served = [a for a in answers if isinstance(a, v1.NodePrepareResourcesResponse)]
            assert len(served) == 10 and all(len(a.claims) == 32 for a in served)
            assert all("not found" in e.error for a in served for e in a.claims.values())
            print(
                f"good claim's prepare under the flood: {good_s:.3f} s; daemon RSS {rss_before:.1f} -> "
                f"{rss_after:.1f} MB"
            )
            assert good_s < 5.0, good_s
            assert rss_after - rss_before < 30.0, (rss_before, rss_after)
            assert lab.log().count("refused a call: NodePrepareResources names") == 1 + 5

    run(scenario, 120)
