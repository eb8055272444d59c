"""A synchronous face for the dev kubelet: its own event loop in a daemon thread.

For sync tests and tools. Every method runs the corresponding
:class:`~devplug.devkubelet.kubelet.DevKubelet` coroutine on the loop thread
and waits for it; properties read and set through the loop too.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from devplug.api.checkpoint import KubeletCheckpoint
from devplug.devkubelet.cgroups import CgroupLayout
from devplug.devkubelet.dra.model import ClaimState, DeviceHealth, DRAPluginView, ResourceStatus
from devplug.devkubelet.kubelet import DevKubelet
from devplug.devkubelet.model import AdmittedPod, KubeletEvent, PodDeviceEntry, PodPhase, PodSpec, ResourceView
from devplug.devkubelet.syncloop import SyncLoopOp

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

    def start(self, *, pod_list_delay: float | None = None) -> None:
        """Start serving (see :meth:`DevKubelet.start`)."""
        self._run(self._kubelet.start(pod_list_delay=pod_list_delay))

    def stop(self) -> None:
        """Stop serving (see :meth:`DevKubelet.stop`); the loop thread stays for a later start."""
        self._run(self._kubelet.stop())

    def restart(
        self, pod_list_delay: float | None = None, *, removed_static_pods: Sequence[str | tuple[str, str]] = ()
    ) -> None:
        """Simulate a kubelet restart, static pods' manifests removed meanwhile (see :meth:`DevKubelet.restart`)."""
        self._run(self._kubelet.restart(pod_list_delay, removed_static_pods=removed_static_pods))

    def remove_static_pod_while_stopped(self, pod_name: str, namespace: str = "default") -> None:
        """Remove a static pod's manifest while stopped (see :meth:`DevKubelet.remove_static_pod_while_stopped`)."""
        self._sync(lambda k: k.remove_static_pod_while_stopped(pod_name, namespace))

    def housekeeping(self) -> tuple[str, ...]:
        """One housekeeping now, through the sync loop; the orphans found (see :meth:`DevKubelet.housekeeping`)."""
        return self._run(self._kubelet.housekeeping())

    def load_pods(self) -> bool:
        """End the restart window now (see :meth:`DevKubelet.load_pods`)."""
        return self._sync(lambda k: k.load_pods())

    def close(self) -> None:
        """Stop serving, kill every container, remove every cgroup made, end the loop thread (idempotent)."""
        if self._loop.is_closed():
            return
        try:
            self._run(self._kubelet.close())
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

    def finish_pod(self, pod_name: str, namespace: str = "default") -> None:
        """A pod's containers end; the pod object stays (see :meth:`DevKubelet.finish_pod`)."""
        self._run(self._kubelet.finish_pod(pod_name, namespace))

    def remove_pod(self, pod_name: str, namespace: str = "default", *, wait: bool = True) -> None:
        """Delete a pod object gracefully (see :meth:`DevKubelet.remove_pod`)."""
        self._run(self._kubelet.remove_pod(pod_name, namespace, wait=wait))

    def remove_static_pod(self, pod_name: str, namespace: str = "default") -> None:
        """Remove a static pod's manifest: the removal window (see :meth:`DevKubelet.remove_static_pod`)."""
        self._run(self._kubelet.remove_static_pod(pod_name, namespace))

    def force_delete_pod(self, pod_name: str, namespace: str = "default") -> None:
        """``--grace-period=0 --force``: the removal window (see :meth:`DevKubelet.force_delete_pod`)."""
        self._run(self._kubelet.force_delete_pod(pod_name, namespace))

    def wait_containers_exited(self, pod_name: str, namespace: str = "default", timeout: float = 60.0) -> None:
        """Block until no container of that pod runs (see :meth:`DevKubelet.wait_containers_exited`)."""
        self._run(self._kubelet.wait_containers_exited(pod_name, namespace, timeout), timeout + _MARGIN)

    def pod_cleaned_up(self, pod_name: str, namespace: str = "default") -> bool:
        """Whether the pod's processes are gone and its cgroup removed (see :meth:`DevKubelet.pod_cleaned_up`)."""
        return self._sync(lambda k: k.pod_cleaned_up(pod_name, namespace))

    def wait_pod_cleaned_up(self, pod_name: str, namespace: str = "default", timeout: float = 60.0) -> None:
        """Block until the pod's cgroup is removed (see :meth:`DevKubelet.wait_pod_cleaned_up`)."""
        self._run(self._kubelet.wait_pod_cleaned_up(pod_name, namespace, timeout), timeout + _MARGIN)

    def pod_uid(self, pod_name: str, namespace: str = "default") -> str:
        """The UID of the newest pod object of that name."""
        return self._sync(lambda k: k.pod_uid(pod_name, namespace))

    def containers_running(self, pod_name: str, namespace: str = "default") -> bool:
        """Whether a container of that pod is still alive."""
        return self._sync(lambda k: k.containers_running(pod_name, namespace))

    def running_containers(self, pod_name: str, namespace: str = "default") -> list[str]:
        """The names of that pod's containers still alive."""
        return self._sync(lambda k: k.running_containers(pod_name, namespace))

    def pod_pids(self, pod_name: str, namespace: str = "default") -> set[int]:
        """Every process in the pod's cgroup (see :meth:`DevKubelet.pod_pids`)."""
        return self._sync(lambda k: k.pod_pids(pod_name, namespace))

    def container_pids(self, pod_name: str, container: str, namespace: str = "default") -> set[int]:
        """The live processes of one container."""
        return self._sync(lambda k: k.container_pids(pod_name, container, namespace))

    def container_pid(self, pod_name: str, container: str, namespace: str = "default") -> int | None:
        """The PID of the container's init while it runs."""
        return self._sync(lambda k: k.container_pid(pod_name, container, namespace))

    def container_failure(self, pod_name: str, container: str, namespace: str = "default") -> str | None:
        """Why the container's last creation failed, or None."""
        return self._sync(lambda k: k.container_failure(pod_name, container, namespace))

    def pod_cgroup_paths(self, pod_name: str, namespace: str = "default") -> tuple[Path, ...]:
        """The pod cgroup's folders, one per hierarchy."""
        return self._sync(lambda k: k.pod_cgroup_paths(pod_name, namespace))

    def container_cgroup_paths(self, pod_name: str, container: str, namespace: str = "default") -> tuple[Path, ...]:
        """The container cgroup's folders, one per hierarchy."""
        return self._sync(lambda k: k.container_cgroup_paths(pod_name, container, namespace))

    def liveness_config(self) -> dict[str, str]:
        """The ``[liveness]`` table for a daemon (see :meth:`DevKubelet.liveness_config`)."""
        return self._kubelet.liveness_config()

    @property
    def cgroup_layout(self) -> CgroupLayout | None:
        """Where containers get their cgroups (None: no processes run)."""
        return self._kubelet.cgroup_layout

    @property
    def dev_root(self) -> Path:
        """The node's ``/dev`` for the runtime's device check; settable (see :attr:`DevKubelet.dev_root`)."""
        return self._sync(lambda k: k.dev_root)

    @dev_root.setter
    def dev_root(self, value: Path) -> None:
        self._sync(lambda k: setattr(k, "dev_root", Path(value)))

    @property
    def check_device_nodes(self) -> bool:
        """Whether DeviceSpec host paths must be device nodes; settable (see :attr:`DevKubelet.check_device_nodes`)."""
        return self._sync(lambda k: k.check_device_nodes)

    @check_device_nodes.setter
    def check_device_nodes(self, value: bool) -> None:
        self._sync(lambda k: setattr(k, "check_device_nodes", bool(value)))

    def pods(self) -> list[AdmittedPod]:
        """The running pods."""
        return self._sync(lambda k: k.pods())

    def known_pods(self) -> list[AdmittedPod]:
        """Every existing pod object (running, finished, rejected)."""
        return self._sync(lambda k: k.known_pods())

    def pod_phase(self, name: str, namespace: str = "default") -> PodPhase | None:
        """The phase of the newest pod object of that name (see :meth:`DevKubelet.pod_phase`)."""
        return self._sync(lambda k: k.pod_phase(name, namespace))

    def attributed(self, resource: str) -> dict[str, tuple[str, str]]:
        """Device -> (pod, container) held by live pods (see :meth:`DevKubelet.attributed`)."""
        return self._sync(lambda k: k.attributed(resource))

    def pod_device_entries(self) -> list[PodDeviceEntry]:
        """Every entry of the kubelet's ``podDevices`` store (see :meth:`DevKubelet.pod_device_entries`)."""
        return self._sync(lambda k: k.pod_device_entries())

    # -- DRA -------------------------------------------------------------------------------------

    def sync_pod(self, pod_name: str, namespace: str = "default") -> bool:
        """Sync the pod now, for its resource claims (see :meth:`DevKubelet.sync_pod`)."""
        return self._run(self._kubelet.sync_pod(pod_name, namespace))

    def reconcile_dra(self) -> list[str]:
        """One pass of the DRA manager's reconcile loop (see :meth:`DevKubelet.reconcile_dra`)."""
        return self._run(self._kubelet.reconcile_dra())

    @property
    def plugins_registry(self) -> Path:
        """Where DRA plugins put their registration sockets."""
        return self._sync(lambda k: k.plugins_registry)

    def dra_plugins(self, driver: str | None = None) -> list[DRAPluginView]:
        """The registered instances of DRA drivers (see :meth:`DevKubelet.dra_plugins`)."""
        return self._sync(lambda k: k.dra_plugins(driver))

    def dra_claims(self) -> list[ClaimState]:
        """The DRA manager's claim cache (see :meth:`DevKubelet.dra_claims`)."""
        return self._sync(lambda k: k.dra_claims())

    def device_health(self, driver: str, pool: str, device: str) -> DeviceHealth:
        """The kubelet's health of one DRA device now."""
        return self._sync(lambda k: k.device_health(driver, pool, device))

    def allocated_resources_status(
        self, pod_name: str, container: str, namespace: str = "default"
    ) -> tuple[ResourceStatus, ...]:
        """A container's ``allocatedResourcesStatus`` for its claims, as the kubelet would write it now."""
        return self._sync(lambda k: k.allocated_resources_status(pod_name, container, namespace))

    def container_cdi_devices(self, pod_name: str, container: str, namespace: str = "default") -> list[str]:
        """The CDI device names of a container's claims (see :meth:`DevKubelet.container_cdi_devices`)."""
        return self._sync(lambda k: k.container_cdi_devices(pod_name, container, namespace))

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

    def resources(self) -> list[ResourceView]:
        """Every known resource, by name."""
        return self._sync(lambda k: k.resources())

    def registrations(self, resource: str) -> int:
        """How many times ``resource`` registered."""
        return self._sync(lambda k: k.registrations(resource))

    def sync_loop_ops(self, kind: str | None = None, pod: str | None = None) -> list[SyncLoopOp]:
        """The sync loop's turns so far, each with how long it waited (see :meth:`DevKubelet.sync_loop_ops`)."""
        return self._sync(lambda k: k.sync_loop_ops(kind, pod))

    @property
    def sync_loop_busy(self) -> str:
        """The turn that has the sync loop now, or ``""`` (see :attr:`DevKubelet.sync_loop_busy`)."""
        return self._sync(lambda k: k.sync_loop_busy)

    @property
    def sync_loop_waiting(self) -> tuple[str, ...]:
        """The turns waiting for the sync loop now (see :attr:`DevKubelet.sync_loop_waiting`)."""
        return self._sync(lambda k: k.sync_loop_waiting)

    def events_of(self, kind: str, resource: str | None = None) -> list[KubeletEvent]:
        """The recorded events of one kind (and resource, if given)."""
        return self._sync(lambda k: k.events_of(kind, resource))

    def add_listener(self, listener: Callable[[KubeletEvent], None]) -> None:
        """Call ``listener`` with every event as it is recorded, on the loop thread (:meth:`DevKubelet.add_listener`).

        It runs before the change that recorded the event goes on, so it sees the world as it was at that moment.
        """
        self._sync(lambda k: k.add_listener(listener))

    @property
    def checkpoint_writes(self) -> int:
        """How many times the checkpoint file was written."""
        return self._sync(lambda k: k.checkpoint_writes)

    @property
    def last_checkpoint(self) -> KubeletCheckpoint | None:
        """What the latest checkpoint write wrote, or None."""
        return self._sync(lambda k: k.last_checkpoint)

    @property
    def sources_ready(self) -> bool:
        """False during the restart window."""
        return self._sync(lambda k: k.sources_ready)

    @property
    def pod_list_loaded(self) -> bool:
        """False during the restart window (PodResources sees no pods)."""
        return self._sync(lambda k: k.pod_list_loaded)

    @property
    def events(self) -> list[KubeletEvent]:
        """A copy of the events recorded so far."""
        return self._sync(lambda k: list(k.events))

    @property
    def kep_mode(self) -> bool:
        """Whether pods finishing call PostStopContainer and Deallocate."""
        return self._sync(lambda k: k.kep_mode)

    @kep_mode.setter
    def kep_mode(self, value: bool) -> None:
        self._sync(lambda k: setattr(k, "kep_mode", value))

    @property
    def write_checkpoint(self) -> bool:
        """Whether the checkpoint file is written (see :class:`DevKubelet`); settable."""
        return self._sync(lambda k: k.write_checkpoint)

    @write_checkpoint.setter
    def write_checkpoint(self, value: bool) -> None:
        self._sync(lambda k: setattr(k, "write_checkpoint", value))

    @property
    def pod_resources_get(self) -> bool:
        """The KubeletPodResourcesGet gate."""
        return self._sync(lambda k: k.pod_resources_get)

    @pod_resources_get.setter
    def pod_resources_get(self, value: bool) -> None:
        self._sync(lambda k: setattr(k, "pod_resources_get", value))

    @property
    def list_active_pods_only(self) -> bool:
        """List answers active pods only (kubelets >= 1.34)."""
        return self._sync(lambda k: k.list_active_pods_only)

    @list_active_pods_only.setter
    def list_active_pods_only(self, value: bool) -> None:
        self._sync(lambda k: setattr(k, "list_active_pods_only", value))

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

    @property
    def checkpoint_path(self) -> Path:
        """Where the kubelet's checkpoint is written."""
        return self._kubelet.checkpoint_path
