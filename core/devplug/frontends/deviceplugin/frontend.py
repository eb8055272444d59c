"""One resource served through the kubelet's device-plugin API: the :class:`~devplug.engine.frontend.FrontEnd`
the core's :class:`~devplug.engine.resource.Resource` drives."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from devplug.api.convert import encode_device_entry, encode_list_and_watch, options_to_pb
from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.config import KubeletConfig
from devplug.drivers import DriverCapabilities
from devplug.engine import AllocationRecord, DeviceLifecycle, DeviceTable, ResourceStatus, TenantEnd
from devplug.frontends.callgate import CallGate
from devplug.frontends.deviceplugin.checkpointview import CheckpointView
from devplug.frontends.deviceplugin.pluginserver import PluginServer
from devplug.frontends.deviceplugin.servicer import DevicePluginService, StreamObserver
from devplug.frontends.deviceplugin.sightings import KubeletSightings
from devplug.frontends.deviceplugin.tenancy import CheckpointTenancy
from devplug.kube.names import socket_file_name
from devplug.types import Device

__all__ = ["DevicePluginCodec", "DevicePluginFrontEnd", "kubelet_options"]

log = logging.getLogger("devplug.engine")


class DevicePluginCodec:
    """ListAndWatchResponse entries, for the device table's cache (:class:`~devplug.engine.devicetable.DeviceCodec`)."""

    def entry(self, device: Device) -> bytes:
        return encode_device_entry(device)

    def listing(self, entries: Iterable[bytes]) -> bytes:
        return encode_list_and_watch(entries)


def kubelet_options(capabilities: DriverCapabilities) -> dp.DevicePluginOptions:
    """The options registered with the kubelet, from the hooks the driver implements."""
    return options_to_pb(
        pre_start=capabilities.pre_start,
        preferred_allocation=capabilities.preferred_allocation,
        post_stop=capabilities.post_stop,
        deallocate=capabilities.deallocate,
    )


class _Serving(Protocol):
    """The front end's serving part, started (:class:`_Started`) or not yet (:data:`_NOT_STARTED`)."""

    @property
    def streaming(self) -> bool: ...

    async def reuses(self, record: AllocationRecord) -> tuple[bool, str]: ...

    async def tenant_end(self, record: AllocationRecord) -> tuple[TenantEnd, str]: ...

    async def serve(self) -> None: ...

    async def stop(self, grace: float) -> None: ...

    def supersede(self, successor: str) -> None: ...

    def on_plugin_dir_changed(self, names: frozenset[str]) -> None: ...


class _NotStarted:
    """Before the core started the driver: no socket, no registration, and no judge of tenancies."""

    streaming = False

    async def reuses(self, record: AllocationRecord) -> tuple[bool, str]:
        return False, "the device-plugin front end has not started: released first, as a new tenancy"

    async def tenant_end(self, record: AllocationRecord) -> tuple[TenantEnd, str]:
        return TenantEnd.UNKNOWN, "the device-plugin front end has not started"

    async def serve(self) -> None:
        pass

    async def stop(self, grace: float) -> None:
        pass

    def supersede(self, successor: str) -> None:
        pass

    def on_plugin_dir_changed(self, names: frozenset[str]) -> None:
        pass


_NOT_STARTED: _Serving = _NotStarted()


class _Started:
    """The started front end, whole: its tenancy judge and its plugin server (serving and registering)."""

    def __init__(self, judge: CheckpointTenancy, server: PluginServer) -> None:
        self.judge = judge
        self.server = server

    @property
    def streaming(self) -> bool:
        return self.server.kubelet_streaming

    async def reuses(self, record: AllocationRecord) -> tuple[bool, str]:
        return await self.judge.reuses(record)

    async def tenant_end(self, record: AllocationRecord) -> tuple[TenantEnd, str]:
        return await self.judge.tenant_end(record)

    async def serve(self) -> None:
        await self.server.run()

    async def stop(self, grace: float) -> None:
        self.judge.close()
        await self.server.stop(grace)

    def supersede(self, successor: str) -> None:
        self.server.supersede(successor)

    def on_plugin_dir_changed(self, names: frozenset[str]) -> None:
        self.server.on_plugin_dir_changed(names)


