"""devplug.kit.devicelocks: work on one device waits only for work on that device."""

from __future__ import annotations

import threading

import pytest

from devplug.kit import DeviceLocks


def test_work_on_other_devices_goes_on_while_one_device_is_held() -> None:
    locks = DeviceLocks()
    with locks.hold(["nvme0"]):
        assert locks.busy() == {"nvme0"}
        with locks.hold(["nvme1", "nvme2"], timeout=1):
            assert locks.busy() == {"nvme0", "nvme1", "nvme2"}
        with pytest.raises(TimeoutError, match="nvme0 still busy"), locks.hold(["nvme1", "nvme0"], timeout=0.05):
            pass
        assert locks.busy() == {"nvme0"}  # the refused hold took nothing
    assert locks.busy() == frozenset()


def test_a_holder_waits_for_the_device_and_gets_it_when_freed() -> None:
    locks = DeviceLocks()
    order: list[str] = []
    held = threading.Event()
    go = threading.Event()

    def first() -> None:
        with locks.hold(["nvme0"]):
            order.append("first in")
            held.set()
            go.wait(10)
            order.append("first out")

    def second() -> None:
        held.wait(10)
        with locks.hold(["nvme0"], timeout=10):
            order.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    held.wait(10)
    go.set()
    for t in threads:
        t.join(10)
    assert order == ["first in", "first out", "second in"]


def test_hold_free_skips_busy_devices_and_never_waits() -> None:
    locks = DeviceLocks()
    with locks.hold(["nvme1"]):
        with locks.hold_free(["nvme0", "nvme1", "nvme2", "nvme0"]) as free:
            assert free == ["nvme0", "nvme2"]
            assert locks.busy() == {"nvme0", "nvme1", "nvme2"}
        assert locks.busy() == {"nvme1"}


def test_a_hold_is_given_back_when_the_work_raises() -> None:
    locks = DeviceLocks()
    with pytest.raises(RuntimeError), locks.hold(["nvme0"]):
        raise RuntimeError("erase failed")
    assert locks.busy() == frozenset()
