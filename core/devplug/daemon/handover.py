"""Handing a node over from a running daemon instance to a new one (a rolling update), through the state dir.

The state lock (:class:`~devplug.daemon.lock.StateLock`) stays the arbiter of
who owns the ledgers: whoever holds it, and only they, writes the state dir's
ledgers, status and CDI specs. The two instances talk through small message
files (:mod:`devplug.daemon.handoverfiles`) and wait on the state dir's
inotify events.

The old instance (:class:`Predecessor`), asked by a request:

1. holds every call that would start new work (they wait, none is refused)
   and starts no release; waits until no hook, release or call runs;
2. flushes its ledgers (snapshots, synced) and its status;
3. says so (``granted``) and releases the lock;
4. waits for the new instance to take the lock (``taken``: the commit
   point). If it does not within ``[handover] timeout``, the old one takes
   the lock back and serves on (``failed``, the held calls run here);
5. stops its drivers (``drivers-stopped``: the new instance's drivers never
   run beside the old ones), waits until the new instance serves
   (``serving``, its endpoints), answers the held calls through it, stops
   serving without registering again or touching what the new one
   registered, says ``done`` and exits.

Only one instance at a time asks, and only it may take the lock the old one
lets go: the new instance holds the state lock's gate (``handover.lock``, see
:mod:`devplug.daemon.lock`) from before its request until it serves, every
instance takes the state lock only through the gate, and a third instance
finding the gate held exits naming the handover in progress. The old instance
acts on a request only while the gate is held by the process the request
names (:func:`~devplug.daemon.lock.gate_holder`: the kernel's lock, not the
file's word), so a request file written by anyone else freezes nothing; and
it gives the handover up the moment that process lets the gate go without
having taken the lock (it exited or gave up), instead of at the timeout.

The new instance (:func:`take_over`) writes the request and waits for the
lock, failing with a :class:`HandoverError` that says why when the old one
refuses or stays silent past the timeout (the old one then serves on); once it
holds the lock it starts as after a restart and announces its endpoints.

The old instance's part is bounded: ``2 x [handover] timeout`` until the new
one serves, then twice ``grace`` (5 s) to answer the held calls and stop
(:func:`handover_bound`).

Both instances time their steps (:attr:`HandoverRecord.steps`): the old one sends its own with ``done``, and the
new one keeps the whole profile, from its process's start to the old one's last word, in ms after the request
(``steps_ms`` in ``handover-last.json``, the status and its log line). Calls are held from ``old:holding`` until
``old:held-calls-answered``; what lies between is flush, lock and the new instance's start until it serves (its
driver's ``start`` and ``list_devices``, which never run beside the old instance's drivers, and its registration).

A ``kill -9`` loses nothing at any step: before the commit the old instance
still owns everything it flushed or journalled (its death frees the lock and
the new instance starts from its files), after it the new one does (its
death leaves the files to its restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from devplug.backoff import Backoff, CappedBackoff
from devplug.daemon.handoverfiles import HandoverFiles, Instance
from devplug.daemon.lock import StateLock, gate_holder
from devplug.daemon.lockholder import process_start_ticks, process_started_at
from devplug.errors import AlreadyRunningError, StateError
from devplug.host.watch import DirectoryWatcher

__all__ = [
    "EXITED_PREDECESSOR",
    "NEW_INSTANCE_STEPS",
    "OLD_INSTANCE_STEPS",
    "HandoverError",
    "HandoverRecord",
    "Predecessor",
    "StateDirEvents",
    "handover_bound",
    "observe_steps",
    "old_drivers_stopped",
    "step",
    "take_over",
]

log = logging.getLogger("devplug.engine")

T = TypeVar("T")

#: Seconds between re-checks while waiting, on top of the inotify wake-ups (a lost event costs at most this).
RECHECK_S = 1.0
#: Seconds the new instance waits beyond ``[handover] timeout``, so that an old instance giving up says why first.
ANSWER_MARGIN_S = 2.0
#: The same while a daemon only waits for a request (an idle daemon must not wake every second).
IDLE_RECHECK_S = 30.0
#: The longest wait between two looks whether hooks and releases still run, at the old instance's freeze (hooks
#: have no completion event).
QUIET_POLL_S = 0.02
#: The first such look comes after this, each next one twice as late (up to ``QUIET_POLL_S``; the new instance looks
#: whether it registered the same way). Measured (issue 42): what runs at the freeze (a release, a Deallocate) ends
#: within a few ms, and a fixed 20 ms look added up to 20 ms to every held call's wait; the doubling looks cost a
#: handful of wake-ups and keep a long wait as cheap as before.
POLL_FIRST_S = 0.001
#: The steps :func:`step` reports, of the old instance and of the new one, in the order they are taken: the old
#: instance's ``holding`` (calls held, ledgers not yet flushed), ``granted`` (lock released), ``drivers-stopped``;
#: the new one's ``request``, ``taken``, ``serving``.
OLD_INSTANCE_STEPS = ("holding", "granted", "drivers-stopped")
NEW_INSTANCE_STEPS = ("request", "taken", "serving")

#: The instance a new one took the node over from when no running instance granted it (it found the lock free).
EXITED_PREDECESSOR = "a previous instance that exited"

#: Who is told of each step (:func:`observe_steps`): nobody, unless a test's launcher installed someone.
_step_observers: list[Callable[[str], None]] = []


def observe_steps(observer: Callable[[str], None]) -> Callable[[], None]:
    """Call ``observer(name)`` right after each handover step this process takes (a name of
    :data:`OLD_INSTANCE_STEPS` or :data:`NEW_INSTANCE_STEPS`), in the thread taking it, before the next one;
    returns the function that removes it.

    For tests: a test's launcher installs an observer that stops the process (SIGSTOP) at a step, so the test can
    kill it exactly there. The daemon installs none; what an observer raises is raised where the step is taken."""
    _step_observers.append(observer)
    return lambda: _step_observers.remove(observer)


def step(name: str) -> None:
    """A step of the handover was taken: logged, and told to every observer (:func:`observe_steps`)."""
    log.debug("handover step: %s", name)
    for observer in tuple(_step_observers):
        observer(name)


def handover_bound(timeout: float, grace: float = 5.0) -> float:
    """The longest the old instance's part of a handover takes, in seconds (``[handover] timeout`` given)."""
    return 2 * timeout + 2 * grace


