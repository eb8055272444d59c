"""The DRA side of one dev kubelet: plugin watcher, plugin manager, health cache and DRA manager, started together.

:class:`DRAKubelet` owns them for one kubelet process: :meth:`~DRAKubelet.start`
is a kubelet (re)start (the claim cache and device health read back from
``dra_manager_state`` and ``dra_health_state``, every ResourceSlice of the
node wiped, the registry folder walked), :meth:`~DRAKubelet.stop` its end
(connections closed, nothing cleared). The paths follow the kubelet's root
directory (``/var/lib/kubelet``): ``plugins_registry/`` for registration
sockets, the two state files beside it.

``DRAConfig(release=...)`` picks the kubelet release whose rules every part
follows (:data:`~devplug.devkubelet.dra.releases.DRA_RELEASES`, default
1.36; :mod:`~devplug.devkubelet.dra.releases` says what differs and where it
was read). Before 1.34 the kubelet has no DRA health: no health cache file
is read or written and no stream is opened, whatever the gate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from devplug.devkubelet.dra.checkpoint import STATE_FILE
from devplug.devkubelet.dra.claiminfo import ClaimInfoCache
from devplug.devkubelet.dra.client import DEFAULT_CALL_TIMEOUT
from devplug.devkubelet.dra.health import DEFAULT_HEALTH_TIMEOUT, HEALTH_STATE_FILE, HealthInfoCache
from devplug.devkubelet.dra.manager import RECONCILE_PERIOD as MANAGER_RECONCILE_PERIOD
from devplug.devkubelet.dra.manager import DRAManager
from devplug.devkubelet.dra.plugins import DEFAULT_WIPING_DELAY, HEALTH_STREAM_PERIOD, DRAPluginManager
from devplug.devkubelet.dra.registration import (
    DIAL_TIMEOUT,
    GET_INFO_TIMEOUT,
    NOTIFY_TIMEOUT,
    RECONCILE_PERIOD,
    PluginWatcher,
)
from devplug.devkubelet.dra.releases import DEFAULT_RELEASE, DRA_RELEASES, ReleaseRules, release_rules
from devplug.errors import KubeletError

__all__ = ["DRA_PLUGIN_TYPE", "DRA_RELEASES", "PLUGINS_REGISTRY", "DRAConfig", "DRAKubelet"]

_log = logging.getLogger("devplug.devkubelet")

#: ``registerapi.DRAPlugin``: the plugin type DRA drivers give in GetInfo.
DRA_PLUGIN_TYPE = "DRAPlugin"
#: The registration folder's name in the kubelet's root directory.
PLUGINS_REGISTRY = "plugins_registry"
#: The pod workers' ``backOffPeriod``: when a pod sync that failed is tried again.
POD_SYNC_BACKOFF = 10.0
#: The kubelet's ``--sync-frequency``: when a pod whose last sync succeeded is synced again.
POD_RESYNC_PERIOD = 60.0


def _seconds(value: float | None, what: str, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) or value <= 0:
        raise ValueError(f"DRAConfig.{what} must be a number of seconds > 0, got {value!r}")


@dataclass(frozen=True)
class DRAConfig:
    """The DRA side of a dev kubelet: which kubelet release, the kubelet's own timings by default, shorter for tests.

    * ``release``: the kubelet release whose DRA rules are followed, one of
      :data:`DRA_RELEASES` (``"1.32"`` ... ``"1.36"``, default ``"1.36"``); a
      ValueError names an unknown one and the known ones;
    * ``reconcile_period``: the plugin manager's reconciler (``loopSleepDuration``, 1 s);
    * ``dial_timeout``, ``get_info_timeout``, ``notify_timeout``: a registration's calls (10, 1, 5 s);
    * ``call_timeout``: NodePrepareResources/NodeUnprepareResources (45 s);
    * ``wiping_delay``: how long a driver may be unusable before its ResourceSlices are wiped (30 s;
      1.32 wipes at once, whatever this says);
    * ``manager_reconcile_period``: the DRA manager's reconcile loop (60 s; None: only when asked);
    * ``pod_resync_period``: when a pod whose claims could not be prepared is synced again (the pod
      workers' resync, ``--sync-frequency``, 1 min; None: only when asked);
    * ``pod_sync_backoff``: when a terminating pod whose claims could not be unprepared is synced again
      (the pod workers' ``backOffPeriod``, 10 s; None: only when asked);
    * ``resource_health_status``: the ResourceHealthStatus gate (health streams); None: the release's
      default (alpha and off in 1.34 and 1.35, beta and on in 1.36); no effect before 1.34 (no DRA health);
    * ``health_messages``: the ResourceHealthStatusMessage gate (messages in ``allocatedResourcesStatus``;
      only 1.36 has messages at all);
    * ``default_health_timeout``: ``DefaultHealthTimeout`` (30 s);
    * ``health_stream_period``: the wait before a health stream that ended is opened again (5 s);
    * ``deregistration_delay``: how long an unregister operation takes to reach the DRA handler (0: at once).
      The plugin watcher runs each socket's operation in a goroutine of its own, so a deregistration and a
      registration of another socket run at the same time; on a real 1.32 node the deregistration finished only
      2.3 to 14.3 ms before a concurrent registration (issue 37). A test widens that window to see what a
      plugin does when the order flips, as it may on a loaded node.
    """

    release: str = DEFAULT_RELEASE
    reconcile_period: float = RECONCILE_PERIOD
    dial_timeout: float = DIAL_TIMEOUT
    get_info_timeout: float = GET_INFO_TIMEOUT
    notify_timeout: float = NOTIFY_TIMEOUT
    call_timeout: float = DEFAULT_CALL_TIMEOUT
    wiping_delay: float = DEFAULT_WIPING_DELAY
    manager_reconcile_period: float | None = MANAGER_RECONCILE_PERIOD
    pod_resync_period: float | None = POD_RESYNC_PERIOD
    pod_sync_backoff: float | None = POD_SYNC_BACKOFF
    resource_health_status: bool | None = None
    health_messages: bool = True
    default_health_timeout: float = DEFAULT_HEALTH_TIMEOUT
    health_stream_period: float = HEALTH_STREAM_PERIOD
    deregistration_delay: float = 0.0

    def __post_init__(self) -> None:
        delay = self.deregistration_delay
        if isinstance(delay, bool) or not isinstance(delay, int | float) or math.isnan(delay) or delay < 0:
            raise ValueError(f"DRAConfig.deregistration_delay must be a number of seconds >= 0, got {delay!r}")
        try:
            release_rules(self.release)
        except ValueError as exc:
            raise ValueError(f"DRAConfig.release: {exc}") from None
        if self.resource_health_status is not None and not isinstance(self.resource_health_status, bool):
            raise ValueError(
                f"DRAConfig.resource_health_status must be True, False or None, got {self.resource_health_status!r}"
            )
        for name in (
            "reconcile_period",
            "dial_timeout",
            "get_info_timeout",
            "notify_timeout",
            "call_timeout",
            "wiping_delay",
            "default_health_timeout",
            "health_stream_period",
        ):
            _seconds(getattr(self, name), name)
        _seconds(self.manager_reconcile_period, "manager_reconcile_period", allow_none=True)
        _seconds(self.pod_resync_period, "pod_resync_period", allow_none=True)
        _seconds(self.pod_sync_backoff, "pod_sync_backoff", allow_none=True)

    @property
    def rules(self) -> ReleaseRules:
        """The DRA rules of :attr:`release`."""
        return release_rules(self.release)

    @property
    def kubelet_version(self) -> str:
        """What the Node's ``status.nodeInfo.kubeletVersion`` says for this release (e.g. ``"v1.32.13"``)."""
        return self.rules.kubelet_version

    @property
    def health_streams(self) -> bool:
        """Whether the kubelet opens NodeWatchResources streams: a release with DRA health and the gate on."""
        rules = self.rules
        gate = rules.health_gate_default if self.resource_health_status is None else self.resource_health_status
        return rules.health and gate


Recorder = Callable[[str, str, str], None]


class DRAKubelet:
    """The DRA parts of a kubelet process under ``root`` (the kubelet's ``/var/lib/kubelet``).

    ``record(kind, driver, detail)`` records an event, ``changed`` wakes
    waiters; ``active_pods()`` gives the UIDs of the active pods and
    ``sources_ready()`` whether the kubelet's pod sources are ready (the DRA
    manager's reconcile loop needs both); ``on_wipe`` receives the drivers
    whose ResourceSlices the kubelet deletes ("" for all of the node's).
    """

    def __init__(
        self,
        root: Path,
        config: DRAConfig,
        record: Recorder,
        *,
        changed: Callable[[], None],
        active_pods: Callable[[], Collection[str]],
        sources_ready: Callable[[], bool],
        on_wipe: Callable[[str], None] | None = None,
    ) -> None:
        self.root = Path(root).absolute()
        self.config = config
        self._record = record
        self._changed = changed
        self._active_pods = active_pods
        self._sources_ready = sources_ready
        self._on_wipe = on_wipe
        self._parts: tuple[PluginWatcher, DRAPluginManager, HealthInfoCache, DRAManager] | None = None
        self._reconciler: asyncio.Task[None] | None = None

    @property
    def registry(self) -> Path:
        """``<root>/plugins_registry``: where plugins put their registration sockets."""
        return self.root / PLUGINS_REGISTRY

    @property
    def state_file(self) -> Path:
        """``<root>/dra_manager_state``."""
        return self.root / STATE_FILE

    @property
    def health_state_file(self) -> Path:
        """``<root>/dra_health_state``."""
        return self.root / HEALTH_STATE_FILE

    @property
    def running(self) -> bool:
        return self._parts is not None

    def _need(self) -> tuple[PluginWatcher, DRAPluginManager, HealthInfoCache, DRAManager]:
        if self._parts is None:
            raise KubeletError("the dev kubelet is not running: its DRA manager cannot be reached")
        return self._parts

    @property
    def watcher(self) -> PluginWatcher:
        return self._need()[0]

    @property
    def plugins(self) -> DRAPluginManager:
        return self._need()[1]

    @property
    def health(self) -> HealthInfoCache:
        return self._need()[2]

    @property
    def manager(self) -> DRAManager:
        return self._need()[3]

    async def start(self) -> None:
        """A kubelet start: read the state files (KubeletError for a corrupt claim checkpoint), then serve."""
        if self._parts is not None:
            raise KubeletError("the DRA side of the dev kubelet is already running")
        self.root.mkdir(parents=True, exist_ok=True)
        rules = self.config.rules
        cache = ClaimInfoCache(self.state_file, rules)
        if cache.state_file.exists():
            count = sum(1 for _ in cache)
            self._record("dra-checkpoint-read", "", f"{self.state_file.name}: {count} claim(s), none prepared yet")
        health = HealthInfoCache(
            self.health_state_file if rules.health else None,  # no healthinfo.go before 1.34
            default_timeout=self.config.default_health_timeout,
            changed=self._changed,
            read_timeouts=rules.health_timeouts,
            read_messages=rules.health_messages,
        )
        health.arm()
        plugins = DRAPluginManager(
            self._record,
            changed=self._changed,
            health=health if self.config.health_streams else None,
            call_timeout=self.config.call_timeout,
            wiping_delay=self.config.wiping_delay,
            health_stream_period=self.config.health_stream_period,
            on_wipe=self._on_wipe,
            rules=rules,
            deregistration_delay=self.config.deregistration_delay,
        )
        manager = DRAManager(
            cache, plugins, health, self._record, changed=self._changed, health_messages=self.config.health_messages
        )
        watcher = PluginWatcher(
            self.registry,
            {DRA_PLUGIN_TYPE: plugins},
            self._record,
            changed=self._changed,
            reconcile_period=self.config.reconcile_period,
            dial_timeout=self.config.dial_timeout,
            get_info_timeout=self.config.get_info_timeout,
            notify_timeout=self.config.notify_timeout,
        )
        plugins.start()
        try:
            await watcher.start()
        except BaseException:
            await plugins.stop()
            health.close()
            raise
        self._parts = (watcher, plugins, health, manager)
        if self.config.manager_reconcile_period is not None:
            self._reconciler = asyncio.get_running_loop().create_task(
                self._reconcile_loop(self.config.manager_reconcile_period)
            )

    async def stop(self) -> None:
        """The kubelet process ends: stop watching and reconciling, close every plugin connection."""
        parts, self._parts = self._parts, None
        if self._reconciler is not None:
            self._reconciler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reconciler
            self._reconciler = None
        if parts is None:
            return
        watcher, plugins, health, _ = parts
        await watcher.stop()
        await plugins.stop()
        health.close()
        self._changed()

    async def reconcile(self) -> list[str]:
        """One pass of the DRA manager's reconcile loop now; the failures (retried at the next pass)."""
        return await self.manager.reconcile(set(self._active_pods()), self._sources_ready())

    async def _reconcile_loop(self, period: float) -> None:
        """``wait.UntilWithContext(reconcileLoop, 60 s)``: a pass at once, then one per period."""
        while True:
            try:
                for failure in await self.reconcile():
                    self._record("dra-reconcile-failed", "", failure)
            except KubeletError as exc:
                _log.warning("dev kubelet: the DRA reconcile loop: %s", exc)
            except Exception:
                _log.exception("dev kubelet: the DRA reconcile loop failed")
            await asyncio.sleep(period)
