"""Two daemon instances hand a DRA node over (issue 30): real ``devplug run`` processes on one state dir, the dev
kubelet's DRA side (the newest connected instance is called, PR #129832) and the API server stand-in.

The new instance asks through the state dir; the old one holds NodePrepareResources and NodeUnprepareResources,
stops writing slices and releasing claims, flushes its ledger, lets the lock go and, once the new one is
registered, answers what it held through the new one's socket, removes its own registration socket and exits 0,
leaving the slices (which the new one adopts unchanged) and the claims' CDI specs in place.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import random
from collections.abc import Callable
from typing import Any

import pytest

from devplug.daemon.handover import NEW_INSTANCE_STEPS, OLD_INSTANCE_STEPS
from devplug.daemon.status import read_status
from devplug.devkubelet import ClaimPrepareError, KubeletError
from devplug.testing.apiserver import ApiServer
from devplug.testing.dranode import TEST_DRA, DraNode
from devplug.testing.process import DaemonProcess
from devplug.testing.scheduler import SchedulingError
from tests.frontends.dra.conftest import run
from tests.frontends.dra.dranode import DRIVER, NS, dra_node, eventually
from tests.support.handoverstop import StoppingDaemon

HANDOVER = {"enabled": True, "timeout": 10.0}
DEVICES = 4
#: Upgrades in the rolling test, and the most pods it admits (bounded in count; each wait is bounded in time).
UPGRADES = 3
PODS_MAX = 200


def _devices() -> dict[str, str]:
    return {f"mock{i}": "" for i in range(DEVICES)}


def successor(lab: DraNode, instance: str, env: dict[str, str] | None = None) -> DaemonProcess:
    """A second ``devplug run`` on the node's config (its state dir), as instance ``instance``."""
    return DaemonProcess(
        lab.config_path,
        lab.root / f"daemon-{instance}.log",
        env={**lab.env, "DEVPLUG_INSTANCE": instance, **(env or {})},
    )


def slice_events(api: ApiServer, after: int) -> list[tuple[str, str, int]]:
    """Every write to the driver's ResourceSlices after revision ``after``: (type, name, devices in the slice)."""
    return [
        (e.type, e.name, len(e.obj["spec"].get("devices") or ()))
        for e in api.storage._history
        if e.revision > after and e.resource.plural == "resourceslices" and e.obj["spec"]["driver"] == DRIVER
    ]


def registered_endpoints(lab: DraNode) -> list[str]:
    """The service endpoint of each registration the kubelet accepted, in order."""
    return [
        e.detail.split(",")[0].removeprefix("endpoint ")
        for e in lab.kubelet.events
        if e.kind == "dra-plugin-registered" and e.resource == DRIVER
    ]


def _hooks_of(lab: DraNode, device: str) -> list[str]:
    return [c["hook"] for c in lab.calls() if c["hook"] in ("allocate", "deallocate") and device in c["device_ids"]]


def releases_balanced(lab: DraNode) -> bool:
    """Every device the driver allocated was deallocated once after each allocation, never twice."""
    for device in _devices():
        hooks = [
            c["hook"] for c in lab.calls() if c["hook"] in ("allocate", "deallocate") and device in c["device_ids"]
        ]
        if hooks.count("allocate") != hooks.count("deallocate"):
            return False
    return True


def check_alternating(lab: DraNode) -> None:
    for device in _devices():
        hooks = [
            c["hook"] for c in lab.calls() if c["hook"] in ("allocate", "deallocate") and device in c["device_ids"]
        ]
        for before, after in itertools.pairwise(hooks):
            assert (before, after) != ("deallocate", "deallocate"), f"{device} released twice: {hooks}"
            assert (before, after) != ("allocate", "allocate"), f"{device} allocated twice unreleased: {hooks}"


def _unregistered(exc: BaseException) -> bool:
    """The kubelet failed a call because no instance of the driver is registered (1.32's words, then 1.33's)."""
    return any(words in str(exc) for words in ("not found in the list of registered DRA plugins", "is not registered"))


