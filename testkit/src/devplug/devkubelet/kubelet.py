"""The dev kubelet: a kubelet's device manager and PodResources server over real gRPC on unix sockets.

:class:`DevKubelet` serves ``kubelet.sock`` (Registration) and the PodResources
socket, holds one :class:`~devplug.devkubelet.plugin_client.PluginClient` per
registered resource, and runs pods through the
:class:`~devplug.devkubelet.lifecycle.PodLifecycle` over the
:class:`~devplug.devkubelet.pods.PodManager` and the
:class:`~devplug.devkubelet.devicemanager.DeviceManager`. Every state change
wakes :meth:`DevKubelet.wait_for`, so tests wait on events, never on sleeps.

What this module itself follows (Kubernetes v1.32.10):

* the sync loop (``syncLoopIteration``, ``pkg/kubelet/kubelet.go``): every
  pod operation the config sources or the PLEG bring is a turn of one
  :class:`~devplug.devkubelet.syncloop.SyncLoop`, first come first served:
  :meth:`DevKubelet.admit_pod` (``ADD``: ``HandlePodAdditions``, the
  plugins' Allocate and GetPreferredAllocation inside it with no deadline,
  ``context.Background()`` in ``pkg/kubelet/cm/devicemanager/endpoint.go``),
  :meth:`DevKubelet.remove_pod` (``UPDATE``), :meth:`DevKubelet.remove_static_pod`
  and :meth:`DevKubelet.force_delete_pod` (``REMOVE``: ``HandlePodRemoves``),
  :meth:`DevKubelet.start_container` and :meth:`DevKubelet.finish_pod` (the
  PLEG's events), :meth:`DevKubelet.sync_pod` and the resync (``SYNC``),
  the first pod lists after a restart, and housekeeping
  (:meth:`DevKubelet.housekeeping`, ``HOUSEKEEPING``). A plugin holding an
  Allocate delays them all; the pod workers' starts, PreStartContainer and
  kills go on.
  :meth:`DevKubelet.sync_loop_ops` says how long each turn waited; a turn
  that waited is also an event (``sync-loop-waited``). PodResources and
  Registration are served beside the loop, as the kubelet serves them;
* start: ``CleanupPluginDirectory`` (``pkg/kubelet/cm/devicemanager/manager.go``,
  called by ``plugin/v1beta1/server.go`` ``Start``) removes every entry of the
  device-plugin folder that is not a directory, except the checkpoint; then
  ``ManagerImpl.Start``/``readCheckpoint`` restore ``podDevices`` and
  ``allocatedDevices`` from ``kubelet_internal_checkpoint`` and recreate every
  resource it lists with no devices and a stopped endpoint without options
  (capacity 0 until the plugin registers again);
* a restart: a new process; the PodResources server answers at once
  (``ListenAndServePodResources`` runs beside the main loop) while the pod
  manager is empty and the sources not ready until the main loop has loaded
  the pods (see :mod:`~devplug.devkubelet.pods`). A static pod whose
  manifest was removed while the kubelet was stopped
  (:meth:`DevKubelet.remove_static_pod_while_stopped`, or
  ``restart(removed_static_pods=...)``) is not loaded: its containers run
  on, its devices are restored from the checkpoint until
  ``UpdateAllocatedDevices`` prunes them, and housekeeping kills it;
* housekeeping (``syncLoop`` in ``pkg/kubelet/kubelet.go``:
  ``housekeepingTicker := time.NewTicker(housekeepingPeriod)``, 2 s; in
  ``syncLoopIteration``, a tick is a turn of the loop that runs
  ``HandlePodCleanups`` if ``kl.sourcesReady.AllReady()`` and is skipped
  otherwise): a tick every ``housekeeping_period`` seconds from each start,
  on the fixed schedule of a Go ticker (a tick that finds the previous one
  still waiting for the loop is dropped), each one a ``HOUSEKEEPING`` turn
  of the sync loop, so a held Allocate delays it; what it kills is
  :meth:`~devplug.devkubelet.lifecycle.PodLifecycle.housekeeping`'s;
* ``PluginListAndWatchReceiver``/``genericDeviceUpdateCallback``: every
  ListAndWatch message replaces the resource's device list and rewrites the
  checkpoint, changed or not; ``PluginDisconnected``: the stream's end marks
  every device unhealthy and stops the endpoint; ``GetCapacity`` drops a
  resource whose endpoint stayed stopped past the grace period and rewrites
  the checkpoint;
* ``PluginConnected``: the options come from GetDevicePluginOptions, never
  from ``RegisterRequest.options``;
* a second instance of a plugin (``registerClient``/``runClient`` of
  ``plugin/v1beta1/handler.go``): the older client stays connected and keeps
  feeding the resource; what its end disconnects depends on how endpoints
  are keyed, per socket path (Kubernetes PR #135437) or per resource name
  (before it): :mod:`~devplug.devkubelet.endpoints`, picked by ``endpoints_by``.

With ``dra=DRAConfig(...)`` it also runs the kubelet's DRA side
(:mod:`devplug.devkubelet.dra`) in the root directory above the device-plugin
folder: the plugin watcher on ``plugins_registry/``, the DRA manager and its
``dra_manager_state``, the device health streams; pods may then use resource
claims. Without it (the default, as the DynamicResourceAllocation gate in
1.32) a pod using claims is refused.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc.aio

from devplug.api.checkpoint import CHECKPOINT_FILE, KubeletCheckpoint
from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.devkubelet.cgroups import CgroupLayout
from devplug.devkubelet.checkpointing import build_checkpoint, load_checkpoint, restore_pod_devices, write_checkpoint
from devplug.devkubelet.containers import ContainerRuntime
from devplug.devkubelet.devicemanager import DeviceManager, Endpoint
from devplug.devkubelet.dra.model import ClaimState, DeviceHealth, DRAPluginView, ResourceStatus
from devplug.devkubelet.dra.node import DRAConfig, DRAKubelet
from devplug.devkubelet.dra.podclaims import PodClaims
from devplug.devkubelet.endpoints import ENDPOINT_KEYINGS, EndpointKeying, OlderStreamEnd, older_stream_end
from devplug.devkubelet.lifecycle import PodLifecycle
from devplug.devkubelet.model import (
    AdmittedPod,
    ContainerSpec,
    DeviceInfo,
    KubeletEvent,
    PluginOptions,
    PodDeviceEntry,
    PodPhase,
    PodSpec,
    ResourceView,
)
from devplug.devkubelet.plugin_client import PluginClient, unix_target
from devplug.devkubelet.poddevices import DeviceAllocateInfo
from devplug.devkubelet.podresources_server import PodResourcesServicer, add_podresources_servicer
from devplug.devkubelet.pods import ContainerRecord, PodManager, PodRecord, pod_label
from devplug.devkubelet.registration_server import RegistrationServicer, add_registration_servicer
from devplug.devkubelet.resources import Resource, cleanup_plugin_directory, describe_predicate, is_socket
from devplug.devkubelet.syncloop import SyncLoop, SyncLoopOp
from devplug.errors import KubeletError

__all__ = ["HOUSEKEEPING_PERIOD", "KUBELET_SOCKET", "DevKubelet"]

_log = logging.getLogger("devplug.devkubelet")

#: The file name the kubelet serves Registration on, inside the device plugin folder.
KUBELET_SOCKET = "kubelet.sock"
#: ``housekeepingPeriod`` (``pkg/kubelet/kubelet.go``): seconds between two housekeeping ticks.
HOUSEKEEPING_PERIOD = 2.0


class _PodResourcesSource:
    """The PodResources server's view of the dev kubelet (``PodResourcesProviders``)."""

    def __init__(self, kubelet: DevKubelet) -> None:
        self._kubelet = kubelet

    def get_pods(self) -> Sequence[PodRecord]:
        return self._kubelet._pods.get_pods()

    def get_pod_by_name(self, namespace: str, name: str) -> PodRecord | None:
        for record in self._kubelet._pods.get_pods():
            if record.spec.namespace == namespace and record.spec.name == name:
                return record
        return None

    def update_allocated_devices(self) -> None:
        self._kubelet._manager.update_allocated_devices()

    def get_devices(self, uid: str, container: str) -> Mapping[str, DeviceAllocateInfo]:
        return self._kubelet._manager.pod_devices.container_resources(uid, container)

    def allocatable(self) -> Mapping[str, list[tuple[str, tuple[int, ...]]]]:
        return self._kubelet._allocatable()


