"""kill -9 at random points under an allocation load loses nothing and releases nothing twice (issue 11).

The ledger is a journal written with plain ``write()`` (no fsync on the
Allocate path): what reached the kernel before the kill must be there after
it. A thread sends Allocates (and KEP Deallocates of what it got) as fast as
the daemon answers; the daemon is killed at a random moment, 50 times, and
after each restart every device whose Allocate was answered is in the ledger,
and no device was deallocated twice without the retry flag.
"""

from __future__ import annotations

import os
import random
import threading
import time
from typing import TYPE_CHECKING

import grpc

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp

if TYPE_CHECKING:
    from tests.lifecycle.conftest import Lab

RESOURCE = "example.com/mock"
KILLS = 50
BUDGET_S = 90.0


class Load:
    """Allocate one device per call, KEP-Deallocate every other one, until stopped; remember what was answered."""

    def __init__(self, lab: Lab, devices: list[str], rng: random.Random) -> None:
        self.lab = lab
        self.free = list(devices)
        self.rng = rng
        self.answered: set[str] = set()  # Allocate answered, not deallocated since
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set() and self.free:
            device = self.free.pop(self.rng.randrange(len(self.free)))
            try:
                self.lab.allocate(device)
            except grpc.RpcError:
                return  # the kill cut it: answered or not, the daemon decides after the restart
            self.answered.add(device)
            if self.rng.random() < 0.5:
                request = dp.DeallocateRequest(devices_ids=[device])
                try:
                    self.lab.grpc_call("Deallocate", request, dp.DeallocateResponse)
                except grpc.RpcError:
                    self.answered.discard(device)  # the kill cut the Deallocate: it may or may not have happened
                    return
                self.answered.discard(device)


def test_fifty_kills_under_load_lose_nothing_and_release_nothing_twice(lab: Lab) -> None:
    seed = int(os.environ.get("DEVPLUG_TORTURE_SEED", random.SystemRandom().randrange(1 << 30)))
    print(f"kill loop seed {seed} (replay: DEVPLUG_TORTURE_SEED={seed})")
    rng = random.Random(seed)
    devices = [f"mock{i}" for i in range(400)]
    lab.start({RESOURCE: lab.resource_table(count=len(devices))}, grace_period=3600.0)  # no pod: keep everything
    held: set[str] = set()
    confirmed_before: set[str] = set()
    deadline = time.monotonic() + BUDGET_S
    kills = 0
    while kills < KILLS and time.monotonic() < deadline:
        load = Load(lab, [d for d in devices if d not in held], rng)
        worker = threading.Thread(target=load.run)
        worker.start()
        time.sleep(rng.uniform(0.02, 0.25))
        lab.kill()
        kills += 1
        worker.join(30)
        lab.restart_process()
        records = lab.ledger()
        confirmed = {d for r in records for d in r["devices"]}
        lost = (load.answered | confirmed_before) - confirmed  # this round's answers, and every earlier one
        assert not lost, f"seed {seed}, kill {kills}: answered Allocates missing from the ledger: {sorted(lost)}"
        held = {d for r in records for d in (*r["devices"], *r["pending"])}  # never asked for again
        confirmed_before = confirmed
    assert kills >= 10, f"seed {seed}: only {kills} kills within {BUDGET_S:g} s"
    deallocs: dict[str, int] = {}
    for call in lab.calls("deallocate"):
        if not call.get("retry"):
            for device in call["device_ids"]:
                deallocs[device] = deallocs.get(device, 0) + 1
    allocs: dict[str, int] = {}
    for call in lab.calls("allocate"):
        for device in call["device_ids"]:
            allocs[device] = allocs.get(device, 0) + 1
    twice = {d: n for d, n in deallocs.items() if n > allocs.get(d, 0)}
    assert not twice, f"seed {seed}: deallocated more often than allocated, without the retry flag: {twice}"