class HandoverError(StateError):
    """A handover did not happen: the old instance refused or did not answer in time (it goes on serving)."""


@dataclass
class HandoverRecord:
    """One handover, as the status, the logs and the metrics show it."""

    from_instance: str
    to_instance: str
    requested_at: float
    state: str = "requested"
    finished_at: float | None = None
    reason: str | None = None
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: When each step was taken (``time.time()``), both instances' (the old one's come with its last word): the
    #: handover's profile, shown in ms after the request by :meth:`describe` (``steps_ms``).
    steps: dict[str, float] = field(default_factory=dict)

    def mark(self, name: str, at: float | None = None) -> None:
        """Step ``name`` was taken now (or at ``at``)."""
        self.steps[name] = time.time() if at is None else at

    def steps_ms(self) -> dict[str, float]:
        """Each step's time in ms after the request (negative: before it, the new process's start), in order."""
        ordered = sorted(self.steps.items(), key=lambda item: item[1])
        return {name: round(1000.0 * (at - self.requested_at), 1) for name, at in ordered}

    @property
    def took_s(self) -> float | None:
        return None if self.finished_at is None else round(self.finished_at - self.requested_at, 4)

    def describe(self) -> dict[str, Any]:
        return {
            "from": self.from_instance,
            "to": self.to_instance,
            "state": self.state,
            "requested_at": self.requested_at,
            "finished_at": self.finished_at,
            "took_s": self.took_s,
            "reason": self.reason,
            "resources": self.resources,
            "steps_ms": self.steps_ms(),
        }


class StateDirEvents:
    """Wakes waiters when a handover message or the lock file changes (inotify on the state dir)."""

    def __init__(self, files: HandoverFiles) -> None:
        self._files = files
        self._names = files.names()
        self._changed = asyncio.Event()
        self._watcher: DirectoryWatcher | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        def changed(names: frozenset[str]) -> None:
            if not names or names & self._names:
                loop.call_soon_threadsafe(self._changed.set)

        self._watcher = DirectoryWatcher(self._files.state_dir, changed)
        self._watcher.start()

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None

    async def wait(self, check: Callable[[], T | None], deadline: float, recheck: float = RECHECK_S) -> T | None:
        """``check()``'s first truthy answer, re-checked at every change and every ``recheck`` seconds; None once
        ``deadline`` (loop time) passed."""
        loop = asyncio.get_running_loop()
        while True:
            self._changed.clear()
            value = check()
            if value:
                return value
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, recheck))


class HandingOver(Protocol):
    """What the old instance hands over: each resource's part (see :class:`~devplug.engine.resource.Resource`)."""

    name: str

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def quiet(self) -> bool: ...

    async def calls_idle(self) -> None: ...

    async def flush(self) -> None: ...

    def handover_facts(self) -> dict[str, Any]: ...

    async def stop_driver(self) -> None: ...

    async def hand_over(self, successor: str, grace: float) -> None: ...


