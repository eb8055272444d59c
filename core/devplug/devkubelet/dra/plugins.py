"""The kubelet's DRA plugin manager: the plugin watcher's handler for type ``DRAPlugin``.

Follows ``pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go`` and ``dra_plugin.go``
(Kubernetes 1.34 to 1.36; several instances per driver since PR #129832 in
1.33, connection monitoring since PR #132058):

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
  connected again. The dev kubelet has no API server: a wipe is an event
  (``resource-slices-wiped``) and a call of ``on_wipe``;
* **health** (gate ResourceHealthStatus): each instance gets a
  NodeWatchResources stream at registration, opened again 5 s after it ends
  (``wait.UntilWithContext`` with a 5 s period), whether or not the plugin
  lists ``v1alpha1.DRAResourceHealth``; each message goes to the health cache
  under the driver's name, and each stream's end clears the driver's health.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from devplug.devkubelet.dra.client import DEFAULT_CALL_TIMEOUT, SERVICES_SUPPORTED_BY_KUBELET, DRAPluginClient
from devplug.devkubelet.dra.health import HealthInfoCache
from devplug.devkubelet.dra.model import DRAPluginView
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


def choose_service(supported: Sequence[str]) -> str:
    """``validateSupportedServices``: the first of the plugin's services the kubelet supports; KubeletError if none."""
    if not supported:
        raise KubeletError("empty list of supported gRPC services (aka supported versions)")
    for service in supported:
        if service in SERVICES_SUPPORTED_BY_KUBELET:
            return service
    raise KubeletError(
        f"none of services supported by the plugin ({_go_quote(supported)}) "
        f"are supported by the kubelet ({_go_quote(SERVICES_SUPPORTED_BY_KUBELET)})"
    )


@dataclass
class _Instance:
    client: DRAPluginClient
    order: int
    health: asyncio.Task[None] | None = None


class DRAPluginManager:
    """The registered instances of every DRA driver, and what follows from them (see the module docstring).

    ``health`` receives the health streams (None: the ResourceHealthStatus
    gate off); ``changed`` is called on every change, ``record(kind, driver,
    detail)`` records an event.
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
    ) -> None:
        self._record = record
        self._changed = changed
        self._health = health
        self._call_timeout = call_timeout
        self._wiping_delay = wiping_delay
        self._health_period = health_stream_period
        self._on_wipe = on_wipe
        self._store: dict[str, list[_Instance]] = {}
        self._wipes: dict[str, asyncio.TimerHandle] = {}
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
        instances = [i for found in self._store.values() for i in found]
        self._store.clear()
        for instance in instances:
            await self._end(instance)
        self._changed()

    # -- the plugin watcher's handler (cache.PluginHandler) --------------------------------------

    def validate_plugin(self, name: str, endpoint: str, versions: Sequence[str]) -> None:
        """``ValidatePlugin``: KubeletError when no supported service is listed."""
        try:
            choose_service(versions)
        except KubeletError as exc:
            raise KubeletError(
                f"invalid supported gRPC versions of DRA driver plugin {name} at endpoint {endpoint}: {exc}"
            ) from None

    async def register_plugin(self, name: str, endpoint: str, versions: Sequence[str]) -> None:
        """``RegisterPlugin``: add one instance of driver ``name`` (KubeletError: refused)."""
        try:
            service = choose_service(versions)
        except KubeletError as exc:
            raise KubeletError(
                f"invalid supported gRPC versions of DRA driver plugin {name} at endpoint {endpoint}: {exc}"
            ) from None
        instances = self._store.setdefault(name, [])
        if any(i.client.endpoint == endpoint for i in instances):
            raise KubeletError(f"endpoint {endpoint} already registered for DRA driver plugin {name}")
        client = DRAPluginClient(
            name, endpoint, service, call_timeout=self._call_timeout, on_connection=self._connection_changed
        )
        self._registrations += 1
        instance = _Instance(client, self._registrations)
        if self._health is not None:
            instance.health = asyncio.get_running_loop().create_task(self._watch_health(client))
        client.open()
        instances.append(instance)
        self._record(
            "dra-plugin-registered", name, f"endpoint {endpoint}, service {service}, {len(instances)} instance(s)"
        )
        self._sync(name)

    async def deregister_plugin(self, name: str, endpoint: str) -> None:
        """``DeRegisterPlugin``: remove the instance at ``endpoint`` (nothing when it is not registered)."""
        instances = self._store.get(name, [])
        found = next((i for i in instances if i.client.endpoint == endpoint), None)
        if found is None:
            return
        instances.remove(found)
        if not instances:
            del self._store[name]
        self._record("dra-plugin-deregistered", name, f"endpoint {endpoint}, {len(instances)} instance(s) left")
        self._sync(name)
        await self._end(found)

    async def _end(self, instance: _Instance) -> None:
        if instance.health is not None:
            instance.health.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await instance.health
        await instance.client.close()

    # -- which instance ----------------------------------------------------------------------------

    def get(self, driver: str) -> DRAPluginClient:
        """``GetPlugin``: the newest connected instance of ``driver``, else its newest; KubeletError if none."""
        if not driver:
            raise KubeletError("DRA driver name is empty")
        instances = self._store.get(driver)
        if not instances:
            raise KubeletError(f"DRA driver {driver} is not registered")
        for instance in reversed(instances):
            if instance.client.connected:
                return instance.client
        return instances[-1].client

    def usable(self, driver: str) -> bool:
        """Whether at least one instance of ``driver`` is connected."""
        return any(i.client.connected for i in self._store.get(driver, ()))

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
        self._sync(client.driver)

    def _sync(self, driver: str) -> None:
        """``sync``: cancel a pending wipe when the driver is usable, else schedule one (once)."""
        if self.usable(driver):
            timer = self._wipes.pop(driver, None)
            if timer is not None:
                timer.cancel()
                self._record("resource-slices-kept", driver, "an instance is connected: the pending wipe is cancelled")
        elif driver not in self._wipes and self._running:
            self._wipes[driver] = asyncio.get_running_loop().call_later(self._wiping_delay, self._wipe_due, driver)
        self._changed()

    def _wipe_due(self, driver: str) -> None:
        self._wipes.pop(driver, None)
        self._wipe(driver)

    def _wipe(self, driver: str) -> None:
        what = f"the node's ResourceSlices of {driver}" if driver else "every ResourceSlice of the node"
        self._record("resource-slices-wiped", driver, f"DeleteCollection of {what}")
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
