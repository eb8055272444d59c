"""Issue 16: device sharing in the core. Each physical device advertised as N replicas, spread by the core's
preferred allocation, health following the physical device, and the release rules per tenancy: ``post_stop``
once per tenant, ``deallocate`` only when the last replica is released, across ``kill -9``.

End to end: the real daemon (``devplug run``), the dev kubelet over unix sockets, the mock driver's device
files and call log (which records the physical IDs the hooks got, and on shared devices the replica IDs and
the other tenants alongside).
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from devplug.devkubelet import ContainerSpec, KubeletError, PodSpec

RESOURCE = "example.com/mock"
SHARED_ENV = "DEVPLUG_SHARED_DEVICES_EXAMPLE_COM_MOCK"


def shared_table(lab: Any, count: int, replicas: int, **extra: Any) -> dict[str, Any]:
    table: dict[str, Any] = lab.resource_table(count=count, replicas=replicas, **extra)
    return table


def shares(lab: Any, resource: str = RESOURCE) -> list[dict[str, Any]]:
    """The status file's per-device sharing figures, once the daemon wrote them for the started resource."""

    def written() -> list[dict[str, Any]] | None:
        for res in lab.status()["resources"]:
            if res["name"] == resource and res.get("sharing", {}).get("devices"):
                found: list[dict[str, Any]] = res["sharing"]["devices"]
                return found
        return None

    result: list[dict[str, Any]] = lab.wait(written, what=f"the sharing figures of {resource} in the status file")
    return result


def physical(replica: str) -> str:
    """The device behind a replica ID, for the test's own bookkeeping (the hooks never parse it)."""
    return replica.rpartition("::")[0]


def test_each_device_is_advertised_as_its_replicas(lab: Any) -> None:
    lab.start({RESOURCE: shared_table(lab, count=2, replicas=4)})
    view = lab.view()
    assert sorted(d.id for d in view.devices) == [f"mock{n}::{k}" for n in range(2) for k in range(4)]
    assert view.capacity == view.allocatable == 8
    assert lab.resource_status()["sharing"]["replicas"] == 4
    assert [(s["device"], s["replicas"], s["in_use"], s["tenants"]) for s in shares(lab)] == [
        ("mock0", 4, 0, 0),
        ("mock1", 4, 0, 0),
    ]


def test_replica_ids_are_stable_across_restarts(lab: Any) -> None:
    daemon = lab.start({RESOURCE: shared_table(lab, count=2, replicas=3)})
    before = sorted(d.id for d in lab.view().devices)
    daemon.restart()
    lab.wait_advertised()
    assert sorted(d.id for d in lab.view().devices) == before


def test_pods_are_spread_over_the_least_loaded_devices(lab: Any) -> None:
    for n in range(3):
        lab.write_device(f"mock{n}", "numa=0")
    lab.start({RESOURCE: shared_table(lab, count=3, replicas=4)})
    got = [physical(d) for pod in ("a", "b", "c") for d in lab.admit(pod)]
    assert sorted(got) == ["mock0", "mock1", "mock2"], "one pod per device before any device gets a second"
    (d,) = lab.admit("d")
    assert physical(d) in got
    # The status file is rewritten at most once a second: wait until it counts the four tenancies, then check them.
    lab.wait(lambda: sum(s["tenants"] for s in shares(lab)) == 4, what="the status to count the four pods")
    tenants = {s["device"]: s["tenants"] for s in shares(lab)}
    assert sorted(tenants.values()) == [1, 1, 2]