class Predecessor:
    """The running instance's side: answers a newer instance's request to take over."""

    def __init__(
        self,
        instance: Instance,
        files: HandoverFiles,
        events: StateDirEvents,
        lock: StateLock,
        timeout: float,
        resources: Callable[[], Sequence[HandingOver]],
        write_status: Callable[[], Awaitable[None]],
        suspend_status: Callable[[bool], None],
        on_change: Callable[[], None],
        grace: float = 5.0,
        refuse: Callable[[], str | None] = lambda: None,
        on_outcome: Callable[[str, float | None], None] = lambda outcome, took_s: None,
    ) -> None:
        """``refuse()`` says why no handover may begin now (a reload applying), or None; ``on_outcome(outcome,
        took_s)`` hears how each handover ended ("done", "failed", "taken-not-serving")."""
        self.instance = instance
        self.files = files
        self.events = events
        self.lock = lock
        self.timeout = timeout
        self._resources = resources
        self._write_status = write_status
        self._suspend_status = suspend_status
        self._on_change = on_change
        self.grace = grace
        self._refuse = refuse
        self._on_outcome = on_outcome
        #: The handover under way or the last one answered.
        self.record: HandoverRecord | None = None
        #: How many handovers this instance answered, by outcome ("done", "failed").
        self.outcomes: dict[str, int] = {}
        self._seen: set[tuple[str, object]] = set()  # requests answered (a failed one stays until its writer exits)

    @property
    def busy(self) -> bool:
        """A handover is under way (nothing else may start or stop resources meanwhile)."""
        return self.record is not None and self.record.state in ("handing-over", "taken")

    def _request(self) -> dict[str, Any] | None:
        request = self.files.read("request")
        if request is None:
            return None
        to = str(request.get("to", ""))
        deadline = request.get("deadline")
        if not to or to == self.instance.id or (to, request.get("requested_at")) in self._seen:
            return None
        if not isinstance(deadline, (int, float)) or deadline < time.time():
            return None  # a stale request of an instance that gave up
        if not self._requester_holds_gate(request):
            self._seen.add((to, request.get("requested_at")))
            log.warning(
                "ignoring a handover request for instance %r (pid %s): its writer does not hold %s, which the "
                "instance taking the node over holds while it asks (the file was written by another process, or "
                "by an instance that has exited, or by a devplug from before the gate); nothing is held",
                to[:100],
                str(request.get("pid"))[:20],
                "handover.lock",
            )
            return None
        return request

    def _requester_holds_gate(self, request: dict[str, Any]) -> bool:
        """The process ``request`` names holds the gate now (:func:`~devplug.daemon.lock.gate_holder`)."""
        holder = gate_holder(self.files.state_dir)
        pid, start = request.get("pid"), request.get("start")
        if holder is None or not isinstance(pid, int):
            return False
        return holder == (pid, start if isinstance(start, int) else None)

    async def serve(self) -> None:
        """Answer requests until one handover is done (returns: this instance leaves), each failure logged."""
        loop = asyncio.get_running_loop()
        while True:
            request = await self.events.wait(self._request, loop.time() + 3600.0, recheck=IDLE_RECHECK_S)
            if request is None:
                continue
            to = str(request["to"])
            self._seen.add((to, request.get("requested_at")))
            try:
                if await self._hand_over(request):
                    return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a file that cannot be written, say: serve on if the node is still ours
                log.exception("handover to %s failed unexpectedly", to)
                if not self.lock.held and not self.lock.try_acquire():
                    self.lock.release()  # the file kept open by the try
                    raise  # the new instance holds the lock: the node is its own, this instance leaves
                self._suspend_status(False)
                for resource in self._resources():
                    resource.resume()
                if self.record is not None and self.record.state != "failed":
                    self._finish(self.record, "failed", f"{type(exc).__name__}: {exc}")

    def _finish(self, record: HandoverRecord, state: str, reason: str | None = None) -> None:
        record.state = state
        record.reason = reason
        record.finished_at = time.time()
        self.outcomes[state] = self.outcomes.get(state, 0) + 1
        self._on_outcome(state, record.took_s)
        self._on_change()

    async def _fail(self, record: HandoverRecord, reason: str, *, paused: Sequence[HandingOver]) -> bool:
        for resource in paused:
            resource.resume()
        self.files.write("failed", {"from": self.instance.id, "to": record.to_instance, "reason": reason})
        self._finish(record, "failed", reason)
        log.error("handover to %s failed, serving on: %s", record.to_instance, reason)
        await self._write_status()
        return False

    async def _hand_over(self, request: dict[str, Any]) -> bool:
        loop = asyncio.get_running_loop()
        to = str(request["to"])
        requested_at = request.get("requested_at")
        requested_at = float(requested_at) if isinstance(requested_at, (int, float)) else time.time()
        record = self.record = HandoverRecord(self.instance.id, to, requested_at, state="handing-over")

        def gone() -> str | None:
            """Why the new instance no longer takes part, or None while it holds the gate."""
            if self._requester_holds_gate(request):
                return None
            return f"the new instance (pid {request.get('pid')}) let {'handover.lock'} go: it exited or gave up"

        deadline = loop.time() + self.timeout
        resources = list(self._resources())
        refusal = self._refuse()
        if refusal is not None:
            return await self._fail(record, f"{refusal}; ask again once it is done", paused=[])
        log.info("instance %s asks to take over; holding new calls and releases", to)
        for resource in resources:
            resource.pause()
        record.mark("old:holding")
        self._on_change()
        step("holding")
        polls = Backoff(schedule=CappedBackoff(POLL_FIRST_S, QUIET_POLL_S))
        while not all(r.quiet() for r in resources):  # hooks report no completion event: look again shortly
            if (why := gone()) is not None:
                return await self._fail(record, why, paused=resources)
            if loop.time() >= deadline:
                busy = [r.name for r in resources if not r.quiet()]
                return await self._fail(
                    record,
                    f"hooks or releases of {', '.join(busy)} still ran after {self.timeout:g} s",
                    paused=resources,
                )
            await asyncio.sleep(polls.next())
        idle = asyncio.ensure_future(asyncio.gather(*(r.calls_idle() for r in resources)))
        left = asyncio.ensure_future(self.events.wait(gone, deadline))
        done, _ = await asyncio.wait(
            (idle, left), timeout=max(0.0, deadline - loop.time()), return_when=asyncio.FIRST_COMPLETED
        )
        left.cancel()
        if idle not in done:
            idle.cancel()
            await asyncio.wait((idle,))  # the gathering ends with the CancelledError: retrieve it, it is no error
            if not idle.cancelled():
                idle.exception()
            why = gone() or f"calls still ran after {self.timeout:g} s"
            return await self._fail(record, why, paused=resources)
        record.mark("old:quiet")
        for resource in resources:
            await resource.flush()
        record.mark("old:flushed")
        record.resources = {r.name: r.handover_facts() for r in resources}
        await self._write_status()
        self._suspend_status(True)  # from the release on, the status file is the new instance's
        record.mark("old:granted")  # before the word and the lock: every step is marked before the other side's next
        # said before the lock goes: the new instance takes it at the lock file's close and reads this at once
        self.files.write(
            "granted", {"from": self.instance.id, "to": to, "resources": record.resources, "at": time.time()}
        )
        self.lock.release()
        log.info("ledgers flushed and the state lock released for %s", to)
        step("granted")
        answer = await self.events.wait(
            lambda: self.files.read_for("taken", to) or ({"gone": why} if (why := gone()) else None), deadline
        )
        taken = answer if answer is not None and "gone" not in answer else None
        if taken is None:
            if not self.lock.try_acquire():
                self.lock.release()  # the file kept open by the try
                taken = {"to": to}  # it took the lock just now: committed
            else:
                self._suspend_status(False)
                why = answer["gone"] if answer is not None else None
                return await self._fail(
                    record,
                    why or f"the new instance did not take the state lock within {self.timeout:g} s",
                    paused=resources,
                )
        record.state = "taken"
        record.mark("old:saw-taken")
        self._on_change()
        for resource in resources:
            await resource.stop_driver()
        record.mark("old:drivers-stopped")
        self.files.write("drivers-stopped", {"from": self.instance.id, "to": to})
        step("drivers-stopped")
        answer = await self.events.wait(
            lambda: self.files.read_for("serving", to) or ({"gone": why} if (why := gone()) else None),
            loop.time() + self.timeout,
        )
        if answer is not None and "gone" in answer:  # it may have written serving and let the gate go just now
            answer = self.files.read_for("serving", to) or answer
        serving = answer if answer is not None and "gone" not in answer else None
        endpoints = serving.get("endpoints", {}) if serving is not None else {}
        if serving is None:
            log.error(
                "the new instance %s took the state lock but did not serve%s",
                to,
                f": {answer['gone']}" if answer is not None else f" within {self.timeout:g} s",
            )
        if not isinstance(endpoints, dict):
            endpoints = {}
        record.mark("old:saw-serving")
        await asyncio.gather(*(r.hand_over(str(endpoints.get(r.name, "")), self.grace) for r in resources))
        record.mark("old:held-calls-answered")
        record.resources = {r.name: r.handover_facts() for r in resources}  # the held calls' waits included now
        self._finish(record, "done" if serving is not None else "taken-not-serving")
        self.files.write(
            "done",
            {
                "from": self.instance.id,
                "to": to,
                "took_s": record.took_s,
                "resources": record.resources,
                "steps": record.steps,
            },
        )
        log.info(
            "handed over to %s in %.3f s: %s; steps (ms after the request): %s",
            to,
            record.took_s or 0.0,
            "; ".join(f"{name}: {facts}" for name, facts in record.resources.items()),
            record.steps_ms(),
        )
        return True


