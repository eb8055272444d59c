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
    previous_tenant_wait = 4.0   # seconds an Allocate waits for a previous tenant being killed to exit
    max_retry_interval = 60.0    # a failing release is retried with backoff, at most this far apart

    [liveness]            # release evidence: no process left in the pod's cgroup
    cgroup_mount = "/sys/fs/cgroup"  # the node's cgroup filesystem (in a pod: the host's, mounted read-only)
    cgroup_root = "/"     # the kubelet's --cgroup-root
    cgroup_driver = "auto"           # the kubelet's cgroup driver: cgroupfs, systemd, or auto
    unknown_grace = 30.0  # without readable cgroups: seconds after its pod vanished before a tenancy is released
    required = false      # true: /readyz fails while the pods' cgroups cannot be read

    [shutdown]
    timeout = 20.0        # seconds SIGTERM may take; hooks still running then are abandoned

    [handover]            # upgrades without downtime (docs/operator/upgrades.md)
    enabled = false       # a second instance on this state dir takes over instead of refusing to start;
                          # socket names carry the instance (DEVPLUG_INSTANCE, e.g. the pod UID)
    timeout = 30.0        # seconds a handover may take before the old instance goes on serving

    [metrics]
    enabled = false       # the Prometheus endpoint and the probes (needs devplug[metrics])
    address = "127.0.0.1" # default: $POD_IP (in a DaemonSet, the downward API's status.podIP), else 127.0.0.1
    port = 19400

    [cdi]
    enabled = false       # write CDI spec files and answer Allocate with CDI device names
    spec_dir = "/var/run/cdi"
    fallback = true       # also send device nodes, mounts and envs, for runtimes without CDI

    [resources."example.com/mock"]      # the base config's resources (per-node changes: [profiles], below)
    driver = "mock"
    options = { directory = "/var/run/devplug/mock", count = 4 }
    health_interval = 0   # seconds between check_health calls (0: never)
    hook_timeout = 30     # seconds a driver hook may take
    cdi_kind = "example.com/mock"   # the CDI kind (vendor/class); default: the resource name
    replicas = 1          # containers that may share each device (its replicas); 1: not shared
    rename = "example.com/mock.shared"      # optional: advertise the resource under this name
    fail_requests_greater_than_one = false  # refuse a container asking for more than one device

    [profiles.big]        # a per-node profile (devplug.profiles): chosen by the node label devplug.io/profile=big
    resources."example.com/mock".options = { directory = "/var/run/devplug/mock", count = 16 }

Every error is a :class:`~devplug.errors.ConfigError` naming the file, the
table (resource) and the key, with a hint. Relative paths are taken relative to
the config file's folder. Durations must be finite and within sane bounds
(:data:`LIMITS`): NaN or infinity would make a poll loop spin or a grace period
end at once.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devplug.config.dra import (
    API_DEVICE_PLUGIN,
    NODE_NAME_ENV,
    DraConfig,
    KubernetesConfig,
    NodeConfig,
    parse_api,
    parse_kubernetes,
    parse_node,
)
from devplug.config.file import read_config_bytes
from devplug.config.profilemerge import check_references
from devplug.config.profiles import ProfileSet, parse_profiles
from devplug.drivers.construction import check_driver_resources
from devplug.drivers.discovery import DriverInfo, installed_drivers, load_driver_class
from devplug.errors import ConfigError, DriverLoadError
from devplug.kube.names import invalid_resource_name_reason
from devplug.options import describe_type, node_checks, parse_options, unknown_key_hint
from devplug.types import ResourceSettings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "CdiConfig",
    "Config",
    "DEFAULT_METRICS_PORT",
    "DraConfig",
    "HandoverConfig",
    "KubernetesConfig",
    "NodeConfig",
    "MetricsConfig",
    "POD_IP_ENV",
    "KubeletConfig",
    "LivenessConfig",
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
    #: Where plugins register with the kubelet's plugin watcher (DRA).
    plugins_registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    #: ``<plugins_dir>/<DRA driver name>/`` holds a DRA resource's service socket.
    plugins_dir: Path = Path("/var/lib/kubelet/plugins")

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
    #: How long an Allocate of a device waits for the previous tenant's containers to exit before it is refused,
    #: when they are being killed (the kubelet forgot the pod during its current run) and still run: the kubelet
    #: can hand a device on while the old pod's containers run out their grace period. The kubelet admits every pod
    #: of the node in one loop and waits for Allocate without a deadline, so the node stalls this long at most. The
    #: default covers a forced deletion (killed after ``minimumGracePeriodInSeconds``, 2 s, in
    #: ``pkg/kubelet/kuberuntime/kuberuntime_container.go``) and the runtime's stop; a longer grace period is
    #: refused sooner, its devices withheld until its containers are gone.
    previous_tenant_wait: float = 4.0
    #: Failing releases are retried with capped exponential backoff (and jitter), at most this many seconds apart.
    max_retry_interval: float = 60.0


