"""Claim churn over shared, partitioned and admin-access devices with kill -9 at random points (issue 41).

One node serves the mock through DRA on a 1.36 control plane (every gate of issue 41 on): ``mock0`` shared by four
(published as one device with consumable capacity), ``mock1`` a plain device, and a card of four regions offered
whole (``card0-whole``) and by region (``card0-part0`` .. ``card0-part3``: a counter set ``regions`` of 4). Each
round makes a claim of one kind (shares of ``mock0``, a part of the card, ``mock1``, or admin access to any device,
in a namespace labelled for it), lets the scheduler stand-in allocate it for a pod, prepares it as the kubelet does
(NodePrepareResources, repeated until it is answered), and unprepares a random prepared one (repeated until it is
done), after which the resourceclaim controller deallocates it. At random moments the daemon is killed with SIGKILL,
sometimes in the middle of a call, and started again; the calls that got no answer are made again (the kubelet owes
them).

What must hold, whatever the seed:

* **no device over-consumed**: the hook record, replayed in the order the hooks finished, never has a part
  allocated while it is held nor the parts held take more regions than the card has; the ledger never gives one
  replica of ``mock0`` to two claims, and each share holds the replicas its ``consumedCapacity`` asks;
* **every share cleaned after its last consumer**: ``mock0`` is deallocated only while no share of it is prepared,
  and at the end every device that was allocated was deallocated last;
* **status written and removed**: every prepared claim shows the driver's entries in ``status.devices`` (the
  mock's ``device_status = "ready"``), gone after its unprepare;
* **admin access without the core**: no hook ever runs for an admin-access claim.

The seed is printed (replay: ``DEVPLUG_TORTURE_SEED=<seed>``); the rounds are bounded in count and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from devplug.api.gen.dra.v1 import api_pb2 as v1
from devplug.api.gen.dra.v1 import api_pb2_grpc as v1_grpc
from devplug.testing.apiserver import ApiServer
from devplug.testing.dranode import DraNode, short_root
from devplug.testing.dranode import dra_node as node_with
from devplug.testing.scheduler import SchedulingError
from tests.frontends.dra.conftest import run
from tests.frontends.dra.dranode import DRIVER, NS, RESOURCE, eventually
from tests.frontends.dra.test_kep41_admin_access import label_namespace
from tests.frontends.dra.test_kep41_prepare_shares import restarted

ROUNDS = 60
BUDGET_S = 75.0
KILL_CHANCE = 0.25
REGIONS = 4
PARTS = {"card0-whole": REGIONS, **{f"card0-part{i}": 1 for i in range(REGIONS)}}
DEVICES = ["mock0", "mock1", *PARTS]
ADMIN_LABEL = "resource.kubernetes.io/admin-access"


@dataclass
class Claimed:
    """A claim the test made and the kubelet's view of it."""

    name: str
    kind: str
    stored: dict[str, Any]
    prepared_at: float | None = None
    unprepare_at: float | None = None
    devices: list[str] = field(default_factory=list)

    @property
    def uid(self) -> str:
        return str(self.stored["metadata"]["uid"])

    def ref(self) -> Any:
        return v1.Claim(namespace=NS, name=self.name, uid=self.uid)

    def results(self) -> list[dict[str, Any]]:
        return list(self.stored["status"]["allocation"]["devices"]["results"])

    def shares(self) -> int:
        return sum(int(r.get("consumedCapacity", {}).get("shares", "0")) for r in self.results())


def _selector(device: str) -> list[dict[str, Any]]:
    return [{"cel": {"expression": f'device.attributes["{DRIVER}"].deviceID == "{device}"'}}]


def _claim_body(lab: DraNode, name: str, kind: str, rng: random.Random) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": lab.device_class, "count": 1}
    if kind == "share":
        exactly["selectors"] = _selector("mock0")
        exactly["capacity"] = {"requests": {"shares": str(rng.choice([1, 1, 2]))}}
    elif kind == "part":
        exactly["selectors"] = _selector(rng.choice(list(PARTS)))
    elif kind == "plain":
        exactly["selectors"] = _selector("mock1")
    else:
        exactly["selectors"] = _selector(rng.choice(DEVICES))
        exactly["adminAccess"] = True
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}},
    }


