"""One resource's DRA kubelet plugin once the core has started its driver: the parts made together and whole.

:meth:`DraPlugin.start` reads what the API server serves, learns how the node's
kubelet keys DRA plugins, and builds every part the plugin runs with at once: the
Kubernetes client, the ResourceSlice publisher, the claim preparer and its
reconciler, the health service, the registration socket and the recovery from the
kubelet's drops. :class:`~devplug.frontends.dra.frontend.DraFrontEnd` holds a
:class:`DraPlugin` from then on, and :data:`NOT_STARTED` (which serves nothing and
holds nothing) before; both answer the front end through :class:`PluginPhase`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import grpc.aio

from devplug.api.gen.dra.v1 import api_pb2_grpc as v1_grpc
from devplug.api.gen.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from devplug.api.gen.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from devplug.engine import DeviceLifecycle, DeviceTable, ReleaseQueue, ResourceState, ResourceStatus
from devplug.frontends.callgate import CallGate
from devplug.frontends.dra.claimcdi import ClaimCdiSpecs
from devplug.frontends.dra.health import HealthService
from devplug.frontends.dra.kubeletrule import KubeletRule, learn_rule
from devplug.frontends.dra.reconcile import ClaimReconciler, claim_ref
from devplug.frontends.dra.registration import (
    HEALTH_SERVICE,
    SERVICES,
    RegistrationServer,
    remove_dead_sockets,
)
from devplug.frontends.dra.reregistration import SETTLE_S, Reregistration
from devplug.frontends.dra.service import ClaimPreparer, DraPluginV1, DraPluginV1beta1
from devplug.text.logsafe import id_list

if TYPE_CHECKING:
    from lightkube import AsyncClient

    from devplug.frontends.dra.apiversions import DraApi
    from devplug.frontends.dra.slices import SlicePublisher

__all__ = ["NOT_STARTED", "DraPlugin", "PluginPhase", "PluginSettings"]

log = logging.getLogger("devplug.frontends.dra")

#: The most prepared claims ``devplug status`` lists (the count is always there).
MAX_CLAIMS_LISTED = 256
#: The largest call the DRA service reads, in bytes (gRPC's default is 4 MiB): a claim is at most ~360 bytes on
#: the wire (a 36-byte UID, a 63-byte namespace, a 253-byte name), so this holds the claims of a node of ~2,900
#: devices in one call, and a flood is refused (RESOURCE_EXHAUSTED) before Python builds its messages.
MAX_CALL_BYTES = 1024 * 1024


@dataclass(frozen=True)
class PluginSettings:
    """What a resource's DRA plugin is made from, fixed when its front end is made."""

    name: str
    driver: str
    node: str
    pool: str
    instance: str
    #: The DRA services' socket, and the folders of the kubelet's plugins and of its plugin registry.
    socket_path: Path
    plugins_registry_dir: Path
    table: DeviceTable
    status: ResourceStatus
    cdi: ClaimCdiSpecs
    gate: CallGate
    releases: Callable[[], ReleaseQueue | None]
    make_client: Callable[[], AsyncClient]
    resource_cdi_kind: str | None
    release_interval: float
    on_change: Callable[[], None]


class PluginPhase(Protocol):
    """What the front end asks of its plugin, started (:class:`DraPlugin`) or not yet (:data:`NOT_STARTED`)."""

    @property
    def serving(self) -> bool:
        """Registered: the kubelet accepted this instance's registration."""
        ...

    def hold(self) -> None:
        """A handover: the slices and the claims' releases are left alone until :meth:`release`."""

    def release(self) -> None:
        """The handover failed: the slices and the releases are this instance's again."""

    async def idle(self) -> None:
        """Return once no slice write nor reconciliation pass runs."""

    def facts(self) -> dict[str, object]:
        """What a handover hands over, beyond the front end's endpoint and held calls."""
        ...

    def describe(self) -> dict[str, Any]:
        """The plugin's part of the resource's status."""
        ...

    async def serve(self) -> None:
        """Serve the services, register, and run the loops until :meth:`stop`."""

    async def stop(self, grace: float, last: Callable[[], bool]) -> None:
        """Stop serving within ``grace`` seconds; delete the slices when ``last()`` says no other instance follows."""


