"""Publishing a node's devices as ResourceSlices, kept in step with the device table.

:class:`SlicePublisher` runs beside the DRA front end for one driver on one node.
What it publishes is :mod:`devplug.frontends.dra.slicecontent`'s (device names,
attributes, taints, how the pool splits into slices; a shared device's replicas
are devices of their own, one per replica ID, with ``physicalDevice`` and
``replica`` attributes, which the scheduler allocates like any device); here is
how it is written:

* **server-side apply** of each slice by its stable name, as field manager
  ``devplug-<driver>``, forced (the daemon owns its slices: a field another
  manager took is taken back), with an ownerReference to the Node (its ``uid``
  read before each write: a node deleted and registered again is a new owner), so
  the garbage collector deletes the slices with the node;
* **generation**: every change of the pool's content is written with
  ``spec.pool.generation`` one above the highest generation of the node's slices
  of the driver (and of any this publisher wrote), on every slice of the pool, so
  a consumer never mixes slices of two contents (it uses the newest generation
  once it has ``resourceSliceCount`` slices of it). Slices no longer wanted (the
  pool shrank, another pool name, a leftover) are deleted first, as the Go
  helper's ``resourceslice`` controller does;
* **when**: on every change of the device table (a change starts a ``debounce``
  wait, so a burst of changes makes one write of the last state); a change that
  does not change the pool's content (a reason's text, a resend) writes nothing;
  and every ``resync_interval`` seconds, or after :meth:`SlicePublisher.resync`,
  the node's slices are listed and written again if someone removed or changed
  them (their names and resourceVersions are not those of the publisher's last
  write; the kubelet deletes a driver's slices at its start and when the driver's
  plugin is gone: call :meth:`~SlicePublisher.resync` after registering again); a
  watch of the node's slices of the driver asks for that resync as soon as someone
  else deletes, changes or adds one (the periodic one covers a watch that fails;
  ``watch=False`` leaves only the periodic one). The watch asks for bookmarks
  (``allowWatchBookmarks``: the API server sends one about every minute), so a
  watch that delivers no valid event or bookmark for ``watch_silence`` seconds
  (a connection that died silently, a proxy holding it open, a stream of junk)
  is started again, with a resync, well before the periodic one. At
  start, slices already carrying the same content (a restarted daemon: their
  ``devplug.io/pool-digest`` annotation and pool say so) are adopted without a
  write;
* **failures** (the API server down, 429, 5xx, 403 for missing RBAC, a Node not
  found) are logged, shown in :attr:`SlicePublisher.state` (for status and
  metrics) and retried after a capped backoff (``Retry-After`` honoured); a pool
  that cannot be built (a device name collision, a bad attribute from the driver)
  is logged and shown the same way and waits for the next table change. The task
  never ends by itself: it runs until cancelled;
* **the API version** (:class:`~devplug.frontends.dra.apiversions.DraApi`): the
  slices are written, listed, watched and deleted through the ``resource.k8s.io``
  version discovery chose (``v1``, ``v1beta2`` or ``v1beta1``), built in v1's
  shape and converted at the edge; whether unavailable devices are tainted or
  left out is the choice made before the first write (a dry run). A request that
  finds the version not served any more (``404`` for the path), and a restart of
  the watch (the API server restarted: an upgrade among others), make the next
  sync discover the version again first. A caller without discovery gives none:
  ``v1`` with taints is assumed;
* **gated fields dropped** after all (the second line: the server dropped taints,
  consumable capacity or counters the dry run kept, a gate turned off since): seen
  in the answer to the apply (:mod:`~devplug.frontends.dra.dropped`), logged once,
  and the pool is published from then on in the older form (unavailable devices
  left out, one device per replica, parts without counters; ``state`` says which)
  until the next discovery;
* **shutdown**: :meth:`SlicePublisher.shutdown` stops publishing and, when the
  caller says this is the driver's last instance on the node
  (``last_instance=True``), deletes the node's slices of the driver; while another
  instance runs (a rolling update's new pod publishes the same slices) they stay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from devplug.engine import Backoff, DeviceTable
from devplug.errors import DevplugError
from devplug.frontends.dra.apiversions import DraApi, DraApiChoice, slice_from_wire, slice_to_wire
from devplug.frontends.dra.capacity import SharedCapacity, shared_capacity
from devplug.frontends.dra.devicenames import DeviceNameCollisionError, DeviceNameMap
from devplug.frontends.dra.dropped import fall_back
from devplug.frontends.dra.slicecontent import (
    DIGEST_ANNOTATION,
    MANAGED_BY_LABEL,
    DeviceDescriber,
    Pool,
    SliceContentError,
    build_pool,
)
from devplug.frontends.dra.sliceswatch import WATCH_SILENCE, follow_slices
from devplug.kube.client import describe_api_error, not_served

if TYPE_CHECKING:
    from lightkube import AsyncClient

__all__ = ["PublisherState", "SlicePublishError", "SlicePublisher", "field_manager_of"]

log = logging.getLogger("devplug.frontends.dra")


class SlicePublishError(DevplugError):
    """The API server refused or failed a request of the publisher; ``retry_after`` is the server's advice."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def field_manager_of(driver: str) -> str:
    """The field manager of a driver's slices: ``devplug-<driver>``."""
    return f"devplug-{driver}"


