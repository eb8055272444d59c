"""One resource served as a DRA kubelet plugin: the :class:`~devplug.engine.frontend.FrontEnd` the core drives.

:class:`DraFrontEnd` puts the DRA parts together for one resource (one DRA
driver on one node) once the core has started its driver:

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
import logging
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc.aio

from devplug.api.gen.dra.v1 import api_pb2_grpc as v1_grpc
from devplug.api.gen.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from devplug.api.gen.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from devplug.config import KubeletConfig
from devplug.config.dra import DraConfig
from devplug.engine import (
    AllocationRecord,
    DeviceLifecycle,
    DeviceTable,
    ReleaseQueue,
    ResourceState,
    ResourceStatus,
    TenantEnd,
)
from devplug.errors import ConfigError, DeviceBusyError
from devplug.frontends.callgate import CallGate
from devplug.frontends.dra.claimcdi import ClaimCdiSpecs
from devplug.frontends.dra.health import HealthService
from devplug.frontends.dra.kubeletrule import KubeletRule, learn_rule
from devplug.frontends.dra.reconcile import ClaimReconciler, claim_ref
from devplug.frontends.dra.registration import (
    HEALTH_SERVICE,
    SERVICES,
    RegistrationServer,
    listening,
    registration_socket,
    remove_dead_sockets,
    service_socket,
)
from devplug.frontends.dra.reregistration import SETTLE_S, Reregistration
from devplug.frontends.dra.service import ClaimPreparer, DraPluginV1, DraPluginV1beta1
from devplug.text.logsafe import id_list

if TYPE_CHECKING:
    from lightkube import AsyncClient

    from devplug.frontends.dra.slices import SlicePublisher

__all__ = ["INSTANCE_ENV", "DraFrontEnd", "instance_name"]

log = logging.getLogger("devplug.frontends.dra")

#: The longest path of a unix socket (``sun_path`` holds 108 bytes, NUL included).
MAX_SOCKET_PATH = 107
#: The most prepared claims ``devplug status`` lists (the count is always there).
MAX_CLAIMS_LISTED = 256
#: The largest call the DRA service reads, in bytes (gRPC's default is 4 MiB): a claim is at most ~360 bytes on
#: the wire (a 36-byte UID, a 63-byte namespace, a 253-byte name), so this holds the claims of a node of ~2,900
#: devices in one call, and a flood is refused (RESOURCE_EXHAUSTED) before Python builds its messages.
MAX_CALL_BYTES = 1024 * 1024
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
    """One resource's DRA kubelet plugin (see the module's docstring)."""

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
        self._releases = releases
        self._make_client = make_client
        self._resource_cdi_kind = resource_cdi_kind
        self._release_interval = release_interval
        #: True at stop when another instance of the driver in this daemon takes over (a reload restarting the
        #: resource): the slices are left to it, which adopts them as they are.
        self._successor = successor
        self._on_change = on_change
        self._client: AsyncClient | None = None
        self.publisher: SlicePublisher | None = None
        self.preparer: ClaimPreparer | None = None
        self.health: HealthService | None = None
        self.registration: RegistrationServer | None = None
        self.reconciler: ClaimReconciler | None = None
        #: How the node's kubelet keys DRA plugins (learnt in :meth:`started`), and the recovery from its drops.
        self.rule = KubeletRule()
        self.reregistration: Reregistration | None = None
        self._server: grpc.aio.Server | None = None
        self._stopped = asyncio.Event()
        #: Set once :meth:`serve`'s loops (the publisher's among them) are cancelled and done.
        self._loops_done = asyncio.Event()
        #: Where prepares and unprepares run during a handover (here, held, or at the successor instance).
        self.gate = CallGate()
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
        from devplug.frontends.dra.apiversions import discover_or_close
        from devplug.frontends.dra.claims import ClaimReader
        from devplug.frontends.dra.nodeselector import NodeLabels
        from devplug.frontends.dra.slices import SlicePublisher

        kept = await self.cdi.kept() if ledger_lost else []
        if kept:  # each kept spec was written with a record of its claim: the ledger held records and is gone
            log.warning(
                "[%s] the allocation ledger %s is missing, but %s keeps the CDI specs of %d claims prepared by an "
                "earlier run (uids %s): the ledger was lost; their unprepare will call no driver hook, so check "
                "their devices before they serve another claim",
                self.name,
                lifecycle.ledger.path,
                self.cdi.keep_dir,
                len(kept),
                id_list(kept),
            )
        elif ledger_lost:
            log.info(
                "[%s] no allocation ledger: a claim the kubelet holds prepared is prepared again when it asks",
                self.name,
            )
        for noisy in ("httpx2", "httpcore2", "httpx", "httpcore"):  # a line per request: the slices' state says more
            logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger(noisy).level))
        client = self._make_client()
        api = await discover_or_close(client, node=self.node, driver=self.driver, pool=self.pool)  # or refuse
        self._client = client
        self.publisher = SlicePublisher(
            driver=self.driver,
            node=self.node,
            pool=self.pool,
            table=self.table,
            client=client,
            api=api,
            on_deleted=self._slice_deleted,
        )
        reader = ClaimReader(
            client,
            driver=self.driver,
            pool=self.pool,
            device_id=self.publisher.device_id,
            api=api,
            node=NodeLabels(client, self.node),
        )
        self.preparer = ClaimPreparer(
            lifecycle,
            reader.read,
            self.cdi,
            driver=self.driver,
            pool=self.pool,
            resource_cdi_kind=self._resource_cdi_kind,
        )
        self.rule = await learn_rule(client, self.node)
        self.health = HealthService(self.table, self.pool, on_stream=self.rule.seen_health_stream)
        self.reconciler = ClaimReconciler(
            lifecycle, self._releases, reader.presence, self.cdi, interval=self._release_interval
        )
        publisher = self.publisher
        self.registration = RegistrationServer(
            driver=self.driver,
            registry_dir=self.kubelet.plugins_registry_dir,
            endpoint=self.socket_path,
            instance=self.instance,
            services=(*SERVICES, HEALTH_SERVICE),
            status=self.status,
            on_registered=publisher.resync,
            on_change=self._on_change,
            on_other_gone=self._other_instance_gone,
        )
        self.reregistration = Reregistration(self.registration, self.rule)
        for record in list(lifecycle.records()):  # a reboot may have emptied the CDI spec dir
            if record.claim_uid is not None and not record.releasing:
                try:
                    await self.cdi.restore(record.claim_uid)
                except OSError as exc:
                    log.error("[%s] cannot restore the CDI spec of %s: %s", self.name, claim_ref(record), exc)

    def _other_instance_gone(self, name: str) -> None:
        """Another instance's registration socket ``name`` went (the registration server saw it)."""
        if self.reregistration is not None:
            self.reregistration.other_gone(name)

    def _slice_deleted(self, _name: str) -> None:
        """Someone else deleted one of the slices the publisher wrote."""
        if self.reregistration is not None:
            self.reregistration.slices_wiped()

    async def _serve_services(self) -> None:
        assert self.preparer is not None and self.health is not None
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        remove_dead_sockets(self.socket_path.parent, "dra-", ".sock")
        dead = remove_dead_sockets(self.kubelet.plugins_registry_dir, f"{self.driver}-", "-reg.sock")
        if dead and self.rule.by_name:
            # The kubelet deregisters a removed socket by the driver's name: registering before it has would let
            # that drop this instance (it runs both at once). Its reconciler runs every second; the wipe that
            # follows a late one is the second line (Reregistration).
            log.info(
                "[%s] removed %d dead registration socket(s) of %s; the kubelet (%s) keys DRA plugins by name: "
                "registering in %g s, once it has deregistered them",
                self.name,
                len(dead),
                self.driver,
                self.rule.kubelet_version or "version unknown",
                SETTLE_S,
            )
            await asyncio.sleep(SETTLE_S)
        # a call's bytes are capped before Python parses them (service.py: the claims a call may name)
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_CALL_BYTES)])
        v1_grpc.add_DRAPluginServicer_to_server(DraPluginV1(self.preparer, self.gate), server)
        v1beta1_grpc.add_DRAPluginServicer_to_server(DraPluginV1beta1(self.preparer, self.gate), server)
        health_grpc.add_DRAResourceHealthServicer_to_server(self.health, server)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server.add_insecure_port(f"unix:{self.socket_path}")
        await server.start()
        os.chmod(self.socket_path, 0o600)
        self._server = server

    async def serve(self) -> None:
        assert self.registration is not None and self.publisher is not None and self.reconciler is not None
        if self._stopped.is_set():
            self._loops_done.set()
            return
        self.status.state = ResourceState.REGISTERING
        await self._serve_services()
        await self.registration.start()
        log.info(
            "[%s] serving DRA driver %s (pool %s) on %s, registered through %s",
            self.name,
            self.driver,
            self.pool,
            self.socket_path,
            self.registration.socket_path,
            extra={"driver": self.driver},
        )
        assert self.reregistration is not None
        tasks = [
            asyncio.ensure_future(self.publisher.run()),
            asyncio.ensure_future(self.registration.run()),
            asyncio.ensure_future(self.reconciler.run()),
            asyncio.ensure_future(self.reregistration.run()),
        ]
        stopped = asyncio.ensure_future(self._stopped.wait())
        try:
            await asyncio.wait([*tasks, stopped], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (*tasks, stopped):
                task.cancel()
            await asyncio.gather(*tasks, stopped, return_exceptions=True)
            self._loops_done.set()
        for task in tasks:  # a loop that ended by itself is a bug: say so rather than serve half
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

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

    async def stop(self, grace: float) -> None:
        serving = self.registration is not None and self.registration.started  # serve() runs its loops
        self._stopped.set()
        if self.registration is not None:
            await self.registration.stop()
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        last = not self.handed_over and not self._successor() and not self._other_instances()
        if self.publisher is not None and last:
            if serving:  # its publisher ends before the slices are deleted, or it could write them again
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._loops_done.wait(), max(grace, 1.0))
            try:
                await asyncio.wait_for(self.publisher.delete_slices(), max(grace, 1.0))
            except Exception as exc:
                log.warning("[%s] ResourceSlices of %s left in place: %s", self.name, self.driver, exc)
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.close()
            self._client = None

    # --- handover (see devplug.engine.frontend.HandoverFrontEnd)

    @property
    def serving(self) -> bool:
        """Registered: the kubelet accepted this instance's registration (it calls the newest instance)."""
        return self.registration is not None and bool(self.registration.state.registered) and self._server is not None

    def hold_calls(self) -> None:
        """Prepares and unprepares wait (never refused), and the slices and the claims' releases are left alone,
        until :meth:`release_calls` or :meth:`hand_over`."""
        self.gate.hold()
        if self.publisher is not None:
            self.publisher.hold()
        if self.reconciler is not None:
            self.reconciler.hold()

    def release_calls(self) -> None:
        """The handover failed: the waiting calls run here, and the slices and releases are this instance's again."""
        self.gate.release()
        if self.publisher is not None:
            self.publisher.release()
        if self.reconciler is not None:
            self.reconciler.release()

    async def calls_idle(self) -> None:
        """Return once no call, slice write or reconciliation pass runs here (held calls wait at the gate)."""
        await self.gate.wait_running_done()
        if self.publisher is not None:
            await self.publisher.idle()
        if self.reconciler is not None:
            await self.reconciler.idle()

    def handover_facts(self) -> dict[str, object]:
        """What this front end hands over: its sockets and registrations, the slices' generation, the claims
        prepared, and the calls held meanwhile."""
        registration = self.registration
        held = [] if self.preparer is None else [r for r in self.preparer.lifecycle.records() if r.claim_uid]
        return {
            "endpoint": self.endpoint,
            "registration_socket": str(registration.socket_path) if registration is not None else None,
            "registrations": registration.state.registrations if registration is not None else 0,
            "slices_generation": self.publisher.state.generation if self.publisher is not None else None,
            "claims": len(held),
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
        out: dict[str, Any] = {
            "driver": self.driver,
            "pool": self.pool,
            "instance": self.instance,
            "kubelet": self.rule.describe(),
        }
        if self.registration is not None:
            out["registration"] = self.registration.state.describe()
        if self.reregistration is not None:
            out["kubelet"].update(self.reregistration.describe())
        if self.publisher is not None:
            state = self.publisher.state
            out["api"] = self.publisher.api.describe()  # resource.k8s.io version in use, device taints or not
            out["slices"] = {
                "generation": state.generation,
                "slices": state.slices,
                "in_sync": state.in_sync,
                "synced_at": state.synced_at,
                "failures": state.failures,
                "error": state.error,
            }
        if self.preparer is not None:
            held = [
                r
                for r in self.preparer.lifecycle.records()
                if r.claim_uid is not None and not r.releasing and not r.pending
            ]
            out["claims"] = {
                "held": len(held),
                "prepared": self.preparer.prepared,
                "unprepared": self.preparer.unprepared,
                "refused": self.preparer.refused,
                # each claim prepared here (a node holds its pods' claims: few), for devplug status
                "list": [
                    {
                        "claim": r.claim,
                        "uid": r.claim_uid,
                        "devices": list(r.devices),
                        "pods": [p for p in (r.pod_uid, *r.pod_uids) if p],
                    }
                    for r in sorted(held, key=lambda r: r.claim or "")[:MAX_CLAIMS_LISTED]
                ],
            }
        return out