class _NotStarted:
    """The plugin before the core started the driver: it serves nothing, holds nothing, and hands nothing over."""

    serving = False

    def hold(self) -> None:
        pass

    def release(self) -> None:
        pass

    async def idle(self) -> None:
        pass

    def facts(self) -> dict[str, object]:
        return {"registration_socket": None, "registrations": 0, "slices_generation": None, "claims": 0}

    def describe(self) -> dict[str, Any]:
        return {"kubelet": KubeletRule().describe()}

    async def serve(self) -> None:
        pass

    async def stop(self, grace: float, last: Callable[[], bool]) -> None:
        pass


#: The plugin of a front end whose driver has not started (yet).
NOT_STARTED: PluginPhase = _NotStarted()


class DraPlugin:
    """One resource's DRA kubelet plugin, whole: made by :meth:`start` once the driver has started."""

    def __init__(
        self,
        settings: PluginSettings,
        *,
        client: AsyncClient,
        rule: KubeletRule,
        publisher: SlicePublisher,
        preparer: ClaimPreparer,
        health: HealthService,
        reconciler: ClaimReconciler,
        registration: RegistrationServer,
        reregistration: Reregistration,
    ) -> None:
        self.settings = settings
        self.client = client
        self.rule = rule
        self.publisher = publisher
        self.preparer = preparer
        self.health = health
        self.reconciler = reconciler
        self.registration = registration
        self.reregistration = reregistration
        #: The DRA services' server while it serves.
        self._server: grpc.aio.Server | None = None
        self._stopped = asyncio.Event()
        #: Set once :meth:`serve`'s loops (the publisher's among them) are cancelled and done.
        self._loops_done = asyncio.Event()

    @classmethod
    async def start(cls, settings: PluginSettings, lifecycle: DeviceLifecycle, ledger_lost: bool) -> DraPlugin:
        """Read the API server and the kubelet, and build every part; raises (closing the client) when the API
        server serves no ``resource.k8s.io`` version devplug speaks."""
        from devplug.frontends.dra.apiversions import discover_or_close

        s = settings
        await _report_kept_specs(s, lifecycle, ledger_lost)
        for noisy in ("httpx2", "httpcore2", "httpx", "httpcore"):  # a line per request: the slices' state says more
            logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger(noisy).level))
        client = s.make_client()
        api = await discover_or_close(client, node=s.node, driver=s.driver, pool=s.pool)  # or refuse
        try:
            return await cls._build(s, lifecycle, client, api)
        except BaseException:
            with contextlib.suppress(Exception):
                await client.close()
            raise

    @classmethod
    async def _build(cls, s: PluginSettings, lifecycle: DeviceLifecycle, client: AsyncClient, api: DraApi) -> DraPlugin:
        from devplug.frontends.dra.adminaccess import AdminClaims, NamespaceCheck
        from devplug.frontends.dra.claims import ClaimReader
        from devplug.frontends.dra.nodeselector import NodeLabels
        from devplug.frontends.dra.slices import SlicePublisher
        from devplug.frontends.dra.statuswriter import ClaimStatusWriter

        rule = await learn_rule(client, s.node)

        # The recovery from the kubelet's drops is told of what the publisher and the registration see; it is
        # made last, from them, and these two calls reach it once it exists (they come from their loops).
        def slices_wiped(_name: str) -> None:
            reregistration.slices_wiped()

        def other_gone(name: str) -> None:
            reregistration.other_gone(name)

        publisher = SlicePublisher(
            driver=s.driver, node=s.node, pool=s.pool, table=s.table, client=client, api=api, on_deleted=slices_wiped
        )
        reader = ClaimReader(
            client,
            driver=s.driver,
            pool=s.pool,
            device_id=publisher.device_id,
            api=api,
            node=NodeLabels(client, s.node),
        )
        status = ClaimStatusWriter(
            client, api, driver=s.driver, name=s.name, state_dir=s.cdi.keep_dir.parent / "dra-claim-status"
        )
        preparer = ClaimPreparer(
            lifecycle,
            reader.read,
            s.cdi,
            driver=s.driver,
            pool=s.pool,
            resource_cdi_kind=s.resource_cdi_kind,
            status=status,
            admin_claims=(admin := AdminClaims(s.cdi.keep_dir.parent / "dra-admin-claims.json")),
            namespaces=NamespaceCheck(client),
        )
        health = HealthService(
            s.table, s.pool, on_stream=rule.seen_health_stream, consumable=lambda: publisher.consumable
        )
        reconciler = ClaimReconciler(
            lifecycle, s.releases, reader.presence, s.cdi, interval=s.release_interval, admin=admin, status=status
        )
        registration = RegistrationServer(
            driver=s.driver,
            registry_dir=s.plugins_registry_dir,
            endpoint=s.socket_path,
            instance=s.instance,
            services=(*SERVICES, HEALTH_SERVICE),
            status=s.status,
            on_registered=publisher.resync,
            on_change=s.on_change,
            on_other_gone=other_gone,
        )
        reregistration = Reregistration(registration, rule)
        await _restore_specs(s, lifecycle)
        await preparer.restore_admin_specs()
        await status.resume(r.claim_uid for r in lifecycle.records() if r.claim_uid and not r.releasing)
        return cls(
            s,
            client=client,
            rule=rule,
            publisher=publisher,
            preparer=preparer,
            health=health,
            reconciler=reconciler,
            registration=registration,
            reregistration=reregistration,
        )

    # --- serving

    async def _serve_services(self) -> None:
        s = self.settings
        s.socket_path.parent.mkdir(parents=True, exist_ok=True)
        remove_dead_sockets(s.socket_path.parent, "dra-", ".sock")
        dead = remove_dead_sockets(s.plugins_registry_dir, f"{s.driver}-", "-reg.sock")
        if dead and self.rule.by_name:
            # The kubelet deregisters a removed socket by the driver's name: registering before it has would let
            # that drop this instance (it runs both at once). Its reconciler runs every second; the wipe that
            # follows a late one is the second line (Reregistration).
            log.info(
                "[%s] removed %d dead registration socket(s) of %s; the kubelet (%s) keys DRA plugins by name: "
                "registering in %g s, once it has deregistered them",
                s.name,
                len(dead),
                s.driver,
                self.rule.kubelet_version or "version unknown",
                SETTLE_S,
            )
            await asyncio.sleep(SETTLE_S)
        # a call's bytes are capped before Python parses them (service.py: the claims a call may name)
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_CALL_BYTES)])
        v1_grpc.add_DRAPluginServicer_to_server(DraPluginV1(self.preparer, s.gate), server)
        v1beta1_grpc.add_DRAPluginServicer_to_server(DraPluginV1beta1(self.preparer, s.gate), server)
        health_grpc.add_DRAResourceHealthServicer_to_server(self.health, server)
        with contextlib.suppress(FileNotFoundError):
            s.socket_path.unlink()
        server.add_insecure_port(f"unix:{s.socket_path}")
        await server.start()
        os.chmod(s.socket_path, 0o600)
        self._server = server

    async def serve(self) -> None:
        """Serve the services, register, and run the loops until :meth:`stop`."""
        s = self.settings
        if self._stopped.is_set():
            self._loops_done.set()
            return
        s.status.state = ResourceState.REGISTERING
        await self._serve_services()
        await self.registration.start()
        log.info(
            "[%s] serving DRA driver %s (pool %s) on %s, registered through %s",
            s.name,
            s.driver,
            s.pool,
            s.socket_path,
            self.registration.socket_path,
            extra={"driver": s.driver},
        )
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

    async def stop(self, grace: float, last: Callable[[], bool]) -> None:
        s = self.settings
        serving = self.registration.started  # serve() runs its loops
        self._stopped.set()
        await self.registration.stop()
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
            with contextlib.suppress(FileNotFoundError):
                s.socket_path.unlink()
        if last():
            if serving:  # its publisher ends before the slices are deleted, or it could write them again
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._loops_done.wait(), max(grace, 1.0))
            try:
                await asyncio.wait_for(self.publisher.delete_slices(), max(grace, 1.0))
            except Exception as exc:
                log.warning("[%s] ResourceSlices of %s left in place: %s", s.name, s.driver, exc)
        with contextlib.suppress(Exception):
            if self.preparer.status is not None:  # writes under way stop; their kept files finish them next run
                await self.preparer.status.close()
            await self.client.close()

    # --- handover

    @property
    def serving(self) -> bool:
        return bool(self.registration.state.registered) and self._server is not None

    def hold(self) -> None:
        self.publisher.hold()
        self.reconciler.hold()

    def release(self) -> None:
        self.publisher.release()
        self.reconciler.release()

    async def idle(self) -> None:
        await self.publisher.idle()
        await self.reconciler.idle()

    def facts(self) -> dict[str, object]:
        return {
            "registration_socket": str(self.registration.socket_path),
            "registrations": self.registration.state.registrations,
            "slices_generation": self.publisher.state.generation,
            "claims": len([r for r in self.preparer.lifecycle.records() if r.claim_uid]),
        }

    def describe(self) -> dict[str, Any]:
        kubelet = self.rule.describe()
        kubelet.update(self.reregistration.describe())
        state = self.publisher.state
        held = [
            r
            for r in self.preparer.lifecycle.records()
            if r.claim_uid is not None and not r.releasing and not r.pending
        ]
        return {
            "kubelet": kubelet,
            "registration": self.registration.state.describe(),
            "api": self.publisher.api.describe(),  # resource.k8s.io version in use, device taints or not
            "claim_status": self.preparer.status.describe() if self.preparer.status is not None else None,
            "slices": {
                "generation": state.generation,
                "slices": state.slices,
                "in_sync": state.in_sync,
                "synced_at": state.synced_at,
                "failures": state.failures,
                "error": state.error,
            },
            "claims": {
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
                # the admin-access claims prepared here (KEP-5018: no record, no hook), likewise
                "admin_access": [
                    {"claim": kept.claim, "uid": uid, "devices": list(kept.devices)}
                    for uid in list(admin)[:MAX_CLAIMS_LISTED]
                    if (kept := admin.get(uid)) is not None
                ]
                if (admin := self.preparer.admin_claims) is not None
                else [],
            },
        }


