"""A test double of devplug-shared for the daemon under test (test entry point ``shared-slow-store``): the real
driver, its coordination store reached through :class:`SlowStore`, so that a test can make one slot's store
calls slow while the other slots' are answered as ever.

What it models is a networked store (etcd's gRPC gateway, the API server) leaving one request unanswered for a
while (a stalled connection, a slow quorum write) while other requests, each on its own connection, are served:
the driver's claims and releases are separate requests (``etcd3gw`` posts each through a ``requests.Session``,
whose urllib3 connection pool gives concurrent requests connections of their own), so nothing on the store's side
makes one slot's request wait for another's. With the ``local`` backend the wait happens before the SQLite
transaction begins, as a request waits before it reaches etcd; a stalled SQLite file itself (its writer lock held)
would stall every slot alike, which no driver can help.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from devplug import DriverContext, hookimpl
from devplug_shared.backends import Backend, StoreWatch
from devplug_shared.driver import SharedDriver
from devplug_shared.options import SharedOptions
from devplug_shared.slots import Claim

#: How long a slowed call waits at most (seconds): far beyond any test, short enough not to leak for ever.
LIMIT = 300.0


class SlowStore:
    """A :class:`~devplug_shared.backends.Backend` whose ``claim`` and ``release`` calls naming a slot listed in
    ``flag`` (one slot a line) wait while the file exists (at most :data:`LIMIT` seconds), then go through."""

    def __init__(self, inner: Backend, flag: Path) -> None:
        self.inner = inner
        self.flag = flag
        self.description = inner.description
        self.options: Any = getattr(inner, "options", None)  # the driver reads lease_ttl from it

    def _slowed(self, slots: Sequence[str]) -> bool:
        try:
            named = set(self.flag.read_text().split())
        except FileNotFoundError:
            return False
        return bool(named & set(slots))

    def _wait(self, slots: Sequence[str]) -> None:
        if not self._slowed(slots):
            return
        deadline = time.monotonic() + LIMIT
        while self.flag.exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    def open(self) -> None:
        self.inner.open()

    def keepalive(self, held: Sequence[str]) -> bool:
        return self.inner.keepalive(held)

    def claim(self, slots: Sequence[str]) -> None:
        self._wait(slots)
        self.inner.claim(slots)

    def release(self, slots: Sequence[str]) -> None:
        self._wait(slots)
        self.inner.release(slots)

    def holders(self) -> Mapping[str, Claim]:
        return self.inner.holders()

    def watch(self, changed: Callable[[], None]) -> StoreWatch | None:
        return self.inner.watch(changed)

    def close(self) -> None:
        self.inner.close()


@dataclass(frozen=True)
class SlowStoreOptions(SharedOptions):
    """The shared driver's options, plus ``slow_store``: the flag file of :class:`SlowStore` (absolute path)."""

    slow_store: str = ""


class SharedOnSlowStore(SharedDriver):
    """The shared driver with its store behind :class:`SlowStore` (flag file ``options.slow_store``)."""

    Options: ClassVar[type[SharedOptions]] = SlowStoreOptions

    @hookimpl
    def start(self, ctx: DriverContext) -> None:
        """Start the driver, then put its store behind the flag file (the start's own calls are never slowed)."""
        super().start(ctx)
        flag = getattr(self.options, "slow_store", "")
        if flag and self._backend is not None:
            self._backend = SlowStore(self._backend, Path(flag))