class ClaimChurn:
    """Pods with a claim each, admitted (prepared) and finished (unprepared, the claim deleted) until stopped or
    ``PODS_MAX`` were admitted; it asks only for devices that are free, so every refusal is the handover's."""

    def __init__(self, lab: DraNode, api: ApiServer, rng: random.Random, *, gaps: bool = False) -> None:
        self.lab = lab
        self.api = api
        self.rng = rng
        #: Whether the driver may be unregistered for a moment (a kubelet keying plugins by name): a pod refused
        #: then ("DRA driver ... is not registered") is synced again, as the pod worker does, and counted.
        self.gaps = gaps
        self.running: dict[str, int] = {}  # pod -> devices its claim holds
        self.admitted = 0
        self.refused: list[str] = []
        self.gap_refusals: list[str] = []
        self.unprepare_failures: list[str] = []
        self.stop = False

    def _published(self) -> str:
        devices = [d for s in self.lab.slices() for d in s["spec"].get("devices") or ()]
        claims = {
            c["metadata"]["name"]: self.lab.allocated_devices(c) if c.get("status") else None
            for c in self.api.objects("resourceclaims")
        }
        return f"published {[(d['name'], d.get('taints')) for d in devices]}; claims {claims}"

    def _untainted(self, devices: list[str]) -> bool:
        """The devices are published without a taint (a released device is tainted until cleaned)."""
        published = {d["name"]: d for s in self.lab.slices() for d in s["spec"].get("devices") or ()}
        return all(name in published and not published[name].get("taints") for name in devices)

    async def _finish(self, name: str) -> None:
        self.running.pop(name)
        devices = self.lab.allocated_devices(self.api.get("resourceclaims", name, NS))
        try:
            await self.lab.kubelet.finish_pod(name)
        except KubeletError as exc:
            if not (self.gaps and _unregistered(exc)):
                self.unprepare_failures.append(f"{name}: {exc}")
                raise
            self.gap_refusals.append(f"{name}: {exc}")
            await self._sync_until_unprepared(name)
        self.lab.scheduler.deallocate(NS, name)  # the resourceclaim controller, once no pod uses the claim
        self.api.delete("resourceclaims", name, NS)
        await eventually(lambda: self._untainted(devices), f"{name}'s devices {devices} published free", 30.0)

    async def run(self) -> None:
        while not self.stop and self.admitted < PODS_MAX:
            free = DEVICES - sum(self.running.values())
            if self.running and (free == 0 or self.rng.random() < 0.45):
                await self._finish(self.rng.choice(sorted(self.running)))
                continue
            name, count = f"churn{self.admitted}", self.rng.randint(1, min(2, free))
            self.admitted += 1
            self.lab.make_claim(name, count)
            try:  # a release's taint may be published just after the release ended: the scheduler waits it out
                pod, _ = await self.lab.schedule_pod_eventually(name, [name], 30.0)
            except SchedulingError as exc:
                raise AssertionError(f"{exc}; running {self.running}; {self._published()}") from exc
            self.running[name] = count
            try:
                await self.lab.kubelet.admit_pod(pod)
            except ClaimPrepareError as exc:
                if not (self.gaps and _unregistered(exc)):
                    self.refused.append(f"{name}: {exc}")
                    raise
                self.gap_refusals.append(f"{name}: {exc}")
                await self._sync_until_prepared(name)
            await asyncio.sleep(0)

    async def _sync_until_unprepared(self, name: str) -> None:
        """The terminating pod's syncs (each tries its unprepare again in the background) until the kubelet's claim
        cache no longer holds its claim: only then is the claim unused, for the resourceclaim controller to
        deallocate (bounded in time)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30.0
        while any(c.name == name for c in self.lab.kubelet.dra_claims()):
            if loop.time() > deadline:
                self.unprepare_failures.append(f"{name}: still prepared 30 s after the driver came back")
                raise AssertionError(self.unprepare_failures[-1])
            await asyncio.sleep(0.1)
            await self.lab.kubelet.sync_pod(name)

    async def _sync_until_prepared(self, name: str) -> None:
        """The pod worker's next syncs of a pod whose claims could not be prepared (or unprepared) while the driver
        was unregistered, until they are (bounded in time)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30.0
        while True:
            await asyncio.sleep(0.1)
            try:
                await self.lab.kubelet.sync_pod(name)
                return
            except KubeletError as exc:
                if not _unregistered(exc) or loop.time() > deadline:
                    self.refused.append(f"{name}: {exc}")
                    raise

    async def drain(self) -> None:
        for name in sorted(self.running):
            await self._finish(name)

    def churned(self, more: int, worker: asyncio.Future[None]) -> Callable[[], bool]:
        """True once ``more`` pods were admitted after this call, or the churn ended (its error then surfaces)."""
        start = self.admitted
        return lambda: self.admitted > start + more or worker.done()


