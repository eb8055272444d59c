"""Whole cards and their regions in one resource (mode ``both``): one excludes the other, across crashes too."""

from __future__ import annotations

import threading
from typing import Any

import grpc

CARD = "0000:3b:00.0"
REGIONS = (f"{CARD}-region0", f"{CARD}-region1")
BLANK_AFU = "0b1a4c0000000000000000000000b1a4"


def _overlaps(device: str) -> list[str]:
    return list(REGIONS) if device == CARD else [CARD]


def test_a_card_and_its_regions_exclude_each_other_across_a_kill_9(lab: Any) -> None:
    lab.model.add_card(CARD, ports=2, afu_id=BLANK_AFU)
    lab.start(lab.dfl_options(mode="both"))
    assert sorted(lab.healths()) == [CARD, *REGIONS]

    (device,) = lab.admit("tenant")

    lab.wait(lambda: all(lab.health(o) == "Unhealthy" for o in _overlaps(device)), what="the overlapping devices out")
    others = [d for d in (CARD, *REGIONS) if d != device and d not in _overlaps(device)]
    assert all(lab.health(d) == "Healthy" for d in others)
    for other in _overlaps(device):  # the reason, for the operator
        lab.wait(lambda o=other: lab.reason(o) == f"overlaps {device}, which is allocated", what=f"{other}'s reason")

    lab.kill()
    lab.restart()

    assert all(lab.health(o) == "Unhealthy" for o in _overlaps(device)), lab.healths()
    lab.kubelet.remove_pod("tenant")
    lab.wait(lambda: lab.released(device), what=f"{device} released")
    lab.wait(lambda: set(lab.healths().values()) == {"Healthy"}, what="every device healthy again")


def test_concurrent_allocates_of_a_card_and_its_region_give_out_only_one(lab: Any) -> None:
    lab.model.add_card(CARD, ports=2, afu_id=BLANK_AFU)
    lab.start(lab.dfl_options(mode="both"), hook_timeout=60.0)
    barrier = threading.Barrier(2)
    results: dict[str, str] = {}

    def allocate(device: str) -> None:
        barrier.wait(10)
        try:
            lab.allocate(device)
            results[device] = "ok"
        except grpc.RpcError as exc:
            results[device] = f"{exc.code().name}: {exc.details()}"

    threads = [threading.Thread(target=allocate, args=(d,)) for d in (CARD, REGIONS[0])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    winners = [d for d, r in results.items() if r == "ok"]
    assert len(winners) == 1, results
    (loser,) = set(results) - set(winners)
    assert "overlap" in results[loser] or "unhealthy" in results[loser].lower(), results
    lab.wait(lambda: lab.health(loser) == "Unhealthy", what=f"{loser} out while {winners[0]} is held")
