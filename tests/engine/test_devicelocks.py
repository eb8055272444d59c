"""devplug.engine.devicelocks: the engine's side of devplug's one device lock (``async with``, in the event loop):
waits only for the devices asked for, in order and first come first served, names what holds a busy device, and
keeps the devices of a hook abandoned at its timeout until it returns (issue 39 merged it with the kit's)."""

from __future__ import annotations

import asyncio

import pytest

from devplug.engine.devicelocks import DeviceLocks, LockTimeout


def test_free_devices_are_taken_without_a_wait_and_busy_ones_after_one() -> None:
    async def scenario() -> None:
        locks = DeviceLocks()
        async with locks.hold(["b", "a"], "allocate") as waited:
            assert waited is False
            assert locks.activity == {"a": "allocate", "b": "allocate"}
            second = asyncio.ensure_future(locks.hold(["b"], "release").__aenter__())
            await asyncio.sleep(0)
            assert not second.done()
        assert await second is True  # it had to wait: other work ran meanwhile
        assert locks.activity == {"b": "release"}

    asyncio.run(scenario())


def test_a_timeout_names_what_holds_the_busy_devices_and_keeps_nothing() -> None:
    async def scenario() -> None:
        locks = DeviceLocks()
        async with locks.hold(["b"], "release: post_stop"):
            with pytest.raises(LockTimeout) as refused:
                async with locks.hold(["a", "b"], "allocate", timeout=0.05):
                    pass
            assert refused.value.busy == {"b": "release: post_stop"}
            assert str(refused.value) == "b (release: post_stop)"
            assert locks.locked("b") and not locks.locked("a")

    asyncio.run(scenario())


def test_holders_take_turns_first_come_first_served_and_a_cancelled_one_leaves_the_queue() -> None:
    async def scenario() -> None:
        locks = DeviceLocks()
        order: list[str] = []

        async def holder(name: str) -> None:
            async with locks.hold(["a"], name):
                order.append(name)
                await asyncio.sleep(0.01)

        async with locks.hold(["a"], "first"):
            tasks = [asyncio.ensure_future(holder(n)) for n in ("second", "third", "fourth")]
            await asyncio.sleep(0.01)
            tasks[1].cancel()
            await asyncio.sleep(0)
        await asyncio.gather(tasks[0], tasks[2])
        assert tasks[1].cancelled()
        assert order == ["second", "fourth"]
        assert not locks.locked("a") and locks.activity == {}

    asyncio.run(scenario())


def test_a_hook_abandoned_at_its_timeout_keeps_its_devices_until_it_returns() -> None:
    async def scenario() -> None:
        released: list[list[str]] = []
        locks = DeviceLocks(released.append)
        running: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        async with locks.hold(["a", "b"], "deallocate"):
            locks.keep_until(["a"], running, "deallocate running past hook_timeout")
        assert locks.kept() == {"a": "deallocate running past hook_timeout"}
        assert locks.locked("a") and not locks.locked("b")
        with pytest.raises(LockTimeout, match="a \\(deallocate running past hook_timeout\\)"):
            async with locks.hold(["a"], "allocate", timeout=0.02):
                pass
        waiting = asyncio.ensure_future(locks.hold(["a"], "allocate").__aenter__())
        await asyncio.sleep(0)
        running.set_result(None)  # the hook returned at last
        assert await asyncio.wait_for(waiting, 5) is True
        assert released == [["a"]] and locks.kept() == {}
        assert locks.activity == {"a": "allocate"}

    asyncio.run(scenario())
