"""The daemon: every configured resource in one process, the state lock, the plugin-folder
watch that notices kubelet restarts, release reconciliation, status, and signals.

Shutdown is bounded by ``[shutdown] timeout``: past it, whatever is still
running is abandoned. Driver hooks run in daemon threads, so one stuck in a
call that never returns cannot keep the process alive; :meth:`Daemon.run`
returns what it abandoned (logged, one line per hook) so the CLI can exit
non-zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from devplug.atomic import write_atomic
from devplug.config import Config
from devplug.engine.asynctools import BackgroundTasks
from devplug.engine.checkpointview import CHECKPOINT_FILE, CheckpointView
from devplug.engine.lock import StateLock
from devplug.engine.reconciler import Reconciler
from devplug.engine.resource import Resource
from devplug.engine.serial import SerialThread
from devplug.engine.statedir import check_replaceable, prepare_state_dir
from devplug.engine.status import STATUS_FILE, StatusBuilder
from devplug.errors import ConfigError
from devplug.watch import DirectoryWatcher

__all__ = ["Daemon", "run_daemon"]

log = logging.getLogger("devplug.engine")

#: Seconds after start-up when the heap's free pages are given back to the kernel (registration, then the first
#: compaction and status writes, are done by then).
TRIM_AFTER_S = (2.0, 8.0)
#: The status file is written at most once a second, after a change (it is for people and probes, not the kubelet).
STATUS_DEBOUNCE_S = 1.0
#: How soon a status write that failed (a full disk) is tried again.
STATUS_RETRY_S = 1.0
#: How long the last status write may take once the shutdown timed out.
FINAL_WRITE_S = 2.0
#: How often shutdown looks whether hooks still running returned.
HOOK_POLL_S = 0.05


class Daemon:
    """Runs every resource of a :class:`Config` until :meth:`request_stop` (or SIGTERM/SIGINT)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.state_dir = config.state.dir
        self.lock = StateLock(self.state_dir)
        self._writer = SerialThread("state-writer")
        self.checkpoint = CheckpointView(config.kubelet.device_plugin_dir / CHECKPOINT_FILE)
        release_wake = asyncio.Event()
        self.resources = [
            Resource(
                rc,
                config.kubelet,
                self.state_dir,
                self.write_file,
                self.checkpoint,
                on_change=self._status_changed,
                on_allocated=release_wake.set,
            )
            for rc in config.resources
        ]
        self.reconciler = Reconciler(
            self.resources, config.kubelet.pod_resources_socket, config.release, self.checkpoint, release_wake
        )
        self._stop = asyncio.Event()
        self._stop_requested = False
        self._status_pending = False
        self._status_failing = False
        self._tasks = BackgroundTasks()
        self.started_at = time.time()
        self._status = StatusBuilder(self.started_at, str(config.path) if config.path else None)
        self._status_writer = SerialThread("status-writer")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watcher: DirectoryWatcher | None = None

    async def write_file(self, path: Path, data: bytes) -> None:
        """Write a state file atomically, in the state-writer thread (writes keep their order)."""
        await asyncio.wrap_future(self._writer.submit(functools.partial(write_atomic, path, data)))

    def request_stop(self) -> None:
        """Begin a graceful shutdown (thread-safe; before :meth:`run` started, it stops at once)."""
        self._stop_requested = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    # --- status

    def _status_changed(self) -> None:
        if self._status_pending or self._loop is None:
            return
        self._status_pending = True
        self._loop.call_later(STATUS_DEBOUNCE_S, lambda: self._tasks.spawn(self._write_status()))

    async def _write_status(self, stopped: bool = False) -> None:
        self._status_pending = False
        status = self._status.build(self.resources)
        status["stopped"] = stopped
        status["release"] = self.reconciler.describe()
        data = (json.dumps(status, separators=(",", ":")) + "\n").encode()
        path = self.state_dir / STATUS_FILE
        try:  # its own thread, and no fsync: it never waits behind (or delays) a ledger snapshot
            await asyncio.wrap_future(
                self._status_writer.submit(functools.partial(write_atomic, path, data, sync=False))
            )
        except OSError as exc:  # a full disk: say so, and try again in a while (the status must catch up)
            if not self._status_failing:
                log.error("cannot write %s: %s; retrying every %g s", self.state_dir / STATUS_FILE, exc, STATUS_RETRY_S)
            self._status_failing = True
            if self._loop is not None and not stopped:
                self._loop.call_later(STATUS_RETRY_S, self._status_changed)
            return
        if self._status_failing:
            log.info("%s written again", self.state_dir / STATUS_FILE)
        self._status_failing = False

    # --- the plugin folder

    def _on_plugin_dir_change(self, names: frozenset[str]) -> None:
        for resource in self.resources:
            resource.on_plugin_dir_changed(names)

    # --- running

    def _prepare_plugin_dir(self) -> Path:
        plugin_dir = self.config.kubelet.device_plugin_dir
        where = f"{self.config.path or '<config>'}: kubelet.device_plugin_dir"
        try:
            plugin_dir.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise ConfigError(f"{where}: {plugin_dir} exists and is not a folder") from None
        except OSError as exc:
            raise ConfigError(f"{where}: cannot create {plugin_dir}: {exc.strerror or exc}") from exc
        if not plugin_dir.is_dir():
            raise ConfigError(f"{where}: {plugin_dir} is not a folder")
        return plugin_dir

    async def run(self) -> list[str]:
        """Serve until stopped; return the driver hooks abandoned at shutdown (described), empty if none.

        Raises :class:`~devplug.errors.StateError` if the state dir is taken
        or unusable, :class:`~devplug.errors.ConfigError` if the plugin folder is.
        """
        self._loop = asyncio.get_running_loop()
        if self._stop_requested:
            self._stop.set()
        prepare_state_dir(self.state_dir)
        check_replaceable(self.state_dir / STATUS_FILE, "the status file")
        self.lock.acquire()
        abandoned: list[str] = []
        try:
            plugin_dir = self._prepare_plugin_dir()
            loop = self._loop

            def plugin_dir_changed(names: frozenset[str]) -> None:
                loop.call_soon_threadsafe(self._on_plugin_dir_change, names)

            self._watcher = DirectoryWatcher(plugin_dir, plugin_dir_changed)
            self._watcher.start()
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(sig, self._stop.set)
            await self._write_status()  # at once: a previous daemon's status must not linger
            lives = [asyncio.ensure_future(r.live()) for r in self.resources]
            reconciling = asyncio.ensure_future(self.reconciler.run())
            if self._loop is not None:
                for delay in TRIM_AFTER_S:
                    self._loop.call_later(delay, _trim_heap)
            log.info(
                "devplug serving %d resource(s): %s",
                len(self.resources),
                ", ".join(r.name for r in self.resources),
            )
            await self._stop.wait()
            timeout = self.config.shutdown.timeout
            log.info("shutting down (at most %g s, [shutdown] timeout)", timeout)
            deadline = loop.time() + timeout
            stopping = asyncio.ensure_future(self._shut_down(lives, reconciling))
            done, _ = await asyncio.wait((stopping,), timeout=timeout)
            if not done:
                stopping.cancel()
                await asyncio.wait((stopping,), timeout=FINAL_WRITE_S)
                abandoned.append(f"the shutdown did not finish within {timeout:g} s ([shutdown] timeout)")
            else:
                await self._hooks_return(deadline)
            abandoned.extend(self._abandoned_hooks())
            for problem in abandoned:
                log.error("abandoned at shutdown: %s", problem)
            await self._final_status()
        finally:
            if self._watcher is not None:
                self._watcher.close()
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    self._loop.remove_signal_handler(sig)
            self._writer.close()  # every write was awaited, or given up on by _final_status
            self._status_writer.close()
            self.lock.release()
            log.info("stopped" if not abandoned else "stopped, abandoning what did not finish")
        return abandoned

    async def _shut_down(self, lives: Sequence[asyncio.Future[None]], reconciling: asyncio.Future[None]) -> None:
        """Stop accepting, finish in-flight calls, stop the drivers; unbounded (the caller bounds it)."""
        reconciling.cancel()
        await asyncio.gather(*(r.stop() for r in self.resources))
        for life in lives:
            life.cancel()
        await asyncio.gather(*lives, reconciling, return_exceptions=True)

    async def _hooks_return(self, deadline: float) -> None:
        """Give hooks still running (a release finishing in the background) until ``deadline`` to return."""
        loop = asyncio.get_running_loop()
        while any(r.runner.running() for r in self.resources) and loop.time() < deadline:
            await asyncio.sleep(HOOK_POLL_S)

    def _abandoned_hooks(self) -> list[str]:
        """The driver hooks that have not returned (stuck, or abandoned earlier after their hook_timeout)."""
        return [hook.describe() for r in self.resources for hook in r.runner.running()]

    async def _final_status(self) -> None:
        """Write the status as stopped after every write queued before, giving up after :data:`FINAL_WRITE_S`
        (a hung disk must not hang the exit)."""
        writing = asyncio.ensure_future(self._write_status(stopped=True))
        done, _ = await asyncio.wait((writing,), timeout=FINAL_WRITE_S)
        if not done:
            writing.cancel()
            log.error("the final status write did not finish within %g s", FINAL_WRITE_S)
        elif writing.exception() is not None:
            log.error("the final status write failed: %s", writing.exception())


def _trim_heap() -> None:
    """Give the C heap's free pages back to the kernel once start-up is over (glibc's ``malloc_trim``).

    Start-up parses the config, reads every device and imports the world;
    most of that is freed again but glibc keeps the pages. Returning them
    lowers the idle daemon's resident memory (see ``make bench``).
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def run_daemon(config: Config) -> list[str]:
    """Run the daemon in the foreground until SIGTERM/SIGINT; returns what was abandoned at shutdown."""
    return asyncio.run(Daemon(config).run())