def test_a_request_for_several_replicas_gets_distinct_devices_and_says_so(lab: Any) -> None:
    lab.write_device("mock0", "numa=0")
    lab.write_device("mock1", "numa=1")
    lab.write_device("mock2", "numa=0")
    lab.start({RESOURCE: shared_table(lab, count=3, replicas=4)})
    (first,) = lab.admit("first")  # one device now carries a tenant
    pod = lab.kubelet.admit_pod(PodSpec("two", [ContainerSpec("app", {RESOURCE: 2})]))
    container = pod.container("app")
    ids = container.devices[RESOURCE]
    devices = sorted({physical(i) for i in ids})
    assert len(devices) == 2, f"two replicas of one device: {ids}"
    assert physical(first) not in devices, "the least-loaded devices are taken first"
    allocation = container.allocations[RESOURCE]
    assert sorted(allocation.envs[SHARED_ENV].split(",")) == devices
    assert sorted(allocation.annotations[f"{RESOURCE}.shared-devices"].split(",")) == devices
    assert sorted(allocation.envs["MOCK_DEVICES"].split(",")) == devices, "the driver saw physical IDs"
    (call,) = [c for c in lab.calls("allocate") if sorted(c["device_ids"]) == devices]
    assert {dev: reps for dev, reps in call["replicas"].items()} == {physical(i): [i] for i in ids}


def test_more_replicas_than_devices_share_one_device_in_one_call(lab: Any) -> None:
    lab.start({RESOURCE: shared_table(lab, count=1, replicas=4)})
    ids = lab.admit("p", count=3)
    assert {physical(i) for i in ids} == {"mock0"}
    (call,) = lab.calls("allocate")
    assert call["device_ids"] == ["mock0"], "the driver gets the device once"
    assert sorted(call["replicas"]["mock0"]) == sorted(ids)


def test_a_device_may_carry_its_own_replica_count(lab: Any) -> None:
    lab.write_device("mock0", "replicas=3")  # e.g. a bigger card
    lab.start({RESOURCE: shared_table(lab, count=3, replicas=1)})
    ids = sorted(d.id for d in lab.view().devices)
    assert ids == ["mock0::0", "mock0::1", "mock0::2", "mock1", "mock2"]
    lab.write_device("mock1", "replicas=2")  # hot: the device's count changes
    lab.wait(lambda: lab.view().device("mock1::1") is not None, what="mock1 advertised as 2 replicas")
    assert lab.view().device("mock1") is None
    lab.wait(lambda: {s["device"]: s["replicas"] for s in shares(lab)} == {"mock0": 3, "mock1": 2}, what="counts")


def test_fail_requests_greater_than_one_refuses_two_replicas(lab: Any) -> None:
    lab.start({RESOURCE: shared_table(lab, count=2, replicas=2, fail_requests_greater_than_one=True)})
    with pytest.raises(KubeletError, match="fail_requests_greater_than_one"):
        lab.kubelet.admit_pod(PodSpec("two", [ContainerSpec("app", {RESOURCE: 2})]))
    assert lab.calls("allocate", ok=None) == [], "the driver never saw the refused request"
    with pytest.raises(grpc.RpcError) as refused:
        lab.allocate("mock0::0", "mock1::0")
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "container #0 of the request asks for 2 devices" in (refused.value.details() or "")
    lab.kubelet.remove_pod("two")
    (one,) = lab.admit("one")  # one replica per container is fine
    assert physical(one) in ("mock0", "mock1")


def test_rename_advertises_the_shared_resource_under_its_own_name(lab: Any) -> None:
    renamed = "example.com/mock.shared"
    lab.daemon = lab.factory(
        {RESOURCE: shared_table(lab, count=1, replicas=2, rename=renamed)}, release_interval=0.1, grace_period=1.0
    )
    assert lab.kubelet.resource(RESOURCE) is None, "nothing is registered under the configured name"
    assert sorted(d.id for d in lab.kubelet.resource(renamed).devices) == ["mock0::0", "mock0::1"]
    pod = lab.kubelet.admit_pod(PodSpec("p", [ContainerSpec("app", {renamed: 1})]))
    assert "DEVPLUG_SHARED_DEVICES_EXAMPLE_COM_MOCK_SHARED" in pod.container("app").allocations[renamed].envs
    lab.kubelet.remove_pod("p")
    lab.wait_released("mock0")  # releases follow PodResources under the advertised name
    (entry,) = [r for r in lab.status()["resources"] if r["name"] == renamed]
    assert entry["sharing"]["configured_as"] == RESOURCE


