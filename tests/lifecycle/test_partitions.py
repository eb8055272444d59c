"""Partitions through the real daemon and the dev kubelet (issue 41, KEP-4815): the engine never hands out two parts
their parent's counters forbid, and withholds (advertises unhealthy) the parts that cannot fit instead of refusing
the kubelet's Allocate later.

The card: the mock's ``partitions`` option (contract 1.1) declares a parent ``card0`` with 4 regions, offered by
region (``mock0`` .. ``mock3``, each consuming 1) and whole (``mock4``, consuming 4). The kubelet offers only
healthy devices (``devicesToAllocate`` in ``pkg/kubelet/cm/devicemanager/manager.go``), so a part advertised
unhealthy is never picked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc
import pytest

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp

if TYPE_CHECKING:
    from tests.lifecycle.conftest import Lab

RESOURCE = "example.com/mock"
REGIONS = ("mock0", "mock1", "mock2", "mock3")
WHOLE = "mock4"
CARD = "card0"


def _table(lab: Lab, whole: str = WHOLE, regions: tuple[str, ...] = REGIONS) -> dict[str, Any]:
    partitions = [
        {
            "parent": CARD,
            "counters": {"regions": 4},
            "whole": whole,
            "devices": {region: {"regions": 1} for region in regions},
        }
    ]
    return {"driver": "mock", "options": {"directory": str(lab.mock_dir()), "count": 5, "partitions": partitions}}


def _healthy(lab: Lab, *devices: str) -> bool:
    return all(lab.health(d) == "Healthy" for d in devices)


def _unhealthy(lab: Lab, *devices: str) -> bool:
    return all(lab.health(d) == "Unhealthy" for d in devices)


def _card_status(lab: Lab, blocked: list[str]) -> dict[str, Any]:
    """The card's entry in the status file, once it shows ``blocked`` (the file is written debounced)."""

    def entry() -> dict[str, Any] | None:
        parents = lab.resource_status().get("partitions", [])
        found = [p for p in parents if p["parent"] == CARD and p["blocked"] == blocked]
        return found[0] if found else None

    found: dict[str, Any] = lab.wait(entry, what=f"the status to show {blocked} blocked")
    return found


def test_a_region_in_use_withholds_the_whole_card_until_it_is_released(lab: Lab) -> None:
    lab.start({RESOURCE: _table(lab)}, grace_period=60.0)
    lab.wait(lambda: _healthy(lab, *REGIONS, WHOLE), what="the card and its regions advertised healthy")
    (region,) = lab.admit("a", 1)
    assert region in REGIONS, f"the kubelet picked {region}: the preferred choice of one device is the first region"
    lab.wait(lambda: _unhealthy(lab, WHOLE), what=f"{WHOLE} (the whole card) advertised unhealthy")
    others = [r for r in REGIONS if r != region]
    assert _healthy(lab, *others), "the other regions still fit: they stay healthy"
    status = _card_status(lab, [WHOLE])
    assert status["counters"] == {"regions": 4} and status["in_use"] == {"regions": 1}
    assert status["held"] == [region]
    shown = lab.status_command()
    assert f"parent {CARD}: regions 1/4 in use; held {region}; withheld {WHOLE}" in shown.stdout, shown.stdout

    # The kubelet cannot give the card to the next pod: it gets the regions left, and no fifth device.
    more = lab.admit("b", 3)
    assert sorted(more) == sorted(others)
    assert lab.count("allocate", WHOLE) == 0

    lab.kubelet.remove_pod("a")
    lab.kubelet.remove_pod("b")
    for dev in REGIONS:
        lab.wait_released(dev)
    lab.wait(lambda: _healthy(lab, WHOLE, *REGIONS), what="the whole card healthy again once its regions are released")
    assert lab.admit("c", 1) in ((REGIONS[0],), (WHOLE,))


def test_the_whole_card_in_use_withholds_every_region(lab: Lab) -> None:
    lab.start({RESOURCE: _table(lab)}, grace_period=60.0)
    lab.wait(lambda: _healthy(lab, *REGIONS, WHOLE), what="the card and its regions advertised healthy")
    lab.allocate(WHOLE)  # an Allocate the kubelet sends for a pod asking for the card (its pick, here ours)
    lab.wait(lambda: _unhealthy(lab, *REGIONS), what="every region advertised unhealthy while the card is in use")
    assert _card_status(lab, list(REGIONS))["in_use"] == {"regions": 4}


