"""The kubelet's DRA plugin manager: the plugin watcher's handler for type ``DRAPlugin``, per kubelet release.

**1.34 to 1.36** -- ``pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go`` and
``dra_plugin.go`` (several instances per driver since PR #129832 in 1.33,
connection monitoring since PR #132058 in 1.34):

* **validation** (``validateSupportedServices``): the plugin's
  ``supported_versions`` must not be empty ("empty list of supported gRPC
  services (aka supported versions)") and must hold a service the kubelet
  supports (``v1.DRAPlugin``, ``v1beta1.DRAPlugin``); the *first one in the
  plugin's own list* that the kubelet supports is chosen (the Go helper lists
  ``v1.DRAPlugin`` first, so kubelets 1.34+ use v1 with it);
* **instances**: a driver may have several registered instances (one per
  registration socket, rolling updates); each is kept in registration order.
  An instance whose endpoint is already registered for the driver is refused
  ("endpoint ... already registered for DRA driver plugin ...");
* **which instance is called** (``get``, "pick the most recent one"): the
  newest instance whose connection is up; when none is up, the newest one;
* **deregistration** (the registration socket removed) removes that instance
  only, closes its connection and cancels its health stream;
* **ResourceSlices**: at start the kubelet wipes the node's slices of every
  driver; when a driver has no connected instance left (deregistered, or its
  connections lost) its slices are wiped after ``wipingDelay`` (30 s,
  ``defaultWipingDelay`` in ``manager.go``), cancelled when an instance is
  connected again (a wipe already queued keeps its time: the
  ``TimedWorkerQueue`` entry is not replaced). ``DeleteCollection`` goes to
  ``resource.k8s.io/v1``. The dev kubelet has no API server: a wipe is an
  event (``resource-slices-wiped``) and a call of ``on_wipe``;
* **health** (gate ResourceHealthStatus: alpha and off in 1.34 and 1.35, beta
  and on in 1.36): each instance gets a NodeWatchResources stream at
  registration, opened again 5 s after it ends (``wait.UntilWithContext`` with
  a 5 s period), whether or not the plugin lists ``v1alpha1.DRAResourceHealth``;
  each message goes to the health cache under the driver's name, and each
  stream's end clears the driver's health.

**1.33** -- ``registration.go`` and ``plugins_store.go`` of PR #129832 (the
``Store``; ``manager.go`` passes a 30 s ``wipingDelay``): several instances
per driver name, kept in registration order, a second one at a registered
endpoint refused ("endpoint ... already registered for plugin ..."); the
*newest* instance is called, connected or not (nothing watches connections);
services as in 1.32; when the last instance is deregistered its slices are
wiped after the delay, cancelled by the next registration under the name
("new plugin instance registered"); a second deregistration meanwhile starts
the delay anew ("plugin deregistered a second time"). ``DeleteCollection``
goes to ``resource.k8s.io/v1beta1``; no health streams (the kubelet has no
DRA health API before 1.34).

**1.32** -- ``registration.go``, ``plugins_store.go`` and ``plugin.go`` of
v1.32.10 (as ``vendor/k8s.io/kubernetes`` in KubeEdge):

* **one plugin per driver name** (``map[string]*Plugin``): a registration
  under a registered name *replaces* the plugin there ("the old plugin was
  replaced and will be forgotten by the kubelet till the next kubelet
  restart"; its connection, if it ever made one, is left open until then);
  the same endpoint registering again replaces it too;
* **deregistration by name** (``DeRegisterPlugin(pluginName)``: the plugin
  watcher passes no endpoint): when *any* registration socket of the driver
  goes, whoever is registered under the name is dropped ("Deregister DRA
  plugin" with *its* endpoint), and the node's slices of the driver are
  wiped at once (``go h.wipeResourceSlices(pluginName)``: no delay, nothing
  cancels it). A rolling update (new instance first, old socket removed
  after) thus leaves the driver unregistered with its slices gone;
* **services** (``validateSupportedServices``): the first of the *kubelet's*
  list (``v1beta1.DRAPlugin``, then ``v1alpha3.NodeService``) that the plugin
  lists; when it lists neither, v1alpha4 all the same ("plugins at that time
  didn't advertise gRPC services"): only an empty list is refused;
* the plugin called is the one registered under the name ("plugin name ...
  not found in the list of registered DRA plugins" when none); connections
  are not watched; ``DeleteCollection`` goes to ``resource.k8s.io/v1beta1``;
  no health streams.

Every release wipes every slice of the node at kubelet start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from devplug.devkubelet.dra.client import DEFAULT_CALL_TIMEOUT, DRAPluginClient
from devplug.devkubelet.dra.health import HealthInfoCache
from devplug.devkubelet.dra.model import DRAPluginView
from devplug.devkubelet.dra.releases import DEFAULT_RELEASE, SERVICE_V1ALPHA4, ReleaseRules, release_rules
from devplug.errors import KubeletError

__all__ = ["DEFAULT_WIPING_DELAY", "HEALTH_STREAM_PERIOD", "DRAPluginManager", "choose_service"]

_log = logging.getLogger("devplug.devkubelet")

#: ``defaultWipingDelay``: how long a driver may be unusable before the kubelet deletes its ResourceSlices.
DEFAULT_WIPING_DELAY = 30.0
#: The period of the health stream's ``wait.UntilWithContext``: a stream that ended is opened again after it.
HEALTH_STREAM_PERIOD = 5.0

Recorder = Callable[[str, str, str], None]


def _go_quote(values: Sequence[str]) -> str:
    """Go's ``%q`` of a ``[]string``: ``["a" "b"]``."""
    return "[" + " ".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "]"


