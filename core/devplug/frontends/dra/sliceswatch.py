"""The watch of a node's ResourceSlices of one driver, for :class:`~devplug.frontends.dra.slices.SlicePublisher`.

:func:`follow_slices` reports every valid event (``ADDED``, ``MODIFIED``, ``DELETED``) and starts the watch again,
telling the caller (who resyncs: events may have been missed meanwhile), when it fails, ends, or delivers no valid
event or bookmark for ``silence`` seconds: it asks for bookmarks, which the API server sends about every minute,
so only a dead, held or junk stream is that quiet (a connection that died without a FIN, a proxy holding it
open). It runs until cancelled. Each start watches through the ResourceSlice class ``resource()`` gives then: the
``resource.k8s.io`` version in use (:mod:`~devplug.frontends.dra.apiversions`), which a restart may have changed.

The watch selects the node's slices of the driver by field (``spec.nodeName``, ``spec.driver``: the selectable
fields of ``pkg/registry/resource/resourceslice/strategy.go``, ``toSelectableFields``), so it sees every slice of the
pool: those with devices and those holding only counter sets (issue 41: they carry the same ``nodeName`` and
``driver``), both written by the publisher under names it knows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from devplug.engine import Backoff
from devplug.kube.client import describe_api_error

if TYPE_CHECKING:
    from lightkube import AsyncClient

__all__ = ["WATCH_SILENCE", "WATCH_TIMEOUT", "WatchedObject", "follow_slices", "watch_slices"]

log = logging.getLogger("devplug.frontends.dra")

#: Seconds a watch request lasts before the server ends it and lightkube resumes it from the last resourceVersion
#: (client-go's reflector asks for 5 to 10 minutes).
WATCH_TIMEOUT = 300
#: Seconds a watch may deliver no valid event or bookmark before it is started again (with a resync). The API
#: server's watch cache sends a watch that allows them a BOOKMARK "roughly every minute" and 2 s before its deadline
#: (``k8s.io/apiserver/pkg/storage/cacher``: ``defaultBookmarkFrequency = time.Minute`` in ``cacher.go``,
#: ``cacheWatcher.nextBookmarkTime``; its one-second buckets make that exact to a second), so a healthy watch is
#: never silent this long; below the default resync interval (120 s), so a deleted slice comes back sooner.
WATCH_SILENCE = 90.0
#: The event types of a watch (``k8s.io/apimachinery/pkg/watch``) other than ERROR.
_WATCH_EVENTS = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK"})


async def follow_slices(
    client: AsyncClient,
    node: str,
    driver: str,
    *,
    silence: float,
    seen: Callable[[str, str, str], None],
    restarted: Callable[[], None],
    resource: Callable[[], Any] | None = None,
) -> None:
    """Call ``seen(type, name, resourceVersion)`` for each valid change event of the watch, and ``restarted()``
    each time it is started again (after a backoff) because it failed, ended or was silent (see the module);
    ``resource()``: lightkube's ResourceSlice class to watch through (default: v1's)."""
    backoff = Backoff(initial=0.5, cap=30.0, jitter=0.2)
    loop = asyncio.get_running_loop()
    while True:
        events = watch_slices(client, node, driver, resource() if resource is not None else None)
        junk = 0
        try:
            quiet_until = loop.time() + silence
            while True:
                try:
                    async with asyncio.timeout_at(quiet_until):
                        kind, obj = await anext(events)
                except StopAsyncIteration:
                    break
                name, version = obj.name, obj.resource_version
                if kind not in _WATCH_EVENTS or version is None or (kind != "BOOKMARK" and name is None):
                    junk += 1  # no sign of life: the silence bound runs on
                    continue
                quiet_until = loop.time() + silence
                backoff.reset()
                if kind != "BOOKMARK" and name is not None:
                    seen(kind, name, version)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            log.warning(
                "ResourceSlices of %s on node %s: the watch delivered no event or bookmark for %g s%s; starting it "
                "again",
                driver,
                node,
                silence,
                f" ({junk} line(s) that were neither)" if junk else "",
            )
        except Exception as exc:  # the API server's or the network's: the periodic resync still runs
            log.debug(
                "ResourceSlices of %s on node %s: the watch failed (%s); starting it again",
                driver,
                node,
                describe_api_error(exc)[0],
            )
        finally:
            with contextlib.suppress(Exception):
                await events.aclose()
        restarted()
        await asyncio.sleep(backoff.next())


class WatchedObject(dict[str, Any]):
    """A watch event's object as plain JSON, whatever it holds: a ResourceSlice, or a BOOKMARK's bare
    ``metadata.resourceVersion`` (which lightkube's ResourceSlice model refuses: no ``spec``). lightkube's watch
    decodes into it and reads ``metadata.resourceVersion`` to resume from."""

    @property
    def metadata(self) -> _WatchedMeta:
        meta = self.get("metadata")
        return _WatchedMeta(meta if isinstance(meta, dict) else {})

    @property
    def name(self) -> str | None:
        value = self.metadata.get("name")
        return value if isinstance(value, str) else None

    @property
    def resource_version(self) -> str | None:
        return self.metadata.resourceVersion


class _WatchedMeta(dict[str, Any]):
    @property
    def resourceVersion(self) -> str | None:  # the name lightkube reads
        value = self.get("resourceVersion")
        return value if isinstance(value, str) and value else None


def watch_slices(
    client: AsyncClient, node: str, driver: str, resource: Any = None
) -> AsyncGenerator[tuple[str, WatchedObject], None]:
    """A watch of the node's ResourceSlices of ``driver`` with bookmarks allowed: ``(type, object)`` events, through
    lightkube's ResourceSlice class ``resource`` (default: ``resource.k8s.io/v1``'s).

    lightkube's ``AsyncClient.watch`` takes no ``allowWatchBookmarks`` and decodes each object as a ResourceSlice
    (a bookmark is none), so the request is prepared by its generic client with the parameter added and the
    objects decoded as :class:`WatchedObject`; it still resumes from the last resourceVersion when the server
    ends the watch, and raises on an ERROR event or an HTTP failure.
    """
    from lightkube.resources.resource_v1 import ResourceSlice

    generic = client._client  # lightkube's GenericAsyncClient: the same transport, credentials and timeouts
    request = generic.prepare_request(
        "list",
        res=resource if resource is not None else ResourceSlice,
        watch=True,
        params={
            "timeoutSeconds": WATCH_TIMEOUT,  # ended by the server and resumed, as informers do
            "allowWatchBookmarks": "true",
            "fieldSelector": f"spec.nodeName={node},spec.driver={driver}",
        },
    )
    events = generic.watch(replace(request, response_type=cast("Any", WatchedObject)))  # lightkube: dict -> type
    return cast("AsyncGenerator[tuple[str, WatchedObject], None]", events)
