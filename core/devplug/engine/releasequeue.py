"""Releases a front end found due, run in the background: once the tenant's containers are gone, retried on failure.

A front end finds a tenancy over (the kubelet no longer attributes its
devices; a DRA claim was unprepared or deleted) and hands it here:

* it is released only once its pod's containers are gone
  (:mod:`devplug.engine.tenantexit`): the kubelet forgets a removed static pod
  or a force-deleted one while its containers still run out their grace
  period. The pod's cgroup says when its last process exited (on cgroup v2
  that wakes the release at once); where the cgroups cannot be read, the
  tenancy waits ``[liveness] unknown_grace`` seconds from the moment its pod
  vanished, and a timer releases it when that grace ends;
* one release per record runs at a time, and none starts while the resource stops;
* a release that fails is retried with capped exponential backoff and jitter
  (from ``[release] interval`` up to ``max_retry_interval``), logged when it
  starts failing, when it is still failing after 10, 100, 1000... attempts, and
  when it recovers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from devplug.engine.asynctools import BackgroundTasks, Backoff
from devplug.engine.ledger import AllocationRecord
from devplug.engine.lifecycle import DeviceLifecycle
from devplug.engine.liveness import PodLiveness, PodState
from devplug.errors import DriverError

__all__ = ["STILL_FAILING_FIRST", "Awaiting", "ReleaseQueue"]

log = logging.getLogger("devplug.engine")

#: A failing release is logged again (without the driver's message, said once) after this many attempts, then
#: after ten times as many, and so on.
STILL_FAILING_FIRST = 10


@dataclass
class Awaiting:
    """A tenancy found over whose pod's containers may still run."""

    resource: str
    devices: tuple[str, ...]
    pod: str | None
    pod_uid: str | None
    since: float
    why: str
    cancel: Callable[[], None] | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "devices": list(self.devices),
            "pod": self.pod,
            "pod_uid": self.pod_uid,
            "since": self.since,
            "why": self.why,
        }


@dataclass
class _Retry:
    """When a failing release is tried again, and what was last said about it in the log."""

    backoff: Backoff
    due: float  # time.monotonic()
    message: str
    next_report: int = STILL_FAILING_FIRST