def test_the_physical_devices_health_reaches_every_replica(lab: Any) -> None:
    lab.start({RESOURCE: shared_table(lab, count=2, replicas=3)})
    lab.write_device("mock0", "unhealthy")
    lab.wait(
        lambda: all(lab.health(f"mock0::{k}") == "Unhealthy" for k in range(3)), what="every replica of mock0 sick"
    )
    assert all(lab.health(f"mock1::{k}") == "Healthy" for k in range(3))
    lab.write_device("mock0")
    lab.wait(lambda: all(lab.health(f"mock0::{k}") == "Healthy" for k in range(3)), what="mock0's replicas healthy")
    lab.device_file("mock1").unlink()  # hot-unplug takes every replica
    lab.wait(lambda: lab.view().capacity == 3, what="mock1's replicas gone")
    assert all(lab.view().device(f"mock1::{k}") is None for k in range(3))
    lab.write_device("mock7")  # hot-plug brings them
    lab.wait(lambda: lab.view().capacity == 6, what="mock7's replicas advertised")
    assert sorted(d.id for d in lab.view().devices if d.id.startswith("mock7")) == [f"mock7::{k}" for k in range(3)]


def two_tenants(lab: Any) -> tuple[str, str]:
    (a,) = lab.admit("a")
    (b,) = lab.admit("b")
    assert physical(a) == physical(b) == "mock0" and a != b
    lab.wait_seen(a, "a")
    lab.wait_seen(b, "b")
    return a, b


def test_two_tenants_leave_post_stop_each_deallocate_once_at_the_end(lab: Any) -> None:
    lab.start({RESOURCE: shared_table(lab, count=1, replicas=2)})
    a, b = two_tenants(lab)
    expected = [("mock0", 2, 2, ["default/a", "default/b"])]
    lab.wait(
        lambda: [(s["device"], s["in_use"], s["tenants"], s["pods"]) for s in shares(lab)] == expected,
        what=f"status showing {expected}",
    )

    lab.kubelet.remove_pod("a")
    lab.wait(lambda: lab.count("post_stop", "mock0") == 1, what="a's post_stop")
    lab.wait(lambda: lab.ledger_record(a) is None, what="a's record to go")
    lab.quiet(0.5)  # several reconciler rounds: nothing more happens to mock0
    assert lab.count("deallocate", "mock0") == 0, "mock0 was deallocated under tenant b"
    (first,) = lab.calls("post_stop", "mock0")
    assert first["replicas"] == {"mock0": [a]} and first["tenants"] == {"mock0": 1} and not first.get("retry")
    assert lab.ledger_record(b) is not None
    assert lab.health(a) == "Healthy", "a's replica is free for the next pod"

    lab.kubelet.remove_pod("b")
    lab.wait_released("mock0")
    hooks = [
        (c["hook"], c.get("replicas")) for c in lab.calls(device="mock0") if c["hook"] in ("post_stop", "deallocate")
    ]
    assert hooks == [("post_stop", {"mock0": [a]}), ("post_stop", {"mock0": [b]}), ("deallocate", None)]
    second = lab.calls("post_stop", "mock0")[1]
    assert second["tenants"] == {"mock0": 0}
    lab.quiet(0.5)
    assert lab.count("deallocate", "mock0") == 1 and lab.count("post_stop", "mock0") == 2