#: The cgroup drivers the kubelet knows (``--cgroup-driver``), and ``auto``: whichever layout the node has.
CGROUP_DRIVERS = ("auto", "cgroupfs", "systemd")


@dataclass(frozen=True)
class LivenessConfig:
    """Where the node's cgroups are, so that a tenancy is released only once no process of its pod is left.

    ``cgroup_mount`` is the cgroup filesystem (cgroup v2, or the folder of the v1 hierarchies); ``cgroup_root``
    the kubelet's ``--cgroup-root``; ``cgroup_driver`` its ``--cgroup-driver`` (``auto``: the layout found).
    Where the pods' cgroups cannot be read, a tenancy whose pod vanished is released ``unknown_grace`` seconds
    later (the kubelet's default termination grace period); ``required`` makes that a readiness failure.
    """

    cgroup_mount: Path = Path("/sys/fs/cgroup")
    cgroup_root: str = "/"
    cgroup_driver: str = "auto"
    unknown_grace: float = 30.0
    required: bool = False


@dataclass(frozen=True)
class ShutdownConfig:
    """How long SIGTERM may take before driver hooks still running are abandoned."""

    timeout: float = 20.0


@dataclass(frozen=True)
class HandoverConfig:
    """Handing the node over from a running instance to a new one on the same state dir (a rolling update)."""

    enabled: bool = False
    #: Seconds from the new instance's request until it must hold the state lock and serve; past it the old
    #: instance goes on serving and the new one exits.
    timeout: float = 30.0


#: The environment variable whose IP address ``[metrics] address`` defaults to: in a DaemonSet, the pod's IP from
#: the downward API (``status.podIP``), which the kubelet's probes and Prometheus reach, and nothing else (under
#: ``hostNetwork`` the node's primary address, not every address of the node as ``0.0.0.0`` would be).
POD_IP_ENV = "POD_IP"

#: ``[metrics] port``'s default. Prometheus's list of exporters' default ports (its wiki's "Default port
#: allocations") has every port of 9100-9999 taken; devplug's earlier default, 9400, is NVIDIA dcgm-exporter's, which
#: runs on the same GPU nodes. 19400 is on no such list, nor among Kubernetes' or OpenShift's host ports.
DEFAULT_METRICS_PORT = 19400


@dataclass(frozen=True)
class MetricsConfig:
    """The Prometheus endpoint (``/metrics``) and the probes (``/healthz``, ``/readyz``): off by default."""

    enabled: bool = False
    #: Without ``address`` in the config: ``$POD_IP`` when set (:data:`POD_IP_ENV`), else this.
    address: str = "127.0.0.1"
    port: int = DEFAULT_METRICS_PORT


@dataclass(frozen=True)
class CdiConfig:
    """Container Device Interface spec files for the devices drivers describe (``Device.allocation``)."""

    enabled: bool = False
    spec_dir: Path = Path("/var/run/cdi")
    #: Also send the device nodes, mounts and envs in Allocate, for runtimes that ignore CDI names.
    fallback: bool = True


@dataclass(frozen=True)
class ResourceConfig:
    """One resource: its name, its driver (class and validated options), and its timings."""

    name: str
    driver: str
    driver_class: type
    options: Any
    health_interval: float = 0.0
    hook_timeout: float = 30.0
    #: How many replicas of each device are advertised (a driver's :attr:`devplug.Device.replicas` overrides it
    #: per device); 1: devices are not shared.
    replicas: int = 1
    #: Refuse an Allocate for more than one device (replica) per container, as time-slicing operators expect.
    fail_requests_greater_than_one: bool = False
    #: The name in the config's table when ``rename`` advertises the resource as :attr:`name` (else ``None``).
    configured_name: str | None = None
    #: The CDI kind (``vendor/class``) of the resource's devices; by default the resource name.
    cdi_kind: str = ""
    #: The kubelet API it is served through: ``"device-plugin"`` or ``"dra"``.
    api: str = API_DEVICE_PLUGIN
    #: Its DRA driver name and pool, when ``api`` is ``"dra"``.
    dra: DraConfig | None = None

    def __post_init__(self) -> None:
        if not self.cdi_kind:
            object.__setattr__(self, "cdi_kind", self.name)


