"""The shared driver: devices many nodes reach, split into slots, each slot held by one node at a time.

Per resource it runs a discovery handler (which devices this node reaches) and
a coordination backend (who holds which slot). It advertises ``capacity``
slots per discovered device, ``<device>-<n>``, identical on every node, and
keeps each slot's health true for this node:

* **unhealthy** when the device stopped answering, or another node holds the
  slot (so the kubelet does not offer it);
* **healthy** when it is free or held by this node.

``preferred_allocation`` steers the kubelet to slots free in a fresh read of
the store; ``allocate`` claims the request's slots atomically (all or
nothing) and fails naming the slot and its holder when one was taken in
between; ``deallocate`` (at least once, also with ``retry=True``) deletes this
node's claims at once. Claims and releases of one slot run one at a time
(:class:`devplug.kit.DeviceLocks`), those of different slots side by side, so
a store call that hangs for one slot holds up that slot only; ``held.json``
changes are written whole under the record store's lock. A keeper thread renews the node's lease, re-reads the
holders every ``refresh_interval`` and writes ``shared-status.json`` (the
kit's rescan loop; the slots' holders and lease are its state, the slots this
node holds the kit's record store). Where the store can be watched (the
``local`` and ``etcd`` backends; option ``watch_store``), a change of its claims wakes the keeper at
once: a slot freed on another node turns healthy here without waiting for
``refresh_interval``, which stays as the safety net for a missed event.

When the store cannot be reached, nothing is released: claims stay (renewed
again once the store answers; the store expires them only after
``lease_ttl``), the last known holders stay advertised, and every new
Allocate, and every release, fails with a message naming the store (the
engine retries a failed release). If the lease was lost meanwhile (the outage
outlasted the TTL), the node claims its pods' slots again when the store is
back; a slot another node took meanwhile is logged and shown as a conflict.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from devplug import ContainerAllocation, Device, DeviceSpec, DriverContext, DriverError, Health, hookimpl
from devplug.kit import DeviceLocks, DriverRuntime, RescanLoop
from devplug_shared.backends import Backend, StoreWatch, build_backend, parse_coordination
from devplug_shared.discovery import DiscoveredDevice, DiscoveryHandler, build_handler
from devplug_shared.options import SharedOptions, resolve_node_name
from devplug_shared.slots import Claim, SlotTakenError, StoreUnavailableError, device_of, slot_ids, sorted_slots
from devplug_shared.state import HeldSlots, write_status

__all__ = ["SharedDriver"]

_module_log = logging.getLogger("devplug_shared")
#: Seconds after which the status file is rewritten even when nothing changed (its ``written`` shows it is fresh).
_STATUS_HEARTBEAT = 30.0
_ENV_BAD = re.compile(r"[^A-Z0-9]+")


def _env_name(*parts: str) -> str:
    return "_".join(_ENV_BAD.sub("_", p.upper()).strip("_") for p in parts)


class SharedDriver:
    """A devplug driver for devices shared across nodes (see the module docstring)."""

    #: The hook contract this driver was written against (see devplug.contract); the core refuses a mismatch.
    hook_contract: ClassVar[str] = "1.1"

    Options: ClassVar[type[SharedOptions]] = SharedOptions

    def __init__(self, options: SharedOptions) -> None:
        self.options = options
        self.node = resolve_node_name(options.node_name)
        self.runtime = DriverRuntime(name="shared", whole=False)  # pushes carry only the slots that changed
        self._handler: DiscoveryHandler | None = None
        self._backend: Backend | None = None
        self._held: HeldSlots | None = None
        self._lock = threading.RLock()  # the view below
        #: The slots a claim or release (or the keeper's re-claim) is working on: work on one slot waits for the
        #: work on it before, never for other slots (one slot's slow store call holds up only that slot).
        self._slots = DeviceLocks()
        self._lease = threading.Lock()  # opening the store, renewing the lease: the keeper's turn, and a first claim's
        self._discovered: dict[str, DiscoveredDevice] = {}
        self._holders: dict[str, Claim] = {}
        self._opened = False
        self._store_error: str | None = None
        self._store_down_since: float | None = None
        self._last_renewal: float | None = None
        self._conflicts: dict[str, str] = {}
        self._stopping = threading.Event()
        self._keeper: RescanLoop | None = None
        self._watch: StoreWatch | None = None
        self._last_status: dict[str, Any] | None = None
        self._last_status_write = 0.0

    def __repr__(self) -> str:
        return f"<SharedDriver node={self.node!r}>"

    @property
    def _log(self) -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
        return self.runtime.log if self.runtime.started else _module_log

    def _need(self) -> tuple[DriverContext, Backend, HeldSlots]:
        if self._backend is None or self._held is None:
            raise DriverError("shared: the driver was not started")
        return self.runtime.ctx, self._backend, self._held

    # --- lifecycle

    @hookimpl
    def start(self, ctx: DriverContext) -> None:
        """Build the handler and backend, resume this node's lease and claims, start discovering and keeping."""
        self.stop()
        self._stopping.clear()
        self.runtime.start(ctx)
        kind, backend_options = parse_coordination(self.options.coordination, "coordination")
        self._backend = build_backend(
            kind, backend_options, node=self.node, resource=ctx.resource_name, state_dir=ctx.state_dir
        )
        self._held = HeldSlots(ctx.state_dir)
        self._handler = build_handler(self.options.discovery, "discovery")
        try:
            self._open_store()
        except StoreUnavailableError as exc:  # serve anyway: pods hold slots; the keeper retries
            self._store_down(exc)
            self._log.error("%s (node %s); retrying every %g s", exc, self.node, self.options.refresh_interval)
        self._handler.start(self._on_discovery)
        self._set_discovered(self._handler.devices())
        ttl = float(getattr(getattr(self._backend, "options", None), "lease_ttl", 10.0))
        period = min(self.options.refresh_interval, ttl / 3)
        self._keeper = RescanLoop(self._keep, interval=period, name="shared-keeper", log=ctx.log)
        self._keeper.start()
        if self.options.watch_store:
            self._watch = self._watch_store(self._backend, self._keeper)
        self._log.info(
            "shared: node %s, %d slot(s) per device, store %s",
            self.node,
            self.options.capacity,
            self._backend.description,
        )

    @hookimpl
    def stop(self) -> None:
        """Stop the keeper and discovery; claims stay in the store (pods keep their slots across restarts)."""
        self._stopping.set()
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.stop(10.0)
        handler, self._handler = self._handler, None
        if handler is not None:
            handler.stop()
        backend, self._backend = self._backend, None
        if backend is not None:
            backend.close()
        self._opened = False

    def _watch_store(self, backend: Backend, keeper: RescanLoop) -> StoreWatch | None:
        """Wake the keeper whenever the store says its claims changed; None when it cannot say (or the watch cannot
        start: the keeper's periodic read is then all there is, as before).

        Fast path (issue 42): the read of the holders after another node released a slot comes at once instead of
        at the keeper's next step; at the default ``refresh_interval`` (1 s) that took 0.5 s of the 2.5-3 s
        hand-over on average, up to 1 s.
        """
        try:
            watch = backend.watch(keeper.trigger)
        except (OSError, StoreUnavailableError) as exc:
            self._log.warning(
                "shared: cannot watch the store %s (%s); reading it every %g s",
                backend.description,
                exc,
                self.options.refresh_interval,
            )
            return None
        if watch is not None:
            self._log.info(
                "shared: watching the store %s: a claim changed elsewhere is read at once (and every %g s anyway)",
                backend.description,
                self.options.refresh_interval,
            )
        return watch

    # --- devices and health

    @hookimpl
    def list_devices(self) -> list[Device]:
        """Every slot of every discovered device, with its health for this node."""
        with self._lock:
            return self.runtime.advertised.set(self._compute(), push=False)

    def _health(self, slot: str) -> Health:
        found = self._discovered.get(device_of(slot))
        if found is None or not found.available:
            return Health.UNHEALTHY
        claim = self._holders.get(slot)
        if claim is not None and claim.holder != self.node:
            return Health.UNHEALTHY
        return Health.HEALTHY

    def _compute(self) -> list[Device]:
        return [
            Device(slot, self._health(slot))
            for name in self._discovered
            for slot in slot_ids(name, self.options.capacity)
        ]

    def _push(self) -> None:
        """Tell the engine about the slots whose health (or existence) changed."""
        if not self.runtime.started or self._stopping.is_set():
            return
        with self._lock:
            self.runtime.advertised.set(self._compute(), whole=False)

    def _set_discovered(self, devices: Sequence[DiscoveredDevice]) -> None:
        with self._lock:
            for dev in devices:  # devices seen once stay advertised; gone ones turn unavailable
                self._discovered[dev.name] = dev

    def _on_discovery(self, devices: Sequence[DiscoveredDevice]) -> None:
        with self._lock:
            seen = {d.name for d in devices}
            for name, old in list(self._discovered.items()):
                if name not in seen and old.available:
                    self._discovered[name] = DiscoveredDevice(name, False, old.properties, old.devnode)
        self._set_discovered(devices)
        self._push()

    # --- allocation

    def _fresh_holders(self) -> Mapping[str, Claim]:
        """The store's holders now; the last known ones when it cannot be read.

        Nothing is pushed from here: a slot found taken between the kubelet's
        choice and its Allocate must reach ``allocate``, which names its holder
        (the engine would refuse it as merely "unhealthy"); the keeper pushes it.
        """
        _, backend, _ = self._need()
        with self._lock:
            known = dict(self._holders)
            if self._store_error is not None:  # known to be down: answer at once, the keeper keeps trying
                return known
        try:
            return dict(backend.holders())
        except StoreUnavailableError:
            return known

    @hookimpl
    def preferred_allocation(self, available: Sequence[Device], must_include: Sequence[str], size: int) -> list[str]:
        """``must_include``, then slots free in a fresh read of the store, spread over devices, then the rest."""
        holders = self._fresh_holders()
        chosen = list(must_include)
        free = [
            d.id for d in available if d.id not in chosen and (d.id not in holders or holders[d.id].holder == self.node)
        ]
        taken = [d.id for d in available if d.id not in chosen and d.id not in free]
        return [*chosen, *free, *taken][:size]

    @hookimpl
    def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation:
        """Claim the slots in the store (all or nothing); the container learns its slots and device addresses."""
        _, backend, held = self._need()
        ids = list(dict.fromkeys(device_ids))
        with self._slots.hold(ids):
            if not self._opened:
                with self._lease:
                    if not self._opened:
                        self._open_store()
            added = held.add(ids)  # before the claim: a crash in between leaves no claim unknown here
            try:
                backend.claim(ids)
            except BaseException as exc:
                held.discard(added)
                if isinstance(exc, SlotTakenError) and exc.claim is not None:
                    with self._lock:
                        self._holders[exc.claim.slot] = exc.claim
                    self._push()
                raise
        now = time.time()
        with self._lock:
            for slot in ids:
                old = self._holders.get(slot)
                self._holders[slot] = (
                    old if old is not None and old.holder == self.node else Claim(slot, self.node, now)
                )
        self._log.info("shared: node %s claimed slot(s) %s", self.node, ", ".join(ids))
        self._write_status()
        return self._allocation(ids)

    def _allocation(self, ids: Sequence[str]) -> ContainerAllocation:
        envs = {"DEVPLUG_SHARED_SLOTS": ",".join(ids), "DEVPLUG_SHARED_NODE": self.node}
        nodes: list[DeviceSpec] = []
        with self._lock:
            for name in dict.fromkeys(device_of(s) for s in ids):
                found = self._discovered.get(name)
                if found is None:
                    continue
                for key, value in found.properties.items():
                    envs[_env_name("DEVPLUG_SHARED", key, name)] = value
                if found.devnode:
                    nodes.append(DeviceSpec(found.devnode, found.devnode, "rw"))
        return ContainerAllocation(envs=envs, devices=tuple(nodes))

    @hookimpl
    def deallocate(self, device_ids: Sequence[str], retry: bool = False) -> None:
        """Delete this node's claims on the slots at once (idempotent: a retry finds them gone)."""
        _, backend, held = self._need()
        ids = list(device_ids)
        with self._slots.hold(ids):
            backend.release(ids)  # StoreUnavailableError: the engine retries; the claim stays meanwhile
            held.discard(ids)
        with self._lock:
            for slot in ids:
                claim = self._holders.get(slot)
                if claim is not None and claim.holder == self.node:
                    del self._holders[slot]
                self._conflicts.pop(slot, None)
        self._log.info("shared: node %s released slot(s) %s%s", self.node, ", ".join(ids), " (retry)" if retry else "")
        self._push()
        self._write_status()

    # --- the store: lease, re-adoption, holders

    def _open_store(self) -> None:
        """Start or resume the lease, claim again the slots our pods hold, drop our other claims."""
        _, backend, held = self._need()
        backend.open()
        self._opened = True
        self._last_renewal = time.time()
        self._readopt(backend, held)
        self._store_up()

    def _readopt(self, backend: Backend, held: HeldSlots) -> None:
        """Claim again each slot ``held.json`` lists, and delete this node's claims on the others.

        A slot a claim or release is working on is left to it (its own store
        call settles the slot's claim); the others are each held while their
        claim is made or deleted, so no claim or release of theirs runs between
        reading ``held.json`` and the store call.
        """
        for slot in sorted_slots(held.snapshot()):
            with self._slots.hold_free([slot]) as free:
                if not free or slot not in held.snapshot():
                    continue
                try:
                    backend.claim([slot])
                except SlotTakenError as exc:
                    holder = exc.claim.holder if exc.claim is not None else "another node"
                    message = f"slot {slot} is held by node {holder} while a pod on node {self.node} holds it"
                    with self._lock:
                        self._conflicts[slot] = message
                    self._log.error("shared: CONFLICT: %s (this node's lease expired during a store outage)", message)
        holders = dict(backend.holders())
        mine = [s for s, c in holders.items() if c.holder == self.node and s not in held.snapshot()]
        with self._slots.hold_free(mine) as free:
            stray = [s for s in free if s not in held.snapshot()]
            if stray:
                self._log.info("shared: deleting claim(s) no pod here holds: %s", ", ".join(stray))
                backend.release(stray)
                for slot in stray:
                    holders.pop(slot, None)
        self._set_holders(holders)

    def _set_holders(self, holders: Mapping[str, Claim]) -> None:
        with self._lock:
            self._holders = dict(holders)
        self._push()

    def _store_up(self) -> None:
        with self._lock:
            if self._store_error is not None:
                self._log.info("shared: the store %s answers again", self._backend.description if self._backend else "")
            self._store_error = None
            self._store_down_since = None

    def _store_down(self, exc: Exception) -> None:
        with self._lock:
            if self._store_error is None:
                self._store_down_since = time.time()
                self._log.error("%s", exc)
            self._store_error = str(exc)

    def _keep(self) -> None:
        """One step of the keeper (a rescan loop every ``refresh_interval``, at most a third of the lease):
        renew the lease, re-read the holders, write the status file. The loop logs a step that fails
        unexpectedly and tries again: a bug here must not stop renewals."""
        _, backend, held = self._need()
        ttl = float(getattr(getattr(backend, "options", None), "lease_ttl", 10.0))
        try:
            with self._lease:
                if not self._opened:
                    self._open_store()
                elif (time.time() - (self._last_renewal or 0.0)) >= ttl / 3:
                    renewed = self._renew(backend, held)
                    if renewed:
                        self._last_renewal = time.time()
                    elif renewed is not None:
                        self._log.error("shared: node %s lost its lease; claiming its pods' slots again", self.node)
                        self._opened = False
                        self._open_store()
                holders = backend.holders()
            self._store_up()
            self._set_holders(holders)
        except StoreUnavailableError as exc:
            self._store_down(exc)
        finally:
            self._write_status()

    def _renew(self, backend: Backend, held: HeldSlots) -> bool | None:
        """Renew the lease and the claims on the held slots no claim or release is working on: True when renewed,
        False when the lease was lost, None when a claim or release began meanwhile on a slot renewed (a release
        may have deleted its claim, which is no lost lease; the next step renews again).

        No slot is held across the store call: a renewal that hangs on one slot's claim (a Lease per slot on the
        ``kubernetes`` backend) keeps no other slot's release waiting.
        """
        idle = [s for s in sorted_slots(held.snapshot()) if s not in self._slots.busy()]
        if backend.keepalive(idle):
            return True
        moved = self._slots.busy() | (set(idle) - held.snapshot())
        return None if moved & set(idle) else False

    # --- observability

    def status(self) -> dict[str, Any]:
        """What ``shared-status.json`` holds: times are unix seconds, so the file changes only with the state."""
        with self._lock:
            slots = []
            for device in self._compute():
                claim = self._holders.get(device.id)
                found = self._discovered.get(device_of(device.id))
                renewed = claim.renewed if claim is not None else None
                if claim is not None and renewed is None and claim.holder == self.node:
                    renewed = self._last_renewal  # etcd: this node's lease, renewed by the keeper
                slots.append(
                    {
                        "slot": device.id,
                        "device": device_of(device.id),
                        "available": bool(found and found.available),
                        "health": str(device.health),
                        "holder": claim.holder if claim is not None else None,
                        "since": claim.since if claim is not None else None,
                        "renewed": renewed,
                        "kept": claim.kept if claim is not None else None,
                    }
                )
            return {
                "resource": self.runtime.ctx.resource_name if self.runtime.started else None,
                "node": self.node,
                "store": self._backend.description if self._backend else None,
                "store_ok": self._store_error is None,
                "store_error": self._store_error,
                "store_down_since": self._store_down_since,
                "conflicts": sorted(self._conflicts.values()),
                "slots": slots,
            }

    def _write_status(self) -> None:
        """Write the status file when it changed, and at least every :data:`_STATUS_HEARTBEAT` seconds."""
        if not self.runtime.started:
            return
        ctx = self.runtime.ctx
        data = self.status()
        now = time.time()
        if data == self._last_status and now - self._last_status_write < _STATUS_HEARTBEAT:
            return
        try:
            ctx.publish_status(data)  # devplug status shows the slots, their holders and lease ages
        except ValueError as exc:
            self._log.warning("shared: cannot publish the status: %s", exc)
        try:
            write_status(ctx.state_dir, {**data, "written": now})
        except OSError as exc:
            self._log.warning("shared: cannot write the status file in %s: %s", ctx.state_dir, exc)
            return
        self._last_status, self._last_status_write = data, now