@dataclass(frozen=True)
class PublisherState:
    """What the publisher has done, for ``devplug status`` and metrics."""

    #: The pool generation last written or adopted (0: nothing yet).
    generation: int = 0
    slices: int = 0
    devices: int = 0
    #: Devices published with a taint (unavailable), and left out (unavailable, without taints).
    tainted: int = 0
    omitted: int = 0
    #: The device table's version the API server's slices show (-1: none yet).
    table_version: int = -1
    #: When the slices were last known to be in step (``time.time()``), or None.
    synced_at: float | None = None
    #: Why the last attempt failed (None: in step), and how many attempts failed in a row.
    error: str | None = None
    failures: int = 0
    #: True while unavailable devices are tainted; False when the API server keeps no taints (left out instead).
    taints: bool = True
    #: The ``resource.k8s.io`` version the slices are written in.
    api_version: str = "resource.k8s.io/v1"
    #: True while shared devices are published as one device with consumable capacity (else one per replica), and
    #: how many are.
    consumable_capacity: bool = False
    shared_devices: int = 0
    #: True while parts are published with their parent's counter set (else without counters), and how many sets.
    partitionable: bool = False
    counter_sets: int = 0

    @property
    def in_sync(self) -> bool:
        return self.error is None and self.synced_at is not None