@pytest.mark.parametrize("release", ["1.32", "1.36"])
def test_rolling_upgrades_of_a_dra_node_under_claim_churn(api: ApiServer, release: str) -> None:
    """On a kubelet keying DRA plugins by endpoint (1.33+) the upgrades are gap-free; on one keying them by name
    (1.32) each new instance is dropped when the old one's socket goes and registers again: pods refused in that
    moment are synced again, and nothing else differs."""
    seed = int(os.environ.get("DEVPLUG_HANDOVER_SEED", random.SystemRandom().randrange(1 << 30)))
    print(f"DRA rolling upgrade seed {seed} (replay: DEVPLUG_HANDOVER_SEED={seed})")
    by_name = release == "1.32"

    async def scenario() -> None:
        kubelet = dataclasses.replace(TEST_DRA, release=release)
        async with dra_node(api, _devices(), handover=HANDOVER, kubelet_dra=kubelet) as lab:
            await lab.published(DEVICES)
            assert lab.daemon is not None
            published_at = api.storage.revision
            first_kept = len(lab.kubelet.events_of("resource-slices-kept", DRIVER))
            churn = ClaimChurn(lab, api, random.Random(seed), gaps=by_name)
            worker = asyncio.ensure_future(churn.run())
            current, processes = lab.daemon, [lab.daemon]
            try:
                for hop in range(UPGRADES):
                    await eventually(churn.churned(3, worker), "pods churning", 30.0)
                    assert not worker.done(), worker.exception()
                    nxt = successor(lab, f"rolling-{hop}").start()
                    processes.append(nxt)
                    assert await asyncio.to_thread(current.wait, 30.0) == 0, current.log_text()
                    current = lab.daemon = nxt
                await eventually(churn.churned(5, worker), "churn after the upgrades", 30.0)
                churn.stop = True
                await asyncio.wait_for(worker, 60.0)
                await churn.drain()
            except BaseException:
                for process in processes:
                    print(f"--- {process.log_path.name} ---\n{process.log_text()[-6000:]}")
                print("--- kubelet events ---\n" + "\n".join(str(e) for e in lab.kubelet.events[-30:]))
                raise
            finally:
                churn.stop = True
                if not worker.done():
                    worker.cancel()
            assert churn.refused == [] and churn.unprepare_failures == []
            await eventually(lambda: releases_balanced(lab), "every allocation released once", details=current.log_text)
            check_alternating(lab)
            assert lab.records() == []
            endpoints = registered_endpoints(lab)
            if by_name:
                # Each new instance registered twice: before the old one stopped, and again after its socket's
                # deregistration dropped it (the kubelet wiped the slices then; the new instance wrote them again).
                assert len(endpoints) == 1 + 2 * UPGRADES and len(set(endpoints)) == 1 + UPGRADES, endpoints
                assert len(lab.kubelet.events_of("resource-slices-wiped", DRIVER)) == UPGRADES
                await lab.published(DEVICES)
            else:
                assert churn.gap_refusals == []
                # The pool never shrank nor went away (its releasing taints may come and go: a release outlasting
                # the publisher's debounce is published).
                writes = slice_events(api, published_at)
                assert all(kind == "MODIFIED" and devices == DEVICES for kind, _, devices in writes), writes
                # No moment without a connected instance (the kubelet would have scheduled the slices' wipe).
                assert len(lab.kubelet.events_of("resource-slices-kept", DRIVER)) == first_kept
                assert lab.kubelet.events_of("resource-slices-wiped", DRIVER) == []
                assert len(endpoints) == 1 + UPGRADES and len(set(endpoints)) == len(endpoints), endpoints
            [view] = lab.kubelet.dra_plugins(DRIVER)  # each old instance removed its registration socket
            assert view.endpoint == endpoints[-1] and view.connected
            held = sum(
                1 for p in processes[:-1] for line in p.log_text().splitlines() if "answered by the successor" in line
            )
            print(
                f"kubelet {release}: {churn.admitted} pods, {len(churn.refused)} refused, "
                f"{len(churn.gap_refusals)} refused while re-registering and synced again, {UPGRADES} upgrades, "
                f"{held} calls answered through the successor"
            )

    run(scenario, 240)