async def take_over(
    instance: Instance,
    files: HandoverFiles,
    events: StateDirEvents,
    lock: StateLock,
    timeout: float,
    busy: AlreadyRunningError,
) -> HandoverRecord:
    """Ask the instance holding the lock to hand over, and take the lock; the record of what happened. The caller
    holds the gate (``handover.lock``) and keeps it until this instance serves: the request counts only while it
    does.

    Raises :class:`HandoverError` saying why when the old instance refuses or
    does not let go within ``timeout`` (it goes on serving), and when this
    instance is one that already handed over (a restarted old container).
    """
    superseded_by = files.superseded().get(instance.id)
    if superseded_by is not None:
        raise HandoverError(
            f"instance {instance.id} already handed this node over to {superseded_by}; it does not ask to take it "
            "back (its pod is being replaced)"
        )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout + ANSWER_MARGIN_S  # the old instance's own deadline passes first: its reason
    requested_at = time.time()
    new_steps = {"new:request": requested_at}
    started = process_started_at(instance.pid)
    if started is not None:
        new_steps["new:process-start"] = started
    files.remove("failed", "granted", "taken", "drivers-stopped", "serving", "done")
    files.write(
        "request",
        {
            "to": instance.id,
            "pid": instance.pid,
            "start": process_start_ticks(instance.pid),
            "requested_at": requested_at,
            "deadline": requested_at + timeout + ANSWER_MARGIN_S,
        },
    )
    log.info("the state dir is in use (%s); asking it to hand over (at most %g s)", busy, timeout)
    step("request")

    def answered() -> str | None:
        failed = files.read_for("failed", instance.id)
        if failed is not None:
            return f"refused: {failed.get('reason', 'no reason given')}"
        return "locked" if lock.try_acquire() else None

    outcome = await events.wait(answered, deadline)
    if outcome != "locked":
        lock.release()  # the file kept open between tries
        files.remove("request")
        why = outcome or (
            f"the running instance did not hand over within {timeout:g} s ([handover] timeout) "
            f"and {ANSWER_MARGIN_S:g} s more for its answer"
        )
        raise HandoverError(f"no handover: {why}; the running instance goes on serving, this one exits")
    granted = files.read_for("granted", instance.id)
    source = str(granted.get("from", "?")) if granted is not None else EXITED_PREDECESSOR
    record = HandoverRecord(source, instance.id, requested_at, state="taken")
    record.steps.update(new_steps)
    record.mark("new:taken")
    if granted is not None:
        facts = granted.get("resources", {})
        record.resources = facts if isinstance(facts, dict) else {}
    files.write("taken", {"to": instance.id, "from": source, "at": time.time()})
    files.remove("request")
    step("taken")
    log.info("took the state lock from %s; starting", source)
    return record


async def old_drivers_stopped(
    instance: Instance, files: HandoverFiles, events: StateDirEvents, record: HandoverRecord, timeout: float
) -> None:
    """Return once the instance this one took the node over from (:func:`take_over`'s ``record``) said its drivers
    stopped, or ``timeout`` passed (logged): this instance's drivers start only then, never beside the old ones.

    Awaited by the new instance right before its drivers start, not right after the lock: what it starts that is no
    driver (its front ends' shared parts, the liveness watch, the status) starts meanwhile. Measured (issue 42): the
    old instance's drivers took 14 ms (median) to stop once it saw the lock taken, and the new instance's start
    until its drivers ~11 ms; both were in every held call's wait one after the other."""
    if record.from_instance == EXITED_PREDECESSOR:
        return  # nobody's drivers run: the old instance died
    loop = asyncio.get_running_loop()
    stopped = await events.wait(lambda: files.read_for("drivers-stopped", instance.id), loop.time() + timeout)
    record.mark("new:saw-drivers-stopped")
    if stopped is None:
        log.warning(
            "%s did not say its drivers stopped within %g s; starting ours anyway", record.from_instance, timeout
        )