async def _report_kept_specs(s: PluginSettings, lifecycle: DeviceLifecycle, ledger_lost: bool) -> None:
    """Say what a lost ledger leaves behind: the claims' CDI specs an earlier run kept."""
    kept = await s.cdi.kept() if ledger_lost else []
    if kept:  # each kept spec was written with a record of its claim: the ledger held records and is gone
        log.warning(
            "[%s] the allocation ledger %s is missing, but %s keeps the CDI specs of %d claims prepared by an "
            "earlier run (uids %s): the ledger was lost; their unprepare will call no driver hook, so check "
            "their devices before they serve another claim",
            s.name,
            lifecycle.ledger.path,
            s.cdi.keep_dir,
            len(kept),
            id_list(kept),
        )
    elif ledger_lost:
        log.info("[%s] no allocation ledger: a claim the kubelet holds prepared is prepared again when it asks", s.name)


async def _restore_specs(s: PluginSettings, lifecycle: DeviceLifecycle) -> None:
    """Write back the CDI specs of the claims held (a reboot may have emptied the CDI spec dir)."""
    for record in list(lifecycle.records()):
        if record.claim_uid is not None and not record.releasing:
            try:
                await s.cdi.restore(record.claim_uid)
            except OSError as exc:
                log.error("[%s] cannot restore the CDI spec of %s: %s", s.name, claim_ref(record), exc)
