"""Calling drivers: the one layer between devplug and pluggy.

Each resource's driver is registered, with any extra plugins and the core's
defaults (``trylast``), in a plugin manager of that resource alone, so a hook
is never dispatched to another resource's driver; ``check_pending()`` then
makes a misspelt hook fail loudly. :class:`DriverFacade` owns that plugin
manager and has one checked call per hook (``call_<hook>``): the only code in
devplug that calls pluggy. Two front doors share those calls: the engine's
:class:`~devplug.engine.driver.AsyncDriver` awaits them in the resource's hook
thread, :class:`DriverHooks` calls them directly (tests, tools, a driver's own
tests). Set ``DEVPLUG_TRACE_HOOKS=1`` to log every hook call at debug level.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pluggy

from devplug import hookimpl, hookspecs
from devplug.allocation import pack_numa, spread_replicas
from devplug.context import DriverContext
from devplug.errors import AllocationConflictError, DriverError, DriverLoadError
from devplug.hookspecs import HOOK_NAMES
from devplug.types import (
    Claim,
    ContainerAllocation,
    Device,
    Health,
    HealthReport,
    Replicas,
    device_id_problem,
    merge_allocations,
    replica_id,
)

__all__ = ["TRACE_ENV", "DriverCapabilities", "DriverFacade", "DriverHooks", "check_device_list"]

TRACE_ENV = "DEVPLUG_TRACE_HOOKS"

log = logging.getLogger("devplug.drivers")


@dataclass(frozen=True)
class DriverCapabilities:
    """Which hooks a driver (with its extra plugins) implements, computed once when it is loaded.

    The engine derives the kubelet options from it (``pre_start_required``,
    ``get_preferred_allocation_available`` and the KEP's two flags) and skips
    optional hooks a driver does not have.
    """

    implemented: tuple[str, ...]

    def has(self, hook: str) -> bool:
        return hook in self.implemented

    @property
    def pre_start(self) -> bool:
        return self.has("pre_start")

    @property
    def preferred_allocation(self) -> bool:
        return self.has("preferred_allocation")

    @property
    def allocate(self) -> bool:
        return self.has("allocate")

    @property
    def check_health(self) -> bool:
        return self.has("check_health")

    @property
    def post_stop(self) -> bool:
        return self.has("post_stop")

    @property
    def deallocate(self) -> bool:
        return self.has("deallocate")


class _CoreDefaults:
    """The core's fallbacks, registered ``trylast`` in every resource's plugin manager."""

    @hookimpl(trylast=True)
    def preferred_allocation(
        self, available: Sequence[Device], must_include: Sequence[str], size: int, replicas: Replicas
    ) -> Sequence[str]:
        if replicas.shared:
            return spread_replicas(available, must_include, size, replicas)
        return pack_numa(available, must_include, size)


class DriverFacade:
    """One resource's plugin manager (its driver, the driver's extra plugins, the core's defaults) and one
    checked call per hook.

    ``call_<hook>`` calls the hook with the arguments its spec names and
    checks what comes back, so callers only ever see well-formed values (a
    :class:`DriverError` naming the resource otherwise). The calls block for as
    long as the driver's hook does. :class:`~devplug.errors.DriverLoadError`
    when the driver (or an extra plugin) implements a hook the contract lacks.
    """

    def __init__(
        self, resource_name: str, driver: object, extra_plugins: Iterable[object] = (), *, replicas: int = 1
    ) -> None:
        self.resource_name = resource_name
        self.driver = driver
        #: The resource's replicas per device (devices listed are checked for replica IDs that fit).
        self.replicas = replicas
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self._defaults = _CoreDefaults()
        self.pm.register(self._defaults, name="devplug-core-defaults")
        where = f"driver {type(driver).__module__}.{type(driver).__qualname__} for {resource_name}"
        try:
            self.pm.register(driver, name=f"driver:{resource_name}")
            for i, plugin in enumerate(extra_plugins):
                self.pm.register(plugin, name=f"extra:{resource_name}:{i}")
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            raise DriverLoadError(f"{where}: {exc}") from exc
        if os.environ.get(TRACE_ENV):
            self.pm.trace.root.setwriter(lambda msg: log.debug("[%s] hook %s", resource_name, msg.rstrip()))
            self.pm.enable_tracing()

    def _share(self, other: DriverFacade) -> None:
        """Call ``other``'s plugin manager from now on (what :meth:`DriverHooks.sharing` builds on)."""
        self.resource_name, self.driver, self.replicas = other.resource_name, other.driver, other.replicas
        self.pm, self._defaults = other.pm, other._defaults

    def implements(self, hook: str) -> bool:
        """True when a plugin other than the core defaults implements ``hook``."""
        caller = getattr(self.pm.hook, hook)
        return any(impl.plugin is not self._defaults for impl in caller.get_hookimpls())

    def implemented(self) -> list[str]:
        """The hooks the driver (and any extra plugins) implement, in lifecycle order."""
        return [name for name in HOOK_NAMES if self.implements(name)]

    # --- lifecycle

    def call_start(self, ctx: DriverContext) -> None:
        self.pm.hook.start(ctx=ctx)

    def call_stop(self) -> None:
        self.pm.hook.stop()

    # --- devices

    def call_list_devices(self) -> list[Device]:
        result = self.pm.hook.list_devices()
        if result is None:
            raise DriverError(f"{self.resource_name}: list_devices returned nothing (implement the hook)")
        return check_device_list(self.resource_name, result, self.replicas)

    def call_check_health(self, devices: Sequence[Device]) -> dict[str, Health | HealthReport]:
        """Each device's health as the driver gave it, checked: a :class:`Health` (its string made one) keeps the
        device's reason as it was; a :class:`HealthReport` sets it."""
        result = self.pm.hook.check_health(devices=devices)
        if result is None:
            return {}
        if not isinstance(result, Mapping):
            raise DriverError(f"{self.resource_name}: check_health must return a mapping, got {result!r}")
        reports: dict[str, Health | HealthReport] = {}
        for key, value in result.items():
            if isinstance(value, HealthReport):
                reports[str(key)] = value
                continue
            try:
                health = value if isinstance(value, Health) else Health(value)
            except ValueError:
                raise DriverError(
                    f"{self.resource_name}: check_health gave device {key!r} {value!r}, neither a Health "
                    f"({', '.join(h.value for h in Health)}) nor a HealthReport"
                ) from None
            reports[str(key)] = health
        return reports

    # --- allocation

    def call_preferred_allocation(
        self, available: Sequence[Device], must_include: Sequence[str], size: int, replicas: Replicas | None = None
    ) -> list[str]:
        if replicas is None:
            replicas = Replicas.unshared_devices(available)
        result = self.pm.hook.preferred_allocation(
            available=available, must_include=must_include, size=size, replicas=replicas
        )
        if isinstance(result, str) or not isinstance(result, Sequence | set | frozenset):
            raise DriverError(
                f"{self.resource_name}: preferred_allocation must return a list of device IDs, got {result!r}"
            )
        return [str(i) for i in result]

    def call_allocate(
        self, device_ids: Sequence[str], replicas: Replicas | None = None, claim: Claim | None = None
    ) -> ContainerAllocation:
        ids = tuple(device_ids)
        shown = Replicas.unshared(ids) if replicas is None else replicas
        parts = [p for p in self.pm.hook.allocate(device_ids=ids, replicas=shown, claim=claim) if p is not None]
        for part in parts:
            if not isinstance(part, ContainerAllocation):
                raise DriverError(f"{self.resource_name}: allocate must return a ContainerAllocation, got {part!r}")
        if not parts:
            return ContainerAllocation()
        try:
            return merge_allocations(reversed(parts))  # registration order: the driver first
        except AllocationConflictError as exc:
            raise DriverError(f"{self.resource_name}: allocate contributions conflict: {exc}") from exc

    def call_pre_start(self, device_ids: Sequence[str], replicas: Replicas | None = None) -> None:
        ids = tuple(device_ids)
        self.pm.hook.pre_start(device_ids=ids, replicas=Replicas.unshared(ids) if replicas is None else replicas)

    # --- release

    def call_post_stop(self, device_ids: Sequence[str], retry: bool = False, replicas: Replicas | None = None) -> None:
        ids = tuple(device_ids)
        shown = Replicas.unshared(ids) if replicas is None else replicas
        self.pm.hook.post_stop(device_ids=ids, retry=retry, replicas=shown)

    def call_deallocate(self, device_ids: Sequence[str], retry: bool = False, replicas: Replicas | None = None) -> None:
        ids = tuple(device_ids)
        shown = Replicas.unshared(ids) if replicas is None else replicas
        self.pm.hook.deallocate(device_ids=ids, retry=retry, replicas=shown)


class DriverHooks(DriverFacade):
    """A driver's hooks, called directly: one method per hook, named after it, results checked.

    For tests, tools and a driver's own tests; the engine awaits the same
    calls (:class:`~devplug.engine.driver.AsyncDriver`).
    """

    @classmethod
    def sharing(cls, facade: DriverFacade) -> DriverHooks:
        """The hooks of ``facade``'s plugin manager: a plugin registered through either is called by both."""
        hooks = cls.__new__(cls)
        hooks._share(facade)
        return hooks

    def capabilities(self) -> DriverCapabilities:
        """What the driver implements now, as a frozen value."""
        return DriverCapabilities(tuple(self.implemented()))

    start = DriverFacade.call_start
    stop = DriverFacade.call_stop
    list_devices = DriverFacade.call_list_devices
    check_health = DriverFacade.call_check_health
    preferred_allocation = DriverFacade.call_preferred_allocation
    allocate = DriverFacade.call_allocate
    pre_start = DriverFacade.call_pre_start
    post_stop = DriverFacade.call_post_stop
    deallocate = DriverFacade.call_deallocate


def check_device_list(resource_name: str, devices: Any, replicas: int = 1) -> list[Device]:
    """``devices`` as a list, or :class:`DriverError` if it holds a non-Device, a duplicate ID, or a shared
    device whose replica IDs (``<id>::<k>``, ``replicas`` each unless the device says) are too long or taken."""
    out = list(devices)
    seen: set[str] = set()
    for dev in out:
        if not isinstance(dev, Device):
            raise DriverError(f"{resource_name}: list_devices returned {dev!r}, not a devplug.Device")
        if dev.id in seen:
            raise DriverError(f"{resource_name}: list_devices returned device ID {dev.id!r} twice")
        seen.add(dev.id)
    advertised: dict[str, str] = {}
    for dev in out:
        count = dev.replicas if dev.replicas is not None else replicas
        for k in range(count) if count > 1 else ():
            rep = replica_id(dev.id, k)
            problem = device_id_problem(rep)
            if problem is not None:
                raise DriverError(f"{resource_name}: device {dev.id!r} cannot be shared: its replica ID {problem}")
            taken = advertised.setdefault(rep, dev.id)
            if rep in seen or taken != dev.id:
                raise DriverError(
                    f"{resource_name}: replica ID {rep!r} of device {dev.id!r} is also the ID of another device"
                )
    return out