def test_kill_between_the_two_tenants_leaving(lab: Any) -> None:
    lab.start({RESOURCE: shared_table(lab, count=1, replicas=2)})
    a, b = two_tenants(lab)
    lab.kubelet.remove_pod("a")
    lab.wait(lambda: lab.ledger_record(a) is None, what="a's release")
    lab.kill()
    lab.restart_process()
    lab.quiet(0.5)
    assert lab.count("deallocate", "mock0") == 0, "a restart deallocated mock0 under tenant b"
    assert lab.count("post_stop", "mock0") == 1, "a's post_stop ran again after the restart"
    assert lab.ledger_record(b) is not None, "b's tenancy survives the restart"
    lab.kubelet.remove_pod("b")
    lab.wait_released("mock0")
    lab.quiet(0.5)
    calls = [
        (c["hook"], c.get("retry", False))
        for c in lab.calls(device="mock0")
        if c["hook"] in ("post_stop", "deallocate")
    ]
    assert calls == [("post_stop", False), ("post_stop", False), ("deallocate", False)]


def test_kill_during_the_last_tenants_deallocate_retries_it(lab: Any) -> None:
    lab.start({RESOURCE: shared_table(lab, count=1, replicas=2)})
    a, _b = two_tenants(lab)
    lab.kubelet.remove_pod("a")
    lab.wait(lambda: lab.ledger_record(a) is None, what="a's release")
    lab.write_device("mock0", "delay=deallocate:120")
    lab.kubelet.remove_pod("b")
    lab.wait(lambda: lab.calls("deallocate", "mock0", ok=None) or _begun(lab, "deallocate"), what="deallocate begun")
    lab.kill()
    assert lab.count("deallocate", "mock0") == 0
    lab.write_device("mock0")
    lab.restart_process()
    lab.wait_released("mock0")
    lab.quiet(0.5)
    (dealloc,) = lab.calls("deallocate", "mock0")
    assert dealloc.get("retry"), "the interrupted deallocate is called again, flagged retry"
    assert lab.count("post_stop", "mock0") == 2, "post_stop ran once per tenant"


def _begun(lab: Any, hook: str) -> bool:
    from devplug.testing.recorder import read_hook_calls

    return any(c.hook == hook for c in read_hook_calls(lab.mock_dir(), device="mock0", started=True))


def test_a_new_tenant_of_a_freed_replica_keeps_the_device_undeallocated(lab: Any) -> None:
    """a leaves, c takes a's replica while b still runs: the device is never deallocated in between."""
    lab.start({RESOURCE: shared_table(lab, count=1, replicas=2)})
    a, b = two_tenants(lab)
    lab.kubelet.remove_pod("a")
    lab.wait(lambda: lab.ledger_record(a) is None, what="a's release")
    lab.wait(lambda: lab.health(a) == "Healthy", what="a's replica advertised free")  # after the durable drop
    (c,) = lab.admit("c")
    assert c == a
    lab.kubelet.remove_pod("b")
    lab.wait(lambda: lab.count("post_stop", "mock0") == 2, what="b's post_stop")
    lab.wait(lambda: lab.ledger_record(b) is None, what="b's record to go")
    assert lab.count("deallocate", "mock0") == 0, "mock0 deallocated under tenant c"
    lab.kubelet.remove_pod("c")
    lab.wait_released("mock0")
    assert lab.count("post_stop", "mock0") == 3


def test_an_undone_shared_allocate_spares_the_other_tenant(lab: Any) -> None:
    """A two-container Allocate whose second container fails is undone like a release: post_stop for the
    tenancy, deallocate only of the device no other tenant holds."""
    from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp

    lab.start({RESOURCE: shared_table(lab, count=2, replicas=2)})
    (held,) = lab.admit("a")
    busy, other = physical(held), ({"mock0", "mock1"} - {physical(held)}).pop()
    lab.write_device(other, "fail=allocate")
    free_replica = next(d.id for d in lab.view().devices if physical(d.id) == busy and d.id != held)
    request = dp.AllocateRequest(
        container_requests=[
            dp.ContainerAllocateRequest(devices_ids=[free_replica]),
            dp.ContainerAllocateRequest(devices_ids=[f"{other}::0"]),
        ]
    )
    with pytest.raises(grpc.RpcError, match="rolled back"):
        lab.grpc_call("Allocate", request, dp.AllocateResponse)
    undo = [
        (c["hook"], c["device_ids"], c.get("tenants")) for c in lab.calls() if c["hook"] in ("post_stop", "deallocate")
    ]
    assert undo == [
        ("post_stop", [other], {other: 0}),
        ("deallocate", [other], None),
        ("post_stop", [busy], {busy: 1}),
    ], "the device pod a uses was not deallocated, the other one was"
    assert lab.ledger_record(held) is not None and lab.ledger_record(free_replica) is None