def test_an_allocate_of_the_card_and_a_region_together_is_refused_naming_the_counter(lab: Lab) -> None:
    lab.start({RESOURCE: _table(lab)})
    lab.wait(lambda: _healthy(lab, *REGIONS, WHOLE), what="the card and its regions advertised healthy")
    with pytest.raises(grpc.RpcError) as caught:
        lab.allocate(WHOLE, "mock1")
    details = caught.value.details() or ""
    for word in (WHOLE, "mock1", "'regions'", f"'{CARD}'", "5", "has 4", "nothing was allocated"):
        assert word in details, details
    assert lab.calls("allocate", ok=None) == [], "a hook ran for a refused allocation"
    assert lab.ledger() == []

    # In two containers of one request: all or nothing as well.
    two = dp.AllocateRequest(
        container_requests=[
            dp.ContainerAllocateRequest(devices_ids=["mock2"]),
            dp.ContainerAllocateRequest(devices_ids=[WHOLE]),
        ]
    )
    with pytest.raises(grpc.RpcError, match="'regions'"):
        lab.grpc_call("Allocate", two, dp.AllocateResponse)
    assert lab.calls("allocate", ok=None) == []
    assert _healthy(lab, *REGIONS, WHOLE), "a refused request withholds nothing"


def test_a_pod_asking_for_two_devices_gets_two_regions_not_the_card_and_a_region(lab: Lab) -> None:
    """The whole card listed first: the kubelet asks GetPreferredAllocation for 2 of the 5 healthy devices, and the
    first two (the card and a region) never fit together; the preferred choice keeps to parts that fit, so the pod
    is admitted with two regions instead of an Allocate the engine must refuse."""
    whole, regions = "mock0", ("mock1", "mock2", "mock3", "mock4")
    lab.start({RESOURCE: _table(lab, whole, regions)}, grace_period=60.0)
    lab.wait(lambda: _healthy(lab, whole, *regions), what="the card and its regions advertised healthy")
    got = lab.admit("pair", 2)
    assert sorted(got) == ["mock1", "mock2"], got
    lab.wait(lambda: _unhealthy(lab, whole), what=f"{whole} (the whole card) advertised unhealthy")
    assert lab.count("allocate", whole) == 0


#: A mock whose parts of ``card0`` disagree about what the card has: a driver bug the engine names and contains.
DISAGREEING = """
from dataclasses import replace

from devplug import Partition
from devplug_mock import MockDriver


class Driver(MockDriver):
    def _device(self, found):
        dev = super()._device(found)
        counters = {"mock0": {"regions": 4}, "mock1": {"regions": 2}}.get(dev.id)
        if counters is None:
            return dev
        return replace(dev, partition=Partition("card0", counters, {"regions": 1}))
"""


def test_parts_that_disagree_about_their_parents_counters_are_named_and_withheld(
    lab: Lab, fake_distribution: Any
) -> None:
    fake_distribution(
        "devplug-test-disagreeing", DISAGREEING, "[devplug.drivers]\ndisagreeing = devplug_test_disagreeing:Driver\n"
    )
    table = {"driver": "disagreeing", "options": {"directory": str(lab.mock_dir()), "count": 3}}
    lab.start({RESOURCE: table})
    lab.wait(lambda: _unhealthy(lab, "mock0", "mock1"), what="both parts of the disagreeing card withheld")
    assert _healthy(lab, "mock2"), "a device that is no part stays in service"
    log = lab.log()
    said = "'mock0' says {regions: 4}, 'mock1' says {regions: 2}"
    assert f"driver error: parts of parent 'card0' declare different counters: {said}" in log, log
    with pytest.raises(grpc.RpcError) as caught:
        lab.allocate("mock0")
    assert "declare different counters" in (caught.value.details() or "")
    assert lab.calls("allocate", ok=None) == []
    conflict = lab.wait(
        lambda: [p for p in lab.resource_status().get("partitions", []) if p.get("conflict")],
        what="the conflict in the status",
    )
    assert conflict[0]["blocked"] == ["mock0", "mock1"]


def test_after_a_crash_the_held_region_still_withholds_the_card(lab: Lab) -> None:
    """kill -9 while a region is allocated: the restarted daemon finds it in its ledger, withholds the whole card
    again and refuses it naming the region that holds the counter."""
    lab.start({RESOURCE: _table(lab)}, grace_period=60.0)
    (region,) = lab.admit("a", 1)
    lab.wait(lambda: _unhealthy(lab, WHOLE), what=f"{WHOLE} advertised unhealthy")
    lab.kill()
    lab.restart_process()
    lab.wait(lambda: _unhealthy(lab, WHOLE), what=f"{WHOLE} advertised unhealthy after the restart")
    assert _card_status(lab, [WHOLE])["held"] == [region]
    with pytest.raises(grpc.RpcError, match="in use by"):
        lab.allocate(WHOLE)