@dataclass(frozen=True)
class Config:
    """The whole daemon config."""

    path: Path | None
    kubelet: KubeletConfig = field(default_factory=KubeletConfig)
    state: StateConfig = field(default_factory=StateConfig)
    release: ReleaseConfig = field(default_factory=ReleaseConfig)
    liveness: LivenessConfig = field(default_factory=LivenessConfig)
    shutdown: ShutdownConfig = field(default_factory=ShutdownConfig)
    resources: tuple[ResourceConfig, ...] = ()
    handover: HandoverConfig = field(default_factory=HandoverConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    cdi: CdiConfig = field(default_factory=CdiConfig)
    node: NodeConfig = field(default_factory=NodeConfig)
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)
    #: The file's ``[profiles]`` (see :mod:`devplug.profiles`), with the base document they are merged into.
    profiles: ProfileSet = field(default_factory=ProfileSet, compare=False, repr=False)
    #: The profiles this config was composed with (:func:`devplug.profiles.compose.compose`); () for the base.
    applied: tuple[str, ...] = ()


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
    "release.previous_tenant_wait": (0.0, 3600.0, False),
    "release.max_retry_interval": (0.01, 86400.0, False),
    "liveness.unknown_grace": (0.0, 86400.0, False),
    "shutdown.timeout": (0.1, 3600.0, False),
    "handover.timeout": (0.5, 600.0, False),
    "health_interval": (0.01, 86400.0, True),
    "hook_timeout": (0.01, 86400.0, False),
}


def _health_interval(table: Mapping[str, Any], driver: str, driver_class: type, where: str) -> float:
    """The resource's ``health_interval``; when the config does not set one, the driver class's default
    (its ``health_interval`` attribute, seconds), else 0 (never)."""
    if "health_interval" in table:
        return _seconds(table["health_interval"], f"{where}.health_interval", "health_interval")
    default = getattr(driver_class, "health_interval", 0.0)
    return _seconds(
        default, f"{where}: health_interval, the default of driver {driver!r} (its class attribute)", "health_interval"
    )


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


_TOP = {
    "node": None,
    "kubernetes": None,
    "kubelet": None,
    "state": None,
    "release": None,
    "liveness": None,
    "shutdown": None,
    "handover": None,
    "metrics": None,
    "cdi": None,
    "resources": None,
    "profiles": None,
}
_KUBELET = {"device_plugin_dir": None, "pod_resources_socket": None, "plugins_registry_dir": None, "plugins_dir": None}
_STATE = {"dir": None}
_RELEASE = {"interval": None, "grace_period": None, "previous_tenant_wait": None, "max_retry_interval": None}
_LIVENESS = {"cgroup_mount": None, "cgroup_root": None, "cgroup_driver": None, "unknown_grace": None, "required": None}
_SHUTDOWN = {"timeout": None}
_HANDOVER = {"enabled": None, "timeout": None}
_METRICS = {"enabled": None, "address": None, "port": None}
_CDI = {"enabled": None, "spec_dir": None, "fallback": None}

#: A CDI kind, ``vendor/class``: CDI's ``pkg/parser`` wants both parts to start with a letter and hold letters,
#: digits, ``_``, ``-``, ``.``; devplug's :class:`~devplug.types.CDIDevice` also wants the vendor a lowercase
#: domain name (``example.com``), as the resource names' domains are.
_CDI_KIND = re.compile(
    r"^[a-z]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+/[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$"
)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    return value


