"""The front ends' call gate during a handover: held calls wait (never fail), then run here or go to
the successor, and the gate knows what is still in flight (issue 30)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from devplug.frontends.callgate import CallGate


def test_held_calls_wait_and_run_here_when_the_handover_fails() -> None:
    async def body() -> None:
        gate = CallGate()
        assert await gate.enter() is None  # open: runs here
        gate.hold()
        waiting = asyncio.ensure_future(gate.enter())
        await asyncio.sleep(0)
        assert not waiting.done()
        assert gate.in_flight == 2  # the one running, and the one held
        idle_here = asyncio.ensure_future(gate.wait_running_done())
        gate.leave()
        await asyncio.wait_for(idle_here, 1.0)  # the running one returned: what the pause waits for
        gate.release()
        assert await asyncio.wait_for(waiting, 1.0) is None  # runs here after all
        assert gate.held_calls == 1 and gate.longest_wait > 0
        gate.leave()
        await asyncio.wait_for(gate.wait_idle(), 1.0)

    asyncio.run(body())


def test_held_and_later_calls_go_to_the_successor_and_count_until_answered() -> None:
    async def body() -> None:
        gate = CallGate()
        gate.hold()
        waiting = asyncio.ensure_future(gate.enter())
        await asyncio.sleep(0)
        idle = asyncio.ensure_future(gate.wait_idle())
        successor = Path("/run/new.sock")
        gate.forward_to(successor)
        assert await asyncio.wait_for(waiting, 1.0) == successor
        assert await gate.enter() == successor  # later calls too
        await asyncio.sleep(0)
        assert not idle.done()  # both forwarded calls still run: the server must not stop yet
        gate.leave()
        gate.leave()
        await asyncio.wait_for(idle, 1.0)
        assert gate.in_flight == 0

    asyncio.run(body())
