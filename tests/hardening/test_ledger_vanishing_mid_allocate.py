"""A journal segment deleted while an Allocate's driver hook runs is found before that Allocate is answered.

Issue 42 took out the look for a vanished ledger file after an Allocate's intent save (the look before the
Allocate had just been made); the look after its confirm save is what finds a file gone during the hook. The
answered allocation is then written back to a new snapshot, and later Allocates are refused naming the file.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import grpc

from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.engine.ledger import read_ledger_records
from devplug.kit.hookrecord import read_hook_calls

if TYPE_CHECKING:
    from tests.hardening.conftest import Bench

RESOURCE = "example.com/mock"


def _request(*ids: str) -> dp.AllocateRequest:
    return dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=list(ids))])


def test_a_segment_deleted_during_the_allocate_hook_is_found_before_the_answer(bench: Bench) -> None:
    bench.start()
    mock = bench.root / "mock"
    (mock / "mock0").write_text("delay=allocate:1.5\n")
    answers: list[Any] = []
    call = threading.Thread(
        target=lambda: answers.append(bench.call("Allocate", _request("mock0"), dp.AllocateResponse))
    )
    call.start()
    bench.wait(lambda: read_hook_calls(mock, hook="allocate", device="mock0", started=True), "the hook running")
    (segment,) = bench.resource_dir().glob("ledger.journal.*")  # the intent is in it
    segment.unlink()
    call.join(timeout=30)
    assert answers and answers[0].container_responses, "the Allocate is answered"
    error = bench.refused("Allocate", _request("mock1"), dp.AllocateResponse)
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert f"the allocation ledger's file {segment} vanished" in (error.details() or "")
    ledger = bench.resource_dir() / "ledger.json"

    def written_back() -> bool:
        try:
            return [r["devices"] for r in read_ledger_records(ledger, RESOURCE)] == [["mock0"]]
        except Exception:
            return False

    bench.wait(written_back, "the answered allocation written back to a new snapshot")
    assert f"the allocation ledger's file {segment} vanished" in bench.log()
