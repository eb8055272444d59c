"""The daemon for tests: as a child process (:class:`DaemonProcess`, :mod:`devplug.testing.process`) or in a thread."""

from __future__ import annotations

import asyncio
import threading

from devplug.config import Config
from devplug.testing.process import DaemonProcess

__all__ = ["DaemonProcess", "DaemonThread"]


class DaemonThread:
    """The daemon in this process, on an event loop in a thread: for drivers that are not installed
    (test doubles defined in a test module) and for debugging with breakpoints.

    Build the :class:`~devplug.config.Config` yourself (``parse_config``, or
    ``dataclasses.replace`` to put a test class in ``ResourceConfig.driver_class``).
    """

    def __init__(self, config: Config) -> None:
        from devplug.daemon.process import Daemon

        self.config = config
        self.daemon = Daemon(config)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="devplug-daemon", daemon=True)

    def _main(self) -> None:
        try:
            asyncio.run(self.daemon.run())
        except BaseException as exc:  # reported by stop()
            self.error = exc

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The daemon's event loop, once it runs (to run a coroutine on it: ``asyncio.run_coroutine_threadsafe``)."""
        loop = self.daemon.loop
        if loop is None:
            raise RuntimeError("the in-process daemon is not running yet")
        return loop

    def start(self) -> DaemonThread:
        self._thread.start()
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """Graceful shutdown, as on SIGTERM; re-raises what the daemon raised."""
        self.daemon.request_stop()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the in-process daemon did not stop within {timeout} s")
        if self.error is not None:
            raise self.error

    def __enter__(self) -> DaemonThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self._thread.is_alive():
            self.stop()