def _parse_metrics(data: Mapping[str, Any], source: str) -> MetricsConfig:
    table = _table(data, "metrics", source)
    _check_keys(table, _METRICS, source, "metrics")
    defaults = MetricsConfig()
    enabled = _bool(table.get("enabled", defaults.enabled), _where(source, "metrics", "enabled"))
    if "address" in table:
        address, where = table["address"], _where(source, "metrics", "address")
    else:  # the pod's IP in a DaemonSet (the downward API's status.podIP), else this node only
        address = os.environ.get(POD_IP_ENV, "") or defaults.address
        where = f"{source}: [metrics] address from the environment variable {POD_IP_ENV}"
    if not isinstance(address, str):
        raise ConfigError(f"{where}: expected an IP address as a string, got {address!r}")
    try:
        ipaddress.ip_address(address)
    except ValueError:
        raise ConfigError(
            f'{where}: {address!r} is not an IP address; use "127.0.0.1" (this node only), the pod\'s IP '
            f'(unset, with {POD_IP_ENV} from the downward API\'s status.podIP), or "0.0.0.0" / "::" for every '
            "address"
        ) from None
    port = table.get("port", defaults.port)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ConfigError(f"{_where(source, 'metrics', 'port')}: expected a TCP port from 1 to 65535, got {port!r}")
    if enabled and importlib.util.find_spec("prometheus_client") is None:
        raise ConfigError(
            f"{_where(source, 'metrics', 'enabled')}: the metrics endpoint needs prometheus-client, which is not "
            "installed; pip install 'devplug[metrics]' (or set enabled = false)"
        )
    return MetricsConfig(enabled=enabled, address=address, port=port)


def _parse_liveness(data: Mapping[str, Any], source: str, base: Path | None) -> LivenessConfig:
    table = _table(data, "liveness", source)
    _check_keys(table, _LIVENESS, source, "liveness")
    defaults = LivenessConfig()
    root = table.get("cgroup_root", defaults.cgroup_root)
    where = _where(source, "liveness", "cgroup_root")
    if not isinstance(root, str) or not root.startswith("/") or "\0" in root or ".." in root.split("/"):
        raise ConfigError(
            f'{where}: expected the kubelet\'s --cgroup-root, an absolute cgroup path like "/" (the default) or '
            f'"/kubelet", got {root!r}'
        )
    driver = table.get("cgroup_driver", defaults.cgroup_driver)
    if driver not in CGROUP_DRIVERS:
        raise ConfigError(
            f"{_where(source, 'liveness', 'cgroup_driver')}: expected one of {', '.join(CGROUP_DRIVERS)} (the "
            f"kubelet's --cgroup-driver, or auto to use the layout found), got {driver!r}"
        )
    return LivenessConfig(
        cgroup_mount=_path(
            table.get("cgroup_mount", str(defaults.cgroup_mount)), base, _where(source, "liveness", "cgroup_mount")
        ),
        cgroup_root=root,
        cgroup_driver=driver,
        unknown_grace=_seconds(
            table.get("unknown_grace", defaults.unknown_grace),
            _where(source, "liveness", "unknown_grace"),
            "liveness.unknown_grace",
        ),
        required=_bool(table.get("required", defaults.required), _where(source, "liveness", "required")),
    )


def _parse_cdi(data: Mapping[str, Any], source: str, base: Path | None) -> CdiConfig:
    table = _table(data, "cdi", source)
    _check_keys(table, _CDI, source, "cdi")
    defaults = CdiConfig()
    return CdiConfig(
        enabled=_bool(table.get("enabled", defaults.enabled), _where(source, "cdi", "enabled")),
        spec_dir=_path(table.get("spec_dir", str(defaults.spec_dir)), base, _where(source, "cdi", "spec_dir")),
        fallback=_bool(table.get("fallback", defaults.fallback), _where(source, "cdi", "fallback")),
    )


def _cdi_kind(table: Mapping[str, Any], name: str, where: str) -> str:
    """The resource's CDI kind: ``cdi_kind``, else the resource name (which must then be a valid kind)."""
    kind = table.get("cdi_kind")
    if kind is None:
        return name  # checked only when CDI is enabled (_check_cdi_kinds)
    if not isinstance(kind, str) or not _CDI_KIND.match(kind):
        raise ConfigError(
            f'{where}.cdi_kind: {kind!r} is not a CDI kind; expected vendor/class like "example.com/gpu" '
            "(the vendor a lowercase domain starting with a letter; the class a letter, then letters, digits, "
            "'_', '-', '.', ending with a letter or digit)"
        )
    return kind


