"""The daemon's status file, ``<state dir>/status.json``, read by ``devplug status``: built from each resource's
report (:class:`StatusBuilder`), written after changes (:class:`StatusFile`), read back (:func:`read_status`).

``devplug status`` and ``/readyz`` apply the same rules (:mod:`devplug.daemon.readiness`), the status to this file:
so that they agree, the file follows every change within about a second, those nothing signals included (a
PodResources read that failed, a device whose health the driver's poll changed): :class:`StatusFile` watches a
fingerprint of what the status shows."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import stat
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devplug.atomic import write_atomic
from devplug.daemon.lock import StateLock
from devplug.daemon.lockholder import prove_holder
from devplug.daemon.statusschema import check_status
from devplug.engine import BackgroundTasks, DeviceEntries, Resource, SerialThread
from devplug.errors import StateError

if TYPE_CHECKING:
    from devplug.engine import ExitEvidence
    from devplug.frontends.deviceplugin.reconciler import Reconciler

__all__ = ["STATUS_FILE", "StatusBuilder", "StatusFile", "read_status", "status_fingerprint"]

log = logging.getLogger("devplug.engine")

STATUS_FILE = "status.json"
#: A status file larger than this is not the daemon's (10k listed devices take about 2 MiB).
MAX_STATUS_BYTES = 64 * 1024 * 1024
#: The status file is written at most once a second, after a change (it is for people and probes, not the kubelet).
STATUS_DEBOUNCE_S = 1.0
#: How soon a status write that failed (a full disk) is tried again.
STATUS_RETRY_S = 1.0
#: How long the last status write may take once the shutdown timed out.
FINAL_WRITE_S = 2.0
#: How often the status's fingerprint is compared with the one last written (a change nothing signalled).
STATUS_WATCH_S = 0.5


class StatusBuilder:
    """Builds the status incrementally: a resource's entry is rebuilt only when something it shows changed."""

    def __init__(self, started_at: float, config_path: str | None) -> None:
        self.started_at = started_at
        self.config_path = config_path
        self._cache: dict[str, tuple[tuple[object, ...], dict[str, Any]]] = {}
        self._device_cache: dict[str, DeviceEntries] = {}

    def forget(self, name: str) -> None:
        """Drop ``name``'s cached entry (its resource was replaced by a reload: the new one's counters restart)."""
        self._cache.pop(name, None)
        self._device_cache.pop(name, None)

    async def build(self, resources: Iterable[Resource]) -> dict[str, Any]:
        """The status: each resource's entry rebuilt when its report version changed, reused otherwise.

        A rebuild lets other work run now and then (:mod:`devplug.engine.resourcereport`); an entry is kept under
        the version read before it was built, so a change meanwhile makes the next build rebuild it.
        """
        entries = []
        for resource in list(resources):
            version = resource.report_version()
            cached = self._cache.get(resource.name)
            if cached is None or cached[0] != version:
                device_cache = self._device_cache.setdefault(resource.name, {})
                cached = (version, await resource.report(device_cache))
                self._cache[resource.name] = cached
            entries.append(cached[1])
        return {
            "pid": os.getpid(),
            "started_at": self.started_at,
            "written_at": time.time(),
            "config": self.config_path,
            "resources": entries,
        }