class SlicePublisher:
    """One driver's ResourceSlices on one node (see the module's docstring)."""

    def __init__(
        self,
        *,
        driver: str,
        node: str,
        table: DeviceTable,
        client: AsyncClient,
        pool: str | None = None,
        describe: DeviceDescriber | None = None,
        debounce: float = 0.2,
        resync_interval: float = 120.0,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.time,
        watch: bool = True,
        watch_silence: float = WATCH_SILENCE,
        api: DraApi | None = None,
        on_deleted: Callable[[str], None] = lambda _name: None,
    ) -> None:
        self.driver = driver
        self.node = node
        self.pool = pool or node
        self.table = table
        self.field_manager = field_manager_of(driver)
        if debounce < 0 or resync_interval <= 0 or not watch_silence > 0:
            raise ValueError(
                f"SlicePublisher: debounce {debounce} must be >= 0, resync_interval {resync_interval} > 0, "
                f"watch_silence {watch_silence} > 0"
            )
        self._client = client
        #: The ``resource.k8s.io`` version and taints choice (shared with the claim reader); v1 with taints when
        #: none is given.
        self.api = api or DraApi.fixed(client)
        #: Set when the version in use may be gone (a 404 for its path, a restarted watch): discover it again first.
        self._stale = False
        self._describe = describe
        self._debounce = debounce
        self._resync_interval = resync_interval
        self._watching = watch
        self._watch_silence = watch_silence
        self._backoff = backoff or Backoff(initial=0.5, cap=30.0, jitter=0.2)
        self._clock = clock
        self._resync = asyncio.Event()
        self._generation = 0
        self._synced_digest: str | None = None
        self._taint_times: dict[tuple[str, str], str] = {}
        self._names = DeviceNameMap()
        self._names_version = -1
        #: The slices as this publisher last wrote or adopted them: name -> resourceVersion.
        self._written: dict[str, str | None] = {}
        #: The names of slices this publisher deleted itself (their DELETED events are no one else's).
        self._deleting: set[str] = set()
        #: Called with a slice's name when someone else deleted one this publisher wrote (the kubelet wipes a
        #: driver's slices when it deregisters the driver).
        self._on_deleted = on_deleted
        self._task: asyncio.Task[None] | None = None
        self._open = asyncio.Event()  # cleared while a handover holds the publisher (see hold)
        self._open.set()
        self._quiet = asyncio.Event()  # cleared while a sync talks to the API server
        self._quiet.set()
        self.state = PublisherState(
            taints=self.api.choice.taints,
            api_version=self.api.choice.api_version,
            consumable_capacity=self.api.choice.consumable_capacity,
            partitionable=self.api.choice.partitionable,
        )

    # --- what other parts ask

    def device_id(self, name: str) -> str | None:
        """The device ID of one of the table's devices by its device name, or None (whether or not it is in the
        slices now: a claim may hold a device that became unavailable since). A shared device's replicas map to
        their replica IDs and its own name (the device published with consumable capacity) to its physical ID,
        whichever form the pool has now (a claim allocated in the other form still resolves). None for every name
        while two devices share one (the pool is not published then either)."""
        if self._names_version != self.table.version:
            try:
                self._names = DeviceNameMap([*self.table.ids, *self.table.shared_devices()])
            except DeviceNameCollisionError:
                self._names = DeviceNameMap()
            self._names_version = self.table.version
        return self._names.device_id(name)

    def shared_capacity(self, device_id: str) -> SharedCapacity | None:
        """The consumable capacity of the shared device ``device_id`` (its physical ID: what :meth:`device_id`
        gives for the device published as one): the capacity's name, what a replica is worth and the replica IDs;
        ``None`` when ``device_id`` is no physical ID of a device advertised as two replicas or more. Whatever form
        the pool has now (see :attr:`consumable`)."""
        return shared_capacity(self.table, device_id)

    @property
    def consumable(self) -> bool:
        """True while shared devices are published as one device with consumable capacity (the API server keeps
        the fields: :attr:`~devplug.frontends.dra.apiversions.DraApiChoice.consumable_capacity`)."""
        return self.api.choice.consumable_capacity

    def resync(self) -> None:
        """List the node's slices and write them again if they differ, soon (after the kubelet may have wiped them)."""
        self._resync.set()

    def hold(self) -> None:
        """A newer instance takes the node over: write nothing from now on (the slices become its own, which it
        adopts as they are); a sync under way finishes (:meth:`idle` waits for it)."""
        self._open.clear()

    def release(self) -> None:
        """The handover failed: publish again, first comparing with what the API server holds."""
        self._open.set()
        self.resync()

    async def idle(self) -> None:
        """Return once no sync talks to the API server (after :meth:`hold`, none starts)."""
        await self._quiet.wait()

    # --- the loop

    async def run(self) -> None:
        """Keep the slices in step with the table until cancelled."""
        if not self._watching:
            await self._publish()
            return
        watcher = asyncio.get_running_loop().create_task(self._watch(), name=f"slices-watch-{self.driver}")
        try:
            await self._publish()
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _watch(self) -> None:
        """Ask for a resync whenever someone else deletes, changes or adds one of the node's slices of the driver,
        and after every restart of the watch (:func:`~devplug.frontends.dra.sliceswatch.follow_slices`).

        A slice is this publisher's own, unchanged, when its name and resourceVersion are those of the last write
        (an event of its own write seen before the write's answer costs one list, no write).
        """
        await follow_slices(
            self._client,
            self.node,
            self.driver,
            silence=self._watch_silence,
            seen=self._seen,
            restarted=self._watch_restarted,
            resource=self.api.slice_resource,
        )

    def _watch_restarted(self) -> None:
        """The watch had to start again: the API server may have restarted as another version (an upgrade), so the
        resync it asks for discovers the version first."""
        self._stale = True
        self.resync()

    def _seen(self, kind: str, name: str, version: str) -> None:
        if kind == "DELETED":
            if name in self._written and name not in self._deleting:
                self.resync()
                self._on_deleted(name)
        elif self._written.get(name, "") != version:
            self.resync()

    async def _publish(self) -> None:
        check = True  # the first pass compares with what the API server holds
        while True:
            if not self._open.is_set():  # held by a handover: what the API server holds may change meanwhile
                await self._open.wait()
                check = True
            version = self.table.version
            delay: float | None = None
            try:
                pool = self._build()
                if check or pool.digest != self._synced_digest:
                    check = not await self._sync(pool, version)
                    if check:  # taints were dropped: build again without them, now
                        continue
                elif self.state.table_version != version:  # a change the slices do not show: nothing to write
                    self.state = replace(self.state, table_version=version)
                self._backoff.reset()
            except SliceContentError as exc:
                self._failed(f"the pool cannot be built: {exc}")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API server's, the network's, or a bug: logged, shown, retried
                if isinstance(exc, SlicePublishError):
                    reason, retry_after = str(exc), exc.retry_after
                else:
                    reason, retry_after = describe_api_error(exc)
                if not_served(exc):  # the version in use is gone (a downgrade, a server restarted without it)
                    self._stale = True
                    reason = f"{self.api.choice.api_version} is not served: {reason}; discovering the version again"
                delay = max(self._backoff.next(), retry_after or 0.0)
                self._failed(reason, delay, error=exc)
                check = True
            if delay is not None:
                await asyncio.sleep(delay)
                continue
            check = await self._wait(version)

    async def _wait(self, version: int) -> bool:
        """Until the table changes (then ``debounce`` more), a resync is asked for or is due; True for a resync."""
        change = self.table.next_change(version)  # shared with other waiters: never cancelled here
        resync: asyncio.Future[Any] = asyncio.ensure_future(self._resync.wait())
        waiting: list[asyncio.Future[Any]] = [change, resync]
        try:
            await asyncio.wait(waiting, timeout=self._resync_interval, return_when=asyncio.FIRST_COMPLETED)
        finally:
            resync.cancel()
        wanted = self._resync.is_set() or not change.done()
        self._resync.clear()
        if change.done() and self._debounce > 0:
            await asyncio.sleep(self._debounce)
        return wanted

    def _failed(self, reason: str, retry_in: float | None = None, *, error: Exception | None = None) -> None:
        """Show the failure in the state and the log: a warning when the reason is new and every tenth time in a
        row, else at debug level (an API server down for an hour logs no line a second); a traceback for what is
        neither the API server's nor the network's doing (a bug)."""
        failures = self.state.failures + 1
        loud = self.state.error != reason or failures % 10 == 0
        self.state = replace(self.state, error=reason, failures=failures)
        then = f"retrying in {retry_in:.1f} s" if retry_in is not None else "waiting for the next device change"
        unexpected = error is not None and not _is_api_failure(error)
        log.log(
            logging.WARNING if loud or unexpected else logging.DEBUG,
            "ResourceSlices of %s on node %s: %s (failure %d in a row); %s",
            self.driver,
            self.node,
            reason,
            failures,
            then,
            exc_info=error if unexpected else None,
            extra={"driver": self.driver},
        )

    def _build(self) -> Pool:
        choice = self.api.choice
        return build_pool(
            self.table,
            driver=self.driver,
            pool=self.pool,
            node=self.node,
            taints=choice.taints,
            describe=self._describe,
            taint_times=self._taint_times,
            consumable=choice.consumable_capacity,
            counters=choice.partitionable,
        )

    # --- the API server

    async def _list(self) -> list[dict[str, Any]]:
        version = self.api.version
        found = self._client.list(
            self.api.slice_resource(), fields={"spec.nodeName": self.node, "spec.driver": self.driver}
        )
        return [slice_from_wire(version, s.to_dict()) async for s in found]

    async def _node_uid(self) -> str:
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Node

        try:
            node = await self._client.get(Node, self.node)
        except ApiError as exc:
            if exc.status.code == 404:
                raise SlicePublishError(f"node {self.node} does not exist in the API server (yet?)") from None
            raise
        uid = node.metadata.uid if node.metadata is not None else None
        if not uid:
            raise SlicePublishError(f"node {self.node} has no uid in the API server's answer")
        return uid

    def _unchanged(self, pool: Pool, existing: list[dict[str, Any]]) -> bool:
        """True when the API server holds the slices this publisher last wrote of ``pool``, untouched since (their
        names and resourceVersions are those its writes returned)."""
        if pool.digest != self._synced_digest or not self._written:
            return False
        return {s["metadata"]["name"]: s["metadata"].get("resourceVersion") for s in existing} == self._written

    def _adoptable(self, pool: Pool, existing: list[dict[str, Any]]) -> int | None:
        """The generation of slices already holding exactly this pool (written by an earlier run, as their digest
        annotation says, and holding that content), or None."""
        if sorted(s["metadata"]["name"] for s in existing) != sorted(name for name, _ in pool.slices):
            return None
        pools = [s["spec"]["pool"] for s in existing]
        digests = {((s["metadata"].get("annotations") or {}).get(DIGEST_ANNOTATION)) for s in existing}
        generations = {p.get("generation") for p in pools}
        if digests != {pool.digest} or len(generations) != 1:
            return None
        if any(p.get("name") != pool.name or p.get("resourceSliceCount") != len(pool.slices) for p in pools):
            return None
        generation = generations.pop()
        if not isinstance(generation, int):
            return None
        wanted = {name: _without_taint_times(spec) for name, spec in pool.slices}
        for found in existing:  # the content itself: an edit that kept the annotation is no adoptable slice
            spec = _without_taint_times({k: v for k, v in found["spec"].items() if k != "pool"})
            if spec != {k: v for k, v in wanted[found["metadata"]["name"]].items() if k != "pool"}:
                return None
        return generation

    async def _sync(self, pool: Pool, version: int) -> bool:
        """Make the API server hold ``pool``; False when the pool must be built again first (the taints choice
        changed: the server dropped the taints, or a new discovery chose otherwise)."""
        self._quiet.clear()
        try:
            if self._stale:
                before = _shape(self.api.choice)
                await self.api.refresh("the slices' watch started again, or the version in use was not served")
                self._stale = False
                self.state = replace(self.state, api_version=self.api.choice.api_version)
                if _shape(self.api.choice) != before:
                    return False
            return await self._sync_now(pool, version)
        finally:
            self._quiet.set()

    async def _sync_now(self, pool: Pool, version: int) -> bool:
        existing = await self._list()
        if self._unchanged(pool, existing):
            self._synced(pool, version)
            return True
        adopted = self._adoptable(pool, existing)
        if adopted is not None:
            self._generation = max(self._generation, adopted)
            self._note_taint_times(existing)
            self._note_written(existing)
            self._synced(pool, version)
            return True
        generation = 1 + max([self._generation, *(int(s["spec"]["pool"].get("generation", 0)) for s in existing)])
        uid = await self._node_uid()
        await self._delete([s for s in existing if s["metadata"]["name"] not in {n for n, _ in pool.slices}])
        self._written = {}
        applied = [await self._apply(name, spec, pool, generation, uid) for name, spec in pool.slices]
        self._generation = generation
        self._note_taint_times(applied)
        self._note_written(applied)
        if fall_back(self.api, pool, applied, driver=self.driver, node=self.node):  # a gate turned off since
            choice = self.api.choice
            self.state = replace(
                self.state,
                taints=choice.taints,
                consumable_capacity=choice.consumable_capacity,
                partitionable=choice.partitionable,
            )
            return False
        self._synced(pool, version)
        return True

    def _synced(self, pool: Pool, version: int) -> None:
        self._synced_digest = pool.digest
        if self.state.error is not None:
            log.info("ResourceSlices of %s on node %s: in step again", self.driver, self.node)
        self.state = replace(
            self.state,
            taints=self.api.choice.taints,
            api_version=self.api.choice.api_version,
            generation=self._generation,
            slices=len(pool.slices),
            devices=pool.device_count,
            tainted=pool.tainted,
            omitted=pool.omitted,
            consumable_capacity=self.api.choice.consumable_capacity,
            shared_devices=len(pool.shared),
            partitionable=self.api.choice.partitionable,
            counter_sets=pool.counter_sets,
            table_version=version,
            synced_at=self._clock(),
            error=None,
            failures=0,
        )

    def _note_written(self, slices: list[dict[str, Any]]) -> None:
        self._written = {s["metadata"]["name"]: s["metadata"].get("resourceVersion") for s in slices}
        self._deleting -= self._written.keys()  # written again: a deletion from now on is someone else's

    def _note_taint_times(self, slices: list[dict[str, Any]]) -> None:
        """Keep each taint's ``timeAdded`` (the API server may set it), to write it back unchanged."""
        times: dict[tuple[str, str], str] = {}
        for found in slices:
            for device in found["spec"].get("devices") or ():
                for taint in device.get("taints") or ():
                    if taint.get("timeAdded"):
                        times[(device["name"], taint.get("value", ""))] = str(taint["timeAdded"])
        self._taint_times = times

    async def _apply(self, name: str, spec: Mapping[str, Any], pool: Pool, generation: int, uid: str) -> dict[str, Any]:
        version = self.api.version
        body = {
            "kind": "ResourceSlice",
            "metadata": {
                "name": name,
                "labels": {MANAGED_BY_LABEL: "devplug"},
                "annotations": {DIGEST_ANNOTATION: pool.digest},
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid, "controller": True}
                ],
            },
            "spec": {
                **spec,
                "pool": {**spec["pool"], "generation": generation, "resourceSliceCount": len(pool.slices)},
            },
        }
        obj = cast(Any, self.api.slice_resource().from_dict(slice_to_wire(version, body)))
        applied = await self._client.apply(obj, field_manager=self.field_manager, force=True)
        return slice_from_wire(version, applied.to_dict())

    async def _delete(self, slices: list[dict[str, Any]]) -> list[str]:
        from lightkube import ApiError

        deleted = []
        for found in slices:
            name = found["metadata"]["name"]
            self._deleting.add(name)  # its DELETED event is this publisher's own (kept: a late event stays ours)
            try:
                await self._client.delete(self.api.slice_resource(), name)
            except ApiError as exc:
                if exc.status.code != 404:
                    raise
            deleted.append(name)
        return deleted

    def start(self) -> asyncio.Task[None]:
        """Run :meth:`run` in a task of its own (once); :meth:`shutdown` ends it."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run(), name=f"slices-{self.driver}")
        return self._task

    async def shutdown(self, *, last_instance: bool) -> list[str]:
        """Stop publishing (the task :meth:`start` made ends) and, when ``last_instance``, delete the node's slices
        of the driver; the names deleted.

        ``last_instance`` is the caller's to say: False while another instance of the driver runs on the node (a
        rolling update's new pod, which publishes the same slices; deleting them would withdraw its devices until
        it writes them again), True when this one is the last (the daemon is being removed from the node, the
        resource retired). Raises :class:`SlicePublishError` when the deletion fails; the kubelet deletes the
        slices of a driver whose last plugin is gone anyway, after a delay.
        """
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if not last_instance:
            return []
        return await self.delete_slices()

    async def delete_slices(self) -> list[str]:
        """Delete the node's slices of the driver (cancel :meth:`run` first, or use :meth:`shutdown`); the names
        deleted.

        Call it on shutdown only when no other instance of the driver runs on the node. Raises
        :class:`SlicePublishError` when the API server does not answer or refuses.
        """
        try:
            deleted = await self._delete(await self._list())
        except Exception as exc:
            raise SlicePublishError(
                f"ResourceSlices of {self.driver} on node {self.node} not deleted: {describe_api_error(exc)[0]}"
            ) from exc
        self._synced_digest = None
        self._written = {}
        self.state = replace(self.state, slices=0, devices=0, tainted=0, omitted=0, synced_at=None)
        if deleted:
            log.info("ResourceSlices of %s on node %s deleted: %s", self.driver, self.node, ", ".join(deleted))
        return deleted


def _is_api_failure(exc: Exception) -> bool:
    """True for what the API server or the network did (an HTTP status, a refused or timed-out connection)."""
    import httpx2

    return isinstance(exc, (SlicePublishError, httpx2.HTTPError, OSError))


def _without_taint_times(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A slice spec without its devices' taints' ``timeAdded`` (the API server's to set) and empty device lists."""
    devices = [
        {**d, "taints": [{k: v for k, v in t.items() if k != "timeAdded"} for t in d["taints"]]} if "taints" in d else d
        for d in spec.get("devices") or ()
    ]
    return {**{k: v for k, v in spec.items() if k != "devices"}, **({"devices": devices} if devices else {})}


def _shape(choice: DraApiChoice) -> tuple[bool, bool, bool]:
    """What a discovery's choice changes in the pool's content: taints, consumable capacity, counters."""
    return choice.taints, choice.consumable_capacity, choice.partitionable
