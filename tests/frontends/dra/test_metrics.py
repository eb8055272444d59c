"""The DRA front end's metrics: ``devplug run`` serving the mock driver through DRA with ``[metrics] enabled``,
scraped over HTTP on loopback while the dev kubelet prepares and unprepares claims, the driver fails, the API server
refuses the slices and a claim is deleted while the daemon is down. The exposition is parsed with prometheus_client's
own parser; each counter moves by exactly what happened, and no series names a claim."""

from __future__ import annotations

import asyncio
import http.client
import socket
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devplug.devkubelet import ClaimPrepareError
from devplug.testing.apiserver import ApiServer
from tests.frontends.dra.conftest import NODE, run
from tests.frontends.dra.dranode import DRIVER, NS, RESOURCE, DraNode, dra_node, eventually

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape_now(port: int) -> Samples:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        body = response.read().decode()
        assert response.status == 200, body
    finally:
        conn.close()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


async def _scrape(port: int) -> Samples:
    return await asyncio.to_thread(_scrape_now, port)


def _v(samples: Samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted({"resource": RESOURCE, **labels}.items())))
    assert key in samples, f"no sample {name}{labels}; have {sorted(k for k in samples if k[0] == name)}"
    return samples[key]


def _series(samples: Samples, prefix: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {k: v for k, v in samples.items() if k[0].startswith(prefix)}


async def _until(port: int, lab: DraNode, what: str, check: Any) -> Samples:
    """Scrape until ``check(samples)`` holds; the samples."""
    found: list[Samples] = []

    async def poll() -> bool:
        found[:] = [await _scrape(port)]
        return bool(check(found[0]))

    deadline = asyncio.get_running_loop().time() + 20.0
    while not await poll():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out waiting for {what}; DRA series: {_series(found[0], 'devplug_dra_')}\n{lab.log()}")
        await asyncio.sleep(0.05)
    return found[0]


def test_claims_prepared_unprepared_and_refused_are_counted_by_kind_never_by_claim(api: ApiServer) -> None:
    port = _free_port()

    async def scenario() -> None:
        async with dra_node(api, {"mock0": ""}, metrics_port=port) as lab:
            await lab.published(1)
            s = await _until(port, lab, "the slices in sync", lambda s: _v(s, "devplug_dra_slices_in_sync") == 1)
            assert _v(s, "devplug_dra_driver_info", driver=DRIVER, pool=NODE) == 1
            assert _v(s, "devplug_dra_registration_state", state="registered") == 1
            assert _v(s, "devplug_dra_registration_state", state="refused") == 0
            assert _v(s, "devplug_dra_registration_state", state="unknown") == 0
            assert _v(s, "devplug_resource_registered") == 1
            assert _v(s, "devplug_dra_slices") == 1
            assert _v(s, "devplug_dra_pool_generation") >= 1
            assert _v(s, "devplug_dra_slice_publish_failures") == 0
            assert _v(s, "devplug_dra_slices_last_sync_timestamp_seconds") > 0
            assert _v(s, "devplug_dra_claims_prepared") == 0
            assert _series(s, "devplug_dra_claim_") == {}  # nothing asked yet: no series

            lab.make_claim("c1")
            pod, [claim] = lab.schedule_pod("p1", ["c1"])
            await lab.kubelet.admit_pod(pod)
            s = await _until(port, lab, "the claim prepared", lambda s: _v(s, "devplug_dra_claims_prepared") == 1)
            assert _v(s, "devplug_dra_claim_prepares_total") == 1
            assert _v(s, "devplug_dra_claim_call_duration_seconds_count", call="prepare") == 1
            assert _series(s, "devplug_dra_claim_prepare_failures") == {}
            assert _v(s, "devplug_allocations_total") == 1  # the core's admission, counted as for Allocate

            await lab.kubelet.finish_pod("p1")
            s = await _until(port, lab, "the claim unprepared", lambda s: _v(s, "devplug_dra_claims_prepared") == 0)
            assert _v(s, "devplug_dra_claim_unprepares_total") == 1
            assert _v(s, "devplug_dra_claim_call_duration_seconds_count", call="unprepare") == 1
            assert _series(s, "devplug_dra_claim_unprepare_failures") == {}
            assert _v(s, "devplug_releases_total") == 1

            lab.scheduler.deallocate(NS, "c1")  # as the claim controller does once no pod uses it

            # the driver's allocate fails: that claim's error, counted by its kind
            (lab.folder / "mock0").write_text("fail=allocate\n")
            lab.make_claim("c2")
            pod2, [claim2] = lab.schedule_pod("p2", ["c2"])
            with pytest.raises(ClaimPrepareError):
                await lab.kubelet.admit_pod(pod2)
            s = await _scrape(port)
            assert _v(s, "devplug_dra_claim_prepares_total") == 2
            assert _v(s, "devplug_dra_claim_prepare_failures_total", reason="driver_failed") == 1
            assert _v(s, "devplug_dra_claims_prepared") == 0

            # the claim is deleted before the kubelet tries again: not found
            (lab.folder / "mock0").write_text("")
            lab.scheduler.deallocate(NS, "c2")
            api.delete("resourceclaims", "c2", NS)
            with pytest.raises(ClaimPrepareError):
                await lab.kubelet.sync_pod("p2")
            s = await _scrape(port)
            assert _v(s, "devplug_dra_claim_prepares_total") == 3
            assert _v(s, "devplug_dra_claim_prepare_failures_total", reason="claim_not_found") == 1
            assert _v(s, "devplug_dra_claim_prepare_failures_total", reason="driver_failed") == 1
            assert _v(s, "devplug_dra_claim_call_duration_seconds_count", call="prepare") == 3

            uids = {claim["metadata"]["uid"], claim2["metadata"]["uid"], "c1", "c2"}
            labels = {value for _, pairs in _series(s, "devplug_") for _, value in pairs}
            assert labels.isdisjoint(uids), "a series names a claim"

    run(scenario, 120)


def test_slices_the_api_server_refuses_show_out_of_sync_with_the_failures_in_a_row(api: ApiServer) -> None:
    port = _free_port()

    async def scenario() -> None:
        async with dra_node(api, {"mock0": "", "mock1": ""}, metrics_port=port) as lab:
            await lab.published(2)
            s = await _until(port, lab, "the slices in sync", lambda s: _v(s, "devplug_dra_slices_in_sync") == 1)
            generation = _v(s, "devplug_dra_pool_generation")

            # every apply of the slices fails from now on: a device's change cannot be published
            api.faults.fail(500, verb="patch", resource="resourceslices", count=10_000)
            (lab.folder / "mock1").write_text("unhealthy=ECC errors\n")
            s = await _until(
                port,
                lab,
                "the publication failing",
                lambda s: _v(s, "devplug_dra_slices_in_sync") == 0 and _v(s, "devplug_dra_slice_publish_failures") >= 2,
            )
            assert _v(s, "devplug_dra_pool_generation") >= generation
            assert _v(s, "devplug_device_unhealthy", device="mock1", reason="ECC errors") == 1

    run(scenario, 120)


def test_a_claim_deleted_while_the_daemon_was_down_is_counted_gone_by_its_cause(api: ApiServer) -> None:
    port = _free_port()

    async def scenario() -> None:
        async with dra_node(api, metrics_port=port) as lab:
            await lab.published(3)
            lab.make_claim("c1")
            pod, _ = lab.schedule_pod("p1", ["c1"])
            await lab.kubelet.admit_pod(pod)
            assert lab.daemon is not None
            assert await asyncio.to_thread(lab.daemon.stop) == 0
            await lab.kubelet.close()  # the node's kubelet forgot the claim too: no unprepare will come
            lab.scheduler.deallocate(NS, "c1")
            api.delete("resourceclaims", "c1", NS)
            lab.start_daemon()
            await eventually(lambda: lab.records() == [], "the deleted claim released", details=lab.log)
            s = await _until(port, lab, "the claim counted gone", lambda s: _series(s, "devplug_dra_claims_gone"))
            assert _v(s, "devplug_dra_claims_gone_total", cause="deleted") == 1
            assert _v(s, "devplug_dra_claims_prepared") == 0
            assert _v(s, "devplug_dra_claim_unprepares_total") == 0  # released by reconciliation, not unprepared
            assert _v(s, "devplug_releases_total") == 1

    run(scenario, 120)


def test_the_claims_device_status_writes_are_counted_by_outcome(api: ApiServer) -> None:
    """Issue 41 (KEP-4817): the status the mock's allocate gives is written at prepare and removed at unprepare,
    each counted; no series before the first."""
    from devplug.testing.dranode import dra_node as node_with
    from tests.frontends.dra.dranode import short_root

    port = _free_port()

    async def scenario() -> None:
        with short_root() as scratch:
            folder = scratch / "mock"
            folder.mkdir()
            (folder / "mock0").write_text("")
            table = {"driver": "mock", "options": {"directory": str(folder), "device_status": "ready"}}
            async with node_with(api, RESOURCE, table, folder, driver=DRIVER, metrics_port=port) as lab:
                await lab.published(1)
                s = await _until(port, lab, "the slices in sync", lambda s: _v(s, "devplug_dra_slices_in_sync") == 1)
                assert _series(s, "devplug_dra_claim_status_writes") == {}
                lab.make_claim("c1")
                pod, _ = lab.schedule_pod("p1", ["c1"])
                await lab.kubelet.admit_pod(pod)
                written = "devplug_dra_claim_status_writes_total"

                def count(s: Samples, outcome: str) -> float:  # no series until the first write
                    return s.get((written, (("outcome", outcome), ("resource", RESOURCE))), 0.0)

                s = await _until(port, lab, "the status written", lambda s: count(s, "written") == 1)
                assert (_v(s, written, outcome="failed"), _v(s, written, outcome="invalid")) == (0, 0)
                await lab.kubelet.finish_pod("p1")
                s = await _until(port, lab, "the status removed", lambda s: count(s, "removed") == 1)
                assert _v(s, written, outcome="written") == 1

    run(scenario, 90)