class Churn:
    """The rounds, the daemon's kills and what the test saw."""

    def __init__(self, lab: DraNode, rng: random.Random, seed: int) -> None:
        self.lab = lab
        self.rng = rng
        self.seed = seed
        self.target = lab.service_target()
        self.prepared: list[Claimed] = []
        self.done: list[Claimed] = []
        self.kills = 0
        self.unschedulable = 0

    def fail(self, what: str) -> str:
        return f"seed {self.seed} (DEVPLUG_TORTURE_SEED={self.seed}), kill {self.kills}: {what}"

    async def _call(self, method: str, request: Any) -> Any | None:
        """One call on the daemon's DRA socket, killed at a random moment now and then; None when the kill cut it
        (the daemon has been started again)."""
        kill = self.rng.random() < KILL_CHANCE
        async with grpc.aio.insecure_channel(self.target) as channel:
            call = asyncio.ensure_future(getattr(v1_grpc.DRAPluginStub(channel), method)(request, timeout=20))
            if kill:
                await asyncio.sleep(self.rng.uniform(0.0, 0.03))
            try:
                answer = await asyncio.shield(call) if not kill else None
            except grpc.aio.AioRpcError as exc:
                raise AssertionError(self.fail(f"{method} failed with no kill: {exc}")) from exc
            if kill:
                await self._restart()
                with contextlib.suppress(grpc.aio.AioRpcError):  # cut by the kill: the kubelet asks again
                    await call
                return None
        return answer

    async def _restart(self) -> None:
        self.kills += 1
        self.target = await restarted(self.lab)

    async def prepare(self, claimed: Claimed) -> None:
        """NodePrepareResources until the claim is answered without an error (a part still being released is a
        retryable refusal, as the kubelet retries it)."""
        deadline = time.monotonic() + 20.0
        while True:
            answer = await self._call("NodePrepareResources", v1.NodePrepareResourcesRequest(claims=[claimed.ref()]))
            if answer is not None:
                got = answer.claims[claimed.uid]
                if not got.error:
                    claimed.prepared_at = time.time()
                    claimed.devices = [d.device_name for d in got.devices]
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(self.fail(f"{claimed.name} ({claimed.kind}) never prepared: {got.error}"))
                await asyncio.sleep(0.05)

    async def unprepare(self, claimed: Claimed) -> None:
        claimed.unprepare_at = time.time()
        deadline = time.monotonic() + 20.0
        while True:
            request = v1.NodeUnprepareResourcesRequest(claims=[claimed.ref()])
            answer = await self._call("NodeUnprepareResources", request)
            if answer is not None and not answer.claims[claimed.uid].error:
                return
            if time.monotonic() > deadline:
                raise AssertionError(self.fail(f"{claimed.name} never unprepared: {answer}"))
            await asyncio.sleep(0.05)

    def status_entries(self, claimed: Claimed) -> list[dict[str, Any]]:
        stored = self.lab.api.get("resourceclaims", claimed.name, NS)
        return [e for e in (stored.get("status") or {}).get("devices") or [] if e.get("driver") == DRIVER]

    async def new_claim(self, index: int) -> None:
        kind = self.rng.choice(["share", "share", "part", "part", "plain", "admin"])
        name = f"c{index}-{kind}"
        self.lab.api.create("resourceclaims", _claim_body(self.lab, name, kind, self.rng), NS)
        try:
            _, [stored] = self.lab.schedule_pod(f"p{index}", [name])
        except SchedulingError:
            self.unschedulable += 1
            self.lab.api.delete("pods", f"p{index}", NS)
            self.lab.api.delete("resourceclaims", name, NS)
            return
        claimed = Claimed(name, kind, stored)
        await self.prepare(claimed)
        self.prepared.append(claimed)
        if kind != "admin":
            await eventually(
                lambda: len(self.status_entries(claimed)) == len(claimed.results()),
                f"{name}'s status.devices written",
                details=self.lab.log,
            )

    async def end_claim(self, claimed: Claimed) -> None:
        await self.unprepare(claimed)
        self.prepared.remove(claimed)
        self.done.append(claimed)
        await eventually(lambda: not self.status_entries(claimed), f"{claimed.name}'s status.devices removed")
        self.lab.scheduler.deallocate(NS, claimed.name)
        self.lab.api.delete("resourceclaims", claimed.name, NS)
        self.lab.api.delete("pods", f"p{claimed.name[1:].split('-')[0]}", NS)

    def check_ledger(self) -> None:
        """No replica of mock0 held twice; each share claim holds what it consumed."""
        holders: dict[str, str] = {}
        by_claim: dict[str, list[str]] = {}
        for record in self.lab.records():
            for device in record["devices"]:
                if device.startswith("mock0::"):
                    other = holders.setdefault(device, str(record["claim"]))
                    assert other == str(record["claim"]), self.fail(f"{device} held by {other} and {record['claim']}")
                    by_claim.setdefault(str(record["claim"]), []).append(device)
        for claimed in self.prepared:
            if claimed.kind == "share":
                held = by_claim.get(f"{NS}/{claimed.name}", [])
                assert len(held) == claimed.shares(), self.fail(f"{claimed.name} holds {held} for {claimed.shares()}")
        # An admin-access result carries a shareID and consumedCapacity too, but counts toward no device's usage:
        # the scheduler's GatherAllocatedState skips results with adminAccess (pkg/scheduler/framework/plugins/
        # dynamicresources), so an admin claim of mock0 may sit beside four shares of it.
        taken = sum(c.shares() for c in self.prepared if c.kind == "share")
        assert taken <= 4, self.fail(f"{taken} shares of mock0 prepared, more than its 4")


