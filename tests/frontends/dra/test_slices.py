"""SlicePublisher: a device table published as this node's ResourceSlices through the API server stand-in, over real
HTTP with the real lightkube client: content, server-side apply, the owner reference, generations, no write when
nothing changed, resyncs after a wipe, adoption after a restart, failures retried, and shutdown."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from devplug.engine.devicetable import DeviceTable
from devplug.frontends.dra.devicenames import device_name
from devplug.frontends.dra.slicecontent import TAINT_KEY, DeviceDescription, Version
from devplug.frontends.dra.slices import SlicePublisher
from devplug.kube.client import make_client
from devplug.testing.apiserver import ApiServer
from devplug.testing.scheduler import SchedulerStandIn
from devplug.types import Device, Health, HealthReport, Topology

from .conftest import DRIVER, NODE, NS, eventually, node, run

MANAGER = f"devplug-{DRIVER}"
PCI = "0000:3b:00.1"


def slices(api: ApiServer, node_name: str = NODE, driver: str = DRIVER) -> list[dict[str, Any]]:
    found = [
        s
        for s in api.objects("resourceslices")
        if s["spec"].get("nodeName") == node_name and s["spec"]["driver"] == driver
    ]
    return sorted(found, key=lambda s: s["metadata"]["name"])


def devices(api: ApiServer) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices(api) for d in s["spec"].get("devices") or ()}


def writes(api: ApiServer) -> int:
    return api.count(resource="resourceslices", verb="patch") + api.count(resource="resourceslices", verb="delete")


async def published(publisher: SlicePublisher, table: DeviceTable, what: str = "the table published") -> None:
    await eventually(lambda: publisher.state.in_sync and publisher.state.table_version == table.version, what)


def scenario(
    api: ApiServer,
    kubeconfig: Path,
    table: DeviceTable,
    body: Callable[[SlicePublisher], Coroutine[Any, Any, None]],
    **options: Any,
) -> None:
    """Run ``body`` with a started publisher of ``table``; the publisher is shut down (slices kept) after."""

    async def go() -> None:
        client = make_client(kubeconfig, field_manager=MANAGER)
        publisher = SlicePublisher(
            driver=DRIVER, node=NODE, table=table, client=client, debounce=options.pop("debounce", 0.01), **options
        )
        task = publisher.start()
        try:
            await body(publisher)
            assert not task.done(), "the publisher's task ended by itself"
        finally:
            await publisher.shutdown(last_instance=False)
            await client.close()

    run(go)


def table_of(*devs: Device, replicas: int = 1) -> DeviceTable:
    table = DeviceTable(replicas=replicas)
    table.replace(devs)
    return table


def test_the_devices_are_published_as_the_nodes_slice_by_server_side_apply_owned_by_the_node(
    api: ApiServer, kubeconfig: Path
) -> None:
    owner = api.create("nodes", node())
    table = table_of(Device("fpga0", topology=Topology((1,))), Device(PCI), Device("both", topology=Topology((0, 1))))

    async def body(publisher: SlicePublisher) -> None:
        await published(publisher, table)
        (found,) = slices(api)
        meta, spec = found["metadata"], found["spec"]
        assert meta["name"] == f"{NODE}-{DRIVER}-0"
        assert meta["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": owner["metadata"]["uid"], "controller": True}
        ]
        assert meta["labels"] == {"app.kubernetes.io/managed-by": "devplug"}
        assert [(m["manager"], m["operation"]) for m in meta["managedFields"]] == [(MANAGER, "Apply")]
        assert spec["driver"] == DRIVER and spec["nodeName"] == NODE
        assert spec["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
        pci = device_name(PCI)
        assert pci != PCI and pci.startswith("0000-3b-00-1-")
        expected: list[dict[str, Any]] = [
            {"name": "fpga0", "attributes": {"deviceID": {"string": "fpga0"}, "numaNode": {"int": 1}}},
            {"name": pci, "attributes": {"deviceID": {"string": PCI}}},
            {"name": "both", "attributes": {"deviceID": {"string": "both"}}},
        ]
        assert spec["devices"] == sorted(expected, key=lambda d: str(d["name"]))
        assert publisher.device_id(pci) == PCI and publisher.device_id("fpga0") == "fpga0"
        assert publisher.device_id("nothing") is None
        assert publisher.state.generation == 1 and publisher.state.devices == 3 and publisher.state.slices == 1

    scenario(api, kubeconfig, table, body)


def test_health_and_device_changes_bump_the_generation_and_a_reason_alone_writes_nothing(
    api: ApiServer, kubeconfig: Path
) -> None:
    api.create("nodes", node())
    table = table_of(Device("fpga0"), Device("fpga1"))

    async def body(publisher: SlicePublisher) -> None:
        await published(publisher, table)
        table.set_health({"fpga1": HealthReport(Health.UNHEALTHY, "PCIe link down")})
        await published(publisher, table, "the unhealthy device tainted")
        taints = devices(api)["fpga1"]["taints"]
        assert [(t["key"], t["value"], t["effect"]) for t in taints] == [(TAINT_KEY, "unhealthy", "NoSchedule")]
        added = taints[0]["timeAdded"]
        assert "taints" not in devices(api)["fpga0"]
        assert slices(api)[0]["spec"]["pool"]["generation"] == 2 == publisher.state.generation
        assert publisher.state.tainted == 1

        before = writes(api)
        table.set_health({"fpga1": HealthReport(Health.UNHEALTHY, "PCIe link down, retrained twice")})
        await published(publisher, table, "the reason's change seen")
        assert writes(api) == before, "a change of the reason alone wrote the slices"

        table.update([Device("fpga2")])
        await published(publisher, table, "the new device published")
        assert sorted(devices(api)) == ["fpga0", "fpga1", "fpga2"]
        assert slices(api)[0]["spec"]["pool"]["generation"] == 3
        assert devices(api)["fpga1"]["taints"][0]["timeAdded"] == added, "the taint's time was not kept"

        table.set_withheld({"fpga0"})
        await published(publisher, table, "the withheld device tainted")
        assert devices(api)["fpga0"]["taints"][0]["value"] == "releasing"
        table.set_withheld(())
        table.set_degraded("the driver's health check fails")
        await published(publisher, table, "every device tainted for the degraded driver")
        assert {d["taints"][0]["value"] for d in devices(api).values()} == {"degraded"}
        table.set_degraded(None)
        table.set_health({"fpga1": Health.HEALTHY})
        table.update(removed=["fpga2"])
        await published(publisher, table, "all healthy again")
        assert [d.get("taints") for d in devices(api).values()] == [None, None]
        assert slices(api)[0]["spec"]["pool"]["generation"] == publisher.state.generation == 6

    scenario(api, kubeconfig, table, body)


def test_replicas_are_devices_of_their_own_naming_their_physical_device_and_the_scheduler_allocates_them(
    api: ApiServer, kubeconfig: Path
) -> None:
    """A shared device is published as one device per replica, with ``physicalDevice`` and ``replica`` attributes:
    the scheduler allocates them like any device, and the claim names replica devices the table knows."""
    api.create("nodes", node())
    table = table_of(Device("fpga0"), Device("fpga1", replicas=1), replicas=2)
    api.create(
        "deviceclasses",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "fpga"},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        },
    )

    async def body(publisher: SlicePublisher) -> None:
        await published(publisher, table)
        found = devices(api)
        assert len(found) == 3
        replicas = {publisher.device_id(name): d["attributes"] for name, d in found.items()}
        assert replicas["fpga0::0"]["physicalDevice"] == {"string": "fpga0"}
        assert replicas["fpga0::1"]["replica"] == {"int": 1}
        assert replicas["fpga1"] == {"deviceID": {"string": "fpga1"}}
        api.create(
            "resourceclaims",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "three"},
                "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "fpga", "count": 3}}]}},
            },
            NS,
        )
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c"}], "resourceClaims": [{"name": "x", "resourceClaimName": "three"}]},
        }
        api.create("pods", pod, NS)
        (claim,) = SchedulerStandIn(api.storage).schedule(NS, "p", NODE)
        given = [publisher.device_id(r["device"]) or "" for r in claim["status"]["allocation"]["devices"]["results"]]
        assert sorted(given) == ["fpga0::0", "fpga0::1", "fpga1"]

    scenario(api, kubeconfig, table, body)


def test_a_describer_adds_attributes_and_capacity_and_a_bad_one_is_shown_and_retried(
    api: ApiServer, kubeconfig: Path
) -> None:
    api.create("nodes", node())
    table = table_of(Device("fpga0"))
    broken = {"now": True}

    def describe(dev: Device) -> DeviceDescription:
        if broken["now"]:
            return DeviceDescription(attributes={"model name": "agilex"})
        return DeviceDescription(
            attributes={"model": "agilex", "firmware": Version("1.2.3"), "example.com/partial": True, "lanes": 16},
            capacity={"memory": "16Gi", "slots": 4},
        )

    async def body(publisher: SlicePublisher) -> None:
        await eventually(lambda: publisher.state.error, "the bad attribute name shown")
        assert "device 'fpga0': attribute: 'model name' must end in a C identifier" in (publisher.state.error or "")
        assert slices(api) == [] and writes(api) == 0
        broken["now"] = False
        table.update([Device("fpga0", topology=Topology((0,)))])
        await published(publisher, table, "the described device published")
        entry = devices(api)["fpga0"]
        assert entry["attributes"] == {
            "deviceID": {"string": "fpga0"},
            "numaNode": {"int": 0},
            "model": {"string": "agilex"},
            "firmware": {"version": "1.2.3"},
            "example.com/partial": {"bool": True},
            "lanes": {"int": 16},
        }
        assert entry["capacity"] == {"memory": {"value": "16Gi"}, "slots": {"value": "4"}}

    scenario(api, kubeconfig, table, body, describe=describe)


def test_a_pool_bigger_than_a_slice_is_split_and_shrinking_deletes_the_slices_no_longer_wanted(
    api: ApiServer, kubeconfig: Path
) -> None:
    api.create("nodes", node())
    table = table_of(*(Device(f"fpga{i}") for i in range(200)))

    async def body(publisher: SlicePublisher) -> None:
        await published(publisher, table)
        found = slices(api)
        assert [len(s["spec"]["devices"]) for s in found] == [128, 72]
        assert {(s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in found} == {(1, 2)}
        table.set_health({"fpga7": Health.UNHEALTHY})  # a slice with a tainted device holds at most 64
        await published(publisher, table, "the pool split again")
        found = slices(api)
        assert [len(s["spec"]["devices"]) for s in found] == [64, 64, 64, 8]
        assert {(s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in found} == {(2, 4)}
        table.replace([Device("fpga0")])
        await published(publisher, table, "the pool shrunk")
        (only,) = slices(api)
        assert only["metadata"]["name"] == f"{NODE}-{DRIVER}-0"
        assert only["spec"]["pool"] == {"name": NODE, "generation": 3, "resourceSliceCount": 1}

    scenario(api, kubeconfig, table, body)


def test_a_wiped_or_edited_slice_is_written_again_on_resync_and_a_leftover_is_deleted(
    api: ApiServer, kubeconfig: Path
) -> None:
    owner = api.create("nodes", node())
    api.create("nodes", node("node-b"))
    leftover: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "old-pool-slice"},
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": "old-pool", "generation": 7, "resourceSliceCount": 1},
            "devices": [{"name": "gone"}],
        },
    }
    api.create("resourceslices", leftover)
    others = [
        {**leftover, "metadata": {"name": "other-node"}, "spec": {**leftover["spec"], "nodeName": "node-b"}},
        {**leftover, "metadata": {"name": "other-driver"}, "spec": {**leftover["spec"], "driver": "gpu.example.com"}},
    ]
    for other in others:
        api.create("resourceslices", other)
    table = table_of(Device("fpga0"))

    async def body(publisher: SlicePublisher) -> None:
        await published(publisher, table)
        (found,) = slices(api)
        assert found["metadata"]["name"] == f"{NODE}-{DRIVER}-0"
        assert found["spec"]["pool"]["generation"] == 8, "the generation is not above the leftover's"
        assert {s["metadata"]["name"] for s in api.objects("resourceslices")} == {
            f"{NODE}-{DRIVER}-0",
            "other-node",
            "other-driver",
        }
        before = writes(api)
        publisher.resync()
        await eventually(lambda: api.count(resource="resourceslices", verb="list") >= 2, "the resync's list")
        await published(publisher, table)
        assert writes(api) == before, "a resync of untouched slices wrote them"

        api.delete("resourceslices", f"{NODE}-{DRIVER}-0")  # the kubelet wiped the driver's slices
        publisher.resync()  # as the front end does after registering again
        await eventually(lambda: slices(api), "the wiped slice written again")
        assert slices(api)[0]["spec"]["pool"]["generation"] == 9
        assert slices(api)[0]["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]

        edited = slices(api)[0]
        edited["spec"]["devices"] = [{"name": "fake"}]
        api.update("resourceslices", edited, manager="someone")
        await eventually(  # no resync() this time, and no watch: the periodic one
            lambda: [d["name"] for d in slices(api)[0]["spec"]["devices"]] == ["fpga0"], "the edit undone"
        )
        assert slices(api)[0]["spec"]["pool"]["generation"] == 10

    scenario(api, kubeconfig, table, body, resync_interval=0.5, watch=False)


def test_a_restarted_publisher_adopts_its_slices_without_a_write_and_a_changed_pool_goes_one_generation_up(
    api: ApiServer, kubeconfig: Path
) -> None:
    api.create("nodes", node())
    table = table_of(Device("fpga0"), Device("fpga1", health=Health.UNHEALTHY))

    async def first(publisher: SlicePublisher) -> None:
        await published(publisher, table)
        table.set_health({"fpga0": Health.UNHEALTHY})  # a change: generation 2, both devices tainted
        await published(publisher, table)

    scenario(api, kubeconfig, table, first)
    assert slices(api)[0]["spec"]["pool"]["generation"] == 2
    stored = slices(api)[0]["metadata"]["resourceVersion"]
    before = writes(api)

    async def again(publisher: SlicePublisher) -> None:
        await published(publisher, table, "the slices adopted")
        assert publisher.state.generation == 2

    scenario(api, kubeconfig, table, again)  # a new daemon process: same content
    assert writes(api) == before and slices(api)[0]["metadata"]["resourceVersion"] == stored

    table.set_health({"fpga1": Health.HEALTHY})  # changed while no daemon ran

    async def changed(publisher: SlicePublisher) -> None:
        await published(publisher, table, "the changed pool written")
        assert slices(api)[0]["spec"]["pool"]["generation"] == 3 == publisher.state.generation
        assert "taints" not in devices(api)["fpga1"]

    scenario(api, kubeconfig, table, changed)


def test_api_failures_are_shown_retried_with_backoff_and_never_end_the_task(
    api: ApiServer, kubeconfig: Path, caplog: pytest.LogCaptureFixture
) -> None:
    table = table_of(Device("fpga0"))
    caplog.set_level(logging.WARNING, "devplug.frontends.dra")

    async def body(publisher: SlicePublisher) -> None:
        await eventually(lambda: publisher.state.error, "the missing node shown")
        assert publisher.state.error == f"node {NODE} does not exist in the API server (yet?)"
        assert "retrying in" in caplog.text and f"node {NODE} does not exist" in caplog.text
        api.create("nodes", node())
        await published(publisher, table, "the slice written once the node is there")
        assert publisher.state.failures == 0 and publisher.state.error is None

        api.faults.fail(500, verb="patch", resource="resourceslices", count=2)
        table.update([Device("fpga1")])
        await eventually(lambda: publisher.state.failures >= 1, "the failed apply shown")
        assert (publisher.state.error or "").startswith("500 InternalError: Internal error occurred")
        await published(publisher, table, "the apply retried")
        assert api.count(resource="resourceslices", verb="patch", code=500) == 2

        api.faults.fail(429, verb="list", resource="resourceslices", retry_after=1)
        table.update([Device("fpga2")])
        await eventually(lambda: (publisher.state.error or "").startswith("429"), "the 429 shown")
        loop = asyncio.get_running_loop()
        refused = loop.time()
        await published(publisher, table, "the list retried after Retry-After")
        assert loop.time() - refused >= 0.9, "Retry-After was not honoured"
        assert sorted(devices(api)) == ["fpga0", "fpga1", "fpga2"]

    scenario(api, kubeconfig, table, body, backoff=_fast_backoff())


def _fast_backoff() -> Any:
    from devplug.engine.asynctools import Backoff

    return Backoff(initial=0.05, cap=0.2)


def test_shutdown_deletes_the_slices_only_for_the_last_instance(api: ApiServer, kubeconfig: Path) -> None:
    api.create("nodes", node())
    api.create(
        "resourceslices",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "other-driver"},
            "spec": {
                "driver": "gpu.example.com",
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                "devices": [],
            },
        },
    )
    table = table_of(Device("fpga0"))

    async def go() -> None:
        client = make_client(kubeconfig, field_manager=MANAGER)
        try:
            publisher = SlicePublisher(driver=DRIVER, node=NODE, table=table, client=client, debounce=0.01)
            task = publisher.start()
            await published(publisher, table)
            assert await publisher.shutdown(last_instance=False) == []
            assert task.cancelled()
            assert len(slices(api)) == 1, "another instance still runs: the slices must stay"

            again = SlicePublisher(driver=DRIVER, node=NODE, table=table, client=client, debounce=0.01)
            again.start()
            await published(again, table)
            assert await again.shutdown(last_instance=True) == [f"{NODE}-{DRIVER}-0"]
            assert slices(api) == []
            assert [s["metadata"]["name"] for s in api.objects("resourceslices")] == ["other-driver"]
        finally:
            await client.close()

    run(go)


def test_a_retired_resource_publishes_an_empty_pool(api: ApiServer, kubeconfig: Path) -> None:
    api.create("nodes", node())
    table = table_of(Device("fpga0"))

    async def body(publisher: SlicePublisher) -> None:
        await published(publisher, table)
        table.retire("removed from the config")
        await published(publisher, table, "the empty pool")
        (found,) = slices(api)
        assert found["spec"].get("devices") in (None, [])
        assert found["spec"]["pool"]["generation"] == 2 and publisher.state.devices == 0

    scenario(api, kubeconfig, table, body)


def test_an_api_server_without_device_taints_gets_unavailable_devices_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An API server with ``DRADeviceTaints`` off (1.34, 1.35 by default) drops the taints: the publisher sees it in
    the apply's answer and publishes unavailable devices no more, rather than as available."""
    from .conftest import write_kubeconfig

    caplog.set_level(logging.WARNING, "devplug.frontends.dra")
    with ApiServer(disabled_features={"DRADeviceTaints"}) as old_api:
        old_api.create("nodes", node())
        table = table_of(Device("fpga0"), Device("fpga1", health=Health.UNHEALTHY))

        async def body(publisher: SlicePublisher) -> None:
            await published(publisher, table)
            assert sorted(d["name"] for s in slices(old_api) for d in s["spec"]["devices"]) == ["fpga0"]
            assert publisher.state.taints is False
            assert (publisher.state.omitted, publisher.state.tainted) == (1, 0)
            assert "dropped the device taints" in caplog.text
            table.set_health({"fpga1": Health.HEALTHY})
            await published(publisher, table, "the healthy device published")
            assert sorted(d["name"] for s in slices(old_api) for d in s["spec"]["devices"]) == ["fpga0", "fpga1"]

        scenario(old_api, write_kubeconfig(old_api, tmp_path / "old-kubeconfig"), table, body)


