"""Finding drivers, and calling them.

Drivers are classes published in the entry-point group ``devplug.drivers``;
the entry-point name is the name operators write in the config. Loading order:
the core's defaults (``trylast``), then the chosen driver, then
``check_pending()`` so that a misspelt hook fails loudly. Set
``DEVPLUG_DISABLE_DRIVERS=a,b`` to hide installed drivers, and
``DEVPLUG_TRACE_HOOKS=1`` to log every hook call at debug level.

The engine calls drivers only through :class:`DriverHooks`, one instance per
resource, each with its own plugin manager, so a hook is never dispatched to
another resource's driver.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pluggy

from devplug import hookimpl, hookspecs
from devplug.allocation import pack_numa, spread_replicas
from devplug.context import DriverContext
from devplug.contract import check_hook_contract
from devplug.errors import (
    AllocationConflictError,
    ConfigError,
    DevplugError,
    DriverError,
    DriverLoadError,
    DriverNotFoundError,
)
from devplug.hookspecs import HOOK_NAMES
from devplug.types import (
    ContainerAllocation,
    Device,
    Health,
    Replicas,
    device_id_problem,
    merge_allocations,
    replica_id,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "DriverCapabilities",
    "DriverHooks",
    "DriverInfo",
    "HOOK_NAMES",
    "driver_hook_names",
    "check_driver_resources",
    "construct_driver",
    "driver_names",
    "installed_drivers",
    "load_driver_class",
]

ENTRY_POINT_GROUP = "devplug.drivers"
DISABLE_ENV = "DEVPLUG_DISABLE_DRIVERS"
TRACE_ENV = "DEVPLUG_TRACE_HOOKS"


log = logging.getLogger("devplug.drivers")


@dataclass(frozen=True)
class EntryPoint:
    """One entry point as a distribution declares it (``name = module:attr`` in its ``entry_points.txt``)."""

    name: str
    value: str

    def load(self) -> Any:
        """Import the module and return the attribute."""
        module, _, attr = self.value.partition(":")
        obj: Any = importlib.import_module(module.strip())
        for part in filter(None, attr.strip().split(".")):
            obj = getattr(obj, part)
        return obj


def _metadata_field(text: str, field: str) -> str:
    for line in text.splitlines():
        if not line.strip():
            break  # the headers end at the first blank line
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() == field:
            return value.strip()
    return "?"


def _distributions(paths: Sequence[str] | None = None) -> Iterator[tuple[Path, str]]:
    """Each distribution's metadata folder on ``paths`` (``sys.path``), with its METADATA (or PKG-INFO) text."""
    for entry in sys.path if paths is None else paths:
        folder = Path(entry or ".")
        try:
            children = sorted(folder.iterdir())
        except OSError:
            continue
        for child in children:
            if child.suffix not in (".dist-info", ".egg-info"):
                continue
            for name in ("METADATA", "PKG-INFO"):
                try:
                    yield child, (child / name).read_text(errors="replace")
                    break
                except OSError:
                    continue


def entry_points(group: str, paths: Sequence[str] | None = None) -> list[tuple[EntryPoint, str, str]]:
    """The entry points of ``group`` of every distribution on ``sys.path``: (entry point, distribution, version).

    Read from the distributions' ``entry_points.txt`` directly (what
    ``importlib.metadata`` does, without its imports, which cost the idle
    daemon about 2 MiB); the first distribution of a name on ``sys.path`` wins.
    """
    found: list[tuple[EntryPoint, str, str]] = []
    seen: set[str] = set()
    for folder, meta in _distributions(paths):
        dist = _metadata_field(meta, "name")
        key = dist.lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        try:
            text = (folder / "entry_points.txt").read_text()
        except OSError:
            continue
        try:
            entries = entry_point_group(text, group)
        except ValueError as exc:
            log.warning("ignoring %s/entry_points.txt: %s", folder, exc)
            continue
        if entries:
            version = _metadata_field(meta, "version")
            found.extend((EntryPoint(name, value), dist, version) for name, value in entries)
    return found


def entry_point_group(text: str, group: str) -> list[tuple[str, str]]:
    """The ``name = object reference`` lines of section ``[group]`` of an ``entry_points.txt`` (the INI form the
    entry points specification gives: ``#`` and ``;`` start comment lines, whitespace around ``=`` is dropped).

    Raises :class:`ValueError` naming the line when one is neither a section header, a comment nor
    ``name = value`` inside a section (configparser, which this replaces, costs the idle daemon 0.2 MiB).
    """
    section: str | None = None
    found: list[tuple[str, str]] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line[0] == "[" and line[-1] == "]":
            section = line[1:-1].strip()
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.strip() or section is None:
            raise ValueError(f"line {number} is not 'name = value' in a [section]: {raw.strip()!r}")
        if section == group:
            found.append((name.strip(), value.strip()))
    return found