def test_a_dra_node_handed_over_keeps_its_prepared_claims_and_specs(api: ApiServer) -> None:
    """What the old instance prepared stays prepared: the new one answers the kubelet's repeated prepare with the
    same devices, unprepares it once, and its status shows the handover and what was handed over."""

    async def scenario() -> None:
        async with dra_node(api, _devices(), handover=HANDOVER) as lab:
            await lab.published(DEVICES)
            lab.make_claim("c1")
            pod, [claim] = lab.schedule_pod("p1", ["c1"])
            uid = claim["metadata"]["uid"]
            await lab.kubelet.admit_pod(pod)
            spec = lab.spec_of(uid)
            published_at = api.storage.revision
            old = lab.daemon
            assert old is not None
            [old_endpoint] = registered_endpoints(lab)
            new = successor(lab, "instance-b").start()
            assert await asyncio.to_thread(old.wait, 30.0) == 0, old.log_text()
            lab.daemon = new
            [view] = lab.kubelet.dra_plugins(DRIVER)  # the old instance removed its registration socket as it left
            assert view.endpoint != old_endpoint and view.connected
            assert registered_endpoints(lab) == [old_endpoint, view.endpoint]
            assert slice_events(api, published_at) == []  # the slices adopted as they were, not written again
            assert lab.spec_of(uid) == spec  # the claim's CDI spec left as it was
            assert [r["claim_uid"] for r in lab.records()] == [uid]

            def took_over() -> dict[str, Any] | None:
                section = read_status(lab.root / "state").get("handover", {}).get("took_over", {})
                return section if section.get("state") == "done" else None

            record = await eventually(took_over, "the handover done in the new instance's status", details=new.log_text)
            assert record["to"] == "instance-b" and record["from"].startswith(f"pid-{old.pid}-")
            facts = record["resources"]["example.com/mock"]
            assert facts["endpoint"] == old_endpoint and facts["claims"] == 1 and facts["held_allocations"] == 1
            assert facts["registration_socket"].startswith(str(lab.root / "plugins_registry" / f"{DRIVER}-"))

            pod2, _ = lab.schedule_pod("p2", ["c1"])  # a second pod of the claim: prepared again, by the new one
            await lab.kubelet.admit_pod(pod2)
            assert lab.kubelet.container_cdi_devices("p2", "app") == [f"{DRIVER}/claim={uid}-dev"]
            assert len(lab.calls("allocate")) == 1
            await lab.kubelet.finish_pod("p1")
            assert lab.calls("deallocate") == []
            await lab.kubelet.finish_pod("p2")
            assert [c["device_ids"] for c in lab.calls("deallocate")] == [lab.allocated_devices(claim)]
            assert lab.records() == []
            assert not (lab.root / "cdi" / f"dra-{DRIVER}-{uid}.json").exists()
            assert "handed over to instance-b in" in old.log_text()

    run(scenario, 120)


