"""Building a driver instance for a resource, and letting a driver class check all of its resources together."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import Any

from devplug.errors import ConfigError, DevplugError, DriverError
from devplug.types import ResourceSettings

__all__ = ["check_driver_resources", "construct_driver", "takes_settings"]


def construct_driver(resource: str, driver: str, cls: type, options: Any) -> object:
    """The driver instance for one resource: ``cls(options)``, or ``cls()`` for a driver without ``Options``.

    Called by the engine when it starts the resource; :class:`DriverError`
    (naming the resource and driver) when the constructor raises.
    """
    try:
        return cls() if getattr(cls, "Options", None) is None else cls(options)
    except Exception as exc:
        raise DriverError(f"{resource}: creating driver {driver!r} failed: {exc}") from exc


def check_driver_resources(
    resources: Iterable[tuple[str, str, type, Any]],
    source: str,
    settings: Mapping[str, ResourceSettings] | None = None,
) -> None:
    """Let each driver class check all of its resources together, e.g. for two claiming one device.

    ``resources`` are (resource name, driver name, driver class, options);
    each class's ``check_resources(options by resource name)`` is called once,
    with ``settings=`` (each resource's :class:`~devplug.types.ResourceSettings`:
    ``hook_timeout``, ``health_interval``, ``replicas``) too when the method
    declares a ``settings`` parameter (drivers written before it existed are
    called as before). A ``ValueError`` or :class:`~devplug.errors.DevplugError`
    it raises becomes a :class:`~devplug.errors.ConfigError` naming ``source``,
    the resources and the driver.
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
            if settings is not None and takes_settings(check):
                check(options, settings={name: settings[name] for name in options if name in settings})
            else:
                check(options)
        except (ValueError, DevplugError) as exc:
            listed = ", ".join(f'"{name}"' for name in options)
            raise ConfigError(f"{source}: resources {listed} (driver {names[cls]}): {exc}") from exc


def takes_settings(check: Any) -> bool:
    """Whether a ``check_resources`` declares a ``settings`` parameter (or takes any keyword)."""
    try:
        parameters = inspect.signature(check).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "settings" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