def test_the_watch_writes_a_deleted_or_edited_slice_again_without_waiting_for_the_periodic_resync(
    api: ApiServer, kubeconfig: Path
) -> None:
    api.create("nodes", node())
    table = table_of(Device("fpga0"))
    name = f"{NODE}-{DRIVER}-0"

    async def body(publisher: SlicePublisher) -> None:
        await published(publisher, table)
        await eventually(lambda: api.count(verb="watch", resource="resourceslices") >= 1, "the watch")
        api.delete("resourceslices", name)  # an admin, or the kubelet's wipe
        await eventually(lambda: slices(api), "the deleted slice written again")
        assert slices(api)[0]["spec"]["pool"]["generation"] == 2
        edited = slices(api)[0]
        edited["spec"]["devices"] = [{"name": "fake"}]
        api.update("resourceslices", edited, manager="someone")
        await eventually(lambda: [d["name"] for d in slices(api)[0]["spec"]["devices"]] == ["fpga0"], "the edit undone")
        assert slices(api)[0]["spec"]["pool"]["generation"] == 3

    scenario(api, kubeconfig, table, body, resync_interval=3600)


def test_a_failing_watch_is_started_again_and_publishing_goes_on(api: ApiServer, kubeconfig: Path) -> None:
    api.create("nodes", node())
    table = table_of(Device("fpga0"))
    api.faults.fail(500, verb="watch", resource="resourceslices", count=2)

    async def body(publisher: SlicePublisher) -> None:
        await published(publisher, table)
        await eventually(lambda: api.count(verb="watch", resource="resourceslices", code=200) >= 1, "the watch again")
        assert api.count(verb="watch", resource="resourceslices", code=500) == 2
        api.delete("resourceslices", f"{NODE}-{DRIVER}-0")
        await eventually(lambda: slices(api), "the deleted slice written again through the restarted watch")

    scenario(api, kubeconfig, table, body, resync_interval=3600)