class DevicePluginFrontEnd:
    """One resource's device-plugin socket, its registration and its tenancy judge."""

    def __init__(
        self,
        name: str,
        kubelet: KubeletConfig,
        table: DeviceTable,
        checkpoint: CheckpointView,
        sightings: KubeletSightings,
        status: ResourceStatus,
        on_change: Callable[[], None] = lambda: None,
        instance: str | None = None,
    ) -> None:
        """``instance``: the daemon instance's tag (:func:`~devplug.kube.names.instance_tag`), which makes
        the socket name unique per instance (handover); None keeps the name fixed per resource. ``sightings``: what
        the daemon saw the kubelet do (its runs, its checkpoint's rewrites), shared by every resource."""
        self.name = name
        self.kubelet = kubelet
        self.table = table
        self.checkpoint = checkpoint
        self.sightings = sightings
        self.status = status
        self._on_change = on_change
        self.socket_name = socket_file_name(name, len(str(kubelet.device_plugin_dir)), instance)
        self.socket_path = kubelet.device_plugin_dir / self.socket_name
        #: The judge and the server, made whole by :meth:`started` (nothing serves before).
        self._serving: _Serving = _NOT_STARTED
        #: Where calls run during a handover (here, held, or forwarded to the successor).
        self.gate = CallGate()

    @property
    def endpoint(self) -> str:
        return str(self.socket_path)

    async def reuses(self, record: AllocationRecord) -> tuple[bool, str]:
        """See :class:`~devplug.frontends.deviceplugin.tenancy.CheckpointTenancy`."""
        return await self._serving.reuses(record)

    async def tenant_end(self, record: AllocationRecord) -> tuple[TenantEnd, str]:
        """See :meth:`CheckpointTenancy.tenant_end`."""
        return await self._serving.tenant_end(record)

    async def started(self, lifecycle: DeviceLifecycle, ledger_lost: bool) -> None:
        judge = CheckpointTenancy(self.name, self.checkpoint, self.table.resend, lifecycle, self.sightings)
        if ledger_lost:
            await self._adopt_from_checkpoint(lifecycle)
        options = kubelet_options(lifecycle.capabilities)

        def make_service(observer: StreamObserver) -> DevicePluginService:
            return DevicePluginService(lifecycle, self.table, options, observer, self.gate)

        server = PluginServer(
            self.name, self.kubelet, self.socket_name, options, make_service, self.status, self._on_change
        )
        self._serving = _Started(judge, server)

    async def _adopt_from_checkpoint(self, lifecycle: DeviceLifecycle) -> None:
        """The ledger was lost: take in what the kubelet's checkpoint says pods held, before registering.

        Read before this resource registers (a ListAndWatch message makes the
        kubelet rewrite the file, dropping pods that ended meanwhile), so the
        devices of pods that ended while the daemon was down are adopted too
        and then released by the reconciler; those of running pods stay held.
        """
        checkpoint = self.checkpoint.current()
        if checkpoint is None:
            return
        by_pod: dict[str, set[str]] = {}
        for entry in checkpoint.entries_for(self.name):
            by_pod.setdefault(entry.pod_uid, set()).update(entry.device_ids)
        now = time.time()
        adopted = False
        for uid, devices in sorted(by_pod.items()):
            record = lifecycle.adopt(devices, now, "the kubelet's checkpoint", pod_uid=uid)
            if record is not None:
                adopted = True
                log.warning(
                    "[%s] allocation ledger lost: adopted %s, which the kubelet's checkpoint gives to pod %s",
                    self.name,
                    ", ".join(record.devices),
                    uid,
                    extra={"device": ", ".join(record.devices)},
                )
        if adopted:
            await lifecycle.save()

    async def serve(self) -> None:
        await self._serving.serve()

    async def stop(self, grace: float) -> None:
        await self._serving.stop(grace)

    def describe(self) -> dict[str, Any] | None:
        """Nothing beyond the resource's own status (its registrations are the resource's)."""
        return None

    # --- handover (see devplug.engine.frontend.FrontEnd)

    @property
    def serving(self) -> bool:
        """Registered, and the kubelet's stream open (a handover's new instance says it serves only then)."""
        return self._serving.streaming

    def hold_calls(self) -> None:
        """Calls that would start new work wait (never refused) until :meth:`release_calls` or :meth:`hand_over`."""
        self.gate.hold()

    def release_calls(self) -> None:
        """The handover failed: the waiting calls run here, and this instance goes on serving."""
        self.gate.release()

    async def calls_idle(self) -> None:
        """Return once no call runs here (held ones wait at the gate)."""
        await self.gate.wait_running_done()

    def handover_facts(self) -> dict[str, object]:
        """What this front end hands over: its socket and registrations, and the calls held meanwhile."""
        return {
            "endpoint": self.endpoint,
            "registrations": self.status.registrations,
            "held_calls": self.gate.held_calls,
            "longest_wait_s": round(self.gate.longest_wait, 4),
        }

    async def hand_over(self, successor: str, grace: float) -> None:
        """The successor serves at ``successor`` (its socket path): send it the waiting and later calls, never
        register again, and stop serving; the successor's socket and registration stay untouched."""
        self._serving.supersede(successor)
        self.gate.forward_to(Path(successor))
        # The kubelet closes its connection to this instance when this instance's stream ends, cancelling what
        # still runs on it: the forwarded calls are answered first.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.gate.wait_idle(), grace)
        await self.stop(grace)

    def on_plugin_dir_changed(self, names: frozenset[str]) -> None:
        """Entries of the device-plugin folder changed (empty: unknown which): a sign of a kubelet restart."""
        self._serving.on_plugin_dir_changed(names)