@dataclass(frozen=True)
class DriverInfo:
    """An installed driver: its config name and the distribution that ships it."""

    name: str
    distribution: str
    version: str
    entry_point: EntryPoint

    def load(self) -> type:
        """Import the driver class and check it: the hook contract it was built for, then ``list_devices``.

        :class:`DriverLoadError` names the distribution on failure.
        """
        try:
            cls = self.entry_point.load()
        except Exception as exc:
            raise DriverLoadError(
                f"driver {self.name!r} from {self.distribution} {self.version} failed to import "
                f"({self.entry_point.value}): {type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(cls, type):
            raise DriverLoadError(
                f"driver {self.name!r} from {self.distribution} {self.version}: entry point "
                f"{self.entry_point.value} is not a class"
            )
        check_hook_contract(cls, self.name, self.distribution, self.version)
        if "list_devices" not in driver_hook_names(cls):
            raise DriverLoadError(
                f"driver {self.name!r} from {self.distribution} {self.version}: class {cls.__qualname__} "
                "does not implement the required hook list_devices"
            )
        return cls


def _disabled() -> set[str]:
    return {n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()}


def installed_drivers() -> dict[str, DriverInfo]:
    """Every driver installed in this environment and not disabled, by name."""
    found: dict[str, DriverInfo] = {}
    blocked = _disabled()
    for ep, dist, version in entry_points(ENTRY_POINT_GROUP):
        if ep.name in blocked or ep.name in found:
            continue
        found[ep.name] = DriverInfo(name=ep.name, distribution=dist, version=version, entry_point=ep)
    return dict(sorted(found.items()))


def driver_names(extra_paths: Sequence[str] = ()) -> list[str]:
    """The names of the drivers installed here, plus those declared under ``extra_paths``, less the disabled."""
    found = {ep.name for ep, _, _ in entry_points(ENTRY_POINT_GROUP)}
    if extra_paths:
        found.update(ep.name for ep, _, _ in entry_points(ENTRY_POINT_GROUP, extra_paths))
    return sorted(found - _disabled())


def load_driver_class(name: str, where: str = "") -> type:
    """The driver class called ``name``; :class:`DriverNotFoundError` lists the installed ones."""
    drivers = installed_drivers()
    info = drivers.get(name)
    if info is None:
        installed = ", ".join(drivers) or "none"
        prefix = f"{where}: " if where else ""
        raise DriverNotFoundError(
            f"{prefix}no driver named {name!r} is installed (installed: {installed}); "
            f"not installed? pip install devplug-{name}"
        )
    return info.load()


def driver_hook_names(cls: type) -> list[str]:
    """The hooks a driver class implements, in lifecycle order."""
    marker = f"{hookspecs.PROJECT_NAME}_impl"
    return [name for name in HOOK_NAMES if hasattr(getattr(cls, name, None), marker)]


def construct_driver(resource: str, driver: str, cls: type, options: Any) -> object:
    """The driver instance for one resource: ``cls(options)``, or ``cls()`` for a driver without ``Options``.

    Called by the engine when it starts the resource; :class:`DriverError`
    (naming the resource and driver) when the constructor raises.
    """
    try:
        return cls() if getattr(cls, "Options", None) is None else cls(options)
    except Exception as exc:
        raise DriverError(f"{resource}: creating driver {driver!r} failed: {exc}") from exc


def check_driver_resources(resources: Iterable[tuple[str, str, type, Any]], source: str) -> None:
    """Let each driver class check all of its resources together, e.g. for two claiming one device.

    ``resources`` are (resource name, driver name, driver class, options);
    each class's ``check_resources(options by resource name)`` is called once.
    A ``ValueError`` or :class:`~devplug.errors.DevplugError` it raises becomes
    a :class:`~devplug.errors.ConfigError` naming ``source``, the resources and the driver.
    """
    by_class: dict[type, dict[str, Any]] = {}
    names: dict[type, str] = {}
    for name, driver, cls, options in resources:
        by_class.setdefault(cls, {})[name] = options
        names[cls] = driver
    for cls, options in by_class.items():
        check = getattr(cls, "check_resources", None)
        if check is None:
            continue
        try:
            check(options)
        except (ValueError, DevplugError) as exc:
            listed = ", ".join(f'"{name}"' for name in options)
            raise ConfigError(f"{source}: resources {listed} (driver {names[cls]}): {exc}") from exc


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


class DriverHooks:
    """A typed facade over one resource's plugin manager: one method per hook.

    Results are checked here, so the engine only ever sees well-formed values.
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
        tracing = bool(os.environ.get(TRACE_ENV))
        if tracing:
            self.pm.trace.root.setwriter(lambda msg: log.debug("[%s] hook %s", resource_name, msg.rstrip()))
            self.pm.enable_tracing()
        self._tracing = tracing

    def implements(self, hook: str) -> bool:
        """True when a plugin other than the core defaults implements ``hook``."""
        caller = getattr(self.pm.hook, hook)
        return any(impl.plugin is not self._defaults for impl in caller.get_hookimpls())

    def implemented(self) -> list[str]:
        """The hooks the driver (and any extra plugins) implement, in lifecycle order."""
        return [name for name in HOOK_NAMES if self.implements(name)]

    def capabilities(self) -> DriverCapabilities:
        """What the driver implements now, as a frozen value."""
        return DriverCapabilities(tuple(self.implemented()))

    # --- lifecycle

    def start(self, ctx: DriverContext) -> None:
        self.pm.hook.start(ctx=ctx)

    def stop(self) -> None:
        self.pm.hook.stop()

    # --- devices

    def list_devices(self) -> list[Device]:
        result = self.pm.hook.list_devices()
        if result is None:
            raise DriverError(f"{self.resource_name}: list_devices returned nothing (implement the hook)")
        return check_device_list(self.resource_name, result, self.replicas)

    def check_health(self, devices: Sequence[Device]) -> dict[str, Health]:
        result = self.pm.hook.check_health(devices=devices)
        if result is None:
            return {}
        if not isinstance(result, Mapping):
            raise DriverError(f"{self.resource_name}: check_health must return a mapping, got {result!r}")
        return {str(k): v if isinstance(v, Health) else Health(v) for k, v in result.items()}

    # --- allocation

    def preferred_allocation(
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

    def allocate(self, device_ids: Sequence[str], replicas: Replicas | None = None) -> ContainerAllocation:
        ids = tuple(device_ids)
        shown = Replicas.unshared(ids) if replicas is None else replicas
        sole = None if self._tracing else _sole_implementation(self.pm.hook.allocate)
        if sole is not None:  # what pluggy does with one plain implementation, without its dispatch
            args = {"device_ids": ids, "replicas": shown}
            if sole.kwargnames:  # arguments the implementation gives defaults (pluggy passes those it is given)
                part = sole.function(
                    *[args[name] for name in sole.argnames], **{n: args[n] for n in sole.kwargnames if n in args}
                )
            else:
                part = sole.function(*[args[name] for name in sole.argnames])
            parts: list[Any] = [] if part is None else [part]
        else:
            parts = [p for p in self.pm.hook.allocate(device_ids=ids, replicas=shown) if p is not None]
        for part in parts:
            if not isinstance(part, ContainerAllocation):
                raise DriverError(f"{self.resource_name}: allocate must return a ContainerAllocation, got {part!r}")
        if not parts:
            return ContainerAllocation()
        try:
            return merge_allocations(reversed(parts))  # registration order: the driver first
        except AllocationConflictError as exc:
            raise DriverError(f"{self.resource_name}: allocate contributions conflict: {exc}") from exc

    def pre_start(self, device_ids: Sequence[str], replicas: Replicas | None = None) -> None:
        ids = tuple(device_ids)
        self.pm.hook.pre_start(device_ids=ids, replicas=Replicas.unshared(ids) if replicas is None else replicas)

    def post_stop(self, device_ids: Sequence[str], retry: bool = False, replicas: Replicas | None = None) -> None:
        ids = tuple(device_ids)
        shown = Replicas.unshared(ids) if replicas is None else replicas
        self.pm.hook.post_stop(device_ids=ids, retry=retry, replicas=shown)

    def deallocate(self, device_ids: Sequence[str], retry: bool = False, replicas: Replicas | None = None) -> None:
        ids = tuple(device_ids)
        shown = Replicas.unshared(ids) if replicas is None else replicas
        self.pm.hook.deallocate(device_ids=ids, retry=retry, replicas=shown)


def _sole_implementation(caller: pluggy.HookCaller) -> pluggy.HookImpl | None:
    """The hook's implementation when it has exactly one and it wraps nothing: calling its function with the
    arguments it names is then all pluggy's call does. Asked at every call: plugins may be registered later."""
    impls = caller.get_hookimpls()
    if len(impls) != 1 or impls[0].wrapper or impls[0].hookwrapper:
        return None
    return impls[0]


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
