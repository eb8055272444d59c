"""devplug.kit.rescan: one scan at a time, on a period and on events, failures backed off and never fatal."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest

from devplug import DriverError
from devplug.kit import RescanLoop
from devplug.testing.waiting import poll_until

log = logging.getLogger("test.rescan")

#: How long a negative assertion ("nothing more happened") lets pass; never used to synchronise.
QUIET = 0.3


class Scans:
    """A scan function that counts its calls, can be held (blocked) and made to fail."""

    def __init__(self) -> None:
        self.count = 0
        self.running = 0
        self.most_at_once = 0
        self.fail: BaseException | None = None
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            self.count += 1
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        self.entered.set()
        try:
            self.gate.wait(10)
            if self.fail is not None:
                raise self.fail
        finally:
            with self._lock:
                self.running -= 1


@pytest.fixture
def scans() -> Scans:
    return Scans()


@pytest.fixture
def loops() -> Iterator[list[RescanLoop]]:
    made: list[RescanLoop] = []
    yield made
    for loop in made:
        loop.stop(5)


def _loop(loops: list[RescanLoop], scans: Scans, **kwargs: float) -> RescanLoop:
    loop = RescanLoop(scans, name="test-rescan", log=log, **kwargs)
    loops.append(loop)
    loop.start()
    return loop


def test_it_scans_every_period_in_a_thread_of_its_own(loops: list[RescanLoop]) -> None:
    threads: list[str] = []
    scans_seen = Scans()

    def scan() -> None:
        threads.append(threading.current_thread().name)
        scans_seen()

    loop = RescanLoop(scan, interval=0.02, name="vfio-rescan example.com/nic", log=log)
    loops.append(loop)
    loop.start()
    poll_until(lambda: scans_seen.count >= 3, "three scans on the period")
    assert set(threads) == {"vfio-rescan example.com/nic"}


def test_without_a_period_it_scans_only_when_triggered(scans: Scans, loops: list[RescanLoop]) -> None:
    loop = _loop(loops, scans, interval=0)
    time.sleep(QUIET)
    assert scans.count == 0
    loop.trigger()
    poll_until(lambda: scans.count == 1, "the triggered scan")
    loop.trigger()
    poll_until(lambda: scans.count == 2, "the second triggered scan")
    time.sleep(QUIET)
    assert scans.count == 2


def test_triggers_while_a_scan_runs_make_one_more_scan_and_scans_never_overlap(
    scans: Scans, loops: list[RescanLoop]
) -> None:
    loop = _loop(loops, scans, interval=0)
    scans.gate.clear()
    loop.trigger()
    assert scans.entered.wait(10)
    for _ in range(5):
        loop.trigger()
    scans.gate.set()
    poll_until(lambda: scans.count == 2, "one more scan for the five triggers")
    time.sleep(QUIET)
    assert scans.count == 2
    assert scans.most_at_once == 1


def test_a_failing_scan_is_retried_with_a_doubling_backoff_capped_and_logged_once(
    scans: Scans, loops: list[RescanLoop], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="test.rescan")
    scans.fail = RuntimeError("sysfs vanished")
    loop = _loop(loops, scans, interval=3600, retry_min=0.01, retry_max=0.04)
    loop.trigger()
    poll_until(lambda: scans.count >= 6, "six attempts, the period notwithstanding")
    assert [loop.retry_min * 2**n for n in range(4)] == [0.01, 0.02, 0.04, 0.08]
    assert loop._backoff() == 0.04  # capped at retry_max
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert errors[0].getMessage() == "test-rescan: rescan failed: sysfs vanished (trying again in 0.01 s)"
    assert errors[0].exc_info is not None  # an unexpected error: its traceback, once
    assert any("rescan failed again" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)

    scans.fail = None
    poll_until(lambda: loop.failures == 0, "a scan that works again")
    assert loop.last_error is None
    assert "test-rescan: rescan works again after" in caplog.text


def test_a_driver_error_is_logged_without_a_traceback_and_a_new_message_again(
    scans: Scans, loops: list[RescanLoop], caplog: pytest.LogCaptureFixture
) -> None:
    scans.fail = DriverError("0000:00:04.0: cannot read vendor")
    loop = _loop(loops, scans, interval=3600, retry_min=0.01, retry_max=0.01)
    loop.trigger()
    poll_until(lambda: scans.count >= 3, "three attempts")
    scans.fail = DriverError("0000:00:04.0: gone")
    poll_until(lambda: loop.last_error == "0000:00:04.0: gone", "the new failure")
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.exc_info for r in errors] == [None, None]
    assert "cannot read vendor" in errors[0].getMessage()
    assert "gone" in errors[1].getMessage()


def test_a_trigger_during_a_backoff_waits_for_it_to_end(scans: Scans, loops: list[RescanLoop]) -> None:
    scans.fail = RuntimeError("down")
    loop = _loop(loops, scans, interval=0, retry_min=600)
    loop.trigger()
    poll_until(lambda: loop.failures == 1, "the first failure")
    loop.trigger()
    time.sleep(QUIET)
    assert scans.count == 1, "a trigger bypassed the backoff"


def test_stop_waits_for_the_scan_in_progress_and_no_scan_starts_after(scans: Scans, loops: list[RescanLoop]) -> None:
    loop = _loop(loops, scans, interval=0)
    scans.gate.clear()
    loop.trigger()
    assert scans.entered.wait(10)
    stopper = threading.Thread(target=loop.stop, args=(10,))
    stopper.start()
    loop.trigger()
    assert stopper.is_alive(), "stop returned while a scan ran"
    scans.gate.set()
    stopper.join(10)
    assert not stopper.is_alive()
    assert not loop.running
    time.sleep(QUIET)
    assert scans.count == 1


def test_bad_intervals_are_refused_naming_the_loop() -> None:
    with pytest.raises(ValueError, match="RescanLoop 'x': interval"):
        RescanLoop(lambda: None, interval=-1, name="x", log=log)
    with pytest.raises(ValueError, match="retry_min"):
        RescanLoop(lambda: None, interval=1, name="x", log=log, retry_min=0)


def test_a_loop_cannot_be_started_twice(loops: list[RescanLoop]) -> None:
    loop = _loop(loops, Scans(), interval=0)
    with pytest.raises(RuntimeError, match="already running"):
        loop.start()
