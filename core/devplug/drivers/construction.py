"""Building a driver instance for a resource, and letting a driver class check all of its resources together."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from devplug.errors import ConfigError, DevplugError, DriverError

__all__ = ["check_driver_resources", "construct_driver"]


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
