"""Live reload (SIGHUP, ``devplug reload``): what a new config changes against the running one, and applying it.

:func:`plan_reload` compares two checked configs resource by resource:

* a resource only in the new config is *added* (it starts);
* one only in the running config is *removed* (it drains, then is torn down);
* one whose table differs in anything (driver, options, ``health_interval``,
  ``hook_timeout``) is *changed* (it restarts on the new table, keeping its
  ledger: its state dir is keyed by the resource name);
* the rest is *unchanged* and keeps serving untouched (no new registration).

``[release]`` and ``[shutdown]`` apply live. The kubelet's paths, the state
dir, the node's name and the API server's credentials cannot change under a
running daemon (sockets, lock, ledgers and published slices hang on them): a
new config changing them is refused with a :class:`ConfigError`
naming the key, and the running config stays.

:class:`Reloader` applies a plan to the running daemon: removed resources
drain (advertise nothing, keep releasing what pods hold) and are torn down once
nothing is allocated; changed ones are stopped (after the releases running in
them) and started again; a config that fails to load, or changes what cannot
change live, is refused and the running one stays.

A change of the node's labels that chooses other per-node profiles (:mod:`devplug.profiles`) takes the same path:
the file is read again, and :meth:`ReloadTarget.compose` applies the node's profiles to it (or refuses them, as a
config that does not load); the record's ``trigger`` says which asked.

:class:`ReloadRecord` is what ``devplug status`` (and ``devplug reload``, which
waits for its ``attempts`` to move) shows about the loaded config and the last
reload.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from devplug.config import Config, ResourceConfig, load_config
from devplug.daemon.cdicleanup import remove_spec_of
from devplug.engine import BackgroundTasks, Resource, in_daemon_thread
from devplug.errors import ConfigError, DevplugError

__all__ = ["FIXED_KEYS", "ReloadPlan", "ReloadRecord", "ReloadTarget", "Reloader", "plan_reload"]

log = logging.getLogger("devplug.engine")

#: How often a resource removed by a reload looks whether its allocations are released (or a resource being
#: restarted whether its releases in flight finished).
DRAIN_POLL_S = 0.1
#: Why a resource removed by a reload advertises nothing (shown in ``devplug status``).
REMOVED_REASON = "removed from the config by a reload: advertising no devices until its allocations are released"
#: How long a reload may take to read and check the new config before it is refused (the file itself is read
#: without blocking and bounded in size; this bounds a file system that hangs, and the drivers' option checks).
RELOAD_LOAD_TIMEOUT_S = 30.0

#: The trigger of a reload asked for by SIGHUP (or ``devplug reload``, which sends it).
SIGHUP = "SIGHUP"

#: Settings a running daemon cannot take over: (the key as written in the config, how to read it).
FIXED_KEYS: tuple[tuple[str, Callable[[Config], object]], ...] = (
    ("kubelet.device_plugin_dir", lambda c: c.kubelet.device_plugin_dir),
    ("kubelet.pod_resources_socket", lambda c: c.kubelet.pod_resources_socket),
    ("kubelet.plugins_registry_dir", lambda c: c.kubelet.plugins_registry_dir),
    ("kubelet.plugins_dir", lambda c: c.kubelet.plugins_dir),
    ("state.dir", lambda c: c.state.dir),
    ("node.name", lambda c: c.node.name),
    ("kubernetes.kubeconfig", lambda c: c.kubernetes.kubeconfig),
)


@dataclass(frozen=True)
class ReloadPlan:
    """What applying a new config does, by resource name (each tuple sorted)."""

    added: tuple[ResourceConfig, ...]
    changed: tuple[ResourceConfig, ...]
    removed: tuple[str, ...]
    unchanged: tuple[str, ...]

    def describe(self) -> str:
        """One line for the log: ``added a, b; changed c; removed -; unchanged d``."""
        parts = [
            ("added", [rc.name for rc in self.added]),
            ("changed", [rc.name for rc in self.changed]),
            ("removed", list(self.removed)),
            ("unchanged", list(self.unchanged)),
        ]
        return "; ".join(f"{what} {', '.join(names) or '-'}" for what, names in parts)


def plan_reload(running: Config, new: Config) -> ReloadPlan:
    """Compare ``new`` with the ``running`` config; :class:`ConfigError` if it changes a setting that cannot
    change live (:data:`FIXED_KEYS`), naming the file and key."""
    source = str(new.path) if new.path is not None else "<config>"
    for key, read in FIXED_KEYS:
        before, after = read(running), read(new)
        if before != after:
            raise ConfigError(
                f"{source}: {key}: changed from {before} to {after}, which a running daemon cannot apply "
                "(its sockets, lock and ledgers live there); restart the daemon for it, or put the old value back"
            )
    old = {rc.name: rc for rc in running.resources}
    now = {rc.name: rc for rc in new.resources}
    return ReloadPlan(
        added=tuple(now[n] for n in sorted(now.keys() - old.keys())),
        changed=tuple(now[n] for n in sorted(now.keys() & old.keys()) if now[n] != old[n]),
        removed=tuple(sorted(old.keys() - now.keys())),
        unchanged=tuple(n for n in sorted(now.keys() & old.keys()) if now[n] == old[n]),
    )


@dataclass
class ReloadRecord:
    """The loaded config's generation and the last reload's outcome, as the status file shows them."""

    #: 1 for the config the daemon started with, one more for each reload applied.
    generation: int = 1
    loaded_at: float = field(default_factory=time.time)
    #: Reloads asked for (SIGHUP) and handled, applied or refused.
    attempts: int = 0
    last_at: float | None = None
    #: ``"ok"`` (applied) or ``"refused"`` (the running config stayed), None before the first reload.
    last_result: str | None = None
    last_error: str | None = None
    last_plan: ReloadPlan | None = None
    #: What asked for the last reload: ``SIGHUP`` (also ``devplug reload``), or the node's labels changing.
    last_trigger: str | None = None

    def applied(self, plan: ReloadPlan, trigger: str = SIGHUP) -> None:
        self.attempts += 1
        self.generation += 1
        self.loaded_at = self.last_at = time.time()
        self.last_result, self.last_error, self.last_plan, self.last_trigger = "ok", None, plan, trigger

    def refused(self, reason: str, trigger: str = SIGHUP) -> None:
        self.attempts += 1
        self.last_at = time.time()
        self.last_result, self.last_error, self.last_plan, self.last_trigger = "refused", reason, None, trigger

    def describe(self) -> dict[str, Any]:
        plan = self.last_plan
        return {
            "generation": self.generation,
            "loaded_at": self.loaded_at,
            "attempts": self.attempts,
            "last_at": self.last_at,
            "last_result": self.last_result,
            "last_error": self.last_error,
            "trigger": self.last_trigger,
            "added": [rc.name for rc in plan.added] if plan else [],
            "changed": [rc.name for rc in plan.changed] if plan else [],
            "removed": list(plan.removed) if plan else [],
            "unchanged": list(plan.unchanged) if plan else [],
        }


class ReloadTarget(Protocol):
    """What a reload changes in the daemon (:class:`~devplug.daemon.process.Daemon`)."""

    @property
    def config(self) -> Config:
        """The config running now."""
        ...

    @property
    def resources(self) -> Sequence[Resource]:
        """Every resource alive: those of the config, and those a reload removed that still drain."""
        ...

    def stopping(self) -> bool:
        """True once the shutdown began: no reload applies any more."""
        ...

    def apply_settings(self, config: Config) -> None:
        """Run on ``config`` from now on; what applies live (``[release]``, ``[liveness]``) applies now."""
        ...

    async def compose(self, loaded: Config) -> Config:
        """The config to run of ``loaded`` (as read from the file): with the node's profiles applied
        (:mod:`devplug.profiles`); :class:`ConfigError` when they cannot be."""
        ...

    def start_resource(self, rc: ResourceConfig) -> Resource:
        """Make ``rc``'s resource, count it among those alive and start its life."""
        ...

    def forget(self, resource: Resource) -> None:
        """``resource`` (stopped) is no longer alive: nothing reconciles, watches or shows it any more."""
        ...

    async def end_life(self, resource: Resource) -> None:
        """Cancel ``resource``'s life (see :meth:`~devplug.engine.resource.Resource.live`) and wait for it."""
        ...

    async def write_status(self) -> None:
        """Write the status file now."""
        ...


