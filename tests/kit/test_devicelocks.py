"""devplug.kit.devicelocks: work on one device waits only for work on that device."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

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


# --- devplug's one device-lock type (issue 39): the engine's (async with) and the kit's (with) are one class.


def test_the_kit_and_the_engine_name_the_one_type() -> None:
    import devplug.engine.devicelocks
    import devplug.kit.devicelocks

    assert DeviceLocks is devplug.kit.devicelocks.DeviceLocks is devplug.kit.devicelocks.DeviceLocks
    assert devplug.engine.devicelocks.DeviceLocks is devplug.kit.devicelocks.DeviceLocks
    assert issubclass(devplug.engine.devicelocks.LockTimeout, TimeoutError)


def test_a_timeout_given_positionally_is_still_a_timeout() -> None:
    locks = DeviceLocks()
    with locks.hold(["nvme0"]), pytest.raises(TimeoutError, match="nvme0 still busy"), locks.hold(["nvme0"], 0.05):
        pass


def test_a_refused_hold_gives_back_the_devices_it_had_taken() -> None:
    locks = DeviceLocks()
    with locks.hold(["nvme9"]):
        with pytest.raises(TimeoutError, match=r"device\(s\) nvme9 still busy"), locks.hold(["nvme0", "nvme9"], 0.05):
            pass
        assert locks.busy() == {"nvme9"}  # nvme0, taken first (sorted order), was given back


def test_a_device_goes_to_the_holder_that_waited_longest() -> None:
    locks = DeviceLocks()
    order: list[str] = []
    threads = []
    with locks.hold(["nvme0"]):
        for name in ("first", "second", "third"):

            def wait(name: str = name) -> None:
                with locks.hold(["nvme0"], timeout=10):
                    order.append(name)

            thread = threading.Thread(target=wait)
            thread.start()
            threads.append(thread)
            _until(lambda: len(locks._queues.get("nvme0", ())) == len(threads))  # queued before the next comes
    for thread in threads:
        thread.join(10)
    assert order == ["first", "second", "third"]
    assert locks.busy() == frozenset()


def test_one_instance_serves_a_thread_and_a_task_alike() -> None:
    import asyncio

    locks = DeviceLocks()
    order: list[str] = []
    in_thread = threading.Event()
    let_go = threading.Event()

    def driver_work() -> None:
        with locks.hold(["nvme1"]):
            in_thread.set()
            let_go.wait(10)
            order.append("thread out")

    async def engine_work() -> bool:
        async with locks.hold(["nvme0", "nvme1"], "allocate", timeout=10) as waited:
            order.append("task in")
            assert locks.activity == {"nvme0": "allocate", "nvme1": "allocate"}
            with locks.hold_free(["nvme0", "nvme1", "nvme2"]) as free:
                assert free == ["nvme2"]
        return waited

    async def scenario() -> bool:
        thread = threading.Thread(target=driver_work)
        thread.start()
        in_thread.wait(10)
        task = asyncio.ensure_future(engine_work())
        await asyncio.sleep(0.05)
        assert not task.done() and locks.locked("nvme0")  # taken in order, waiting for nvme1
        let_go.set()  # the thread lets go: nvme1 passes to the task, woken through its loop
        waited = await asyncio.wait_for(task, 10)
        thread.join(10)
        return waited

    assert asyncio.run(scenario()) is True
    assert order == ["thread out", "task in"]
    assert locks.busy() == frozenset() and locks.activity == {}


def _until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)