def test_a_held_publisher_writes_nothing_until_released_and_then_publishes_what_changed(
    api: ApiServer, kubeconfig: Path
) -> None:
    """A handover holds the old instance's publisher (the slices become the new instance's); a failed handover
    releases it, and it publishes the changes it held back."""
    api.create("nodes", node())
    table = table_of(Device("fpga0"), Device("fpga1"))

    async def body(publisher: SlicePublisher) -> None:
        await published(publisher, table)
        publisher.hold()
        await asyncio.wait_for(publisher.idle(), 5.0)
        before = writes(api)
        table.set_health({"fpga1": HealthReport(Health.UNHEALTHY, "PCIe link down")})
        publisher.resync()
        await asyncio.sleep(0.3)  # longer than the debounce: a publisher not held would have written by now
        assert writes(api) == before and "taints" not in devices(api)["fpga1"]
        publisher.release()
        await published(publisher, table, "the held change published")
        assert devices(api)["fpga1"]["taints"][0]["value"] == "unhealthy"

    scenario(api, kubeconfig, table, body)


def test_a_silent_watch_is_started_again_and_a_deleted_slice_comes_back_before_the_resync(
    api: ApiServer, kubeconfig: Path
) -> None:
    """Issue 36, item 11: a watch that delivered nothing (a connection held open by a proxy, or dead without a FIN)
    left a deleted slice gone until the periodic resync (120 s). The watch asks for bookmarks, and one silent for
    ``watch_silence`` is started again, with a resync; a healthy watch, kept alive by bookmarks, is not."""
    api.create("nodes", node())
    api.storage.bookmark_interval = 0.2  # the real server's minute, scaled as watch_silence is
    table = table_of(Device("fpga0"))

    def watches() -> list[Any]:
        return [r for r in api.storage.requests if r.verb == "watch" and r.resource == "resourceslices"]

    async def body(publisher: SlicePublisher) -> None:
        await published(publisher, table)
        await eventually(lambda: len(watches()) >= 1, "the watch")
        assert watches()[0].query.get("allowWatchBookmarks") == "true"
        await asyncio.sleep(2.0)  # quiet, but bookmarks keep coming: the watch is kept
        assert len(watches()) == 1
        api.faults.silence_watches(resource="resourceslices")
        api.close_watches()  # the client resumes with a watch that stays silent
        await eventually(lambda: len(watches()) == 2, "the silent watch")
        api.delete("resourceslices", f"{NODE}-{DRIVER}-0")
        await eventually(lambda: slices(api), "the deleted slice written again", timeout=10)
        await eventually(lambda: len(watches()) >= 3, "the silent watch given up for a fresh one")

    scenario(api, kubeconfig, table, body, resync_interval=3600, watch_silence=1.0)
