"""Taking the state dir: the state lock through its gate, and, from an instance that holds it, a handover.

Every daemon takes the state lock only through its gate (:func:`devplug.daemon.lock.handover_gate`): a third
instance that finds the gate held while a handover is under way exits naming it, so only the instance the
handover is for takes the lock the old one lets go. With ``[handover] enabled`` and the lock held by another
instance, :meth:`Takeover.take_lock` asks that instance to hand the node over
(:func:`devplug.daemon.handover.take_over`); once every resource of this instance serves,
:meth:`Takeover.finish` tells the old instance where, lets the gate go and waits for the old one's last word.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from devplug.backoff import Backoff, CappedBackoff
from devplug.config import HandoverConfig
from devplug.daemon.handover import (
    EXITED_PREDECESSOR,
    POLL_FIRST_S,
    HandoverError,
    HandoverRecord,
    StateDirEvents,
    old_drivers_stopped,
    take_over,
)
from devplug.daemon.handover import step as handover_step
from devplug.daemon.handoverfiles import HandoverFiles, Instance
from devplug.daemon.lock import GATE_RETRY_S, GATE_TRIES, StateLock, handover_gate
from devplug.engine import Resource
from devplug.errors import AlreadyRunningError, ConfigError

if TYPE_CHECKING:
    from devplug.daemon.metrics import Metrics

__all__ = ["Takeover"]

log = logging.getLogger("devplug.engine")

#: The longest wait between two looks whether every resource registered, once this instance took over.
REGISTERED_POLL_S = 0.02


class Takeover:
    """The new instance's side: the gate, the state lock, and a handover from the instance holding it."""

    def __init__(self, instance: Instance, files: HandoverFiles, lock: StateLock, handover: HandoverConfig) -> None:
        self.instance = instance
        self.files = files
        self.lock = lock
        self.handover = handover
        #: The state lock's gate: held while taking the lock, and by a new instance until it serves.
        self.gate = handover_gate(files.state_dir)
        #: The state dir's handover files as they change (with ``[handover] enabled``), once the lock is taken.
        self.events: StateDirEvents | None = None
        #: The handover this instance took the node over by (None: it started on a free state dir).
        self.took_over: HandoverRecord | None = None

    async def take_lock(self, loop: asyncio.AbstractEventLoop, metrics: Metrics | None) -> None:
        """Take the state lock; with ``[handover] enabled`` and another instance holding it, ask it to hand over
        (:class:`~devplug.daemon.handover.HandoverError` when it does not)."""
        await self._take_gate()
        if self.handover.enabled:
            self.events = StateDirEvents(self.files)
            self.events.start(loop)
        try:
            self.lock.acquire()
        except AlreadyRunningError as busy:
            if self.events is None:
                self.gate.release()
                raise
            try:
                self.took_over = await take_over(
                    self.instance, self.files, self.events, self.lock, self.handover.timeout, busy
                )
            except BaseException:
                self.gate.release()
                self.events.close()
                if metrics is not None:
                    metrics.handover("to", "failed", None)
                raise
            return  # the gate is kept until this instance serves (finish)
        self.gate.release()

    async def _take_gate(self) -> None:
        """Take the gate to the state lock, or raise :class:`HandoverError` naming the handover in progress: only
        the instance a handover is for may take the lock the old instance lets go, so a third one exits."""
        for attempt in range(GATE_TRIES):
            if self.gate.try_acquire():
                return
            if attempt + 1 < GATE_TRIES:
                await asyncio.sleep(GATE_RETRY_S)
        holder = self.gate.holder() or "a process that did not say who it is"
        self.gate.release()  # the file kept open by the tries
        request = self.files.read("request") or {}
        to = f" (instance {str(request['to'])[:100]})" if request.get("to") else ""
        raise HandoverError(
            f"a handover is in progress in {self.files.state_dir}: {holder}{to} is taking the node over and holds "
            f"{self.gate.path.name}; this instance exits and takes no state (start it again once that handover ended)"
        )

    async def old_drivers_stopped(self) -> None:
        """Before this instance's drivers start: once it took the node over, wait until the old instance's drivers
        stopped (:func:`~devplug.daemon.handover.old_drivers_stopped`); at once otherwise."""
        if self.took_over is not None and self.events is not None:
            await old_drivers_stopped(self.instance, self.files, self.events, self.took_over, self.handover.timeout)

    def close(self) -> None:
        """The daemon stops: watch the handover files no more, and let the gate go (if still held)."""
        if self.events is not None:
            self.events.close()
        self.gate.release()

    async def finish(
        self,
        resources: Callable[[], Sequence[Resource]],
        on_change: Callable[[], None],
        serve_metrics: Callable[[], None] | None,
        metrics: Metrics | None,
    ) -> None:
        """Once every resource registered, tell the old instance where they are served; wait for it to leave.

        ``serve_metrics`` starts this instance's metrics server, on the address the old one had (raising
        :class:`ConfigError` while it is still taken)."""
        record = self.took_over
        assert record is not None and self.events is not None, "finish() is for an instance that took over"
        loop = asyncio.get_running_loop()
        timeout = self.handover.timeout
        deadline = loop.time() + timeout
        # Registered and streaming: the old instance stops once told, and on kubelets keying endpoints by resource
        # name its stream's end then cuts ours, which only an open stream of ours notices (to register again).
        # Registration reports no event of its own here: look after 1 ms, then twice as long each time up to 20 ms.
        # Measured (issue 42): the fixed 20 ms look added 10 ms on average (up to 20) to every held call's wait.
        polls = Backoff(schedule=CappedBackoff(POLL_FIRST_S, REGISTERED_POLL_S))
        while not all(r.serving for r in resources()):
            if loop.time() >= deadline:
                break
            await asyncio.sleep(polls.next())
        endpoints = {r.name: r.endpoint for r in resources()}
        record.mark("new:serving")
        self.files.write("serving", {"to": self.instance.id, "endpoints": endpoints})
        self.gate.release()  # after the word: the old instance reads a gate let go without it as this one's end
        handover_step("serving")
        record.state = "serving"
        on_change()
        if record.from_instance == EXITED_PREDECESSOR:
            done = None
        else:
            done = await self.events.wait(lambda: self.files.read_for("done", self.instance.id), loop.time() + timeout)
        record.finished_at = time.time()
        record.mark("new:saw-done", record.finished_at)
        record.state = "done" if done is not None else "done-without-word"
        if done is not None and isinstance(done.get("resources"), dict):
            record.resources = done["resources"]  # the old instance's final word: with the calls it held
        if done is not None and isinstance(done.get("steps"), dict):  # the old instance's steps: the whole profile
            record.steps.update(
                {
                    str(k): float(v)
                    for k, v in done["steps"].items()
                    if isinstance(v, (int, float)) and k not in record.steps
                }
            )
        if done is not None:
            self.files.add_superseded(record.from_instance, self.instance.id)
        self.files.write_last(record.describe())
        self.files.clear()
        if serve_metrics is not None:  # the old instance's server had its address (on the host's network)
            await _serve_once_free(serve_metrics, loop.time() + timeout)
        if metrics is not None:
            metrics.handover("to", "done", record.took_s)
        log.info(
            "took the node over from %s in %.3f s (%s); steps (ms after the request): %s",
            record.from_instance,
            record.took_s or 0.0,
            "; ".join(f"{name}: {facts}" for name, facts in record.resources.items()) or "nothing held",
            record.steps_ms(),
        )
        on_change()


async def _serve_once_free(serve: Callable[[], None], deadline: float) -> None:
    """Serve the metrics on the address the old instance had: it says it is done before its server is closed and
    the process gone, so a bind may fail for a moment; try again (doubling waits from 20 ms, up to 1 s) until
    ``deadline``, then say why there are no metrics."""
    loop = asyncio.get_running_loop()
    waits = Backoff(0.02, 1.0)
    while True:
        wait = waits.next()
        try:
            serve()
            return
        except ConfigError as exc:
            if loop.time() + wait > deadline:
                log.error("%s", exc)
                return
        await asyncio.sleep(wait)
