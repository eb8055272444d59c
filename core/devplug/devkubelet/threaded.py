"""A synchronous face for the dev kubelet: its own event loop in a daemon thread.

For sync tests and tools. Every method runs the corresponding
:class:`~devplug.devkubelet.kubelet.DevKubelet` coroutine on the loop thread
and waits for it; properties read and set through the loop too.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from devplug.devkubelet.kubelet import DevKubelet
from devplug.devkubelet.model import AdmittedPod, KubeletEvent, PodSpec, ResourceView

__all__ = ["DevKubeletThread"]

T = TypeVar("T")

#: Extra seconds a blocking call waits beyond the operation's own timeout.
_MARGIN = 30.0


class DevKubeletThread:
    """A :class:`DevKubelet` driven synchronously; usable as a context manager (start, then close).

    Keyword arguments go to :class:`DevKubelet`. ``call_timeout`` bounds every
    blocking call that has no timeout of its own (admission, removal, start,
    stop), so a hung plugin fails the caller instead of hanging it.
    """

    def __init__(self, device_plugin_dir: Path, *, call_timeout: float = 60.0, **kwargs: Any) -> None:
        self._call_timeout = call_timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="devkubelet-loop", daemon=True)
        self._thread.start()
        try:
            self._kubelet: DevKubelet = self._run(self._make(Path(device_plugin_dir), kwargs))
        except BaseException:
            self._end_loop()
            raise

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    @staticmethod
    async def _make(device_plugin_dir: Path, kwargs: dict[str, Any]) -> DevKubelet:
        return DevKubelet(device_plugin_dir, **kwargs)

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if self._loop.is_closed():
            coro.close()
            raise RuntimeError("this DevKubeletThread is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(self._call_timeout if timeout is None else timeout)

    def _sync(self, fn: Callable[[DevKubelet], T]) -> T:
        async def call() -> T:
            return fn(self._kubelet)

        return self._run(call())

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def kubelet(self) -> DevKubelet:
        """The wrapped DevKubelet; touch it only from coroutines run on its loop."""
        return self._kubelet

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the dev kubelet runs on."""
        return self._loop

    def start(self) -> None:
        """Start serving (see :meth:`DevKubelet.start`)."""
        self._run(self._kubelet.start())

    def stop(self) -> None:
        """Stop serving (see :meth:`DevKubelet.stop`); the loop thread stays for a later start."""
        self._run(self._kubelet.stop())

    def restart(self) -> None:
        """Simulate a kubelet restart (see :meth:`DevKubelet.restart`)."""
        self._run(self._kubelet.restart())

    def close(self) -> None:
        """Stop serving and end the loop thread (idempotent)."""
        if self._loop.is_closed():
            return
        try:
            self._run(self._kubelet.stop())
        finally:
            self._end_loop()

    def _end_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=_MARGIN)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> DevKubeletThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- pods ------------------------------------------------------------------------------------

    def admit_pod(self, pod: PodSpec) -> AdmittedPod:
        """Admit a pod (see :meth:`DevKubelet.admit_pod`)."""
        return self._run(self._kubelet.admit_pod(pod))

    def start_container(self, pod_name: str, container: str, namespace: str = "default") -> None:
        """(Re)start a container (see :meth:`DevKubelet.start_container`)."""
        self._run(self._kubelet.start_container(pod_name, container, namespace))

    def remove_pod(self, pod_name: str, namespace: str = "default") -> None:
        """Remove a pod (see :meth:`DevKubelet.remove_pod`)."""
        self._run(self._kubelet.remove_pod(pod_name, namespace))

    def pods(self) -> list[AdmittedPod]:
        """The admitted pods."""
        return self._sync(lambda k: k.pods())

    # -- waiting and observation -----------------------------------------------------------------

    def wait_for(
        self, predicate: Callable[[DevKubelet], bool], timeout: float = 5.0, *, what: str | None = None
    ) -> None:
        """Block until ``predicate(kubelet)`` holds (evaluated on the loop thread); TimeoutError otherwise."""
        self._run(self._kubelet.wait_for(predicate, timeout, what=what), timeout + _MARGIN)

    def wait_registered(self, resource: str, timeout: float = 5.0, *, after: int = 0) -> None:
        """Block until ``resource`` registered more than ``after`` times."""
        self._run(self._kubelet.wait_registered(resource, timeout, after=after), timeout + _MARGIN)

    def resource(self, name: str) -> ResourceView | None:
        """A snapshot of a registered resource, or None."""
        return self._sync(lambda k: k.resource(name))

    def registrations(self, resource: str) -> int:
        """How many times ``resource`` registered."""
        return self._sync(lambda k: k.registrations(resource))

    @property
    def events(self) -> list[KubeletEvent]:
        """A copy of the events recorded so far."""
        return self._sync(lambda k: list(k.events))

    @property
    def kep_mode(self) -> bool:
        """Whether pod removal calls PostStopContainer and Deallocate."""
        return self._sync(lambda k: k.kep_mode)

    @kep_mode.setter
    def kep_mode(self, value: bool) -> None:
        self._sync(lambda k: setattr(k, "kep_mode", value))

    @property
    def pod_resources_available(self) -> bool:
        """False simulates a PodResources outage (calls fail with UNAVAILABLE)."""
        return self._sync(lambda k: k.pod_resources_available)

    @pod_resources_available.setter
    def pod_resources_available(self, value: bool) -> None:
        self._sync(lambda k: setattr(k, "pod_resources_available", value))

    @property
    def kubelet_socket(self) -> Path:
        """Where Registration is served."""
        return self._kubelet.kubelet_socket

    @property
    def pod_resources_socket(self) -> Path:
        """Where PodResources is served."""
        return self._kubelet.pod_resources_socket

    @property
    def device_plugin_dir(self) -> Path:
        """The device plugin folder."""
        return self._kubelet.device_plugin_dir