class DevKubelet:
    """A stand-in for the kubelet's device manager and PodResources server, on real unix sockets (grpc.aio).

    ``device_plugin_dir`` plays ``/var/lib/kubelet/device-plugins``;
    ``pod_resources_socket`` defaults to ``<parent>/pod-resources/kubelet.sock``.

    Options:

    * ``kep_mode``: pods finishing call PostStopContainer and Deallocate (the
      unmerged KEP); stock kubelets never do;
    * ``pod_resources_rate``: the PodResources token bucket (calls per
      second, burst), None for no limit;
    * ``pod_resources_get``: the KubeletPodResourcesGet gate (off by default
      in 1.32: Get answers UNKNOWN "PodResources API Get method disabled");
    * ``list_active_pods_only``: List as kubelets >= 1.34 answer it (active
      pods only); by default as 1.32 (finished and rejected pods listed too);
    * ``write_checkpoint``: write ``kubelet_internal_checkpoint`` as the
      kubelet does; False keeps it in memory only (never read or written on disk);
    * ``pod_list_delay``: the default for :meth:`restart`: seconds after a
      restart during which the pod manager is still empty;
    * ``housekeeping_period``: seconds between housekeeping ticks
      (``housekeepingPeriod``, 2 s, the default); None runs housekeeping only
      when :meth:`housekeeping` is called;
    * ``drop_after``: drop a resource whose endpoint stayed stopped that many
      seconds (the kubelet waits 5 minutes); None (the default) never drops;
    * ``endpoints_by``: how the device manager keys plugin endpoints, which
      decides what a second instance of one plugin (a rolling update with
      ``maxSurge``) does to the first (see :mod:`~devplug.devkubelet.endpoints`):
      ``"socket-path"`` (the default; kubelets with Kubernetes PR #135437,
      merged 2025-11-25) or ``"resource-name"`` (every kubelet before it,
      v1.32.10 included). In both, a newer registration does not close the
      older one, whose stream keeps feeding the resource's device list;
      they differ in what the older stream's end does;
    * ``cgroups``: run every container as a real process in a real cgroup of
      this :class:`~devplug.devkubelet.cgroups.CgroupLayout` (root needed;
      see :mod:`~devplug.devkubelet.containers`). The layout's root cgroup
      and everything below it are made here and removed by :meth:`close`.
      None (the default) runs no process: containers stop at once;
    * ``dev_root``: the node's ``/dev`` for the runtime's device check
      (a kernel model's dev folder in tests); settable as :attr:`dev_root`;
    * ``check_device_nodes``: refuse a DeviceSpec host path that is not a
      device node, as containerd does; implied by a ``dev_root`` other than
      ``/dev``, the default from devplug 1.0, a DeprecationWarning until then
      (see :mod:`~devplug.devkubelet.devicespecs`); settable;
    * ``dra``: run the kubelet's DRA side with these timings (see
      :class:`~devplug.devkubelet.dra.node.DRAConfig`), in the root directory
      ``device_plugin_dir.parent``; None (the default) runs none. ``on_wipe``
      receives the drivers whose ResourceSlices the kubelet deletes ("": all
      of the node's).

    :meth:`stop` is a kubelet process ending (containers keep running, a
    later :meth:`start` is a restart); :meth:`close` also kills every
    container and removes every cgroup made.
    """

    def __init__(
        self,
        device_plugin_dir: Path,
        *,
        pod_resources_socket: Path | None = None,
        kep_mode: bool = False,
        register_dial_timeout: float = 10.0,
        pod_resources_rate: tuple[float, int] | None = (100.0, 10),
        pod_resources_get: bool = False,
        list_active_pods_only: bool = False,
        write_checkpoint: bool = True,
        pod_list_delay: float = 0.0,
        housekeeping_period: float | None = HOUSEKEEPING_PERIOD,
        drop_after: float | None = None,
        endpoints_by: EndpointKeying = "socket-path",
        cgroups: CgroupLayout | None = None,
        dev_root: Path = Path("/dev"),
        check_device_nodes: bool = False,
        dra: DRAConfig | None = None,
        on_wipe: Callable[[str], None] | None = None,
    ) -> None:
        self.device_plugin_dir = Path(device_plugin_dir).absolute()
        self.pod_resources_socket = (
            Path(pod_resources_socket).absolute()
            if pod_resources_socket is not None
            else self.device_plugin_dir.parent / "pod-resources" / KUBELET_SOCKET
        )
        #: When True, pods finishing call PostStopContainer and Deallocate on plugins that advertise them.
        self.kep_mode = kep_mode
        #: When False, every PodResources call fails with UNAVAILABLE (a simulated outage).
        self.pod_resources_available = True
        #: The KubeletPodResourcesGet feature gate.
        self.pod_resources_get = pod_resources_get
        #: List answers active pods only, as kubelets >= 1.34 do.
        self.list_active_pods_only = list_active_pods_only
        #: Every call the dev kubelet made or received, oldest first.
        self.events: list[KubeletEvent] = []
        #: Whether the checkpoint file is written (a kubelet whose checkpoint devplug cannot see when False:
        #: another root dir, or the folder not mounted whole). Settable at any time.
        self.write_checkpoint = write_checkpoint
        self._pod_list_delay = pod_list_delay
        if housekeeping_period is not None and not (math.isfinite(housekeeping_period) and housekeeping_period > 0):
            raise KubeletError(
                f"housekeeping_period must be a number of seconds above 0, or None, not {housekeeping_period!r}"
            )
        self._housekeeping_period = housekeeping_period
        self._housekeeping: asyncio.Task[None] | None = None
        self._dial_timeout = register_dial_timeout
        self._pod_resources_rate = pod_resources_rate
        self._drop_after = drop_after
        if endpoints_by not in ENDPOINT_KEYINGS:
            raise KubeletError(f"endpoints_by must be one of {', '.join(ENDPOINT_KEYINGS)}, not {endpoints_by!r}")
        #: How the device manager keys plugin endpoints ("socket-path" or "resource-name").
        self.endpoints_by: EndpointKeying = endpoints_by
        self._resources: dict[str, Resource] = {}
        self._registrations: dict[str, int] = {}
        self._listeners: list[Callable[[KubeletEvent], None]] = []
        self._waiters: set[asyncio.Future[None]] = set()
        self._background: set[asyncio.Task[Any]] = set()
        self._servers: list[grpc.aio.Server] = []
        self._generation = 0
        self._running = False
        self._started_before = False
        self._window_timer: asyncio.TimerHandle | None = None
        self._memory_checkpoint: KubeletCheckpoint | None = None
        self._checkpoint_writes = 0
        self._sync_loop = SyncLoop(self._waited, self._changed)
        self._pods = PodManager()
        self._manager = DeviceManager(
            self._endpoint_for,
            self._devices_for,
            lambda: {p.uid for p in self._pods.active_pods()},
            lambda: self._pods.sources_ready,
            self._write_checkpoint,
            self._record,
        )
        self._runtime = ContainerRuntime(
            cgroups,
            lambda kind, detail: self._record(kind, "", detail, ()),
            dev_root=dev_root,
            check_device_nodes=check_device_nodes,
        )
        self._dra = (
            DRAKubelet(
                self.device_plugin_dir.parent,
                dra,
                lambda kind, driver, detail: self._record(kind, driver, detail, ()),
                changed=self._changed,
                active_pods=lambda: {p.uid for p in self._pods.active_pods()},
                sources_ready=lambda: self._pods.sources_ready,
                on_wipe=on_wipe,
            )
            if dra is not None
            else None
        )
        claims = PodClaims(
            self._dra,
            lambda kind, driver, detail: self._record(kind, driver, detail, ()),
            backoff=dra.pod_sync_backoff if dra is not None else None,
        )
        self._lifecycle = PodLifecycle(
            self._pods, self._manager, self._endpoint_for, self._record, self._runtime, claims
        )
        self._resync: asyncio.Task[None] | None = None
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def kubelet_socket(self) -> Path:
        """Where Registration is served: ``device_plugin_dir / "kubelet.sock"``."""
        return self.device_plugin_dir / KUBELET_SOCKET

    @property
    def checkpoint_path(self) -> Path:
        """``device_plugin_dir / "kubelet_internal_checkpoint"``."""
        return self.device_plugin_dir / CHECKPOINT_FILE

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._running

    async def start(self, *, pod_list_delay: float | None = None) -> None:
        """Start like a kubelet process: clean the folder, restore the checkpoint, then serve.

        Every entry at the top of the device-plugin folder that is not a
        directory is deleted, except ``kubelet_internal_checkpoint``
        (``CleanupPluginDirectory``). The device manager starts empty and
        restores ``podDevices`` and the registered resources from the
        checkpoint (``readCheckpoint``). Serves Registration on
        ``kubelet.sock`` and PodResources on its socket.

        Every start after the first is a kubelet restart: the pod manager is
        empty and the sources are not ready for ``pod_list_delay`` seconds
        (default: the constructor's), or until :meth:`load_pods`.
        """
        if self._running:
            raise KubeletError("the dev kubelet is already running")
        if self._closed:
            raise KubeletError("the dev kubelet is closed")
        if self.cgroup_layout is not None:  # the node-allocatable and QoS cgroups (qosContainerManagerImpl.Start)
            try:
                for literal in self.cgroup_layout.kubelet_cgroups():
                    self._runtime.ensure_cgroup(literal)
            except OSError as exc:
                raise KubeletError(
                    f"cannot make the kubelet's cgroups ({self.cgroup_layout.describe()}): {exc}"
                ) from exc
        kubelet_target = unix_target(self.kubelet_socket)
        pod_resources_target = unix_target(self.pod_resources_socket)
        if self._dra is not None:  # reads dra_manager_state first: a corrupt one stops the start
            await self._dra.start()
        self.device_plugin_dir.mkdir(parents=True, exist_ok=True)
        self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
        cleanup_plugin_directory(self.device_plugin_dir, keep=CHECKPOINT_FILE)
        if is_socket(self.pod_resources_socket):
            self.pod_resources_socket.unlink()
        self._generation += 1
        registration = grpc.aio.server()
        add_registration_servicer(registration, RegistrationServicer(self._register, self._refused))
        pod_resources = grpc.aio.server()
        add_podresources_servicer(
            pod_resources,
            PodResourcesServicer(
                _PodResourcesSource(self),
                lambda: (self.pod_resources_available, self.pod_resources_get, self.list_active_pods_only),
                self._pod_resources_rate,
            ),
        )
        for server, target in ((registration, kubelet_target), (pod_resources, pod_resources_target)):
            try:
                server.add_insecure_port(target)
            except RuntimeError as exc:
                for started in self._servers:
                    await started.stop(None)
                self._servers.clear()
                if self._dra is not None:
                    await self._dra.stop()
                raise KubeletError(f"cannot serve on {target}: {exc}") from exc
        self._start_device_manager()
        for server in (registration, pod_resources):
            await server.start()
            self._servers.append(server)
        self._running = True
        restarted, self._started_before = self._started_before, True
        if restarted:
            delay = self._pod_list_delay if pod_list_delay is None else pod_list_delay
            self._pods.loaded = False
            self._pods.sources_ready = False
            if delay > 0:
                self._window_timer = asyncio.get_running_loop().call_later(delay, self._end_window)
            else:
                self._lifecycle.load_pods()
        if self._dra is not None and self._dra.config.pod_resync_period is not None:
            self._resync = asyncio.get_running_loop().create_task(self._resync_loop(self._dra.config.pod_resync_period))
        if self._housekeeping_period is not None:
            self._housekeeping = asyncio.get_running_loop().create_task(
                self._housekeeping_ticks(self._housekeeping_period)
            )
        self._changed()

    def _start_device_manager(self) -> None:
        """``newManagerImpl`` + ``Start``/``readCheckpoint``: an empty manager, then what the checkpoint holds."""
        self._manager.reset()
        if self.write_checkpoint:
            found = self.checkpoint_path.exists()
            checkpoint, detail = load_checkpoint(self.checkpoint_path)
        else:
            checkpoint = self._memory_checkpoint
            found = checkpoint is not None
            detail = "kept in memory (write_checkpoint=False)"
        registered: Mapping[str, tuple[str, ...]] = {}
        if checkpoint is not None:
            skipped = restore_pod_devices(checkpoint, self._manager.pod_devices)
            registered = checkpoint.registered_devices
            detail += f"; {len(checkpoint.entries) - skipped} entries restored"
            if skipped:
                detail += f", {skipped} skipped (AllocResp does not unmarshal)"
        self._manager.restored()
        for res in self._resources.values():
            res.cancel_drop()
        self._resources = {name: Resource.restored(name) for name in registered}
        for res in self._resources.values():
            self._schedule_drop(res)
        if found:
            self._record("checkpoint-read", "", detail, ())

    async def stop(self) -> None:
        """Stop serving, close every plugin channel, remove the dev kubelet's sockets.

        Registrations end with it (devices show as unhealthy); pods and their
        devices are kept. A later :meth:`start` is a kubelet restart.
        """
        if not self._running:
            return
        self._running = False
        self._generation += 1
        if self._window_timer is not None:
            self._window_timer.cancel()
            self._window_timer = None
        servers, self._servers = self._servers, []
        for server in servers:
            await server.stop(None)
        if self._resync is not None:
            self._resync.cancel()
            await asyncio.gather(self._resync, return_exceptions=True)
            self._resync = None
        if self._housekeeping is not None:
            self._housekeeping.cancel()
            await asyncio.gather(self._housekeeping, return_exceptions=True)
            self._housekeeping = None
        if self._dra is not None:
            await self._dra.stop()
        for resource in self._resources.values():
            clients = [*resource.superseded, resource.client]
            resource.client, resource.superseded = None, []
            resource.mark_unhealthy()
            for client in clients:
                if client is not None:
                    await client.close()
        for path in (self.kubelet_socket, self.pod_resources_socket):
            if is_socket(path):
                path.unlink(missing_ok=True)
        for task in list(self._background):
            await task
        self._changed()

    async def close(self) -> None:
        """Stop serving, then kill every container and remove every cgroup made (idempotent; no restart after)."""
        await self.stop()
        if self._closed:
            return
        self._closed = True
        await self._lifecycle.close()
        await self._runtime.close()
        self._changed()

    async def restart(
        self, pod_list_delay: float | None = None, *, removed_static_pods: Sequence[str | tuple[str, str]] = ()
    ) -> None:
        """A kubelet restart: stop, then start as a new process (see :meth:`start`).

        Pods keep running and keep their devices as far as the checkpoint
        restores them. Every resource restored from the checkpoint shows no
        devices until its plugin registers again. For ``pod_list_delay``
        seconds (default: the constructor's ``pod_list_delay``) PodResources
        List succeeds with no pods and nothing is freed; then the pods reappear.

        ``removed_static_pods`` (names in ``default``, or ``(namespace, name)``)
        lose their static manifest while the kubelet is stopped
        (:meth:`remove_static_pod_while_stopped`): the restarted kubelet never
        loads them, and its housekeeping kills them.
        """
        if isinstance(removed_static_pods, str):  # one name, not its letters
            removed_static_pods = (removed_static_pods,)
        keys = [("default", p) if isinstance(p, str) else p for p in removed_static_pods]
        for namespace, name in keys:  # checked before anything stops
            record = self._pods.by_name((namespace, name))
            if record is None or record.phase is not PodPhase.RUNNING:
                state = "no such pod" if record is None else f"it is {record.phase}"
                raise KubeletError(f"cannot remove the static pod manifest of {namespace}/{name}: {state}")
        self._record("restart", "", f"restarting; {len(self._resources)} resource(s) must register again", ())
        await self.stop()
        for namespace, name in keys:
            self.remove_static_pod_while_stopped(name, namespace)
        await self.start(pod_list_delay=pod_list_delay)

    def remove_static_pod_while_stopped(self, pod_name: str, namespace: str = "default") -> None:
        """The pod's static manifest is removed while the kubelet is stopped (between :meth:`stop` and :meth:`start`).

        Nothing happens to the pod now: no kubelet runs. The restarted kubelet
        does not load it (its pod lists lack it), so PodResources never lists
        it again, while its containers and sandbox keep running in its cgroup
        and its devices, restored from the checkpoint, stay in ``podDevices``
        until the first ``UpdateAllocatedDevices`` after the sources are
        ready, which hands them to the next pod. Its phase is ``deleted`` from
        now on. The first housekeeping once the sources are ready kills it
        (see :meth:`housekeeping`). Raises :class:`KubeletError` while the
        kubelet runs, or unless the pod runs.
        """
        if self._running:
            raise KubeletError(
                f"cannot remove the static pod manifest of {namespace}/{pod_name} while stopped: the kubelet runs "
                "(remove_static_pod removes it from a running kubelet)"
            )
        self._lifecycle.orphan_static_pod((namespace, pod_name))
        self._changed()

    async def housekeeping(self) -> tuple[str, ...]:
        """One housekeeping now, as a tick brings it: a ``HOUSEKEEPING`` turn of the sync loop.

        Waits for the loop (a held Allocate delays it), then, once the sources
        are ready (``kl.sourcesReady.AllReady()``; skipped before),
        ``HandlePodCleanups``: every orphan (a pod the runtime still runs that
        neither the pod manager nor a pod worker knows, as a static pod whose
        manifest was removed while the kubelet was stopped) is handed to a pod
        worker that kills it with a grace period of 1 s (2 s in
        ``killContainer``), and its pod cgroup destroyed (every process in it
        SIGKILLed) in the background. Returns the orphans it found
        (``namespace/name (uid ...)``), empty when skipped or none.
        """
        async with self._sync_loop.turn("HOUSEKEEPING"):
            if not self._pods.sources_ready:
                _log.debug("dev kubelet: SyncLoop (housekeeping, skipped): sources aren't ready yet")
                return ()
            try:
                found = self._lifecycle.housekeeping()
            finally:
                self._changed()
        return tuple(f"{r.label} (uid {r.uid})" for r in found)

    async def _housekeeping_ticks(self, period: float) -> None:
        """``housekeepingTicker``: a housekeeping every ``period`` seconds on a fixed schedule from the start.

        A Go ticker's channel holds one tick: while a tick waits for the loop
        the next ones are dropped, so after a long hold housekeeping runs once,
        then at the next tick of the schedule.
        """
        loop = asyncio.get_running_loop()
        origin = loop.time()
        while True:
            elapsed = loop.time() - origin
            await asyncio.sleep(period * (math.floor(elapsed / period) + 1) - elapsed)
            try:
                await self.housekeeping()
            except Exception:  # "Failed cleaning pods": logged, and the loop goes on
                _log.exception("dev kubelet: housekeeping failed")

    def load_pods(self) -> bool:
        """End the restart window now: the main loop has loaded the pods, the sources are ready.

        Returns False when there was no window to end.
        """
        if self._window_timer is not None:
            self._window_timer.cancel()
            self._window_timer = None
        ended = self._lifecycle.load_pods()
        self._changed()
        return ended

    def _end_window(self) -> None:
        self._window_timer = None
        self._spawn(self._first_pod_lists())

    async def _first_pod_lists(self) -> None:
        """The sources' first pod lists reach the sync loop (``HandlePodAdditions`` of every pod, then ready)."""
        async with self._sync_loop.turn("ADD"):
            self._lifecycle.load_pods()

    async def __aenter__(self) -> DevKubelet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- observation -----------------------------------------------------------------------------

    def add_listener(self, listener: Callable[[KubeletEvent], None]) -> None:
        """Call ``listener`` with every event as it is recorded (from the event loop)."""
        self._listeners.append(listener)

    def resource(self, name: str) -> ResourceView | None:
        """A snapshot of a resource the kubelet knows (None if unknown or dropped)."""
        res = self._resources.get(name)
        if res is None:
            return None
        return ResourceView(
            name=res.name,
            endpoint=res.endpoint,
            options=res.options or PluginOptions(),
            devices=res.devices,
            stream_open=res.stream_open,
            registered=res.client is not None,
            registrations=self.registrations(name),
            in_use=frozenset(self._manager.in_use(name)),
        )

    def resources(self) -> list[ResourceView]:
        """Every known resource, by name."""
        return [view for name in sorted(self._resources) if (view := self.resource(name)) is not None]

    def registrations(self, resource: str) -> int:
        """How many times ``resource`` registered successfully (counted across restarts and drops)."""
        return self._registrations.get(resource, 0)

    def pods(self) -> list[AdmittedPod]:
        """The running pods (admitted, not finished), in admission order, whether or not the kubelet loaded them."""
        return [record.admitted() for record in self._pods.running()]

    def known_pods(self) -> list[AdmittedPod]:
        """Every existing pod object (running, finished, rejected), in admission order."""
        return [record.admitted() for record in self._pods.known()]

    def pod_phase(self, name: str, namespace: str = "default") -> PodPhase | None:
        """The phase of the newest pod object called ``namespace/name`` (``deleted`` included); None if never seen."""
        record = self._pods.latest((namespace, name))
        return record.phase if record is not None else None

    def attributed(self, resource: str) -> dict[str, tuple[str, str]]:
        """Device ID -> (pod ``namespace/name``, container) for every device of ``resource`` held by a live pod.

        A live pod is one whose containers run (or that is being admitted),
        the restart window notwithstanding. Init containers count; a device
        reused by a later container maps to the last container holding it.
        Devices of finished, rejected or deleted pods are never in it, even
        while ``podDevices`` still has their entries.
        """
        live = self._pods.live_uids()
        result: dict[str, tuple[str, str]] = {}
        for uid, container, res, info in self._manager.pod_devices.entries():
            record = self._pods.by_uid(uid)
            if res != resource or uid not in live or record is None:
                continue
            for device_id in info.device_ids:
                result[device_id] = (record.label, container)
        return result

    def pod_device_entries(self) -> list[PodDeviceEntry]:
        """Every entry of the kubelet's ``podDevices`` store, inactive pods' included (as the checkpoint has them)."""
        return self._manager.entries(self._label_of_uid)

    @property
    def checkpoint_writes(self) -> int:
        """How many times the checkpoint file was written (each write is a new inode); 0 when disabled."""
        return self._checkpoint_writes

    @property
    def last_checkpoint(self) -> KubeletCheckpoint | None:
        """What the latest ``writeCheckpoint`` wrote (kept even when ``write_checkpoint`` is False), or None."""
        return self._memory_checkpoint

    @property
    def sources_ready(self) -> bool:
        """False during the restart window (``UpdateAllocatedDevices`` does nothing meanwhile)."""
        return self._pods.sources_ready

    @property
    def pod_list_loaded(self) -> bool:
        """False during the restart window (PodResources List and Get see no pods)."""
        return self._pods.loaded

    def sync_loop_ops(self, kind: str | None = None, pod: str | None = None) -> list[SyncLoopOp]:
        """The sync loop's turns so far (of one kind, for one ``namespace/name``, if given), in the order they ended.

        Each says how long it waited behind the loop and how long it held it:
        an admission's ``waited`` is how long a held Allocate elsewhere delayed it.
        """
        return [
            op for op in self._sync_loop.ops if (kind is None or op.kind == kind) and (pod is None or op.pod == pod)
        ]

    @property
    def sync_loop_busy(self) -> str:
        """The turn that has the sync loop now (``"ADD default/p"``), or ``""`` when it is free."""
        return self._sync_loop.busy

    @property
    def sync_loop_waiting(self) -> tuple[str, ...]:
        """The turns waiting for the sync loop now, first in line first (``"REMOVE default/q"``)."""
        return self._sync_loop.waiting

    def events_of(self, kind: str, resource: str | None = None) -> list[KubeletEvent]:
        """The recorded events of one kind (and resource, if given)."""
        return [e for e in self.events if e.kind == kind and (resource is None or e.resource == resource)]

    async def wait_for(
        self, predicate: Callable[[DevKubelet], bool], timeout: float = 5.0, *, what: str | None = None
    ) -> None:
        """Return once ``predicate(self)`` is true, re-checked on every state change.

        Raises :class:`TimeoutError` naming what was awaited (``what``, or the
        predicate's name and line) and the resources' state.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate(self):
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(
                    f"dev kubelet: timed out after {timeout:g}s waiting for {what or describe_predicate(predicate)}; "
                    f"{self._summary()}"
                )
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.add(waiter)
            try:
                await asyncio.wait_for(waiter, remaining)
            except asyncio.TimeoutError:
                pass
            finally:
                self._waiters.discard(waiter)

    async def wait_registered(self, resource: str, timeout: float = 5.0, *, after: int = 0) -> None:
        """Wait until ``resource`` has registered more than ``after`` times (``after=n``: a re-registration)."""
        await self.wait_for(
            lambda k: k.registrations(resource) > after,
            timeout,
            what=f"{resource} to register (registration count > {after})",
        )

    def _summary(self) -> str:
        dra = ""
        if self._dra is not None and self._dra.running:
            instances = [f"{v.driver} at {v.endpoint} (connected={v.connected})" for v in self._dra.plugins.views()]
            dra = "; DRA plugins: " + (", ".join(instances) or "none")
        if not self._resources:
            return "no resource is known" + dra
        parts = []
        for res in self._resources.values():
            healthy = sum(1 for d in res.devices if d.healthy)
            parts.append(
                f"{res.name}: registrations={self.registrations(res.name)} registered={res.client is not None} "
                f"stream_open={res.stream_open} capacity={len(res.devices)} allocatable={healthy}"
            )
        return "; ".join(parts) + dra

    def _label_of_uid(self, uid: str) -> str:
        record = self._pods.by_uid(uid)
        return record.label if record is not None else ""

    # -- pods ------------------------------------------------------------------------------------

    async def admit_pod(self, pod: PodSpec) -> AdmittedPod:
        """Admit a pod object: allocate devices for every container (init containers first), then start them.

        The pod gets ``pod.uid`` or a fresh uuid4. A finished or rejected pod
        of the same name is replaced (its object deleted); a running one is an
        error. Raises :class:`KubeletError` with the kubelet's message when the
        pod is rejected (it stays known in phase ``rejected``, and what it was
        already allocated stays attributed until the next
        ``UpdateAllocatedDevices``), or
        :class:`~devplug.devkubelet.devicemanager.ContainerStartError` when it
        was admitted but a container failed to start (the pod keeps running).
        With DRA, the pod's resource claims are prepared after its admission and
        before its sandbox: :class:`~devplug.devkubelet.dra.podclaims.ClaimPrepareError`
        when they cannot be (the pod stays admitted with nothing running until
        :meth:`sync_pod`, or the periodic resync, prepares them).

        The admission is a turn of the sync loop (:mod:`~devplug.devkubelet.syncloop`):
        it waits for every earlier turn, a held Allocate or
        GetPreferredAllocation among them, and holds the loop until its own
        calls to the plugins answer (they have no deadline). The claims,
        sandbox and containers are the pod worker's, after the turn.
        """
        async with self._sync_loop.turn("ADD", pod_label(pod)):
            try:
                record = await self._lifecycle.admit(pod, kep_mode=self.kep_mode)
            finally:
                self._stop_window_timer_if_loaded()
                self._changed()
        try:
            return await self._lifecycle.start_admitted(record)
        finally:
            self._changed()

    async def sync_pod(self, pod_name: str, namespace: str = "default") -> bool:
        """Sync the pod now, for its resource claims (what the pod worker does at its next sync).

        A pod admitted while its claims could not be prepared gets them
        prepared, then its sandbox and containers (raises
        :class:`~devplug.devkubelet.dra.podclaims.ClaimPrepareError` when they
        still cannot); a terminating pod whose claims could not be unprepared
        is tried again at once, in its termination's background task. Returns
        whether there was anything to do.
        """
        await self._sync_loop.dispatch("SYNC", f"{namespace}/{pod_name}")  # the sync tick, through the loop
        try:
            return await self._lifecycle.sync((namespace, pod_name))
        finally:
            self._changed()

    async def _resync_loop(self, period: float) -> None:
        """The pod workers' periodic resync of pods whose claims are still to be prepared."""
        while True:
            await asyncio.sleep(period)
            for namespace, name in self._lifecycle.pods_to_resync():
                try:
                    await self.sync_pod(name, namespace)
                except KubeletError as exc:  # recorded as pod-prepare-failed; the next resync tries again
                    _log.info("dev kubelet: resync of pod %s/%s: %s", namespace, name, exc)

    async def start_container(self, pod_name: str, container: str, namespace: str = "default") -> None:
        """(Re)start one container: PreStartContainer again when its plugins require it.

        A restart after a crash: the kubelet learns of the crash from the PLEG
        in its sync loop, so the restart waits for the loop (a held Allocate
        delays it), then runs in the pod worker.
        """
        await self._sync_loop.dispatch("PLEG", f"{namespace}/{pod_name}")
        try:
            await self._lifecycle.start_container((namespace, pod_name), container)
        finally:
            self._changed()

    async def finish_pod(self, pod_name: str, namespace: str = "default") -> None:
        """The pod's containers end on their own (exit 0; phase Succeeded); the pod object stays in the pod manager.

        Returns once their processes are gone; then the sandbox is stopped and
        the pod cgroup removed. Its devices stay attributed in ``podDevices`` until the next
        ``UpdateAllocatedDevices`` (the next allocation or PodResources List),
        and go to the next pod at once. In KEP mode, PostStopContainer and
        Deallocate are called now; stock kubelets call nothing.

        The containers end whatever the kubelet does; the kubelet learns of it
        from the PLEG in its sync loop, so the pod turns finished (and its
        sandbox and cgroup go) only once the loop is free.
        """
        try:
            record = await self._lifecycle.end_containers((namespace, pod_name))
            self._changed()
            await self._sync_loop.dispatch("PLEG", f"{namespace}/{pod_name}")
            await self._lifecycle.finish(record, kep_mode=self.kep_mode)
        finally:
            self._stop_window_timer_if_loaded()
            self._changed()

    async def remove_pod(self, pod_name: str, namespace: str = "default", *, wait: bool = True) -> None:
        """Delete a pod object gracefully, as ``kubectl delete pod`` does.

        A running pod turns ``terminating`` (still in the pod manager, still
        active, its devices still attributed) while its containers get SIGTERM
        and, after ``max(terminationGracePeriodSeconds, 2)`` seconds, SIGKILL;
        once they are gone it finishes, its sandbox and cgroup go, and it
        leaves the pod manager and PodResources. A finished or rejected pod
        leaves at once; a grace period of 0 is :meth:`force_delete_pod`.
        ``wait=False`` returns once the termination has begun.

        In KEP mode, the pod's PostStopContainer and Deallocate are called
        after its containers stopped; a failure of theirs is raised (with
        ``wait``) once the pod is gone. Stock kubelets call nothing.

        The deletion reaches the kubelet as a config ``UPDATE``: it waits for
        the sync loop; the kill runs in the pod worker, outside it.
        """
        async with self._sync_loop.turn("UPDATE", f"{namespace}/{pod_name}"):
            try:
                task = self._lifecycle.remove((namespace, pod_name), kep_mode=self.kep_mode)
            finally:
                self._stop_window_timer_if_loaded()
                self._changed()
        if task is not None and wait:
            failures = await asyncio.shield(task)
            if failures:
                raise KubeletError(f"pod {namespace}/{pod_name} removed, but: " + "; ".join(failures))

    async def remove_static_pod(self, pod_name: str, namespace: str = "default") -> None:
        """The pod's static manifest is removed: it leaves the pod manager now, its containers die later.

        The removal window (``HandlePodRemoves``): from this call on,
        PodResources List and the next ``UpdateAllocatedDevices`` (the next
        Allocate's, which hands its devices on, and the checkpoint written
        after it) no longer know the pod, while its containers get SIGTERM
        and, after ``max(terminationGracePeriodSeconds, 2)`` seconds, SIGKILL
        in the background; then its sandbox and cgroup go. Returns at once;
        :meth:`wait_containers_exited` waits for the end.
        """
        await self._remove_now(pod_name, namespace, None, "its static pod manifest was removed")

    async def force_delete_pod(self, pod_name: str, namespace: str = "default") -> None:
        """``kubectl delete pod --grace-period=0 --force``: as :meth:`remove_static_pod`, with 2 s of grace.

        The API server deletes the object at once after setting its deletion
        grace period to 0; the pod worker then kills with 1 s, which
        ``killContainer`` raises to 2 s.
        """
        await self._remove_now(pod_name, namespace, 0, "force-deleted (--grace-period=0 --force)")

    async def _remove_now(self, pod_name: str, namespace: str, deletion_grace: int | None, how: str) -> None:
        """A config ``REMOVE`` (``HandlePodRemoves``): a turn of the sync loop; the kill runs in the pod worker."""
        async with self._sync_loop.turn("REMOVE", f"{namespace}/{pod_name}"):
            try:
                self._lifecycle.remove_now(
                    (namespace, pod_name), kep_mode=self.kep_mode, deletion_grace=deletion_grace, how=how
                )
            finally:
                self._stop_window_timer_if_loaded()
                self._changed()

    async def wait_containers_exited(self, pod_name: str, namespace: str = "default", timeout: float = 60.0) -> None:
        """Wait until no container of the newest pod object called ``namespace/pod_name`` runs."""
        await self.wait_for(
            lambda k: not k.containers_running(pod_name, namespace),
            timeout,
            what=f"the containers of pod {namespace}/{pod_name} to exit",
        )

    def pod_cleaned_up(self, pod_name: str, namespace: str = "default") -> bool:
        """Whether the pod's containers and sandbox are gone and its cgroup removed (or it never ran)."""
        record = self._pod_record(pod_name, namespace)
        sandbox = record.sandbox is not None and record.sandbox.running
        cgroup = record.cgroup is not None and any(p.is_dir() for p in self.pod_cgroup_paths(pod_name, namespace))
        return not (record.containers_running or sandbox or cgroup)

    async def wait_pod_cleaned_up(self, pod_name: str, namespace: str = "default", timeout: float = 60.0) -> None:
        """Wait until :meth:`pod_cleaned_up` (the kubelet destroyed the pod's cgroup)."""
        await self.wait_for(
            lambda k: k.pod_cleaned_up(pod_name, namespace),
            timeout,
            what=f"pod {namespace}/{pod_name} to be cleaned up (sandbox stopped, cgroup removed)",
        )

    # -- DRA ---------------------------------------------------------------------------------------

    @property
    def dra(self) -> DRAKubelet | None:
        """The DRA side (plugin watcher, plugin manager, DRA manager), or None when it runs without DRA."""
        return self._dra

    def _need_dra(self) -> DRAKubelet:
        if self._dra is None:
            raise KubeletError("this dev kubelet runs without DRA (DevKubelet(..., dra=DRAConfig()))")
        return self._dra

    @property
    def plugins_registry(self) -> Path:
        """Where DRA plugins put their registration sockets: ``<root>/plugins_registry``."""
        return self._need_dra().registry

    def dra_plugins(self, driver: str | None = None) -> list[DRAPluginView]:
        """The registered instances of DRA drivers (of ``driver``, or all), oldest first; empty while stopped."""
        dra = self._need_dra()
        return dra.plugins.views(driver) if dra.running else []

    def dra_claims(self) -> list[ClaimState]:
        """The DRA manager's claim cache (what ``dra_manager_state`` holds, and whether each is prepared)."""
        return self._need_dra().manager.claims()

    def device_health(self, driver: str, pool: str, device: str) -> DeviceHealth:
        """The kubelet's health of one DRA device now (Unknown when unknown or timed out)."""
        return self._need_dra().health.get(driver, pool, device)

    async def reconcile_dra(self) -> list[str]:
        """One pass of the DRA manager's reconcile loop now (unprepare owed for inactive pods); the failures."""
        return await self._need_dra().reconcile()

    def _pod_and_container(self, pod_name: str, container: str, namespace: str) -> tuple[PodRecord, ContainerSpec]:
        record = self._pod_record(pod_name, namespace)
        spec = next((c for c in record.spec.containers if c.name == container), None)
        if spec is None:
            raise KubeletError(f"pod {record.label} has no container {container!r}")
        return record, spec

    def allocated_resources_status(
        self, pod_name: str, container: str, namespace: str = "default"
    ) -> tuple[ResourceStatus, ...]:
        """The container status's ``allocatedResourcesStatus`` for its claims, as the kubelet would write it now."""
        record, spec = self._pod_and_container(pod_name, container, namespace)
        return self._need_dra().manager.allocated_resources_status(record.spec.resource_claims, spec.container_claims)

    def container_cdi_devices(self, pod_name: str, container: str, namespace: str = "default") -> list[str]:
        """The CDI device names the kubelet passes to the runtime for the container's claims (``GetResources``)."""
        record, spec = self._pod_and_container(pod_name, container, namespace)
        return self._need_dra().manager.cdi_devices(record.spec.resource_claims, spec.container_claims)

    # -- containers and cgroups ------------------------------------------------------------------

    @property
    def cgroup_layout(self) -> CgroupLayout | None:
        """Where containers get their cgroups (None: no processes run)."""
        return self._runtime.layout

    @property
    def dev_root(self) -> Path:
        """The node's ``/dev`` for the runtime's device check: DeviceSpec host paths under /dev are looked up here."""
        return self._runtime.dev_root

    @dev_root.setter
    def dev_root(self, value: Path) -> None:
        self._runtime.dev_root = Path(value)

    @property
    def check_device_nodes(self) -> bool:
        """Whether DeviceSpec host paths must be device nodes (as containerd wants) even under ``/dev`` itself."""
        return self._runtime.check_device_nodes

    @check_device_nodes.setter
    def check_device_nodes(self, value: bool) -> None:
        self._runtime.check_device_nodes = bool(value)

    def liveness_config(self) -> dict[str, str]:
        """The ``[liveness]`` table a devplug daemon needs to find these pods' cgroups.

        ``{"cgroup_mount": ..., "cgroup_root": ..., "cgroup_driver": ...}``:
        the cgroup file system (v1: the folder of the controller mounts; v2:
        the cgroup2 mount), the kubelet's ``--cgroup-root``, and the driver.
        Empty when no container runs as a process (no :class:`CgroupLayout`):
        there are no cgroups to read.
        """
        return self.cgroup_layout.liveness_config() if self.cgroup_layout is not None else {}

    def _pod_record(self, pod_name: str, namespace: str) -> PodRecord:
        record = self._pods.latest((namespace, pod_name))
        if record is None:
            raise KubeletError(f"no pod {namespace}/{pod_name} was ever admitted")
        return record

    def pod_uid(self, pod_name: str, namespace: str = "default") -> str:
        """The UID of the newest pod object called ``namespace/pod_name`` (deleted ones included)."""
        return self._pod_record(pod_name, namespace).uid

    def containers_running(self, pod_name: str, namespace: str = "default") -> bool:
        """Whether a container (not the sandbox) of the newest pod object of that name is still alive."""
        return self._pod_record(pod_name, namespace).containers_running

    def running_containers(self, pod_name: str, namespace: str = "default") -> list[str]:
        """The names of that pod's containers still alive."""
        return [c.name for c in self._pod_record(pod_name, namespace).containers if c.running]

    def pod_pids(self, pod_name: str, namespace: str = "default") -> set[int]:
        """Every process in the pod's cgroup (its containers' and its sandbox's); empty once it is gone."""
        return self._runtime.cgroup_pids(self._pod_record(pod_name, namespace).cgroup)

    def container_pids(self, pod_name: str, container: str, namespace: str = "default") -> set[int]:
        """The live processes of one container (its init first among them is :meth:`container_pid`)."""
        crec = self._container_record(pod_name, container, namespace)
        return self._runtime.pids(crec.runtime) if crec.runtime is not None else set()

    def container_pid(self, pod_name: str, container: str, namespace: str = "default") -> int | None:
        """The PID of the container's init while it runs (None without processes)."""
        crec = self._container_record(pod_name, container, namespace)
        return crec.runtime.pid if crec.runtime is not None and crec.runtime.running else None

    def container_failure(self, pod_name: str, container: str, namespace: str = "default") -> str | None:
        """Why the container's last creation failed (``CreateContainerError: ...``), None after a start."""
        return self._container_record(pod_name, container, namespace).failure

    def _container_record(self, pod_name: str, container: str, namespace: str) -> ContainerRecord:
        record = self._pod_record(pod_name, namespace)
        crec = record.container(container)
        if crec is None:
            raise KubeletError(f"pod {record.label} has no container {container!r}")
        return crec

    def pod_cgroup_paths(self, pod_name: str, namespace: str = "default") -> tuple[Path, ...]:
        """The pod cgroup's folders, one per hierarchy (they exist until the kubelet destroys the cgroup)."""
        record = self._pod_record(pod_name, namespace)
        if self.cgroup_layout is None or record.cgroup is None:
            return ()
        return self.cgroup_layout.paths(record.cgroup)

    def container_cgroup_paths(self, pod_name: str, container: str, namespace: str = "default") -> tuple[Path, ...]:
        """The folders of the container's cgroup (its latest instance), one per hierarchy."""
        crec = self._container_record(pod_name, container, namespace)
        if self.cgroup_layout is None or crec.runtime is None or crec.runtime.cgroup is None:
            return ()
        return self.cgroup_layout.paths(crec.runtime.cgroup)

    def _stop_window_timer_if_loaded(self) -> None:
        if self._window_timer is not None and self._pods.loaded and self._pods.sources_ready:
            self._window_timer.cancel()
            self._window_timer = None

    # -- checkpoint ------------------------------------------------------------------------------

    def _write_checkpoint(self, why: str) -> None:
        """``writeCheckpoint``: podDevices as it is now, and the healthy devices of every listed resource."""
        registered = {name: res.healthy_ids() for name, res in self._resources.items() if res.listed}
        checkpoint = build_checkpoint(self._manager.pod_devices, registered)
        self._memory_checkpoint = checkpoint
        if not self.write_checkpoint:
            return
        try:
            write_checkpoint(self.checkpoint_path, checkpoint)
        except OSError as exc:
            _log.warning("dev kubelet: writing the checkpoint (%s) failed: %s", why, exc)
            raise KubeletError(f'failed to write checkpoint file "{CHECKPOINT_FILE}": {exc}') from exc
        self._checkpoint_writes += 1
        _log.debug("checkpoint written (%s): %d entries", why, len(checkpoint.entries))
        self._changed()

    # -- internals -------------------------------------------------------------------------------

    def _changed(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _record(self, kind: str, resource: str, detail: str, device_ids: tuple[str, ...] = ()) -> None:
        event = KubeletEvent(time.time(), kind, resource, detail, tuple(device_ids))
        self.events.append(event)
        _log.debug("%s", event)
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:
                _log.exception("dev kubelet event listener failed")
        self._changed()

    def _waited(self, op: SyncLoopOp) -> None:
        detail = f"{op.label} waited {op.waited:.3f}s behind {op.behind}, then held the loop {op.held:.3f}s"
        self._record("sync-loop-waited", "", detail, ())

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _endpoint_for(self, resource: str) -> Endpoint | None:
        res = self._resources.get(resource)
        return Endpoint(resource, res.client, res.options) if res is not None else None

    def _devices_for(self, resource: str) -> tuple[DeviceInfo, ...] | None:
        res = self._resources.get(resource)
        return res.devices if res is not None and res.listed else None

    def _allocatable(self) -> Mapping[str, list[tuple[str, tuple[int, ...]]]]:
        return {
            name: [(d.id, d.numa_nodes) for d in res.devices if d.healthy]
            for name, res in sorted(self._resources.items())
            if res.listed
        }

    def _refused(self, resource: str, reason: str) -> None:
        self._record("register-refused", resource, reason)

    async def _register(self, request: dp.RegisterRequest) -> None:
        name = str(request.resource_name)
        endpoint = str(request.endpoint)
        generation = self._generation
        socket = Path(os.path.normpath(f"{self.device_plugin_dir}/{endpoint}"))
        # PluginConnected: the options are GetDevicePluginOptions' answer; RegisterRequest.options is ignored
        client = await PluginClient.connect(name, endpoint, socket, self._dial_timeout)
        if generation != self._generation or not self._running:
            await client.close()
            raise KubeletError("the kubelet restarted while the registration was in progress")
        res = self._resources.get(name)
        if res is None:
            res = self._resources[name] = Resource(name)
        old, res.client = res.client, client
        res.endpoint = endpoint
        res.options = client.options
        self._registrations[name] = self._registrations.get(name, 0) + 1
        res.stream_open = False
        res.cancel_drop()
        opts = client.options
        flags = [
            flag
            for flag, on in (
                ("pre_start_required", opts.pre_start_required),
                ("get_preferred_allocation_available", opts.get_preferred_allocation_available),
                ("post_stop_required", opts.post_stop_required),
                ("deallocate_available", opts.deallocate_available),
            )
            if on
        ]
        detail = f"endpoint {endpoint}, options [{', '.join(flags)}]"
        if old is not None:
            detail += f", replaces endpoint {old.endpoint}"
        self._record("register", name, detail)
        if old is not None:  # not closed: its stream goes on (registerClient keeps the older client)
            res.superseded.append(old)
        client.watch(
            on_opened=lambda: self._stream_opened(res, client),
            on_list=lambda devices: self._stream_list(res, client, devices),
            on_end=lambda reason: self._stream_ended(res, client, reason),
        )

    def _stream_opened(self, res: Resource, client: PluginClient) -> None:
        if res.client is client:
            res.stream_open = True
            self._changed()

    def _stream_list(self, res: Resource, client: PluginClient, devices: tuple[DeviceInfo, ...]) -> None:
        """``genericDeviceUpdateCallback``: replace the device list, then rewrite the checkpoint."""
        if res.client is not client and client not in res.superseded:
            return
        if self._resources.get(res.name) is not res:
            return
        res.devices = devices
        res.listed = True
        healthy = sum(1 for d in devices if d.healthy)
        unhealthy = tuple(d.id for d in devices if not d.healthy)
        detail = f"{len(devices)} device(s), {healthy} healthy"
        if unhealthy:
            detail += ", unhealthy:"
        self._record("list-and-watch", res.name, detail, unhealthy)
        try:
            self._write_checkpoint(f"device list of {res.name}")
        except KubeletError as exc:  # the kubelet logs "Writing checkpoint encountered" and goes on
            _log.warning("%s", exc)

    def _stream_ended(self, res: Resource, client: PluginClient, reason: str) -> None:
        """``runClient`` after ``Run`` returned: disconnect the client the handler finds for this one."""
        if client in res.superseded:
            res.superseded.remove(client)
            self._spawn(client.close())
            current = res.client
            effect = older_stream_end(self.endpoints_by, client.endpoint, current.endpoint if current else None)
            if current is None or effect is OlderStreamEnd.ONLY_ITSELF:
                self._record(
                    "instance-disconnected",
                    res.name,
                    f"the older registration at {client.endpoint} ended ({reason}); the current one at "
                    f"{res.endpoint} is untouched (endpoints keyed by {self.endpoints_by})",
                )
                return
            if effect is OlderStreamEnd.CURRENT_BY_NAME:
                reason = f"an older registration's stream ended ({reason}), so the current one was disconnected"
            else:
                reason = (
                    f"an older registration on the same socket {client.endpoint} ended ({reason}), so the current "
                    "one was disconnected"
                )
            client = current
        elif res.client is not client:
            return
        res.client = None
        res.mark_unhealthy()
        self._record("stream-ended", res.name, f"{reason}; every device marked unhealthy")
        self._spawn(client.close())
        self._schedule_drop(res)

    def _schedule_drop(self, res: Resource) -> None:
        if self._drop_after is not None:
            res.cancel_drop()
            res.drop_timer = asyncio.get_running_loop().call_later(self._drop_after, self._drop, res)

    def _drop(self, res: Resource) -> None:
        """``GetCapacity`` past the grace period: the resource is forgotten and the checkpoint rewritten."""
        if self._resources.get(res.name) is res and res.client is None:
            del self._resources[res.name]
            self._record("resource-dropped", res.name, f"no registration within {self._drop_after:g}s")
            try:
                self._write_checkpoint(f"{res.name} dropped")
            except KubeletError as exc:
                _log.warning("%s", exc)
