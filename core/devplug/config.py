"""The daemon's TOML config, parsed strictly into typed values.

::

    [kubelet]
    device_plugin_dir = "/var/lib/kubelet/device-plugins"
    pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock"

    [state]
    dir = "/var/lib/devplug"

    [release]
    interval = 1.0        # seconds between PodResources polls
    grace_period = 10.0   # seconds a fresh allocation may stay invisible in PodResources

    [shutdown]
    timeout = 20.0        # seconds SIGTERM may take; hooks still running then are abandoned

    [resources."example.com/mock"]
    driver = "mock"
    options = { directory = "/var/run/devplug/mock", count = 4 }
    health_interval = 0   # seconds between check_health calls (0: never)
    hook_timeout = 30     # seconds a driver hook may take

Every error is a :class:`~devplug.errors.ConfigError` naming the file, the
table (resource) and the key, with a hint. Relative paths are taken relative to
the config file's folder. Durations must be finite and within sane bounds
(:data:`LIMITS`): NaN or infinity would make a poll loop spin or a grace period
end at once.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devplug.drivers import check_driver_resources, load_driver_class
from devplug.errors import ConfigError, DriverLoadError
from devplug.options import describe_type, parse_options, unknown_key_hint
from devplug.resource_names import invalid_resource_name_reason

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "Config",
    "KubeletConfig",
    "ReleaseConfig",
    "ResourceConfig",
    "ShutdownConfig",
    "StateConfig",
    "load_config",
    "parse_config",
]


@dataclass(frozen=True)
class KubeletConfig:
    """Where the kubelet's sockets are."""

    device_plugin_dir: Path = Path("/var/lib/kubelet/device-plugins")
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")

    @property
    def kubelet_socket(self) -> Path:
        """The kubelet's registration socket."""
        return self.device_plugin_dir / "kubelet.sock"


@dataclass(frozen=True)
class StateConfig:
    """The daemon's own files: lock, allocation ledger, status, drivers' state."""

    dir: Path = Path("/var/lib/devplug")


@dataclass(frozen=True)
class ReleaseConfig:
    """How releases are detected on kubelets that never call Deallocate."""

    interval: float = 1.0
    grace_period: float = 10.0


@dataclass(frozen=True)
class ShutdownConfig:
    """How long SIGTERM may take before driver hooks still running are abandoned."""

    timeout: float = 20.0


@dataclass(frozen=True)
class ResourceConfig:
    """One resource: its name, its driver (class and validated options), and its timings."""

    name: str
    driver: str
    driver_class: type
    options: Any
    health_interval: float = 0.0
    hook_timeout: float = 30.0


@dataclass(frozen=True)
class Config:
    """The whole daemon config."""

    path: Path | None
    kubelet: KubeletConfig = field(default_factory=KubeletConfig)
    state: StateConfig = field(default_factory=StateConfig)
    release: ReleaseConfig = field(default_factory=ReleaseConfig)
    shutdown: ShutdownConfig = field(default_factory=ShutdownConfig)
    resources: tuple[ResourceConfig, ...] = ()


def _where(source: str, *keys: str) -> str:
    parts = []
    for key in keys:
        parts.append(f'"{key}"' if ("." in key or "/" in key) else key)
    return f"{source}: {'.'.join(parts)}"


def _table(data: Mapping[str, Any], key: str, source: str, *outer: str) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{_where(source, *outer, key)}: expected a table, got {value!r}")
    return value


def _check_keys(table: Mapping[str, Any], allowed: Mapping[str, Any], source: str, *keys: str) -> None:
    for key in table:
        if key not in allowed:
            raise ConfigError(f"{_where(source, *keys, key)}: unknown key; {unknown_key_hint(key, allowed)}")


def _path(value: Any, base: Path | None, where: str) -> Path:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected a path (a non-empty string), got {value!r}")
    path = Path(value)
    if not path.is_absolute() and base is not None:
        path = base / path
    return path


#: (lowest, highest, whether 0 means "off") for every duration key, in seconds.
LIMITS: dict[str, tuple[float, float, bool]] = {
    "release.interval": (0.01, 3600.0, False),  # PodResources allows ~100 calls/s
    "release.grace_period": (0.0, 86400.0, False),
    "shutdown.timeout": (0.1, 3600.0, False),
    "health_interval": (0.01, 86400.0, True),
    "hook_timeout": (0.01, 86400.0, False),
}