# --- issue 24 item 7: a replica count lowered by a reload


def _reload_replicas(lab: Any, replicas: int) -> None:
    """Rewrite the running daemon's config with ``replicas`` and apply it with ``devplug reload``."""
    import copy
    import subprocess
    import sys

    from devplug.testing.configs import write_toml

    daemon = lab.daemon
    config = copy.deepcopy(daemon.config)
    config["resources"][RESOURCE]["replicas"] = replicas
    write_toml(daemon.config_path, config)
    before = lab.kubelet.registrations(RESOURCE)
    result = subprocess.run(
        [sys.executable, "-m", "devplug", "reload", "--config", str(daemon.config_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert f"changed: {RESOURCE}" in result.stdout
    lab.kubelet.wait_registered(RESOURCE, timeout=15.0, after=before)
    lab.wait_advertised()


def _free_healthy(lab: Any) -> list[str]:
    view = lab.view()
    return [d.id for d in view.devices if d.healthy and d.id not in view.in_use]


def test_replicas_lowered_by_a_reload_take_no_new_tenant_until_the_excess_drained(lab: Any) -> None:
    lab.start({RESOURCE: shared_table(lab, count=1, replicas=4)})
    held = {pod: lab.admit(pod)[0] for pod in ("a", "b", "c")}
    for pod, replica in held.items():
        lab.wait_seen(replica, pod)
    _reload_replicas(lab, 2)
    assert sorted(d.id for d in lab.view().devices) == ["mock0::0", "mock0::1"]
    lab.wait(lambda: _free_healthy(lab) == [], what="no replica of mock0 offered while 3 tenants hold it")

    # a tenant holding an advertised replica leaves: 2 tenants remain, as many as mock0 has replicas now
    leaving = next(pod for pod, replica in held.items() if replica in ("mock0::0", "mock0::1"))
    lab.kubelet.remove_pod(leaving)
    lab.wait(lambda: lab.ledger_record(held[leaving]) is None, what=f"{leaving}'s release")
    lab.quiet(0.5)  # several reconciler rounds and device lists
    assert _free_healthy(lab) == [], "the freed replica is offered although mock0 has its 2 tenants"
    with pytest.raises(KubeletError):
        lab.admit("d")
    with pytest.raises(grpc.RpcError) as refused:  # the Allocate refuses it too, should a kubelet ask anyway
        lab.allocate(held[leaving])
    assert "mock0 is advertised as 2 replica(s) now (its count was lowered)" in str(refused.value.details())
    assert "nothing was allocated" in str(refused.value.details())

    # one more leaves: a single tenant, so one replica is offered again, and only one
    staying = [pod for pod in held if pod != leaving]
    lab.kubelet.remove_pod(staying[0])
    lab.wait(lambda: lab.ledger_record(held[staying[0]]) is None, what=f"{staying[0]}'s release")
    lab.wait(lambda: len(_free_healthy(lab)) == 1, what="one replica of mock0 offered to a second tenant")
    (got,) = lab.admit("e")
    assert got in ("mock0::0", "mock0::1")
    lab.wait(lambda: _free_healthy(lab) == [], what="mock0 full again with 2 tenants")
    with pytest.raises(KubeletError):
        lab.admit("f")
    lab.wait_seen(got, "e")
    tenants = {r["pod"] for r in lab.ledger()}
    assert tenants == {f"default/{staying[1]}", "default/e"}, tenants
