"""devplug.kit.retries: capped doubling waits, per device, on the caller's clock."""

from __future__ import annotations

import pytest

from devplug.kit import CappedBackoff, DeviceRetries, RescanLoop
from devplug.testing.clock import ManualClock


def test_the_wait_doubles_after_each_failure_up_to_the_cap() -> None:
    backoff = CappedBackoff(0.5, 6.0)
    assert [backoff.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 6.0, 6.0]
    assert backoff.delay(10_000) == 6.0  # no overflow however long it fails


@pytest.mark.parametrize(("retry_min", "retry_max"), [(0, 1), (-1, 1), (2, 1)])
def test_nonsense_bounds_are_refused_naming_them(retry_min: float, retry_max: float) -> None:
    with pytest.raises(ValueError, match="CappedBackoff: retry_m"):
        CappedBackoff(retry_min, retry_max)


def test_the_rescan_loop_backs_off_with_the_same_delays() -> None:
    import logging

    loop = RescanLoop(lambda: None, interval=8, name="t", log=logging.getLogger("t"), retry_min=0.5)
    backoff = CappedBackoff(0.5, 8)
    for failures in range(1, 7):
        loop.failures = failures
        assert loop._backoff() == backoff.delay(failures)


def test_a_failing_device_is_due_again_only_once_its_wait_is_over_and_the_others_always() -> None:
    clock = ManualClock()
    retries = DeviceRetries(retry_min=0.5, retry_max=4.0, clock=clock)
    assert retries.due(["vf0", "vf1"]) == ["vf0", "vf1"]  # nothing failed yet

    waits = []
    for _ in range(5):
        assert retries.due(["vf0", "vf1"]) == ["vf0", "vf1"]
        waits.append(retries.failed("vf0"))
        assert retries.due(["vf0", "vf1"]) == ["vf1"]  # vf0 waits; vf1 never does
        clock.advance(waits[-1] - 0.01)
        assert retries.due(["vf0", "vf1"]) == ["vf1"]
        clock.advance(0.01)
    assert waits == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert retries.failures("vf0") == 5

    retries.succeeded("vf0")
    assert (retries.failures("vf0"), retries.due(["vf0"])) == (0, ["vf0"])
    assert retries.failed("vf0") == 0.5  # a new run of failures starts over


def test_forget_drops_the_devices_no_longer_owed_work() -> None:
    clock = ManualClock()
    retries = DeviceRetries(retry_min=1.0, clock=clock)
    retries.failed("vf0")
    retries.failed("vf1")
    retries.forget(keep=["vf1"])
    assert (retries.failures("vf0"), retries.failures("vf1")) == (0, 1)
    assert retries.due(["vf0", "vf1"]) == ["vf0"]


def test_the_cap_is_never_below_the_first_wait() -> None:
    retries = DeviceRetries(retry_min=120.0, retry_max=60.0, clock=ManualClock())
    assert [retries.failed("vf0") for _ in range(3)] == [120.0, 120.0, 120.0]