_RESOURCE = {
    "driver": None,
    "options": None,
    "health_interval": None,
    "hook_timeout": None,
    "replicas": None,
    "rename": None,
    "fail_requests_greater_than_one": None,
    "cdi_kind": None,
    "api": None,
    "dra": None,
}
#: The most replicas a device may be advertised as (each is a device ID the kubelet keeps).
MAX_REPLICAS = 1024


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
        plugins_registry_dir=_path(
            kubelet_t.get("plugins_registry_dir", str(defaults.plugins_registry_dir)),
            base,
            _where(source, "kubelet", "plugins_registry_dir"),
        ),
        plugins_dir=_path(
            kubelet_t.get("plugins_dir", str(defaults.plugins_dir)), base, _where(source, "kubelet", "plugins_dir")
        ),
    )
    state_t = _table(data, "state", source)
    _check_keys(state_t, _STATE, source, "state")
    state = StateConfig(dir=_path(state_t.get("dir", str(StateConfig().dir)), base, _where(source, "state", "dir")))
    release_t = _table(data, "release", source)
    _check_keys(release_t, _RELEASE, source, "release")
    rdef = ReleaseConfig()
    release = ReleaseConfig(
        **{
            key: _seconds(release_t.get(key, getattr(rdef, key)), _where(source, "release", key), f"release.{key}")
            for key in _RELEASE
        }
    )
    liveness = _parse_liveness(data, source, base)
    shutdown_t = _table(data, "shutdown", source)
    _check_keys(shutdown_t, _SHUTDOWN, source, "shutdown")
    shutdown = ShutdownConfig(
        timeout=_seconds(
            shutdown_t.get("timeout", ShutdownConfig().timeout),
            _where(source, "shutdown", "timeout"),
            "shutdown.timeout",
        )
    )
    handover_t = _table(data, "handover", source)
    _check_keys(handover_t, _HANDOVER, source, "handover")
    handover = HandoverConfig(
        enabled=_bool(handover_t.get("enabled", False), _where(source, "handover", "enabled")),
        timeout=_seconds(
            handover_t.get("timeout", HandoverConfig().timeout),
            _where(source, "handover", "timeout"),
            "handover.timeout",
        ),
    )
    resources_t = _table(data, "resources", source)
    if not resources_t:
        raise ConfigError(
            f'{source}: no resources configured; add a table like [resources."example.com/mock"] with driver = "mock"'
        )
    metrics = _parse_metrics(data, source)
    cdi = _parse_cdi(data, source, base)
    drivers = installed_drivers()  # one scan of sys.path for every resource (8.5 ms each; issue 42)
    resources = tuple(_parse_resource(name, table, source, base, drivers) for name, table in resources_t.items())
    _check_cdi_kinds(resources, cdi, source)
    _check_renames(resources, source)
    node = parse_node(data, source)
    _check_dra(resources, node, source)
    profiles = ProfileSet(
        parse_profiles(data, source), {k: v for k, v in data.items() if k != "profiles"}, base, source
    )
    check_references(profiles)
    check_driver_resources(
        ((rc.name, rc.driver, rc.driver_class, rc.options) for rc in resources),
        source,
        settings={rc.name: ResourceSettings(rc.hook_timeout, rc.health_interval, rc.replicas) for rc in resources},
    )
    return Config(
        path=Path(source) if base is not None else None,
        kubelet=kubelet,
        state=state,
        release=release,
        liveness=liveness,
        shutdown=shutdown,
        resources=resources,
        handover=handover,
        metrics=metrics,
        cdi=cdi,
        node=node,
        kubernetes=parse_kubernetes(data, source, base),
        profiles=profiles,
    )


def _check_dra(resources: tuple[ResourceConfig, ...], node: NodeConfig, source: str) -> None:
    """A DRA resource needs the node's name (its pool, its slices' node); two resources may not share a DRA
    driver name (the kubelet knows a DRA plugin by it)."""
    owners: dict[str, str] = {}
    for rc in resources:
        if rc.dra is None:
            continue
        where = _where(source, "resources", rc.configured_name or rc.name)
        if not node.name and node_checks():  # off the node (check-config --offline) the pod's env is not there
            raise ConfigError(
                f"{where}: served through DRA, which needs the node's name: set [node] name, or the environment "
                f"variable {NODE_NAME_ENV} (in a DaemonSet, from the downward API's spec.nodeName)"
            )
        other = owners.setdefault(rc.dra.driver_name, rc.name)
        if other != rc.name:
            raise ConfigError(
                f'{where}.dra.driver_name: "{rc.dra.driver_name}" is also the DRA driver of resource "{other}"; '
                "give each resource a driver name of its own"
            )