class Reloader:
    """Reloads the daemon's config file and applies it, one reload at a time."""

    def __init__(self, daemon: ReloadTarget) -> None:
        self._daemon = daemon
        self.record = ReloadRecord()
        #: Resources removed by a reload, waiting for their allocations to be released.
        self._draining: dict[str, asyncio.Future[None]] = {}
        #: Resources being stopped for good by a reload (shutdown waits for these instead of stopping them again).
        self._teardowns: dict[Resource, asyncio.Future[None]] = {}
        self._lock: asyncio.Lock | None = None
        self._tasks = BackgroundTasks()

    def busy(self) -> str | None:
        """Why resources are being started or torn down now (a reload applying, removed resources draining), or
        None: a handover must not begin meanwhile."""
        if self._lock is not None and self._lock.locked():
            return "a reload is being applied"
        if self._draining:
            return f"removed resources still drain: {', '.join(sorted(self._draining))}"
        return None

    def request(self, trigger: str = SIGHUP) -> None:
        """Reload in the background (SIGHUP, or ``trigger``: what asked); reloads run one after another."""
        self._tasks.spawn(self.reload(trigger))

    async def reload(self, trigger: str = SIGHUP) -> None:
        """Load the config file again and apply it, or refuse it (logged and in the status) keeping the running one."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        daemon = self._daemon
        async with self._lock:
            if daemon.stopping():
                return
            path = daemon.config.path
            log.info("reloading %s (%s)", path, trigger)
            try:
                if path is None:
                    raise ConfigError("the daemon was not started from a config file: there is nothing to re-read")
                new = await daemon.compose(await self._load(path))
                plan = plan_reload(daemon.config, new)
            except Exception as exc:  # a DevplugError says what is wrong; anything else is a bug, logged with its trace
                reason = str(exc) if isinstance(exc, DevplugError) else f"{type(exc).__name__}: {exc}"
                self.record.refused(reason, trigger)
                generation = self.record.generation
                log.error(
                    "reload refused, the running config (generation %d) stays: %s",
                    generation,
                    reason,
                    exc_info=None if isinstance(exc, DevplugError) else exc,
                )
                await daemon.write_status()
                return
            daemon.apply_settings(new)
            for name in plan.removed:
                self._drain(self._resource(name))
            await asyncio.gather(*(self._replace(rc) for rc in (*plan.changed, *plan.added)))
            self.record.applied(plan, trigger)
            log.info("reload applied (config generation %d): %s", self.record.generation, plan.describe())
            await daemon.write_status()

    async def _load(self, path: Path) -> Config:
        """Read and check the config file for a reload, in a daemon thread bounded by :data:`RELOAD_LOAD_TIMEOUT_S`
        (a hung read then refuses this reload, and neither later reloads nor the shutdown wait for it)."""
        try:
            return await in_daemon_thread("config-reload", functools.partial(load_config, path), RELOAD_LOAD_TIMEOUT_S)
        except TimeoutError:
            raise ConfigError(
                f"{path}: reading and checking the config took more than {RELOAD_LOAD_TIMEOUT_S:g} s (a hung file "
                "system?); abandoned"
            ) from None

    def _resource(self, name: str) -> Resource:
        return next(r for r in self._daemon.resources if r.name == name)

    async def _replace(self, rc: ResourceConfig) -> None:
        """Start ``rc``'s resource; first stop the instance of that name still running (changed, or draining after
        an earlier removal). The ledger is kept: what pods hold stays held, and is released by the new instance."""
        old = next((r for r in self._daemon.resources if r.name == rc.name), None)
        if old is not None:
            drain = self._draining.pop(rc.name, None)
            if drain is not None:
                drain.cancel()
            log.info("[%s] restarting on its new config", rc.name)
            await asyncio.shield(self._tear_down(old))
        self._daemon.start_resource(rc)

    def _tear_down(self, resource: Resource) -> asyncio.Future[None]:
        """Stop ``resource`` for good (once); the future is done when its socket is gone and its driver stopped."""
        teardown = self._teardowns.get(resource)
        if teardown is None:
            teardown = self._teardowns[resource] = asyncio.ensure_future(self._stop_for_good(resource))
            teardown.add_done_callback(lambda _: self._teardowns.pop(resource, None))
        return teardown

    async def _stop_for_good(self, resource: Resource) -> None:
        resource.wind_down()  # the reconciler starts no new release in it
        while resource.releasing():  # one running finishes in this instance's ledger
            await asyncio.sleep(DRAIN_POLL_S)
        try:
            await resource.stop()
        finally:
            self._daemon.forget(resource)
        await self._daemon.end_life(resource)
        await remove_spec_of(resource, self._daemon.config)

    def _drain(self, resource: Resource) -> None:
        resource.retire(REMOVED_REASON)
        log.info(
            "[%s] removed from the config: advertising no devices; torn down once its %d allocation(s) are released",
            resource.name,
            resource.held_count(),
        )
        self._draining[resource.name] = asyncio.ensure_future(self._drain_then_tear_down(resource))

    async def _drain_then_tear_down(self, resource: Resource) -> None:
        while not resource.drained():
            await asyncio.sleep(DRAIN_POLL_S)
        log.info("[%s] drained: tearing it down (driver stop, socket removed)", resource.name)
        await asyncio.shield(self._tear_down(resource))
        log.info("[%s] torn down", resource.name)
        if self._draining.get(resource.name) is asyncio.current_task():
            del self._draining[resource.name]

    async def shut_down(self) -> None:
        """Stop every resource alive (unbounded: the caller bounds it): the waits of draining resources end (a
        teardown they began goes on), a reload applying now finishes first, teardowns under way are waited for."""
        drains = list(self._draining.values())
        for drain in drains:  # only their waiting is cancelled: a teardown they began goes on (shielded)
            drain.cancel()
        await asyncio.gather(*drains, return_exceptions=True)
        if self._lock is not None:  # a reload applying now finishes first: it may be starting resources
            await self._lock.acquire()
        teardowns = self._teardowns
        await asyncio.gather(
            *(asyncio.shield(teardowns[r]) if r in teardowns else r.stop() for r in self._daemon.resources),
            *teardowns.values(),
        )
