"""Issue 41's published forms against the API-server stand-in over real HTTP: the dry run that finds whether the
server keeps consumable capacity and counters (each gate on and off, 1.32 to 1.36), and the publisher writing what it
found: one consumable device or N replicas, parts with or without their counter sets, counter slices deleted with
the pool."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from devplug.cli.statusview import format_status
from devplug.daemon.status import read_status
from devplug.engine.devicetable import DeviceTable
from devplug.errors import StateError
from devplug.frontends.dra.apiversions import DraApi, probe_name
from devplug.frontends.dra.devicenames import device_name
from devplug.frontends.dra.slices import SlicePublisher
from devplug.kube.client import make_client
from devplug.testing.apiserver import ApiServer
from devplug.types import Device, Partition, ShareCapacity

from .conftest import DRIVER, NODE, NS, eventually, node, run, write_kubeconfig
from .dranode import dra_node
from .dranode import eventually as node_eventually

MANAGER = f"devplug-{DRIVER}"


async def _discover(api: ApiServer, tmp_path: Path) -> DraApi:
    client = make_client(write_kubeconfig(api, tmp_path / f"kubeconfig-{id(api)}"), field_manager=MANAGER)
    try:
        return await DraApi.discover(client, node=NODE, driver=DRIVER, pool=NODE)
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("release", "enabled", "disabled", "consumable", "partitionable", "why_consumable", "why_counters", "probes"),
    [
        ("1.32", (), None, False, False, "has no consumable capacity (it refused", "has no counters (it refused", 1),
        ("1.33", (), None, False, False, "has no consumable capacity (it refused", "DRAPartitionableDevices is off", 2),
        (
            "1.33",
            ("DRAPartitionableDevices",),
            None,
            False,
            True,
            "has no consumable capacity (it refused",
            "kept by the API server",
            2,
        ),
        ("1.34", (), None, False, False, "DRAConsumableCapacity is off", "DRAPartitionableDevices is off", 1),
        ("1.35", ("DRAConsumableCapacity",), None, True, False, "kept", "DRAPartitionableDevices is off", 1),
        ("1.36", (), None, True, True, "kept by the API server", "kept by the API server", 1),
        ("1.36", (), ("DRAConsumableCapacity",), False, True, "DRAConsumableCapacity is off", "kept", 1),
        ("1.36", (), ("DRAPartitionableDevices",), True, False, "kept", "DRAPartitionableDevices is off", 1),
    ],
)
def test_one_dry_run_finds_whether_the_server_keeps_consumable_capacity_and_counters(
    tmp_path: Path,
    release: str,
    enabled: tuple[str, ...],
    disabled: tuple[str, ...] | None,
    consumable: bool,
    partitionable: bool,
    why_consumable: str,
    why_counters: str,
    probes: int,
) -> None:
    with ApiServer(release=release, enabled_features=enabled, disabled_features=disabled) as api:
        api.create("nodes", node())
        found = run(lambda: _discover(api, tmp_path))
        choice = found.choice
        assert (choice.consumable_capacity, choice.partitionable) == (consumable, partitionable), choice
        assert why_consumable in choice.consumable_capacity_reason
        assert why_counters in choice.partitionable_reason
        dry_runs = [r for r in api.requests if r.verb == "patch"]
        assert len(dry_runs) == probes, "one dry run; a second only when the version refuses some fields"
        assert all(r.query.get("dryRun") == "All" and r.name == probe_name(NODE, DRIVER) for r in dry_runs)
        assert api.objects("resourceslices") == [], "the dry runs store nothing"
        shown = found.describe()
        assert (shown["consumable_capacity"], shown["partitionable"]) == (consumable, partitionable)
        assert shown["consumable_capacity_reason"] == choice.consumable_capacity_reason


def _slices(api: ApiServer) -> list[dict[str, Any]]:
    return sorted(
        (s for s in api.objects("resourceslices") if s["spec"]["driver"] == DRIVER), key=lambda s: s["metadata"]["name"]
    )


def _devices(api: ApiServer) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in _slices(api) for d in s["spec"].get("devices") or ()}


def _publish_until(
    api: ApiServer, tmp_path: Path, table: DeviceTable, check: Any, then: Any = None, api_version: str | None = None
) -> SlicePublisher:
    """Run a publisher with discovery against ``api`` until ``check()`` holds (and ``then(publisher)`` after it)."""

    async def go() -> SlicePublisher:
        client = make_client(write_kubeconfig(api, tmp_path / f"kubeconfig-{id(api)}"), field_manager=MANAGER)
        found = await DraApi.discover(client, node=NODE, driver=DRIVER, pool=NODE)
        publisher = SlicePublisher(
            driver=DRIVER, node=NODE, table=table, client=client, api=found, debounce=0, watch=False
        )
        task = publisher.start()
        try:
            await eventually(check, "the slices published")
            await eventually(lambda: publisher.state.in_sync, "the publisher in sync")
            if then is not None:
                await then(publisher)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.close()
        return publisher

    return run(go)


def test_a_1_36_server_gets_a_shared_device_as_one_consumable_device_and_prepare_s_lookups_answer(
    tmp_path: Path,
) -> None:
    table = DeviceTable()
    table.replace([Device("fpga0", replicas=4), Device("fpga1")])
    with ApiServer(release="1.36") as api:
        api.create("nodes", node())

        async def lookups(publisher: SlicePublisher) -> None:
            assert publisher.consumable and publisher.device_id("fpga0") == "fpga0"
            assert publisher.device_id(device_name("fpga0::2")) == "fpga0::2", "the replicas' names still resolve"
            shared = publisher.shared_capacity("fpga0")
            assert shared is not None and shared.replica_ids == tuple(f"fpga0::{k}" for k in range(4))
            assert publisher.shared_capacity("fpga1") is None and publisher.shared_capacity("fpga0::1") is None

        publisher = _publish_until(api, tmp_path, table, lambda: "fpga0" in _devices(api), lookups)
        stored = _devices(api)
        assert sorted(stored) == ["fpga0", "fpga1"]
        assert stored["fpga0"]["allowMultipleAllocations"] is True
        assert stored["fpga0"]["capacity"] == {
            "shares": {
                "value": "4",
                "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}},
            }
        }
        assert publisher.state.consumable_capacity and publisher.state.shared_devices == 1


def test_a_server_without_consumable_capacity_gets_one_device_per_replica_from_the_first_write(tmp_path: Path) -> None:
    table = DeviceTable()
    table.replace([Device("fpga0", replicas=3)])
    with ApiServer(release="1.36", disabled_features=("DRAConsumableCapacity",)) as api:
        api.create("nodes", node())
        names = sorted(device_name(f"fpga0::{k}") for k in range(3))
        publisher = _publish_until(api, tmp_path, table, lambda: sorted(_devices(api)) == names)
        assert all("allowMultipleAllocations" not in d for d in _devices(api).values())
        writes = [r for r in api.requests if r.verb == "patch" and not r.query.get("dryRun")]
        assert len(writes) == 1, "chosen before the first write: no consumable device was ever written"
        assert not publisher.consumable and publisher.state.shared_devices == 0


def _parts() -> list[Device]:
    card = {"regions": 4}
    return [
        Device("card0-whole", partition=Partition("card0", card, {"regions": 4})),
        *(Device(f"card0-part{k}", partition=Partition("card0", card, {"regions": 1})) for k in range(4)),
    ]


def test_parts_go_with_their_counter_set_in_a_slice_of_its_own_and_it_goes_with_the_pool(tmp_path: Path) -> None:
    table = DeviceTable()
    table.replace(_parts())
    with ApiServer(release="1.36") as api:
        api.create("nodes", node())

        def published() -> bool:
            return len(_slices(api)) == 2

        async def retire(publisher: SlicePublisher) -> None:
            slices = _slices(api)
            counters = [s for s in slices if s["spec"].get("sharedCounters")]
            assert [s["spec"]["sharedCounters"] for s in counters] == [
                [{"name": "card0", "counters": {"regions": {"value": "4"}}}]
            ]
            assert not counters[0]["spec"].get("devices")
            assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}
            assert len({s["spec"]["pool"]["generation"] for s in slices}) == 1
            assert _devices(api)["card0-part3"]["consumesCounters"] == [
                {"counterSet": "card0", "counters": {"regions": {"value": "1"}}}
            ]
            assert publisher.state.partitionable and publisher.state.counter_sets == 1
            table.retire("removed from the config")
            await eventually(lambda: len(_slices(api)) == 1 and not _devices(api), "the empty pool")

        _publish_until(api, tmp_path, table, published, retire)
        [left] = _slices(api)
        assert not left["spec"].get("sharedCounters"), "the counter slice went with the retired resource"


def test_a_server_without_counters_gets_the_parts_as_plain_devices(tmp_path: Path) -> None:
    table = DeviceTable()
    table.replace(_parts())
    with ApiServer(release="1.35") as api:  # DRAPartitionableDevices alpha, off
        api.create("nodes", node())
        _publish_until(api, tmp_path, table, lambda: len(_devices(api)) == 5)
        assert len(_slices(api)) == 1
        assert all("consumesCounters" not in d for d in _devices(api).values())


def test_a_1_32_server_gets_v1beta1_slices_of_replicas_and_plain_parts(tmp_path: Path) -> None:
    table = DeviceTable()
    table.replace([Device("fpga0", replicas=2), *_parts()])
    with ApiServer(release="1.32") as api:
        api.create("nodes", node())
        _publish_until(api, tmp_path, table, lambda: len(_devices(api)) == 7)
        assert device_name("fpga0::1") in _devices(api) and len(_slices(api)) == 1
        assert all(r.path.startswith("/apis/resource.k8s.io/v1beta1/") for r in api.requests if r.verb == "patch")


# --- a real daemon (the mock driver under the dev kubelet)


@pytest.mark.parametrize("gate_on", [True, False], ids=["consumable", "replicas"])
def test_a_daemon_publishes_the_mock_s_shared_device_in_the_form_the_server_keeps(gate_on: bool) -> None:
    disabled = None if gate_on else ("DRAConsumableCapacity",)
    with ApiServer(release="1.36", disabled_features=disabled) as api:

        async def scenario() -> dict[str, dict[str, Any]]:
            async with dra_node(api, {"mock0": "replicas=4\n", "mock1": ""}) as lab:
                slices = await lab.published(2 if gate_on else 5)
                shown = await node_eventually(
                    lambda: _api_status(lab), "the DRA section of the status", details=lab.log
                )
                assert shown["consumable_capacity"] is gate_on, shown
                text = format_status(read_status(lab.root / "state"))
                used = "used: kept by the API server" if gate_on else "not used: dropped by the API server"
                assert f"consumable capacity {used}" in text, text
                return {d["name"]: d for s in slices for d in s["spec"].get("devices") or ()}

        stored = run(scenario, timeout=120)
        if gate_on:
            assert sorted(stored) == ["mock0", "mock1"]
            assert stored["mock0"]["allowMultipleAllocations"] is True
            assert stored["mock0"]["capacity"]["shares"]["value"] == "4"
            assert stored["mock0"]["attributes"]["deviceID"] == {"string": "mock0"}
            assert "replica" not in stored["mock0"]["attributes"]
        else:
            assert sorted(stored) == sorted(["mock1", *(device_name(f"mock0::{k}") for k in range(4))])
            assert all("allowMultipleAllocations" not in d for d in stored.values())


def _api_status(lab: Any) -> dict[str, Any] | None:
    """The resource's DRA ``api`` section of ``devplug status`` (None until written)."""
    try:
        [entry] = read_status(lab.root / "state")["resources"]
    except (OSError, ValueError, KeyError, StateError):  # not written yet
        return None
    shown = (entry or {}).get("frontend", {}).get("api") if isinstance(entry, dict) else None
    return dict(shown) if isinstance(shown, dict) else None