def _check_cdi_kinds(resources: tuple[ResourceConfig, ...], cdi: CdiConfig, source: str) -> None:
    """With CDI on, every resource needs a valid kind, and no two resources may share one (one spec file each)."""
    if not cdi.enabled:
        return
    owners: dict[str, str] = {}
    for rc in resources:
        where = _where(source, "resources", rc.name)
        if not _CDI_KIND.match(rc.cdi_kind):
            raise ConfigError(
                f'{where}: the resource name "{rc.name}" is not a valid CDI kind (the vendor must start with a '
                'letter); set cdi_kind = "vendor.com/class"'
            )
        other = owners.setdefault(rc.cdi_kind, rc.name)
        if other != rc.name:
            raise ConfigError(
                f'{where}.cdi_kind: "{rc.cdi_kind}" is also the CDI kind of resource "{other}"; give each '
                "resource a kind of its own"
            )


def _parse_resource(
    name: str, table: Any, source: str, base: Path | None, drivers: Mapping[str, DriverInfo]
) -> ResourceConfig:
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
        driver_class = load_driver_class(driver, where=f"{where}.driver", installed=drivers)
    except DriverLoadError as exc:
        raise ConfigError(f"{where}.driver: {exc}") from exc
    options_t = table.get("options", {})
    if not isinstance(options_t, dict):
        raise ConfigError(f"{where}.options: expected {describe_type(dict[str, Any])}, got {options_t!r}")
    schema = getattr(driver_class, "Options", None)
    options_t = _resolve_option_paths(schema, options_t, base)
    options = parse_options(schema, options_t, f"{where}.options")
    rename = _rename(table.get("rename"), name, f"{where}.rename")
    api, dra = parse_api(table, rename or name, where)
    return ResourceConfig(
        name=rename or name,
        driver=driver,
        driver_class=driver_class,
        options=options,
        health_interval=_health_interval(table, driver, driver_class, where),
        hook_timeout=_seconds(table.get("hook_timeout", 30.0), f"{where}.hook_timeout", "hook_timeout"),
        cdi_kind=_cdi_kind(table, rename or name, where),
        replicas=_replicas(table.get("replicas", 1), f"{where}.replicas"),
        fail_requests_greater_than_one=_flag(
            table.get("fail_requests_greater_than_one", False), f"{where}.fail_requests_greater_than_one"
        ),
        configured_name=name if rename else None,
        api=api,
        dra=dra,
    )


def _replicas(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REPLICAS:
        raise ConfigError(
            f"{where}: expected the number of containers that may share each device, an integer from 1 to "
            f"{MAX_REPLICAS} (1: not shared), got {value!r}"
        )
    return value


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    return value


def _rename(value: Any, name: str, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f'{where}: expected a resource name like "{name}.shared", got {value!r}')
    reason = invalid_resource_name_reason(value)
    if reason is not None:
        raise ConfigError(f'{where}: the kubelet would refuse the resource name "{value}": {reason}')
    return None if value == name else value


#: The APIs as messages name them.
_API_NAMES = {"device-plugin": "the device-plugin API", "dra": "DRA"}


def _check_renames(resources: tuple[ResourceConfig, ...], source: str) -> None:
    """Two resources advertised under one name would take each other's registration: refuse it."""
    seen: dict[str, ResourceConfig] = {}
    for rc in resources:
        table = rc.configured_name or rc.name
        first = seen.setdefault(rc.name, rc)
        other = first.configured_name or first.name
        if other != table:
            renamed = table if rc.configured_name else other
            apis = (
                f" (one through {_API_NAMES[first.api]}, one through {_API_NAMES[rc.api]}: on one node a resource "
                "name comes from one API only)"
                if first.api != rc.api
                else ""
            )
            raise ConfigError(
                f'{_where(source, "resources", renamed, "rename")}: resources "{other}" and "{table}" would both '
                f'be advertised as "{rc.name}"{apis}; give each its own name'
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
    """Read and check the config file at ``path`` (a regular file of bounded size: :mod:`devplug.config.file`)."""
    path = Path(path)
    raw = read_config_bytes(path)
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    return parse_config(data, source=str(path), base=path.resolve().parent)
