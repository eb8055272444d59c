"""A claim's ``status.devices`` entries from a driver's device status (:mod:`devplug.frontends.dra.devicestatus`):
one per allocation result of the device the status names: a device of its own, each replica of a shared device
published as N devices, each share (``shareID``) of one published as a consumable device."""

from __future__ import annotations

from devplug.frontends.dra.claims import AllocatedDevice
from devplug.frontends.dra.devicestatus import entry_key, now_rfc3339, status_entries
from devplug.types import DeviceCondition, DeviceStatus, NetworkData

DRIVER = "mock.example.com"
POOL = "node-a"
WHEN = 1_780_000_000.0  # 2026-05-28T20:26:40Z


def _physical(device_id: str) -> str:
    return device_id.partition("::")[0]


READY = DeviceStatus(conditions=(DeviceCondition("Ready", "True", "Prepared", "ok"),), data={"k": 1})


def test_a_device_of_its_own_gets_one_entry_with_every_part() -> None:
    net = NetworkData("eth1", ("10.0.0.5/24",), "02:00:00:00:00:01")
    status = DeviceStatus(conditions=READY.conditions, data={"image": "afu-1"}, network_data=net)
    found = status_entries(
        DRIVER, POOL, [AllocatedDevice("dev", "fpga0", "fpga0")], {"fpga0": status}, _physical, now=WHEN
    )
    assert found.entries == (
        {
            "driver": DRIVER,
            "pool": POOL,
            "device": "fpga0",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Prepared",
                    "message": "ok",
                    "lastTransitionTime": "2026-05-28T20:26:40Z",
                }
            ],
            "data": {"image": "afu-1"},
            "networkData": {"interfaceName": "eth1", "ips": ["10.0.0.5/24"], "hardwareAddress": "02:00:00:00:00:01"},
        },
    )
    assert found.unmatched == () and found.device_ids == ("fpga0",)


def test_each_replica_of_a_shared_device_gets_the_physical_devices_status() -> None:
    """The N-device form: two results name two replicas of ``mock0``; allocate was given ``mock0``."""
    devices = [
        AllocatedDevice("dev", "mock0-0-abc", "mock0::0"),
        AllocatedDevice("dev", "mock0-1-def", "mock0::1"),
        AllocatedDevice("dev", "mock1", "mock1"),
    ]
    found = status_entries(DRIVER, POOL, devices, {"mock0": READY}, _physical, now=WHEN)
    assert [entry_key(e) for e in found.entries] == [
        (DRIVER, POOL, "mock0-0-abc", ""),
        (DRIVER, POOL, "mock0-1-def", ""),
    ]
    assert found.device_ids == ("mock0", "mock0")


def test_each_share_of_a_consumable_device_gets_an_entry_with_its_share_id() -> None:
    share_a, share_b = "3f1e0000-0000-4000-8000-00000000000a", "3f1e0000-0000-4000-8000-00000000000b"
    devices = [AllocatedDevice("a", "mock0", "mock0", share_a), AllocatedDevice("b", "mock0", "mock0", share_b)]
    found = status_entries(DRIVER, POOL, devices, {"mock0": READY}, _physical, now=WHEN)
    assert [entry_key(e) for e in found.entries] == [(DRIVER, POOL, "mock0", share_a), (DRIVER, POOL, "mock0", share_b)]
    assert all(e["shareID"] in (share_a, share_b) for e in found.entries)


def test_a_status_of_no_device_of_the_claim_is_named_and_an_empty_one_makes_no_entry() -> None:
    devices = [AllocatedDevice("dev", "mock0", "mock0"), AllocatedDevice("dev", "mock1", "mock1")]
    found = status_entries(DRIVER, POOL, devices, {"mock0": DeviceStatus(), "mock9": READY}, _physical, now=WHEN)
    assert found.entries == () and found.unmatched == ("mock9",)
    assert status_entries(DRIVER, POOL, devices, {}, _physical) == status_entries(DRIVER, POOL, [], {}, _physical)


def test_times_are_rfc_3339_utc_seconds() -> None:
    assert now_rfc3339(0.9) == "1970-01-01T00:00:00Z"