# --- the choice changing under a running publisher, and the beta shapes


def test_fields_dropped_by_an_apply_make_the_publisher_fall_back_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The second line: the publisher was told the server keeps both (no dry run), the server drops them."""
    caplog.set_level(logging.WARNING, "devplug.frontends.dra")
    table = DeviceTable()
    table.replace([Device("fpga0", replicas=2), *_parts()])
    with ApiServer(release="1.35") as api:  # both gates off
        api.create("nodes", node())

        async def go() -> SlicePublisher:
            client = make_client(write_kubeconfig(api, tmp_path / "kubeconfig"), field_manager=MANAGER)
            told = DraApi.fixed(client, consumable_capacity=True, partitionable=True)
            publisher = SlicePublisher(
                driver=DRIVER, node=NODE, table=table, client=client, api=told, debounce=0, watch=False
            )
            task = publisher.start()
            try:
                replicas = {device_name(f"fpga0::{k}") for k in range(2)}

                def fell_back() -> bool:
                    names = set(_devices(api))
                    return replicas <= names and "fpga0" not in names and len(_slices(api)) == 1

                await eventually(fell_back, "the fallback")
                await eventually(lambda: publisher.state.in_sync, "in sync")
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await client.close()
            return publisher

        publisher = run(go)
        assert all("consumesCounters" not in d and "allowMultipleAllocations" not in d for d in _devices(api).values())
        assert "dropped consumable capacity (allowMultipleAllocations) (feature gate DRAConsumableCapacity off)" in (
            caplog.text
        )
        assert "dropped the counters (consumesCounters) (feature gate DRAPartitionableDevices off)" in caplog.text
        assert not publisher.state.consumable_capacity and not publisher.state.partitionable
        assert "dropped from the answer to an apply" in publisher.api.choice.consumable_capacity_reason


def test_a_restart_without_the_gate_is_found_by_the_watch_and_the_device_is_published_as_replicas(
    tmp_path: Path,
) -> None:
    table = DeviceTable()
    table.replace([Device("fpga0", replicas=2)])
    replicas = sorted(device_name(f"fpga0::{k}") for k in range(2))
    with ApiServer(release="1.36") as api:
        api.create("nodes", node())

        async def go() -> None:
            client = make_client(write_kubeconfig(api, tmp_path / "kubeconfig"), field_manager=MANAGER)
            found = await DraApi.discover(client, node=NODE, driver=DRIVER, pool=NODE)
            publisher = SlicePublisher(
                driver=DRIVER, node=NODE, table=table, client=client, api=found, debounce=0, watch_silence=5
            )
            task = publisher.start()
            try:
                await eventually(lambda: sorted(_devices(api)) == ["fpga0"], "the consumable device")
                api.restart(disabled_features=("DRAConsumableCapacity",))  # a downgrade's flags, say
                await eventually(lambda: sorted(_devices(api)) == replicas, "the replicas after the restart")
                assert not publisher.consumable and found.discoveries == 2
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await client.close()

        run(go)


def test_a_v1beta1_server_gets_the_counter_sets_in_a_slice_without_devices(tmp_path: Path) -> None:
    """v1beta1 wraps a device's fields in ``basic``; a slice of counter sets gets no ``devices`` (not even [])."""
    table = DeviceTable()
    table.replace(_parts())
    with ApiServer(release="1.36", resource_versions=("v1beta1",)) as api:
        api.create("nodes", node())
        _publish_until(api, tmp_path, table, lambda: len(_slices(api)) == 2)
        assert _devices(api)["card0-part0"]["consumesCounters"][0]["counterSet"] == "card0"
        assert [s["spec"]["sharedCounters"][0]["name"] for s in _slices(api) if s["spec"].get("sharedCounters")] == [
            "card0"
        ]
        assert {r.path.split("/")[3] for r in api.requests if r.verb == "patch"} == {"v1beta1"}