def _check_hooks(churn: Churn) -> None:
    calls = churn.lab.calls()
    admin_names = {f"{NS}/{c.name}" for c in churn.done if c.kind == "admin"}
    held: set[str] = set()
    share_windows = [
        (c.prepared_at, c.unprepare_at) for c in churn.done if c.kind == "share" and c.prepared_at and c.unprepare_at
    ]
    last: dict[str, str] = {}
    for call in calls:
        hook, ids = call["hook"], list(call["device_ids"])
        for device_id in ids:
            last[device_id] = hook
        tenants = {str(s.get("data", {}).get("tenant")) for s in (call.get("device_status") or {}).values()}
        assert not tenants & admin_names, churn.fail(f"a hook ran for an admin-access claim: {call}")
        parts = [d for d in ids if d in PARTS]
        if hook == "allocate" and not call.get("error"):
            for part in parts:
                assert part not in held, churn.fail(f"{part} allocated while held: {call}")
                held.add(part)
            used = sum(PARTS[p] for p in held)
            assert used <= REGIONS, churn.fail(f"parts {sorted(held)} take {used} regions of {REGIONS}")
        elif hook == "deallocate":
            held.difference_update(parts)
            if "mock0" in ids:
                at = float(call["time"])
                live = [w for w in share_windows if w[0] < at < w[1]]
                assert not live, churn.fail(f"mock0 deallocated at {at} while a share was prepared: {live}")
    for device_id, hook in last.items():
        assert hook == "deallocate", churn.fail(f"{device_id}'s last hook is {hook}, not deallocate")
    assert not held, churn.fail(f"parts never deallocated: {sorted(held)}")


def test_claim_churn_with_kills_over_shared_partitioned_and_admin_devices(api: ApiServer) -> None:
    seed = int(os.environ.get("DEVPLUG_TORTURE_SEED", random.SystemRandom().randrange(1 << 30)))
    print(f"issue 41 churn seed {seed} (replay: DEVPLUG_TORTURE_SEED={seed})")
    rng = random.Random(seed)
    label_namespace(api, {ADMIN_LABEL: "true"})

    async def scenario() -> None:
        with short_root() as scratch:
            folder = Path(scratch) / "mock"
            folder.mkdir()
            (folder / "mock0").write_text("replicas=4\n")
            (folder / "mock1").write_text("")
            options = {
                "directory": str(folder),
                "device_status": "ready",
                "partitions": [
                    {"parent": "card0", "counters": {"regions": REGIONS}, "whole": "card0-whole", "parts": REGIONS}
                ],
            }
            table = {"driver": "mock", "options": options}
            async with node_with(api, RESOURCE, table, folder, driver=DRIVER) as lab:
                await lab.published(len(DEVICES))
                churn = Churn(lab, rng, seed)
                started = time.monotonic()
                for index in range(ROUNDS):
                    if time.monotonic() - started > BUDGET_S:
                        break
                    if churn.prepared and (len(churn.prepared) >= 4 or rng.random() < 0.4):
                        await churn.end_claim(rng.choice(churn.prepared))
                    else:
                        await churn.new_claim(index)
                    churn.check_ledger()
                while churn.prepared:
                    await churn.end_claim(churn.prepared[0])
                await eventually(lambda: not lab.records(), "every release done", details=lab.log)
                _check_hooks(churn)
                kinds = {c.kind for c in churn.done}
                print(
                    f"seed {seed}: {len(churn.done)} claims {sorted(kinds)}, {churn.kills} kills, "
                    f"{churn.unschedulable} unschedulable"
                )
                assert len(churn.done) >= 8, churn.fail(f"only {len(churn.done)} claims went through")
                assert churn.kills >= 3, churn.fail(f"only {churn.kills} kills")

    run(scenario, BUDGET_S + 120)