class StatusFile:
    """Writes the status file: at once when asked (start, reload), else at most once a second after a change
    (:data:`STATUS_DEBOUNCE_S`); a write that failed is tried again every :data:`STATUS_RETRY_S`.

    ``resources`` are the resources alive; ``sections`` the node-wide parts
    added to each status (release reconciliation, reloads); ``fingerprint`` cheap scalars that change whenever the
    status would say something new: every :data:`STATUS_WATCH_S` it is compared with its value at the last write,
    and a difference writes the status (what changed without calling :meth:`changed`).
    """

    def __init__(
        self,
        state_dir: Path,
        builder: StatusBuilder,
        resources: Callable[[], Iterable[Resource]],
        sections: Callable[[], dict[str, Any]],
        fingerprint: Callable[[], object] = lambda: None,
    ) -> None:
        self.path = state_dir / STATUS_FILE
        self._fingerprint = fingerprint
        self._written: object = None
        self._watching: asyncio.Task[None] | None = None
        self._final = False
        self._fingerprint_failed = False
        self._builder = builder
        self._resources = resources
        self._sections = sections
        self._pending = False
        self._failing = False
        self._building = asyncio.Lock()
        self._writer = SerialThread("status-writer")
        self._tasks = BackgroundTasks()
        self._loop: asyncio.AbstractEventLoop | None = None
        #: While True nothing is written: the state dir's lock was handed to a newer instance, whose file it is.
        self.suspended = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Changes are written from now on, on ``loop`` (before, :meth:`changed` does nothing), those nothing
        signalled too (the fingerprint's watch)."""
        self._loop = loop
        self._watching = self._tasks.spawn(self._watch())

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(STATUS_WATCH_S)
            if self._pending or self.suspended or self._final:
                continue
            if self._current() != self._written:
                self._pending = True
                self._tasks.spawn(self.write())

    def _current(self) -> object:
        """The fingerprint now; a bug in it must not stop the status following the daemon: then a value equal to
        nothing (the status is written every time), said once."""
        try:
            return self._fingerprint()
        except Exception:
            if not self._fingerprint_failed:
                log.exception("cannot fingerprint the status; writing it every %g s", STATUS_WATCH_S)
            self._fingerprint_failed = True
            return object()

    def changed(self) -> None:
        """Something the status shows changed: write it within :data:`STATUS_DEBOUNCE_S`."""
        if self._pending or self._loop is None:
            return
        self._pending = True
        self._loop.call_later(STATUS_DEBOUNCE_S, lambda: self._tasks.spawn(self.write()))

    def forget(self, name: str) -> None:
        """Resource ``name`` was torn down (a reload): drop its cached entry, and write the status without it."""
        self._builder.forget(name)
        self.changed()

    async def write(self, stopped: bool = False) -> None:
        """Build and write the status now (after the writes queued before); nothing while :attr:`suspended`."""
        self._pending = False
        if self.suspended or (self._final and not stopped):
            return
        async with self._building:  # one build at a time (it lets other work run): files in build order
            self._written = self._current()  # before the build: a change meanwhile is written next
            status = await self._builder.build(self._resources())
            status["stopped"] = stopped
            status.update(self._sections())
            # its own thread, and no fsync: it never waits behind (or delays) a ledger snapshot. Encoded in that
            # thread too: nothing the status holds is changed once built (entries are fresh or cached read-only),
            # and a 10k-device resource's entry costs milliseconds to encode.
            written = self._writer.submit(functools.partial(_write_status_file, self.path, status))
        try:
            await asyncio.wrap_future(written)
        except OSError as exc:  # a full disk: say so, and try again in a while (the status must catch up)
            if not self._failing:
                log.error("cannot write %s: %s; retrying every %g s", self.path, exc, STATUS_RETRY_S)
            self._failing = True
            if self._loop is not None and not stopped:
                self._loop.call_later(STATUS_RETRY_S, self.changed)
            return
        if self._failing:
            log.info("%s written again", self.path)
        self._failing = False

    async def write_final(self) -> None:
        """Write the status as stopped after every write queued before, giving up after :data:`FINAL_WRITE_S`
        (a hung disk must not hang the exit); nothing is written after it."""
        self._final = True
        if self._watching is not None:
            self._watching.cancel()
        writing = asyncio.ensure_future(self.write(stopped=True))
        done, _ = await asyncio.wait((writing,), timeout=FINAL_WRITE_S)
        if not done:
            writing.cancel()
            log.error("the final status write did not finish within %g s", FINAL_WRITE_S)
        elif writing.exception() is not None:
            log.error("the final status write failed: %s", writing.exception())

    def close(self) -> None:
        """Stop the watch and the writer thread (every write was awaited, or given up on by :meth:`write_final`)."""
        if self._watching is not None:
            self._watching.cancel()
        self._writer.close()


def status_fingerprint(
    resources: Iterable[Resource], reconciler: Reconciler | None, exits: ExitEvidence
) -> tuple[object, ...]:
    """Cheap scalars that change whenever the status would say something new, the changes nothing signals included
    (a PodResources read failing, a device's health polled): what :class:`StatusFile`'s watch compares.
    ``reconciler``: the device-plugin API's release reconciler (None: no resource is served through that API)."""
    return (
        tuple(r.report_version() for r in resources),
        *(
            (reconciler.failures, reconciler.last_error, reconciler.failing_since, reconciler.awaiting_exit())
            if reconciler is not None
            else ()
        ),
        exits.liveness.mode,
    )


def _write_status_file(path: Path, status: dict[str, Any]) -> None:
    write_atomic(path, (json.dumps(status, separators=(",", ":")) + "\n").encode(), sync=False)


def _holds_lock(state_dir: Path, pid: int) -> bool:
    """Whether process ``pid`` is proven to hold the state dir's lock (a live pid alone may have been reused)."""
    try:
        with prove_holder(state_dir, StateLock(state_dir).path) as holder:
            return holder.pid == pid
    except StateError:
        return False


def _read_regular(path: Path) -> bytes:
    """The file's bytes; refuses (``ValueError``) a FIFO or device, which could block, and a huge file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > MAX_STATUS_BYTES:
            raise ValueError(f"{st.st_size} bytes, more than a status file ever holds")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_status(state_dir: Path) -> dict[str, Any]:
    """The daemon's last status (``running`` added: not stopped, and its pid proven to hold the state dir's lock);
    :class:`StateError` when there is none or it is malformed."""
    path = state_dir / STATUS_FILE
    try:
        raw = _read_regular(path)
    except FileNotFoundError:
        raise StateError(f"no devplug daemon status at {path}: is the daemon running with this state dir?") from None
    except OSError as exc:
        raise StateError(f"{path}: unreadable status file: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise StateError(f"{path}: not a devplug status file: {exc}") from None
    try:
        data = check_status(json.loads(raw))
    except RecursionError:
        raise StateError(f"{path}: not a devplug status file: JSON nested too deeply") from None
    except ValueError as exc:  # JSON syntax, bad UTF-8, or the wrong shape
        raise StateError(f"{path}: not a devplug status file: {exc}") from None
    data["running"] = not data.get("stopped") and _holds_lock(state_dir, data["pid"])
    return data