def test_the_scheduler_shares_the_published_consumable_device_until_its_capacity_is_used() -> None:
    """The published shape is what kube-scheduler's allocator (the stand-in) shares: shareIDs, consumedCapacity
    keyed by the capacity's name as published, and no share once the replicas' capacity is taken."""
    from devplug.testing.scheduler import SchedulingError

    with ApiServer(release="1.36") as api:

        async def scenario() -> list[dict[str, Any]]:
            async with dra_node(api, {"mock0": "replicas=4\n"}) as lab:
                await lab.published(1)
                results = []
                for k in range(3):
                    exactly = {"deviceClassName": lab.device_class, "capacity": {"requests": {"shares": "2"}}}
                    spec = {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}}
                    claim_body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "spec": spec}
                    api.create("resourceclaims", {**claim_body, "metadata": {"name": f"c{k}"}}, NS)
                    if k == 2:
                        with pytest.raises(SchedulingError):
                            lab.schedule_pod(f"p{k}", [f"c{k}"])
                        break
                    _, [claim] = lab.schedule_pod(f"p{k}", [f"c{k}"])
                    results.extend(claim["status"]["allocation"]["devices"]["results"])
                return results

        results = run(scenario, timeout=120)
        assert [(r["device"], r["consumedCapacity"]) for r in results] == [("mock0", {"shares": "2"})] * 2
        assert len({r["shareID"] for r in results}) == 2


