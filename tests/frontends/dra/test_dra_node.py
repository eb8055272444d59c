"""End to end: ``devplug run`` serving the mock driver through DRA, the dev kubelet's DRA side, the API server and
scheduler stand-ins. A pod's claim is admitted, prepared, used and unprepared; the kubelet restarts; the daemon is
killed mid-way; a device turns unhealthy with its reason."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import pytest

from devplug.cli.statusview import format_status
from devplug.daemon.status import read_status
from devplug.devkubelet import ClaimPrepareError, ClaimUnprepareError, ContainerSpec, PodPhase, PodSpec
from devplug.devkubelet.dra.model import HealthStatus
from devplug.testing.apiserver import ApiServer
from tests.frontends.dra.conftest import NODE, run
from tests.frontends.dra.dranode import DRIVER, NS, RESOURCE, dra_node, eventually


def _healthy_devices(view: Any) -> int:
    return 0 if view is None else sum(1 for d in view.devices if d.healthy)


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
            assert prepared.cdi_device_ids == (f"{DRIVER}/claim={uid}-dev",)
            assert lab.kubelet.container_cdi_devices("p1", "app") == [f"{DRIVER}/claim={uid}-dev"]
            spec = lab.spec_of(uid)
            assert spec["kind"] == f"{DRIVER}/claim"
            [cdi_device] = spec["devices"]
            assert cdi_device["name"] == f"{uid}-dev"
            assert [n["path"] for n in cdi_device["containerEdits"]["deviceNodes"]] == [f"/dev/mock/{device}"]
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

            def shown() -> Any:
                [entry] = read_status(lab.root / "state")["resources"]
                return entry if entry.get("frontend", {}).get("claims", {}).get("prepared") == 1 else None

            entry = await eventually(shown, "the prepared claim in the status", details=lab.log)
            assert entry["state"] == "registered" and entry["socket"].startswith(str(lab.root / "plugins" / DRIVER))
            frontend = entry["frontend"]
            assert (frontend["driver"], frontend["pool"]) == (DRIVER, NODE)
            assert frontend["registration"]["registered"] is True and frontend["registration"]["error"] == ""
            assert frontend["slices"]["error"] is None and frontend["slices"]["slices"] == 1
            assert frontend["slices"]["in_sync"] is True and frontend["slices"]["failures"] == 0
            assert frontend["claims"]["held"] == 1
            assert frontend["claims"]["list"] == [
                {"claim": f"{NS}/c1", "uid": uid, "devices": [device], "pods": [pod.uid]}
            ]
            shown_text = format_status(read_status(lab.root / "state"))
            assert f"DRA driver {DRIVER}, pool {NODE}" in shown_text
            assert "kubelet plugin watcher: registered" in shown_text
            assert "keys DRA plugins by endpoint (from Node node-a status.nodeInfo.kubeletVersion)" in shown_text
            assert "API resource.k8s.io/v1 (served v1), device taints used" in shown_text
            assert "ResourceSlices: 1, generation" in shown_text and "in sync" in shown_text
            assert "claims: 1 prepared now; since start 1 prepared, 0 unprepared, 0 refused" in shown_text
            assert f"{NS}/c1 (uid {uid}): {device}; pods {pod.uid}" in shown_text

            # a second pod shares the claim: prepared once, released when the last pod is done
            pod2, _ = lab.schedule_pod("p2", ["c1"])
            await lab.kubelet.admit_pod(pod2)
            assert lab.kubelet.container_cdi_devices("p2", "app") == [f"{DRIVER}/claim={uid}-dev"]
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
            (lab.folder / "mock1").write_text("unhealthy=ECC errors: 12 uncorrectable\n")
            await eventually(lambda: health("mock1") is HealthStatus.UNHEALTHY, "mock1 unhealthy", details=lab.log)
            assert lab.kubelet.device_health(DRIVER, NODE, "mock1").message == "ECC errors: 12 uncorrectable"
            assert health("mock0") is HealthStatus.HEALTHY

    run(scenario, 90)


def test_a_kubelet_restart_and_a_wiped_plugins_registry_register_the_driver_again(api: ApiServer) -> None:
    async def scenario() -> None:
        async with dra_node(api) as lab:
            await lab.published(3)
            lab.make_claim("c1")
            pod, [claim] = lab.schedule_pod("p1", ["c1"])
            await lab.kubelet.admit_pod(pod)
            notified = len(lab.kubelet.events_of("dra-plugin-registered", DRIVER))

            await lab.kubelet.restart()
            await lab.registered()
            await lab.published(3)  # the kubelet wipes slices of drivers it does not see; the daemon's are back
            [state] = lab.kubelet.dra_claims()
            assert state.uid == claim["metadata"]["uid"] and not state.prepared  # from dra_manager_state
            pod2, _ = lab.schedule_pod("p2", ["c1"])
            await lab.kubelet.admit_pod(pod2)  # the kubelet prepares the restored claim again: the same answer
            [state] = lab.kubelet.dra_claims()
            assert state.prepared and state.pod_uids == {pod.uid, pod2.uid}
            # the kubelet appends the new answer's devices to the checkpoint's (addDevice): the same CDI ID twice
            assert lab.kubelet.container_cdi_devices("p2", "app") == [f"{DRIVER}/claim={state.uid}-dev"] * 2
            assert len(lab.calls("allocate")) == 1

            [socket] = list((lab.root / "plugins_registry").glob(f"{DRIVER}-*-reg.sock"))
            socket.unlink()  # what a wiped plugins_registry does to the running kubelet: the plugin is gone
            await eventually(
                lambda: len(lab.kubelet.events_of("dra-plugin-registered", DRIVER)) > notified + 1,
                "registered again through a new socket",
                details=lab.log,
            )
            assert socket.exists()

            await lab.kubelet.finish_pod("p1")
            await lab.kubelet.finish_pod("p2")
            assert lab.kubelet.dra_claims() == []
            assert [c["device_ids"] for c in lab.calls("deallocate")] == [lab.allocated_devices(claim)]
            assert lab.records() == []

    run(scenario, 120)


def test_a_daemon_killed_inside_prepare_and_inside_unprepare_keeps_the_ledger_right(api: ApiServer) -> None:
    async def scenario() -> None:
        async with dra_node(api, {"mock0": "crash=allocate\n"}) as lab:
            await lab.published(1)
            lab.make_claim("c1")
            pod, [claim] = lab.schedule_pod("p1", ["c1"])
            uid = claim["metadata"]["uid"]
            assert lab.daemon is not None
            with pytest.raises(ClaimPrepareError):
                await lab.kubelet.admit_pod(pod)  # the daemon dies after the driver's allocate, before the ledger
            await asyncio.to_thread(lab.daemon.wait, 10.0)
            [pending] = lab.records()
            assert pending["claim_uid"] == uid and pending["pending"] == ["mock0"]

            (lab.folder / "mock0").write_text("crash=post_stop\n")
            lab.start_daemon()
            await lab.registered()
            await lab.kubelet.sync_pod("p1")  # the kubelet prepares again: the crashed allocate is undone first
            [state] = lab.kubelet.dra_claims()
            assert state.prepared
            [record] = lab.records()
            assert (record["claim_uid"], record["devices"], record["pending"]) == (uid, ["mock0"], [])
            assert [(c["hook"], c.get("retry", False)) for c in lab.calls() if c["hook"] != "preferred_allocation"] == [
                ("allocate", False),
                ("deallocate", False),  # the pending record of the crashed allocate: undone before the new one
                ("allocate", False),
            ]

            with pytest.raises(ClaimUnprepareError):  # the daemon dies after post_stop, before the ledger
                await lab.kubelet.finish_pod("p1")
            await asyncio.to_thread(lab.daemon.wait, 10.0)
            assert lab.kubelet.dra_claims() != []  # unprepare owed
            (lab.folder / "mock0").write_text("")
            lab.start_daemon()
            await lab.registered()
            await lab.kubelet.sync_pod("p1")
            await eventually(lambda: lab.kubelet.dra_claims() == [], "the claim unprepared", details=lab.log)
            assert lab.records() == []
            release = [(c["hook"], c.get("retry", False)) for c in lab.calls()][-3:]
            assert release == [("post_stop", False), ("post_stop", True), ("deallocate", False)]

    run(scenario, 150)


def test_a_claim_deleted_while_the_daemon_was_down_is_released_by_reconciliation(api: ApiServer) -> None:
    async def scenario() -> None:
        async with dra_node(api) as lab:
            await lab.published(3)
            lab.make_claim("c1")
            pod, [claim] = lab.schedule_pod("p1", ["c1"])
            await lab.kubelet.admit_pod(pod)
            [device] = lab.allocated_devices(claim)
            assert lab.daemon is not None
            assert await asyncio.to_thread(lab.daemon.stop) == 0
            assert lab.slices() == []  # the last instance of the driver stopped: its slices went with it
            await lab.kubelet.close()  # the node's kubelet forgot it too (its state lost): no unprepare will come
            lab.scheduler.deallocate(NS, "c1")
            api.delete("resourceclaims", "c1", NS)
            lab.start_daemon()
            await eventually(lambda: lab.records() == [], "the deleted claim released", details=lab.log)
            assert [c["device_ids"] for c in lab.calls("post_stop")] == [[device]]
            assert [c["device_ids"] for c in lab.calls("deallocate")] == [[device]]
            assert "is deleted in the API server" in lab.log()
            assert "PodResources" not in lab.log()  # a daemon serving only DRA never polls it (the kubelet is gone)

    run(scenario, 120)


def test_a_node_moved_from_the_device_plugin_api_releases_its_leftovers_by_the_liveness_rules(
    api: ApiServer,
) -> None:
    async def scenario() -> None:
        async with dra_node(api, {"mock0": ""}, start=False) as lab:
            dra_config = lab.config_path.read_text()
            dra_lines = ['api = "dra"', f'dra = {{ driver_name = "{DRIVER}" }}']
            assert all(line in dra_config.splitlines() for line in dra_lines)
            lab.config_path.write_text("\n".join(x for x in dra_config.splitlines() if x not in dra_lines) + "\n")
            lab.start_daemon()
            await lab.kubelet.wait_registered(RESOURCE, 20.0)
            await eventually(lambda: _healthy_devices(lab.kubelet.resource(RESOURCE)) == 1, "mock0 advertised")
            await lab.kubelet.admit_pod(PodSpec("old", [ContainerSpec("app", {RESOURCE: 1})]))
            [record] = lab.records()
            assert record["claim_uid"] is None and record["devices"] == ["mock0"]
            assert lab.daemon is not None and await asyncio.to_thread(lab.daemon.stop) == 0

            lab.config_path.write_text(dra_config)  # the node moves to DRA with the pod still there
            lab.start_daemon()
            await lab.registered()
            # no PodResources through DRA: the record is released once its pod's containers are gone (here they
            # cannot be read, so after [liveness] unknown_grace), as the device-plugin front end would
            await eventually(lambda: lab.records() == [], "the leftover released", details=lab.log)
            assert [c["device_ids"] for c in lab.calls("post_stop")] == [["mock0"]]
            assert [c["device_ids"] for c in lab.calls("deallocate")] == [["mock0"]]
            # while its pod may still run the device is withheld (tainted in the slice): published free again once
            # released, which kube-scheduler waits for (a ResourceSlice update retries the pod)
            lab.make_claim("c1")
            pod, _ = await lab.schedule_pod_eventually("new", ["c1"])
            await lab.kubelet.admit_pod(pod)
            assert [r["claim"] for r in lab.records()] == [f"{NS}/c1"]

    run(scenario, 120)


def test_a_live_reload_restarts_the_resource_and_the_claim_is_unprepared_through_the_new_instance(
    api: ApiServer,
) -> None:
    async def scenario() -> None:
        async with dra_node(api) as lab:
            await lab.published(3)
            lab.make_claim("c1")
            pod, [claim] = lab.schedule_pod("p1", ["c1"])
            await lab.kubelet.admit_pod(pod)
            [first] = lab.kubelet.dra_plugins(DRIVER)
            [before] = lab.slices()
            text = lab.config_path.read_text()
            assert 'api = "dra"' in text
            lab.config_path.write_text(text.replace('api = "dra"', 'api = "dra"\nhealth_interval = 2.0', 1))
            assert lab.daemon is not None and lab.daemon.process is not None
            lab.daemon.process.send_signal(signal.SIGHUP)

            def connected() -> list[str]:
                return [v.endpoint for v in lab.kubelet.dra_plugins(DRIVER) if v.connected]

            await eventually(
                lambda: connected() not in ([], [first.endpoint]),
                "the restarted resource registered through its new instance",
                details=lab.log,
            )
            assert first.endpoint not in connected()
            [after] = await lab.published(3)
            # the old instance left its slices to the new one, which adopted them: never deleted, not written again
            assert after["metadata"]["uid"] == before["metadata"]["uid"]
            assert after["spec"]["pool"]["generation"] == before["spec"]["pool"]["generation"]
            await lab.kubelet.finish_pod("p1")
            assert lab.kubelet.dra_claims() == []
            assert [c["device_ids"] for c in lab.calls("deallocate")] == [lab.allocated_devices(claim)]
            assert lab.records() == []

    run(scenario, 120)
