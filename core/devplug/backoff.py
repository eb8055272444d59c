"""devplug's one backoff: how long to wait before trying failed work again.

Every retry in devplug waits by :class:`CappedBackoff`: the driver kit's rescan loop and per-device retries
(:mod:`devplug.kit.retries`, where drivers import it), the engine's driver starts, health loop, releases and
supervised tasks, the front ends' registration and ResourceSlice publishing, the per-node profiles' Node watch
and the mock's folder watch. A caller keeping its own count of failures asks :meth:`CappedBackoff.delay`; one
that only retries until something works keeps a :class:`Backoff` (the count, over a schedule) and calls
:meth:`Backoff.next` after each failure and :meth:`Backoff.reset` after a success.

It lives in the package root, beside the driver contract, because the host package (the directory watcher)
uses it and the kit imports the host package: in the kit it would make the two import each other. Drivers import
it from :mod:`devplug.kit` as before.

Our own rather than a retry library's (tenacity, backoff): the core depends only on pluggy, grpcio, protobuf and
click, and its retries are schedules kept per device, per record and per connection, waited on with events that
cut them short, not calls a decorator could wrap.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Backoff", "CappedBackoff"]


@dataclass(frozen=True)
class CappedBackoff:
    """The wait before the next attempt after ``failures`` failures in a row: ``retry_min`` after the first,
    multiplied by ``factor`` (doubling) after each further one, at most ``retry_max`` (never below ``retry_min``).

    ``jitter`` (0 to 1) spreads retries of many failures: each wait is shortened by a random part of up to that
    fraction (from ``(1 - jitter) * d`` to ``d``), or with ``centred`` lengthened or shortened alike (from
    ``(1 - jitter) * d`` to ``(1 + jitter) * d``). A server's ``Retry-After`` is honoured by passing it to
    :meth:`delay`: the wait is never shorter than what it asks.
    """

    retry_min: float
    retry_max: float
    factor: float = 2.0
    jitter: float = 0.0
    centred: bool = False

    def __post_init__(self) -> None:
        if not self.retry_min > 0:
            raise ValueError(f"CappedBackoff: retry_min must be a number of seconds > 0, got {self.retry_min!r}")
        if not self.retry_max >= self.retry_min:
            raise ValueError(
                f"CappedBackoff: retry_max must be a number of seconds >= retry_min ({self.retry_min:g}), "
                f"got {self.retry_max!r}"
            )
        if not self.factor >= 1:
            raise ValueError(f"CappedBackoff: factor must be a number >= 1, got {self.factor!r}")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"CappedBackoff: jitter must be from 0 to 1, got {self.jitter!r}")

    def delay(self, failures: int, retry_after: float | None = None) -> float:
        """Seconds to wait after ``failures`` (>= 1) failures in a row; at least ``retry_after`` when given."""
        try:
            wait = min(self.retry_max, self.retry_min * self.factor ** (max(failures, 1) - 1))
        except OverflowError:  # failing for ever: the cap long since
            wait = self.retry_max
        if self.jitter:
            spread = self.jitter * (2.0 * random.random() - 1.0 if self.centred else -random.random())
            wait *= 1.0 + spread
        return float(wait if retry_after is None else max(wait, retry_after))


class Backoff:
    """A run of failures on a :class:`CappedBackoff` schedule: :meth:`next` after each failure gives the wait,
    :meth:`reset` after a success starts the run over. One per thing retried (a connection, a record), not
    shared.

    ``Backoff(initial, cap, jitter)`` is ``CappedBackoff(initial, max(initial, cap), jitter=jitter)``;
    ``schedule`` gives any other (a factor, centred jitter).
    """

    def __init__(
        self,
        initial: float = 0.05,
        cap: float = 5.0,
        jitter: float = 0.0,
        *,
        schedule: CappedBackoff | None = None,
    ) -> None:
        self.schedule = schedule or CappedBackoff(initial, max(initial, cap), jitter=jitter)
        #: Failures in the current run (0 after :meth:`reset`).
        self.failures = 0

    def __repr__(self) -> str:
        return f"<Backoff {self.failures} failure(s) on {self.schedule!r}>"

    def next(self, retry_after: float | None = None) -> float:
        """One more failure: the seconds to wait before the next attempt (at least ``retry_after`` when given)."""
        self.failures += 1
        return self.schedule.delay(self.failures, retry_after)

    def reset(self) -> None:
        """The work succeeded: the next failure waits the schedule's first wait again."""
        self.failures = 0