def choose_service(supported: Sequence[str], rules: ReleaseRules | None = None) -> str:
    """``validateSupportedServices`` of ``rules``' release (default 1.36): the service chosen; KubeletError if none.

    1.34+: the first of the plugin's services the kubelet supports. 1.32/1.33:
    the first of the kubelet's services the plugin lists, else v1alpha4.
    """
    rules = rules if rules is not None else release_rules(DEFAULT_RELEASE)
    if not supported:
        raise KubeletError("empty list of supported gRPC services (aka supported versions)")
    if not rules.plugin_order:
        return next((service for service in rules.services if service in supported), SERVICE_V1ALPHA4)
    for service in supported:
        if service in rules.services:
            return service
    raise KubeletError(
        f"none of services supported by the plugin ({_go_quote(supported)}) "
        f"are supported by the kubelet ({_go_quote(rules.services)})"
    )


@dataclass
class _Instance:
    client: DRAPluginClient
    order: int
    health: asyncio.Task[None] | None = None


class DRAPluginManager:
    """The registered instances of every DRA driver, and what follows from them (see the module docstring).

    ``rules`` is the release followed (default 1.36); ``health`` receives the
    health streams (None: no streams: the ResourceHealthStatus gate off, or a
    release before 1.34); ``changed`` is called on every change,
    ``record(kind, driver, detail)`` records an event.
    """

    def __init__(
        self,
        record: Recorder,
        *,
        changed: Callable[[], None] = lambda: None,
        health: HealthInfoCache | None = None,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        wiping_delay: float = DEFAULT_WIPING_DELAY,
        health_stream_period: float = HEALTH_STREAM_PERIOD,
        on_wipe: Callable[[str], None] | None = None,
        rules: ReleaseRules | None = None,
        deregistration_delay: float = 0.0,
    ) -> None:
        self.rules = rules if rules is not None else release_rules(DEFAULT_RELEASE)
        self._deregistration_delay = deregistration_delay
        self._record = record
        self._changed = changed
        self._health = health if self.rules.health else None
        self._call_timeout = call_timeout
        self._wiping_delay = wiping_delay
        self._health_period = health_stream_period
        self._on_wipe = on_wipe
        self._store: dict[str, list[_Instance]] = {}
        self._wipes: dict[str, asyncio.TimerHandle] = {}
        #: 1.32: instances replaced or dropped, their connections left open until the kubelet stops.
        self._forgotten: list[_Instance] = []
        self._registrations = 0
        self._running = False

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """``NewDRAPluginManager``: no driver is registered yet, so every slice of the node is wiped."""
        self._running = True
        self._wipe("")

    async def stop(self) -> None:
        """``Stop``: cancel pending wipes, close every connection, end every health stream (nothing is cleared)."""
        self._running = False
        for timer in self._wipes.values():
            timer.cancel()
        self._wipes.clear()
        instances = [i for found in self._store.values() for i in found] + self._forgotten
        self._store.clear()
        self._forgotten = []
        for instance in instances:
            await self._end(instance)
        self._changed()

    # -- the plugin watcher's handler (cache.PluginHandler) --------------------------------------

    def _invalid(self, name: str, endpoint: str, exc: KubeletError, *, registering: bool) -> KubeletError:
        if self.rules.plugin_order:
            return KubeletError(
                f"invalid supported gRPC versions of DRA driver plugin {name} at endpoint {endpoint}: {exc}"
            )
        if registering:  # 1.32/1.33 RegisterPlugin
            return KubeletError(f"version check of plugin {name} failed: {exc}")
        return KubeletError(f"invalid versions of plugin {name}: {exc}")  # 1.32/1.33 ValidatePlugin

    def validate_plugin(self, name: str, endpoint: str, versions: Sequence[str]) -> None:
        """``ValidatePlugin``: KubeletError when no supported service is listed."""
        try:
            choose_service(versions, self.rules)
        except KubeletError as exc:
            raise self._invalid(name, endpoint, exc, registering=False) from None

    async def register_plugin(self, name: str, endpoint: str, versions: Sequence[str]) -> None:
        """``RegisterPlugin``: add one instance of driver ``name`` (KubeletError: refused)."""
        try:
            service = choose_service(versions, self.rules)
        except KubeletError as exc:
            raise self._invalid(name, endpoint, exc, registering=True) from None
        instances = self._store.setdefault(name, [])
        if not self.rules.one_plugin_per_name and any(i.client.endpoint == endpoint for i in instances):
            what = "DRA driver plugin" if self.rules.connection_monitoring else "plugin"
            raise KubeletError(f"endpoint {endpoint} already registered for {what} {name}")
        client = DRAPluginClient(
            name,
            endpoint,
            service,
            call_timeout=self._call_timeout,
            on_connection=self._connection_changed,
            rules=self.rules,
        )
        self._registrations += 1
        instance = _Instance(client, self._registrations)
        if self._health is not None:
            instance.health = asyncio.get_running_loop().create_task(self._watch_health(client))
        client.open()
        replaced = ""
        if self.rules.one_plugin_per_name and instances:
            # 1.32 pluginsStore.add: the plugin under the name is replaced and forgotten (its context cancelled)
            [old] = instances
            instances.clear()
            self._forgotten.append(old)
            replaced = f", replacing endpoint {old.client.endpoint} (forgotten by the kubelet till its next restart)"
        instances.append(instance)
        self._record(
            "dra-plugin-registered",
            name,
            f"endpoint {endpoint}, service {service}, {len(instances)} instance(s){replaced}",
        )
        if self.rules.connection_monitoring:
            self._sync(name)
        else:
            self._cancel_wipe(name, "new plugin instance registered")  # 1.33 RegisterPlugin (1.32 has none pending)
            self._changed()

    async def deregister_plugin(self, name: str, endpoint: str) -> None:
        """``DeRegisterPlugin``: remove the instance at ``endpoint``; on 1.32, whoever is registered as ``name``."""
        if self._deregistration_delay:  # the operation's goroutine scheduled late (DRAConfig.deregistration_delay)
            await asyncio.sleep(self._deregistration_delay)
        instances = self._store.get(name, [])
        if self.rules.one_plugin_per_name:
            found = instances[0] if instances else None  # DeRegisterPlugin(pluginName): the endpoint is not passed
        else:
            found = next((i for i in instances if i.client.endpoint == endpoint), None)
        if found is None:
            return  # "Deregister DRA plugin not necessary, was already removed"
        instances.remove(found)
        if not instances:
            del self._store[name]
        self._record(
            "dra-plugin-deregistered", name, f"endpoint {found.client.endpoint}, {len(instances)} instance(s) left"
        )
        if self.rules.connection_monitoring:
            self._sync(name)
            await self._end(found)
        elif not self.rules.wiping_delay:
            # 1.32: the plugin's context is cancelled (its connection stays open); the slices go at once
            self._forgotten.append(found)
            asyncio.get_running_loop().call_soon(self._wipe, name)
            self._changed()
        else:
            # 1.33 Store.remove: the context is cancelled; when it was the last instance, wipe after the delay
            self._forgotten.append(found)
            if not instances:
                self._cancel_wipe(name, "plugin deregistered a second time", record=False)
                self._schedule_wipe(name)
            self._changed()

    async def _end(self, instance: _Instance) -> None:
        if instance.health is not None:
            instance.health.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await instance.health
        await instance.client.close()

    # -- which instance ----------------------------------------------------------------------------

    def get(self, driver: str) -> DRAPluginClient:
        """``GetPlugin``: the instance of ``driver`` to call (see the module docstring); KubeletError if none."""
        legacy = self.rules.one_plugin_per_name
        if not driver:
            raise KubeletError("plugin name is empty" if legacy else "DRA driver name is empty")
        instances = self._store.get(driver)
        if not instances:
            if legacy:
                raise KubeletError(f"plugin name {driver} not found in the list of registered DRA plugins")
            raise KubeletError(f"DRA driver {driver} is not registered")
        if self.rules.connection_monitoring:
            for instance in reversed(instances):
                if instance.client.connected:
                    return instance.client
        return instances[-1].client

    def usable(self, driver: str) -> bool:
        """Whether the kubelet counts ``driver`` usable: an instance connected (1.34+), registered (before)."""
        if self.rules.connection_monitoring:
            return any(i.client.connected for i in self._store.get(driver, ()))
        return bool(self._store.get(driver))

    def views(self, driver: str | None = None) -> list[DRAPluginView]:
        """The registered instances (of ``driver``, or all), oldest first per driver, drivers by name."""
        return [
            DRAPluginView(name, i.client.endpoint, i.client.service, i.client.connected, i.order)
            for name in sorted(self._store)
            if driver is None or name == driver
            for i in self._store[name]
        ]

    def pending_wipes(self) -> frozenset[str]:
        """The drivers whose ResourceSlices are to be wiped once the wiping delay has passed."""
        return frozenset(self._wipes)

    # -- connections and slices ------------------------------------------------------------------

    def _connection_changed(self, client: DRAPluginClient) -> None:
        if not self._running:
            return
        state = "connected" if client.connected else "disconnected"
        self._record(f"dra-plugin-{state}", client.driver, f"endpoint {client.endpoint}")
        if self.rules.connection_monitoring:
            self._sync(client.driver)
        else:
            self._changed()  # before 1.34 nobody watches the connection: nothing follows from it

    def _sync(self, driver: str) -> None:
        """``sync``: cancel a pending wipe when the driver is usable, else schedule one (once)."""
        if self.usable(driver):
            self._cancel_wipe(driver, "an instance is connected: the pending wipe is cancelled")
        elif driver not in self._wipes:
            self._schedule_wipe(driver)
        self._changed()

    def _schedule_wipe(self, driver: str) -> None:
        if self._running:
            self._wipes[driver] = asyncio.get_running_loop().call_later(self._wiping_delay, self._wipe_due, driver)

    def _cancel_wipe(self, driver: str, why: str, *, record: bool = True) -> None:
        timer = self._wipes.pop(driver, None)
        if timer is not None:
            timer.cancel()
            if record:
                self._record("resource-slices-kept", driver, why)

    def _wipe_due(self, driver: str) -> None:
        self._wipes.pop(driver, None)
        self._wipe(driver)

    def _wipe(self, driver: str) -> None:
        if not self._running:
            return
        what = f"the node's ResourceSlices of {driver}" if driver else "every ResourceSlice of the node"
        self._record("resource-slices-wiped", driver, f"DeleteCollection ({self.rules.resource_api}) of {what}")
        if self._on_wipe is not None:
            try:
                self._on_wipe(driver)
            except Exception:
                _log.exception("dev kubelet: the ResourceSlice wipe callback failed")
        self._changed()

    # -- health ------------------------------------------------------------------------------------

    async def _watch_health(self, client: DRAPluginClient) -> None:
        """One instance's health stream, opened again ``health_stream_period`` after each end."""
        assert self._health is not None
        while True:
            reason = "ended"
            try:
                async for message in client.node_watch_resources():
                    changed = self._health.update(client.driver, message)
                    if changed:
                        detail = ", ".join(f"{d.pool_name}/{d.device_name}={d.health.value}" for d in changed)
                        self._record("dra-health", client.driver, detail)
            except KubeletError as exc:
                reason = str(exc)
            except asyncio.CancelledError:
                if self._running:  # deregistered: the stream handler's deferred clearDriver runs
                    self._health.clear_driver(client.driver)
                raise  # the kubelet stopping clears nothing (its process just ends)
            self._health.clear_driver(client.driver)
            self._record("dra-health-stream-ended", client.driver, f"endpoint {client.endpoint}: {reason}")
            await asyncio.sleep(self._health_period)  # the kubelet's period before opening it again