class ReleaseQueue:
    """The background releases of one resource."""

    def __init__(
        self,
        lifecycle: DeviceLifecycle,
        *,
        interval: float,
        max_retry_interval: float,
        stopping: Callable[[], bool],
    ) -> None:
        self.lifecycle = lifecycle
        self.name = lifecycle.resource_name
        self.exits = lifecycle.exits
        self.interval = interval
        self.max_retry_interval = max_retry_interval
        self._stopping = stopping
        #: Tenancies whose pod's containers may still run, by record ID.
        self._awaiting: dict[str, Awaiting] = {}
        #: Failing releases' schedules, by record ID.
        self._retries: dict[str, _Retry] = {}
        self._running: set[str] = set()
        self._tasks = BackgroundTasks()

    def configure(self, interval: float, max_retry_interval: float) -> None:
        """``[release] interval`` or ``max_retry_interval`` changed (a reload); running backoffs keep theirs."""
        self.interval = interval
        self.max_retry_interval = max_retry_interval

    # --- what front ends ask

    def running(self, record_id: str) -> bool:
        """True while a release of the record runs here."""
        return record_id in self._running

    def any_running(self) -> bool:
        """Whether a release of one of the resource's allocations is running (a reload waits for it)."""
        return bool(self._running)

    def release_when_exited(self, record: AllocationRecord, reason: str, now: float) -> None:
        """Release ``record`` now if its pod's containers are gone; else wait for them (woken by the pod's cgroup
        on v2, or by a timer at the end of ``[liveness] unknown_grace`` when the cgroups cannot say; asked again at
        the front end's next look otherwise)."""
        verdict = self.exits.verdict(record, now)
        if verdict.exited:
            self.stop_awaiting(record.id)
            self.start(record, reason, verdict.why)
            return
        waiting = self._awaiting.get(record.id)
        if waiting is not None:
            waiting.why = verdict.why
            return
        self.lifecycle.guard.withhold_busy(record, verdict.why)
        devices = tuple(record.all_devices())
        log.warning(
            "[%s] %s: the kubelet no longer attributes them, but pod %s may still run (%s): released once its "
            "containers are gone",
            self.name,
            ", ".join(devices),
            record.pod or record.pod_uid or "(unknown)",
            verdict.why,
            extra={"device": ", ".join(devices)},
        )
        waiting = Awaiting(self.name, devices, record.pod, record.pod_uid, now, verdict.why)
        self._awaiting[record.id] = waiting
        if verdict.liveness.state is PodState.RUNNING and verdict.pod_uid is not None:
            record_id = record.id
            waiting.cancel = self.exits.liveness.on_exit(
                verdict.pod_uid, lambda answer: self._exited(record_id, reason, answer)
            )
        elif verdict.grace_ends is not None:
            waiting.cancel = self._at_grace_end(record.id, reason, verdict.grace_ends)

    def _at_grace_end(self, record_id: str, reason: str, ends: float) -> Callable[[], None] | None:
        """Look at the tenancy again when its ``unknown_grace`` ends (``ends``, ``time.time()`` scale); the timer's
        cancel. None outside the event loop (the front end's next look then decides).

        Fast path (issue 42): the grace's end was seen only at the front end's next look, so a 0.5 s grace cost a
        whole ``[release] interval`` (1 s by default): the shared slot hand-over (``bench.scenarios.shared``, default
        settings, no cgroups to read) spent 1.0 s there of its 2.4-3.0 s, and now 0.5 s. The decision is the one
        the next look would make: the kubelet no longer attributes the devices (a look saw it, and a later look
        that sees them attributed again cancels the timer through :meth:`stop_awaiting`) and the grace is over.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        handle = loop.call_later(max(0.0, ends - time.time()), self._grace_over, record_id, reason)
        return handle.cancel

    def _grace_over(self, record_id: str, reason: str) -> None:
        """The timer of :meth:`_at_grace_end`: release if the verdict now says the containers are gone."""
        waiting = self._awaiting.get(record_id)
        record = self.lifecycle.record(record_id)
        if waiting is None or record is None or record.releasing or record_id in self._running or self._stopping():
            return
        verdict = self.exits.verdict(record)
        if verdict.exited:
            self.stop_awaiting(record_id)
            self.start(record, reason, verdict.why)
        elif verdict.grace_ends is not None:  # the clocks disagree by a hair, or the grace was lengthened: again
            waiting.cancel = self._at_grace_end(record_id, reason, verdict.grace_ends)

    def _exited(self, record_id: str, reason: str, answer: PodLiveness) -> None:
        """The pod's cgroup says its last process is gone: release at once (unless something else did)."""
        waiting = self._awaiting.pop(record_id, None)
        record = self.lifecycle.record(record_id)
        if waiting is None or record is None or record.releasing:
            return
        if record_id in self._running or self._stopping():
            return
        verdict = self.exits.verdict(record)
        if verdict.exited:
            self.start(record, reason, verdict.why)
        else:  # unknown after all: the front end's next look decides, with the grace
            log.debug("[%s] pod %s: %s", self.name, record.pod_uid, answer.detail)

    def stop_awaiting(self, record_id: str) -> None:
        """The record's tenancy is not over after all (or was released): stop waiting for its containers."""
        waiting = self._awaiting.pop(record_id, None)
        self.exits.forget(record_id)
        self.lifecycle.guard.end_busy(record_id)
        if waiting is not None and waiting.cancel is not None:
            waiting.cancel()

    def retry(self, record: AllocationRecord) -> None:
        """A record left releasing: finish it (interrupted by a restart) or retry it once its backoff is over."""
        failure = self.lifecycle.release_failures.get(record.id)
        if failure is None:
            self.start(record, "finishing an interrupted release")
            return
        retry = self._retries.get(record.id)
        if retry is not None and time.monotonic() < retry.due:
            return
        self.start(record, f"retrying a failed release (attempt {failure.attempts + 1})")

    def start(self, record: AllocationRecord, reason: str, evidence: str | None = None) -> None:
        """Release ``record`` in the background (not while the resource stops: a reload's new instance finds the
        record in the ledger)."""
        if self._stopping() or record.id in self._running:
            return
        self._running.add(record.id)
        self._tasks.spawn(self._release(record, reason, evidence))

    # --- for the status

    def awaiting(self) -> list[Awaiting]:
        """The tenancies waiting for their pod's containers to exit."""
        return list(self._awaiting.values())

    def forget_gone(self) -> None:
        """Drop what is kept about records no longer in the ledger (released).

        Not the retry schedule of a release still running: its record leaves the ledger before the release's last
        write returns, and the release itself drops the schedule then, saying it recovered.
        """
        alive = {r.id for r in self.lifecycle.records()}
        for record_id in [i for i in self._awaiting if i not in alive]:
            self.stop_awaiting(record_id)
        for record_id in [i for i in self._retries if i not in alive and i not in self._running]:
            del self._retries[record_id]

    def close(self) -> None:
        """The resource is gone (a reload removed or replaced it): stop waiting for any container."""
        for record_id in list(self._awaiting):
            self.stop_awaiting(record_id)

    # --- the release

    async def _release(self, record: AllocationRecord, reason: str, evidence: str | None) -> None:
        try:
            await self.lifecycle.release(record.id, reason, evidence)
        except DriverError as exc:
            self._failed(record, exc)
        except Exception:
            log.exception("[%s] release of %s failed unexpectedly, will retry", self.name, record.id)
        else:
            if self._retries.pop(record.id, None) is not None:
                log.info("[%s] release of %s recovered", self.name, ", ".join(record.all_devices()))
        finally:
            self._running.discard(record.id)

    def _failed(self, record: AllocationRecord, exc: DriverError) -> None:
        """A release failed: schedule its retry (capped exponential backoff with jitter) and log a change of
        state only: the first failure (with the driver's message), a new message, every tenfold attempts."""
        failure = self.lifecycle.release_failures.get(record.id)
        attempts = failure.attempts if failure is not None else 1
        message = exc.reason or str(exc)
        devices = ", ".join(record.all_devices())
        retry = self._retries.get(record.id)
        if retry is None:
            retry = self._retries[record.id] = _Retry(
                Backoff(initial=self.interval, cap=max(self.interval, self.max_retry_interval), jitter=0.5), 0.0, ""
            )
        delay = retry.backoff.next()
        retry.due = time.monotonic() + delay
        # The schedule as decided, every attempt (debug only): the time between two attempts also holds the wait
        # for the next reconciliation pass, the ledger's writes and the hook thread, which load stretches.
        log.debug(
            "[%s] release of %s: attempt %d failed; next attempt in %.3f s at the earliest",
            self.name,
            devices,
            attempts,
            delay,
            extra={"device": devices},
        )
        hook = f"{exc.hook}: " if exc.hook else ""
        if message != retry.message:
            log.error(
                "[%s] release of %s failed (attempt %d): %s%s; retrying with backoff, at most every %g s",
                self.name,
                devices,
                attempts,
                hook,
                message,
                self.max_retry_interval,
                extra={"device": devices},
            )
            retry.message = message
        elif attempts >= retry.next_report:
            log.warning(
                "[%s] release of %s still failing after %d attempts (next in %.1f s)",
                self.name,
                devices,
                attempts,
                delay,
                extra={"device": devices},
            )
            retry.next_report *= 10