# --- kill -9 at each step ---------------------------------------------------------------------------------------

#: (which instance dies, right after which step); see tests.support.handoverstop.
KILL_POINTS = [*(("old", step) for step in OLD_INSTANCE_STEPS), *(("new", step) for step in NEW_INSTANCE_STEPS)]


def claims_in_ledger(lab: DraNode) -> set[str]:
    return {r["claim"] for r in lab.records() if r["claim"]}


@pytest.mark.parametrize(("victim", "step"), KILL_POINTS, ids=[f"{v}-at-{s}" for v, s in KILL_POINTS])
def test_kill_9_at_each_step_of_a_dra_handover_loses_nothing(api: ApiServer, victim: str, step: str) -> None:
    async def scenario() -> None:
        async with dra_node(api, _devices(), handover={"enabled": True, "timeout": 4.0}, start=False) as lab:
            if victim == "old":  # the old daemon stops itself at the step
                old = lab.daemon = StoppingDaemon(step, lab.config_path, lab.root / "daemon.log", env=lab.env).start()
            else:
                old = lab.start_daemon()
            await lab.registered()
            await lab.published(DEVICES)
            published_at = api.storage.revision
            pods = {}
            for name in ("a", "b"):
                lab.make_claim(name)
                pods[name], _ = lab.schedule_pod(name, [name])
                await lab.kubelet.admit_pod(pods[name])
            assert claims_in_ledger(lab) == {f"{NS}/a", f"{NS}/b"}
            new = successor(lab, "kill-b")
            if victim == "new":  # the new daemon stops itself at the step
                new = StoppingDaemon.like(new, step)
            new.start()
            dying = old if victim == "old" else new
            await eventually(dying.stopped, f"the {victim} instance stopped at {step}")
            dying.kill()
            survivor = new if victim == "old" else old
            try:
                if victim == "new" and step == "request":  # before the commit: the old instance serves on
                    await eventually(lambda: "handover to kill-b failed, serving on" in old.log_text(), "refusal")
                    assert old.running()
                else:
                    if victim == "new":  # after the commit: the old one leaves, and the new one's restart serves
                        assert await asyncio.to_thread(old.wait, 20.0) == 0, old.log_text()
                        new = successor(lab, "kill-b").start()  # the same instance, stopping nowhere
                        survivor = new
                    old_endpoint = registered_endpoints(lab)[0]

                    def new_alone() -> bool:
                        views = lab.kubelet.dra_plugins(DRIVER)
                        return len(views) == 1 and views[0].connected and views[0].endpoint != old_endpoint

                    await eventually(new_alone, "the new instance alone registered", details=new.log_text)
                lab.daemon = survivor
                assert claims_in_ledger(lab) == {f"{NS}/a", f"{NS}/b"}  # nothing lost
                assert sum(len(s["spec"]["devices"]) for s in lab.slices()) == DEVICES
                assert [e for e in slice_events(api, published_at) if e[0] == "DELETED"] == []
                lab.make_claim("c")
                pods["c"], _ = lab.schedule_pod("c", ["c"])
                await lab.kubelet.admit_pod(pods["c"])
                for name in ("a", "b", "c"):
                    await lab.kubelet.finish_pod(name)
                await eventually(lambda: releases_balanced(lab), "every allocation released once")
                check_alternating(lab)
                assert lab.records() == []
                assert [p.running() for p in (old, new) if p is not survivor] == [False]  # the survivor alone runs
            finally:
                for process in (old, new):  # never leave a daemon behind, whatever failed
                    if process is not survivor and process.running():
                        process.kill()
                print(f"--- surviving instance ---\n{survivor.log_text()[-4000:]}")

    run(scenario, 120)
