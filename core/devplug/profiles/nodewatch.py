"""Reading and watching one Node's labels, for as long as the daemon runs.

:class:`NodeWatch` follows the API concepts' list-then-watch pattern ("Efficient detection of changes"), for one
object: a ``get`` of the Node gives its labels and a ``resourceVersion``; a ``watch`` of ``nodes`` with the field
selector ``metadata.name=<node>`` from that version then delivers each change (lightkube starts the watch again
from the last version seen when the server ends a stream, as every server does after its timeout). When the
version has left the server's window the watch gets ``410 Gone`` ("410 Gone responses"): the Node is read again
and watched from its new version. Any other failure (the server unreachable, a 5xx, the Node not there yet) is
retried with capped exponential backoff, each said in the log and in :attr:`NodeWatch.state`; nothing but the
daemon's shutdown ends the loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from devplug.backoff import Backoff, CappedBackoff

__all__ = ["BACKOFF_JITTER", "BACKOFF_MAX_S", "BACKOFF_START_S", "NodeWatch"]

log = logging.getLogger("devplug.profiles")

#: The first wait after a failure, doubled after each failure in a row up to :data:`BACKOFF_MAX_S`, each
#: lengthened or shortened by up to :data:`BACKOFF_JITTER` (devplug's one backoff, :mod:`devplug.backoff`).
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0
BACKOFF_JITTER = 0.2
#: The watch's ``timeoutSeconds``: the server ends each stream after this long, and it is started again.
WATCH_TIMEOUT_S = 300


class NodeWatch:
    """Reads Node ``name`` and follows its labels through ``client`` (a ``lightkube.AsyncClient``), calling
    ``on_labels`` with the labels after each read or change (also when unchanged: the caller compares)."""

    def __init__(self, client: Any, name: str, on_labels: Callable[[Mapping[str, str]], None]) -> None:
        self._client = client
        self.name = name
        self._on_labels = on_labels
        #: ``connecting``, ``watching`` or ``retrying``; :attr:`detail` says more.
        self.state = "connecting"
        self.detail = ""
        #: The Node's last resourceVersion seen ("" before the first read).
        self.resource_version = ""
        #: Reads of the whole Node (the first, and one after each 410 Gone or failure).
        self.reads = 0
        #: Failures retried with backoff, and 410 Gone answers (each followed by a read).
        self.failures = 0
        self.expired = 0

    async def read(self) -> Mapping[str, str]:
        """Get the Node once: its labels (also given to ``on_labels``); lightkube's errors propagate."""
        from lightkube.resources.core_v1 import Node

        node = await self._client.get(Node, self.name)
        self.reads += 1
        self.resource_version = node.metadata.resourceVersion or ""
        labels: Mapping[str, str] = dict(node.metadata.labels or {})
        self._on_labels(labels)
        return labels

    async def run(self) -> None:
        """Follow the Node until cancelled; reads it first unless :meth:`read` already did."""
        from lightkube import ApiError

        backoff = Backoff(schedule=CappedBackoff(BACKOFF_START_S, BACKOFF_MAX_S, jitter=BACKOFF_JITTER, centred=True))
        while True:
            try:
                if not self.resource_version:
                    await self.read()
                    backoff.reset()  # the API answers again
                await self._follow()
            except asyncio.CancelledError:
                raise
            except ApiError as exc:
                if exc.status.code == 410:
                    self.expired += 1
                    log.info(
                        "node %s: watch from resourceVersion %s expired (410 Gone): reading the Node again",
                        self.name,
                        self.resource_version,
                    )
                    self.resource_version = ""
                    continue
                await self._retry(f"the API server answered {exc.status.code}: {exc.status.message}", backoff)
            except Exception as exc:  # unreachable, timed out, cut, a body lightkube cannot decode: all retried
                await self._retry(f"{type(exc).__name__}: {exc}", backoff)
            else:  # the watch ended without an error: lightkube's never does, but a loop must not spin
                await self._retry("the watch ended", backoff)

    async def _follow(self) -> None:
        from lightkube.resources.core_v1 import Node

        self.state, self.detail = "watching", f"from resourceVersion {self.resource_version}"
        watch = self._client.watch(
            Node,
            fields={"metadata.name": self.name},
            resource_version=self.resource_version,
            server_timeout=WATCH_TIMEOUT_S,
        )
        async for kind, node in watch:
            self.resource_version = node.metadata.resourceVersion or self.resource_version
            if kind in ("ADDED", "MODIFIED"):
                self._on_labels(dict(node.metadata.labels or {}))
            elif kind == "DELETED":
                log.warning("node %s: the Node object was deleted; the running config stays", self.name)
                self.detail = "the Node object was deleted"

    async def _retry(self, reason: str, backoff: Backoff) -> None:
        """Say why and wait ``backoff``'s next delay; reading the Node comes first then."""
        self.failures += 1
        self.state, self.detail = "retrying", reason
        self.resource_version = ""  # after an outage, read the Node again: changes may be past the window
        wait = backoff.next()
        log.warning("node %s: cannot read or watch the Node (%s); retrying in %.1f s", self.name, reason, wait)
        await asyncio.sleep(wait)