@pytest.mark.parametrize("release", ["1.36", "1.35"])
def test_a_daemon_publishes_the_mock_s_parts_with_their_card_s_counter_set_where_the_server_keeps_them(
    release: str,
) -> None:
    from devplug.testing.dranode import dra_node as node_with_table
    from devplug.testing.dranode import short_root

    from .dranode import DRIVER as MOCK_DRIVER
    from .dranode import RESOURCE

    card = {"parent": "card0", "counters": {"regions": 4}, "whole": "card0-whole", "parts": 4}
    with ApiServer(release=release) as api, short_root() as scratch:
        folder = scratch / "mock"
        folder.mkdir()
        table = {"driver": "mock", "options": {"directory": str(folder), "count": 0, "partitions": [card]}}

        async def scenario() -> list[dict[str, Any]]:
            async with node_with_table(api, RESOURCE, table, folder, driver=MOCK_DRIVER) as lab:
                await lab.published(5)
                want = 2 if release == "1.36" else 1  # the counter set's slice is written after the devices'
                await node_eventually(lambda: len(lab.slices()) == want, f"{want} slices", details=lab.log)
                return lab.slices()

        slices = run(scenario, timeout=120)
        devices = {d["name"]: d for s in slices for d in s["spec"].get("devices") or ()}
        assert sorted(devices) == ["card0-part0", "card0-part1", "card0-part2", "card0-part3", "card0-whole"]
        sets = [c for s in slices for c in s["spec"].get("sharedCounters") or ()]
        if release == "1.36":
            assert sets == [{"name": "card0", "counters": {"regions": {"value": "4"}}}]
            assert devices["card0-whole"]["consumesCounters"] == [
                {"counterSet": "card0", "counters": {"regions": {"value": "4"}}}
            ]
            assert devices["card0-part2"]["consumesCounters"][0]["counters"] == {"regions": {"value": "1"}}
            assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}
        else:  # DRAPartitionableDevices off: plain parts, the engine keeps them apart
            assert sets == [] and len(slices) == 1
            assert all("consumesCounters" not in d for d in devices.values())


def test_a_restarted_publisher_adopts_its_consumable_device_and_counter_slices_without_a_write(tmp_path: Path) -> None:
    table = DeviceTable()
    table.replace([Device("fpga0", replicas=2, share_capacity=ShareCapacity("mem", 1000)), *_parts()])
    with ApiServer(release="1.36") as api:
        api.create("nodes", node())
        first = _publish_until(api, tmp_path, table, lambda: len(_slices(api)) == 2)
        writes = [r for r in api.requests if r.verb in ("patch", "delete") and not r.query.get("dryRun")]
        again = _publish_until(api, tmp_path, table, lambda: True)
        assert [r for r in api.requests if r.verb in ("patch", "delete") and not r.query.get("dryRun")] == writes
        assert again.state.generation == first.state.generation and again.state.counter_sets == 1
        assert _devices(api)["fpga0"]["capacity"]["mem"]["value"] == "2k"
