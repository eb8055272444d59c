"""Kubelet restarts (issue 3): the daemon notices, serves a fresh socket and registers again, for
every resource, while pods keep their devices; nothing is released by mistake, and removing the
pods afterwards still releases their devices."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.lifecycle.conftest import Lab

RESOURCE = "example.com/mock"
RESOURCE_B = "example.com/other"
INTERVAL = 0.1


def test_kubelet_restart_reregisters_every_resource_and_loses_no_allocation(lab: Lab) -> None:
    lab.start({RESOURCE: lab.resource_table(), RESOURCE_B: lab.resource_table(RESOURCE_B)})
    held = {RESOURCE: lab.admit("p", 2, RESOURCE), RESOURCE_B: lab.admit("q", 1, RESOURCE_B)}
    for resource, devices in held.items():
        for dev in devices:
            lab.wait_seen(dev, resource=resource)
    before = {name: lab.kubelet.registrations(name) for name in held}

    lab.kubelet.restart()
    for name in held:
        lab.kubelet.wait_registered(name, timeout=10.0, after=before[name])
        lab.wait_advertised(name)
        assert lab.kubelet.registrations(name) == before[name] + 1
        lab.wait(lambda: all(lab.view(r).allocatable == 4 for r in held), what="every device healthy again")
    assert "re-registering" in lab.log()

    lab.quiet(5 * INTERVAL)  # the reconciler keeps polling: the pods still hold their devices
    for resource, devices in held.items():
        assert set(lab.view(resource).in_use) == set(devices)
        for dev in devices:
            assert lab.count("post_stop", dev, resource) == 0
            assert lab.count("deallocate", dev, resource) == 0
            record = lab.ledger_record(dev, resource)
            assert record is not None
            assert not record["releasing"]

    lab.kubelet.remove_pod("p")
    lab.kubelet.remove_pod("q")
    for resource, devices in held.items():
        for dev in devices:
            lab.wait_released(dev, resource=resource)
            assert lab.count("post_stop", dev, resource) == 1
            assert lab.count("deallocate", dev, resource) == 1
