"""One resource served as a DRA kubelet plugin: the :class:`~devplug.engine.frontend.FrontEnd` the core drives.

:class:`DraFrontEnd` is made with the resource; once the core has started its
driver, it makes the resource's plugin whole
(:class:`~devplug.frontends.dra.plugin.DraPlugin`), which puts the DRA parts
together for one resource (one DRA driver on one node):

* the ResourceSlices of its pool (:class:`~devplug.frontends.dra.slices.SlicePublisher`),
  published again soon after each registration (the kubelet deletes a driver's
  slices at its start and when the driver's plugin went away);
* the DRA services on ``<plugins_dir>/<driver>/dra-<instance>.sock``
  (:mod:`~devplug.frontends.dra.service`, :mod:`~devplug.frontends.dra.health`);
* the registration socket (:mod:`~devplug.frontends.dra.registration`), made
  after the services serve, so the kubelet can call them as soon as it finds it;
* claim reconciliation (:mod:`~devplug.frontends.dra.reconcile`) through the
  resource's release queue.

Its tenancy judge: an admission of devices a live record holds is never a reuse
through DRA (each claim is a tenancy of its own, and prepare answers a claim
prepared before without an admission). A record of another claim is refused
(the devices are busy: that claim is still prepared here); a record of no claim
(left by the device-plugin API before the node moved to DRA) is released first,
once its pod's containers are gone.

At stop the registration socket goes first (the kubelet deregisters the
instance), then the services; the slices are deleted only when no other
instance of the driver serves on the node (a rolling update's new pod publishes
the same pool, and so does the instance a live reload starts in this daemon).

A handover to a newer daemon instance (:class:`~devplug.engine.frontend.HandoverFrontEnd`,
:mod:`devplug.daemon.handover`): asked, the front end holds new prepares and
unprepares at its :class:`~devplug.frontends.callgate.CallGate`, and the slice
publisher and the claim reconciler write nothing more (the slices, the claims'
CDI specs and the releases become the successor's, which adopts them as they
are). The successor registers its own sockets (the kubelet calls the newest
instance, PR #129832); once it serves, the held and later calls go to its
service socket, and this instance removes its registration socket and stops,
never deleting the slices nor registering again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devplug.config import KubeletConfig
from devplug.config.dra import DraConfig
from devplug.engine import (
    AllocationRecord,
    DeviceLifecycle,
    DeviceTable,
    ReleaseQueue,
    ResourceStatus,
    TenantEnd,
)
from devplug.errors import ConfigError, DeviceBusyError
from devplug.frontends.callgate import CallGate
from devplug.frontends.dra.claimcdi import ClaimCdiSpecs
from devplug.frontends.dra.plugin import NOT_STARTED, DraPlugin, PluginPhase, PluginSettings
from devplug.frontends.dra.registration import listening, registration_socket, service_socket
from devplug.text.logsafe import id_list

if TYPE_CHECKING:
    from lightkube import AsyncClient

__all__ = ["INSTANCE_ENV", "DraFrontEnd", "instance_name"]

#: The longest path of a unix socket (``sun_path`` holds 108 bytes, NUL included).
MAX_SOCKET_PATH = 107
#: The environment variable naming this instance (the pod's UID, from the downward API), as the Go helper does.
INSTANCE_ENV = "POD_UID"


def instance_name(pod_uid: str | None = None) -> str:
    """A name of this process's own for its DRA sockets: the first 8 characters of its pod's UID (``pod_uid``,
    else ``$POD_UID``; so an operator finds a socket's pod) and 6 random hex digits, or 12 random hex digits
    outside a pod. A container restarted in the same pod gets a name of its own, so a restart never removes a
    socket the new process then makes again at the same path: the kubelet sees the dead socket go and a new one
    come, two paths it handles apart (at most 8 + 1 + 6 characters, against a pod UID's 36: the sockets fit
    ``sun_path`` under longer kubelet roots)."""
    uid = (os.environ.get(INSTANCE_ENV, "") if pod_uid is None else pod_uid).strip()
    prefix = "".join(c for c in uid if c.isalnum())[:8].lower()
    return f"{prefix}-{uuid.uuid4().hex[:6]}" if prefix else uuid.uuid4().hex[:12]


class DraFrontEnd:
    """One resource's DRA kubelet plugin (see the module's docstring): made with the resource, its plugin
    (:class:`~devplug.frontends.dra.plugin.DraPlugin`) made whole once the core started the driver."""

    def __init__(
        self,
        name: str,
        dra: DraConfig,
        *,
        node: str,
        kubelet: KubeletConfig,
        cdi_spec_dir: Path,
        keep_dir: Path,
        table: DeviceTable,
        status: ResourceStatus,
        releases: Callable[[], ReleaseQueue | None],
        make_client: Callable[[], AsyncClient],
        resource_cdi_kind: str | None = None,
        release_interval: float = 1.0,
        instance: str | None = None,
        successor: Callable[[], bool] = lambda: False,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.name = name
        self.driver = dra.driver_name
        self.node = node
        self.pool = dra.pool_on(node)
        self.kubelet = kubelet
        self.table = table
        self.status = status
        self.instance = instance or instance_name()
        self.socket_path = service_socket(kubelet.plugins_dir, self.driver, self.instance)
        self.cdi = ClaimCdiSpecs(cdi_spec_dir, self.driver, keep_dir)
        for path in (
            self.socket_path,
            registration_socket(self.kubelet.plugins_registry_dir, self.driver, self.instance),
        ):
            if len(str(path).encode()) > MAX_SOCKET_PATH:
                raise ConfigError(
                    f"{self.name}: the DRA socket path {path} is {len(str(path).encode())} bytes long, more than a "
                    f"unix socket's {MAX_SOCKET_PATH}: shorten [kubelet] plugins_registry_dir / plugins_dir or the "
                    f"driver name {self.driver!r}"
                )
        #: Where prepares and unprepares run during a handover (here, held, or at the successor instance).
        self.gate = CallGate()
        self._settings = PluginSettings(
            name=name,
            driver=self.driver,
            node=node,
            pool=self.pool,
            instance=self.instance,
            socket_path=self.socket_path,
            plugins_registry_dir=kubelet.plugins_registry_dir,
            table=table,
            status=status,
            cdi=self.cdi,
            gate=self.gate,
            releases=releases,
            make_client=make_client,
            resource_cdi_kind=resource_cdi_kind,
            release_interval=release_interval,
            on_change=on_change,
        )
        #: True at stop when another instance of the driver in this daemon takes over (a reload restarting the
        #: resource): the slices are left to it, which adopts them as they are.
        self._successor = successor
        #: The plugin: :data:`~devplug.frontends.dra.plugin.NOT_STARTED` until :meth:`started` made it whole.
        self.plugin: PluginPhase = NOT_STARTED
        self._stopped = False
        #: Set once this instance handed the node over to a newer one (:meth:`hand_over`): it leaves the slices.
        self.handed_over = False

    @property
    def endpoint(self) -> str:
        return str(self.socket_path)

    # --- the tenancy judge

    async def reuses(self, record: AllocationRecord) -> tuple[bool, str]:
        """A record of another claim: busy (:class:`DeviceBusyError`); of no claim: released first."""
        if record.claim_uid is not None:
            raise DeviceBusyError(
                f"{self.name}: {id_list(record.all_devices())} held by claim {record.claim} (uid {record.claim_uid}), "
                "still prepared on this node; nothing was prepared"
            )
        return False, (
            "allocated through the device-plugin API before this resource moved to DRA: released first, once its "
            "pod's containers are gone"
        )

    async def tenant_end(self, record: AllocationRecord) -> tuple[TenantEnd, str]:
        """A record of the device-plugin API's time: DRA sees nothing of the kubelet's device manager."""
        return TenantEnd.UNKNOWN, "allocated through the device-plugin API, whose pods DRA does not see"

    # --- the life

    async def started(self, lifecycle: DeviceLifecycle, ledger_lost: bool) -> None:
        """Make the plugin, whole (:meth:`DraPlugin.start <devplug.frontends.dra.plugin.DraPlugin.start>`)."""
        previous, self.plugin = self.plugin, NOT_STARTED
        await previous.stop(0.0, lambda: False)  # a start tried again after a failure: its client is closed
        plugin = await DraPlugin.start(self._settings, lifecycle, ledger_lost)
        if self._stopped:  # stopped while it was made: it never serves (nothing is published yet)
            await plugin.stop(0.0, lambda: False)
        self.plugin = plugin

    async def serve(self) -> None:
        if not self._stopped:
            await self.plugin.serve()

    def _other_instances(self) -> bool:
        """Whether another instance of the driver serves its registration socket on this node."""
        ours = registration_socket(self.kubelet.plugins_registry_dir, self.driver, self.instance).name
        try:
            names = os.listdir(self.kubelet.plugins_registry_dir)
        except FileNotFoundError:
            return False
        return any(
            n != ours
            and n.startswith(f"{self.driver}-")
            and n.endswith("-reg.sock")
            and listening(self.kubelet.plugins_registry_dir / n)
            for n in names
        )

    def _last(self) -> bool:
        """Whether no other instance follows this one on the node: then the slices are deleted at stop."""
        return not self.handed_over and not self._successor() and not self._other_instances()

    async def stop(self, grace: float) -> None:
        self._stopped = True
        await self.plugin.stop(grace, self._last)

    # --- handover (see devplug.engine.frontend.HandoverFrontEnd)

    @property
    def serving(self) -> bool:
        """Registered: the kubelet accepted this instance's registration (it calls the newest instance)."""
        return self.plugin.serving

    def hold_calls(self) -> None:
        """Prepares and unprepares wait (never refused), and the slices and the claims' releases are left alone,
        until :meth:`release_calls` or :meth:`hand_over`."""
        self.gate.hold()
        self.plugin.hold()

    def release_calls(self) -> None:
        """The handover failed: the waiting calls run here, and the slices and releases are this instance's again."""
        self.gate.release()
        self.plugin.release()

    async def calls_idle(self) -> None:
        """Return once no call, slice write or reconciliation pass runs here (held calls wait at the gate)."""
        await self.gate.wait_running_done()
        await self.plugin.idle()

    def handover_facts(self) -> dict[str, object]:
        """What this front end hands over: its sockets and registrations, the slices' generation, the claims
        prepared, and the calls held meanwhile."""
        return {
            "endpoint": self.endpoint,
            **self.plugin.facts(),
            "held_calls": self.gate.held_calls,
            "longest_wait_s": round(self.gate.longest_wait, 4),
        }

    async def hand_over(self, successor: str, grace: float) -> None:
        """The successor serves at ``successor`` (its service socket): send it the waiting and later calls, then
        remove this instance's registration socket (the kubelet drops this instance only) and stop, leaving the
        slices and the claims' CDI specs to the successor."""
        self.handed_over = True
        if successor:  # else none serves: the held calls end with this instance's server (the kubelet retries)
            self.gate.forward_to(Path(successor))
            with contextlib.suppress(asyncio.TimeoutError):  # the forwarded calls are answered before this stops
                await asyncio.wait_for(self.gate.wait_idle(), grace)
        await self.stop(grace)

    def describe(self) -> dict[str, Any]:
        """The DRA side of the resource, for status."""
        return {"driver": self.driver, "pool": self.pool, "instance": self.instance, **self.plugin.describe()}
