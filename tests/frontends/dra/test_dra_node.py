"""End to end: ``devplug run`` serving the mock driver through DRA, the dev kubelet's DRA side, the API server and
scheduler stand-ins. A pod's claim is admitted, prepared, used and unprepared; the kubelet restarts; the daemon is
killed mid-way; a device turns unhealthy with its reason."""

from __future__ import annotations

from devplug.devkubelet import PodPhase
from devplug.devkubelet.dra.model import HealthStatus
from devplug.testing.apiserver import ApiServer
from tests.frontends.dra.conftest import NODE, run
from tests.frontends.dra.dranode import DRIVER, NS, dra_node, eventually, spec_of


def test_a_pods_claim_is_prepared_used_and_unprepared_once(api: ApiServer) -> None:
    async def scenario() -> None:
        async with dra_node(api) as lab:
            slices = await lab.published(3)
            assert {s["spec"]["nodeName"] for s in slices} == {NODE}
            lab.make_claim("c1", config={"mode": "fast"})
            pod, [claim] = lab.schedule_pod("p1", ["c1"])
            uid = claim["metadata"]["uid"]
            [device] = lab.allocated_devices(claim)

            await lab.kubelet.admit_pod(pod)
            [state] = lab.kubelet.dra_claims()
            assert state.prepared and state.uid == uid
            [prepared] = state.devices[DRIVER]
            assert (prepared.pool_name, prepared.device_name) == (NODE, device)
            assert prepared.cdi_device_ids == (f"{DRIVER}/claim={uid}",)
            assert lab.kubelet.container_cdi_devices("p1", "app") == [f"{DRIVER}/claim={uid}"]
            spec = spec_of(lab.root, uid)
            assert spec["kind"] == f"{DRIVER}/claim"
            [cdi_device] = spec["devices"]
            assert cdi_device["name"] == uid
            assert f"MOCK_DEVICES={device}" in cdi_device["containerEdits"]["env"]
            [allocate] = lab.calls("allocate")
            assert allocate["device_ids"] == [device]
            assert allocate["claim"] == {
                "name": f"{NS}/c1",
                "uid": uid,
                "requests": {"dev": [device]},
                "config": [{"source": "claim", "requests": ["dev"], "parameters": {"mode": "fast"}}],
            }
            [record] = lab.records()
            assert (record["claim_uid"], record["claim"], record["devices"]) == (uid, f"{NS}/c1", [device])
            assert record["pod_uid"] == pod.uid

            # a second pod shares the claim: prepared once, released when the last pod is done
            pod2, _ = lab.schedule_pod("p2", ["c1"])
            await lab.kubelet.admit_pod(pod2)
            assert lab.kubelet.container_cdi_devices("p2", "app") == [f"{DRIVER}/claim={uid}"]
            assert len(lab.calls("allocate")) == 1
            await lab.kubelet.finish_pod("p1")
            assert lab.kubelet.pod_phase("p1") is PodPhase.FINISHED
            assert lab.calls("post_stop") == [] and lab.calls("deallocate") == []
            assert [r["claim_uid"] for r in lab.records()] == [uid]

            await lab.kubelet.finish_pod("p2")
            assert lab.kubelet.dra_claims() == []
            assert [c["device_ids"] for c in lab.calls("post_stop")] == [[device]]
            assert [c["device_ids"] for c in lab.calls("deallocate")] == [[device]]
            assert lab.records() == []
            assert not (lab.root / "cdi" / f"dra-{DRIVER}-{uid}.json").exists()

    run(scenario, 90)


def test_an_unhealthy_device_reaches_the_kubelets_health_cache_with_its_reason(api: ApiServer) -> None:
    async def scenario() -> None:
        async with dra_node(api, {"mock0": "", "mock1": ""}) as lab:
            await lab.published(2)

            def health(name: str) -> HealthStatus:
                return lab.kubelet.device_health(DRIVER, NODE, name).health

            await eventually(lambda: health("mock1") is HealthStatus.HEALTHY, "mock1 healthy", details=lab.log)
            (lab.mock_dir / "mock1").write_text("unhealthy=ECC errors: 12 uncorrectable\n")
            await eventually(lambda: health("mock1") is HealthStatus.UNHEALTHY, "mock1 unhealthy", details=lab.log)
            assert lab.kubelet.device_health(DRIVER, NODE, "mock1").message == "ECC errors: 12 uncorrectable"
            assert health("mock0") is HealthStatus.HEALTHY

    run(scenario, 90)
