"""The daemon: every configured resource in one process, the state lock, the plugin-folder
watch that notices kubelet restarts, release reconciliation, status, and signals."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from devplug.atomic import write_atomic
from devplug.config import Config
from devplug.engine.lock import StateLock
from devplug.engine.reconciler import Reconciler
from devplug.engine.resource import Resource
from devplug.engine.statedir import check_replaceable, prepare_state_dir
from devplug.engine.status import STATUS_FILE, build_status
from devplug.watch import DirectoryWatcher

__all__ = ["Daemon", "run_daemon"]

log = logging.getLogger("devplug.engine")

STATUS_DEBOUNCE_S = 0.25


class Daemon:
    """Runs every resource of a :class:`Config` until :meth:`request_stop` (or SIGTERM/SIGINT)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.state_dir = config.state.dir
        self.lock = StateLock(self.state_dir)
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="state-writer")
        self.resources = [
            Resource(rc, config.kubelet, self.state_dir, self.write_file, self._status_changed)
            for rc in config.resources
        ]
        self.reconciler = Reconciler(self.resources, config.kubelet.pod_resources_socket, config.release)
        self._stop = asyncio.Event()
        self._stop_requested = False
        self._status_pending = False
        self.started_at = time.time()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watcher: DirectoryWatcher | None = None

    async def write_file(self, path: Path, data: bytes) -> None:
        """Write a state file atomically, in the state-writer thread (writes keep their order)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._writer, functools.partial(write_atomic, path, data))

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
        self._loop.call_later(STATUS_DEBOUNCE_S, lambda: asyncio.ensure_future(self._write_status()))

    async def _write_status(self, stopped: bool = False) -> None:
        self._status_pending = False
        status = build_status(self.resources, self.started_at, str(self.config.path) if self.config.path else None)
        status["stopped"] = stopped
        status["release"] = self.reconciler.describe()
        await self.write_file(self.state_dir / STATUS_FILE, (json.dumps(status, separators=(",", ":")) + "\n").encode())

    # --- the plugin folder

    def _on_plugin_dir_change(self, names: frozenset[str]) -> None:
        for resource in self.resources:
            resource.on_plugin_dir_changed(names)

    # --- running

    async def run(self) -> None:
        """Serve until stopped; raises :class:`~devplug.errors.StateError` if the state dir is taken."""
        self._loop = asyncio.get_running_loop()
        if self._stop_requested:
            self._stop.set()
        prepare_state_dir(self.state_dir)
        check_replaceable(self.state_dir / STATUS_FILE, "the status file")
        self.lock.acquire()
        try:
            plugin_dir = self.config.kubelet.device_plugin_dir
            plugin_dir.mkdir(parents=True, exist_ok=True)
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
            log.info(
                "devplug serving %d resource(s): %s",
                len(self.resources),
                ", ".join(r.name for r in self.resources),
            )
            await self._stop.wait()
            log.info("shutting down")
            reconciling.cancel()
            await asyncio.gather(*(r.stop() for r in self.resources))
            for life in lives:
                life.cancel()
            await asyncio.gather(*lives, reconciling, return_exceptions=True)
            await self._write_status(stopped=True)
        finally:
            if self._watcher is not None:
                self._watcher.close()
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    self._loop.remove_signal_handler(sig)
            self._writer.shutdown(wait=True)
            self.lock.release()
            log.info("stopped")


def run_daemon(config: Config) -> None:
    """Run the daemon in the foreground until SIGTERM/SIGINT."""
    asyncio.run(Daemon(config).run())
