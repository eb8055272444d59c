"""The device table's kept health sets: the counts and lists the status reads, and the check every Allocate makes,
without walking every device."""

from __future__ import annotations

import random

from devplug import Device, Health
from devplug.engine.devicetable import DeviceTable


def _walked(table: DeviceTable) -> tuple[int, set[str]]:
    """What the kept sets must equal: the healthy count and the unhealthy IDs, found by walking every device."""
    devices = table.reported_devices()
    unhealthy = {d.id for d in devices if not d.healthy}
    if table.degraded is not None:
        return 0, unhealthy
    return sum(1 for d in devices if d.healthy and d.id not in table.withheld), unhealthy


def test_health_sets_follow_replace_update_removal_and_withholding() -> None:
    table = DeviceTable(replicas=1)
    table.replace([Device("a"), Device("b", Health.UNHEALTHY), Device("c")])
    assert (table.healthy_count(), table.unhealthy_ids()) == (2, {"b"})
    table.update([Device("b"), Device("c", Health.UNHEALTHY)], removed=["a"])
    assert (table.healthy_count(), table.unhealthy_ids()) == (1, {"c"})
    table.set_withheld(["b", "gone"])  # a withheld ID the table lacks changes no count
    assert table.healthy_count() == 0
    table.set_withheld([])
    table.set_health({"c": Health.HEALTHY})
    assert (table.healthy_count(), table.unhealthy_ids()) == (2, set())
    table.set_degraded("hung hooks")
    assert table.healthy_count() == 0


def test_health_sets_match_a_walk_under_random_changes_of_shared_and_plain_devices() -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    table = DeviceTable(replicas=2)
    names = [f"d{i}" for i in range(12)]
    for _ in range(300):
        step = rng.randrange(5)
        if step == 0:
            table.replace(_random_device(rng, n) for n in rng.sample(names, rng.randrange(len(names))))
        elif step == 1:
            table.update([_random_device(rng, n) for n in rng.sample(names, 3)], removed=rng.sample(names, 2))
        elif step == 2:
            table.set_health({n: rng.choice(list(Health)) for n in rng.sample(names, 4)})
        elif step == 3:
            ids = [d.id for d in table.reported_devices()]
            table.set_withheld(rng.sample(ids, min(len(ids), 3)))
        else:
            table.set_degraded(rng.choice([None, "hung"]))
        assert (table.healthy_count(), table.unhealthy_ids()) == _walked(table), f"seed {seed}"
        asked = set(rng.sample([*names, *(d.id for d in table.reported_devices())], 3))
        assert table.all_reported_healthy(asked) == _all_reported_healthy(table, asked), f"seed {seed}, {asked}"
        ids = [d.id for d in table.reported_devices()] + ["nope"] * (step == 3)
        available = rng.sample(ids, min(len(ids), rng.randrange(8))) * rng.choice([1, 2])  # duplicates too
        musts = rng.sample(available, min(len(available), rng.randrange(3)))
        offer, walked = table.offer(available, musts), _walked_offer(table, available, musts)
        assert (offer.devices, offer.unknown) == walked, f"seed {seed}"
        offered_ids = {d.id for d in walked[0]}
        for dev_id in {*names, *ids, "nope"}:
            assert (dev_id in offer.ids) == (dev_id in offered_ids), f"seed {seed}, {dev_id}"
    some = {d.id for d in table.reported_devices() if d.healthy} or {"d0"}
    table.set_degraded(None)
    table.retire("removed from the config")
    assert not table.all_reported_healthy(some)


def _walked_offer(table: DeviceTable, available: list[str], musts: list[str]) -> tuple[list[Device], list[str]]:
    """What ``offer`` must return, device by device: the must-includes as advertised, then the healthy others."""
    offered: list[Device] = []
    unknown: list[str] = []
    for dev_id in dict.fromkeys([*musts, *available]):
        reported = table.reported(dev_id)
        if reported is None:
            unknown.append(dev_id)
        elif reported.healthy and not table.overrides_health(dev_id):
            offered.append(reported)
        elif dev_id in musts:
            offered.append(table.advertised(dev_id) or reported)
    return offered, unknown


def _all_reported_healthy(table: DeviceTable, ids: set[str]) -> bool:
    """What ``all_reported_healthy`` must say, device by device: known, healthy as reported, resource serving."""
    if table.degraded is not None or table.retired is not None:
        return False
    return all((dev := table.reported(i)) is not None and dev.healthy for i in ids)


def _random_device(rng: random.Random, name: str) -> Device:
    return Device(name, rng.choice(list(Health)), replicas=rng.choice([None, 1, 3]))
