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


# --- devplug's one backoff (issue 39): the kit's CappedBackoff is what the engine, the front ends and the Node
# watch wait by too, each with the delays and jitter bounds it had.


def test_the_engines_backoff_counts_failures_over_the_same_schedule() -> None:
    from devplug.engine.asynctools import Backoff

    backoff = Backoff()  # the registration's: 0.05 s doubling to 5 s
    assert [backoff.next() for _ in range(9)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    backoff.reset()
    assert backoff.next() == 0.05
    assert backoff.schedule == CappedBackoff(0.05, 5.0)


@pytest.mark.parametrize("jitter", [0.2, 0.5])
def test_jitter_only_shortens_each_wait_by_up_to_its_fraction(jitter: float) -> None:
    from devplug.engine.asynctools import Backoff

    waits = [Backoff(initial=1.0, cap=1.0, jitter=jitter).next() for _ in range(2000)]
    assert all((1 - jitter) * 1.0 <= w <= 1.0 for w in waits)
    assert min(waits) < 1 - jitter * 0.9 and max(waits) > 1 - jitter * 0.1  # spread over the whole range


def test_centred_jitter_lengthens_and_shortens_alike_as_the_node_watch_did() -> None:
    schedule = CappedBackoff(0.5, 30.0, jitter=0.2, centred=True)
    waits = [schedule.delay(3) for _ in range(2000)]  # 2 s, +-20 %
    assert all(1.6 <= w <= 2.4 for w in waits)
    assert min(waits) < 1.65 and max(waits) > 2.35


def test_retry_after_is_honoured_and_a_factor_other_than_two_taken() -> None:
    from devplug.backoff import Backoff

    assert CappedBackoff(0.5, 30.0).delay(1, retry_after=7.0) == 7.0
    assert CappedBackoff(0.5, 30.0).delay(4, retry_after=1.0) == 4.0  # the backoff's own wait is longer
    assert Backoff(0.5, 30.0).next(retry_after=3.0) == 3.0
    assert [CappedBackoff(1.0, 100.0, factor=3).delay(n) for n in range(1, 6)] == [1.0, 3.0, 9.0, 27.0, 81.0]
    assert CappedBackoff(1.0, 100.0, factor=3).delay(10_000) == 100.0


@pytest.mark.parametrize(("field", "value"), [("factor", 0.5), ("jitter", -0.1), ("jitter", 1.5)])
def test_a_nonsense_factor_or_jitter_is_refused_naming_it(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"CappedBackoff: {field} must be"):
        CappedBackoff(0.5, 1.0, **{field: value})  # type: ignore[arg-type]


def test_the_kit_the_engine_and_the_node_watch_share_the_one_backoff() -> None:
    import devplug.backoff
    import devplug.engine.asynctools
    import devplug.kit.retries

    assert devplug.kit.retries.CappedBackoff is devplug.backoff.CappedBackoff
    assert devplug.engine.asynctools.Backoff is devplug.backoff.Backoff