def _seconds(value: Any, where: str, limit: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: expected a number of seconds, got {value!r}")
    low, high, zero_is_off = LIMITS[limit]
    seconds = float(value)
    if zero_is_off and seconds == 0:
        return 0.0
    if not math.isfinite(seconds) or not low <= seconds <= high:
        off = " (or 0 for never)" if zero_is_off else ""
        raise ConfigError(f"{where}: must be a finite number of seconds from {low:g} to {high:g}{off}, got {value!r}")
    return seconds


_TOP = {"kubelet": None, "state": None, "release": None, "shutdown": None, "resources": None}
_KUBELET = {"device_plugin_dir": None, "pod_resources_socket": None}
_STATE = {"dir": None}
_RELEASE = {"interval": None, "grace_period": None}
_SHUTDOWN = {"timeout": None}
_RESOURCE = {"driver": None, "options": None, "health_interval": None, "hook_timeout": None}


def parse_config(data: Mapping[str, Any], source: str = "<config>", base: Path | None = None) -> Config:
    """Check a parsed TOML document and build the :class:`Config`; ``source`` names it in errors."""
    _check_keys(data, _TOP, source)
    kubelet_t = _table(data, "kubelet", source)
    _check_keys(kubelet_t, _KUBELET, source, "kubelet")
    defaults = KubeletConfig()
    kubelet = KubeletConfig(
        device_plugin_dir=_path(
            kubelet_t.get("device_plugin_dir", str(defaults.device_plugin_dir)),
            base,
            _where(source, "kubelet", "device_plugin_dir"),
        ),
        pod_resources_socket=_path(
            kubelet_t.get("pod_resources_socket", str(defaults.pod_resources_socket)),
            base,
            _where(source, "kubelet", "pod_resources_socket"),
        ),
    )
    state_t = _table(data, "state", source)
    _check_keys(state_t, _STATE, source, "state")
    state = StateConfig(dir=_path(state_t.get("dir", str(StateConfig().dir)), base, _where(source, "state", "dir")))
    release_t = _table(data, "release", source)
    _check_keys(release_t, _RELEASE, source, "release")
    rdef = ReleaseConfig()
    release = ReleaseConfig(
        interval=_seconds(
            release_t.get("interval", rdef.interval), _where(source, "release", "interval"), "release.interval"
        ),
        grace_period=_seconds(
            release_t.get("grace_period", rdef.grace_period),
            _where(source, "release", "grace_period"),
            "release.grace_period",
        ),
    )
    shutdown_t = _table(data, "shutdown", source)
    _check_keys(shutdown_t, _SHUTDOWN, source, "shutdown")
    shutdown = ShutdownConfig(
        timeout=_seconds(
            shutdown_t.get("timeout", ShutdownConfig().timeout),
            _where(source, "shutdown", "timeout"),
            "shutdown.timeout",
        )
    )
    resources_t = _table(data, "resources", source)
    if not resources_t:
        raise ConfigError(
            f'{source}: no resources configured; add a table like [resources."example.com/mock"] with driver = "mock"'
        )
    resources = tuple(_parse_resource(name, table, source, base) for name, table in resources_t.items())
    check_driver_resources(((rc.name, rc.driver, rc.driver_class, rc.options) for rc in resources), source)
    return Config(
        path=Path(source) if base is not None else None,
        kubelet=kubelet,
        state=state,
        release=release,
        shutdown=shutdown,
        resources=resources,
    )


def _parse_resource(name: str, table: Any, source: str, base: Path | None) -> ResourceConfig:
    where = _where(source, "resources", name)
    reason = invalid_resource_name_reason(name)
    if reason is not None:
        raise ConfigError(f'{where}: the kubelet would refuse the resource name "{name}": {reason}')
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table, got {table!r}")
    _check_keys(table, _RESOURCE, source, "resources", name)
    driver = table.get("driver")
    if not isinstance(driver, str) or not driver:
        raise ConfigError(f'{where}.driver: missing; name the driver, e.g. driver = "mock"')
    try:
        driver_class = load_driver_class(driver, where=f"{where}.driver")
    except DriverLoadError as exc:
        raise ConfigError(f"{where}.driver: {exc}") from exc
    options_t = table.get("options", {})
    if not isinstance(options_t, dict):
        raise ConfigError(f"{where}.options: expected {describe_type(dict[str, Any])}, got {options_t!r}")
    schema = getattr(driver_class, "Options", None)
    options_t = _resolve_option_paths(schema, options_t, base)
    options = parse_options(schema, options_t, f"{where}.options")
    return ResourceConfig(
        name=name,
        driver=driver,
        driver_class=driver_class,
        options=options,
        health_interval=_seconds(table.get("health_interval", 0.0), f"{where}.health_interval", "health_interval"),
        hook_timeout=_seconds(table.get("hook_timeout", 30.0), f"{where}.hook_timeout", "hook_timeout"),
    )


def _resolve_option_paths(schema: Any, table: Mapping[str, Any], base: Path | None) -> dict[str, Any]:
    """Relative ``Path`` options are relative to the config file, like the core's own paths."""
    out = dict(table)
    if base is None or schema is None:
        return out
    import typing

    hints = typing.get_type_hints(schema)
    for key, value in table.items():
        tp = hints.get(key)
        accepts_path = tp is Path or Path in typing.get_args(tp)
        if accepts_path and isinstance(value, str) and value and not Path(value).is_absolute():
            out[key] = str(base / value)
    return out


def load_config(path: Path) -> Config:
    """Read and check the config file at ``path``."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file: {exc.strerror or exc}") from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    return parse_config(data, source=str(path), base=path.resolve().parent)
