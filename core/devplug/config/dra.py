"""The config's keys for serving a resource through Dynamic Resource Allocation (DRA), and for the node and the API
server that DRA (and per-node profiles) need::

    [node]
    name = "node-1"        # default: the NODE_NAME environment variable (the downward API's spec.nodeName)

    [kubernetes]
    kubeconfig = "/etc/devplug/kubeconfig"   # default: the pod's service account (in-cluster)

    [kubelet]
    plugins_registry_dir = "/var/lib/kubelet/plugins_registry"   # where DRA plugins register (plugin watcher)
    plugins_dir = "/var/lib/kubelet/plugins"                     # <plugins_dir>/<driver name>/ holds the DRA socket

    [resources."example.com/fpga"]
    driver = "fpga"
    api = "dra"            # "device-plugin" (the default) or "dra"
    dra = { driver_name = "fpga.example.com", pool = "node-1" }   # both optional

A DRA resource is published as ResourceSlices of the DRA driver ``driver_name``
(default: the resource name turned around, ``example.com/fpga`` ->
``fpga.example.com``), in the pool ``pool`` (default: the node name); its
resource name is the extended resource name a DeviceClass maps to it
(KEP-5004), so pods asking for ``example.com/fpga: 1`` are served by whichever
API their node runs.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devplug.errors import ConfigError

__all__ = [
    "API_DEVICE_PLUGIN",
    "API_DRA",
    "APIS",
    "NODE_NAME_ENV",
    "DraConfig",
    "KubernetesConfig",
    "NodeConfig",
    "default_driver_name",
    "dns_subdomain_problem",
]

API_DEVICE_PLUGIN = "device-plugin"
API_DRA = "dra"
#: The kubelet APIs a resource can be served through.
APIS = (API_DEVICE_PLUGIN, API_DRA)
#: Where the node's name comes from when the config does not say (the downward API's ``spec.nodeName``).
NODE_NAME_ENV = "NODE_NAME"

_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def dns_subdomain_problem(value: str) -> str | None:
    """Why ``value`` is not a DNS subdomain (RFC 1123, as Kubernetes checks object and driver names), or None."""
    if not value:
        return "it is empty"
    if len(value) > 253:
        return f"it is {len(value)} characters long, more than 253"
    for label in value.split("."):
        if not _DNS_LABEL.match(label):
            return (
                f"{label!r} is not a DNS label (lowercase letters, digits and '-', starting and ending with a "
                "letter or digit, at most 63 characters)"
            )
    return None


def default_driver_name(resource_name: str) -> str:
    """The DRA driver name a resource gets by default: ``example.com/fpga`` -> ``fpga.example.com``."""
    domain, _, name = resource_name.partition("/")
    return f"{name}.{domain}".lower().replace("_", "-")


@dataclass(frozen=True)
class DraConfig:
    """How a resource served through DRA is published: its DRA driver name and pool."""

    driver_name: str
    #: The pool of its ResourceSlices; ``None``: the node name.
    pool: str | None = None

    def pool_on(self, node: str) -> str:
        """The pool name on ``node``."""
        return self.pool or node


@dataclass(frozen=True)
class NodeConfig:
    """The node the daemon runs on."""

    #: Its name ("" when neither the config nor ``NODE_NAME`` says: only a config without DRA runs so).
    name: str = ""
    #: Where the name came from: ``"config"``, ``"NODE_NAME"``, or ``""`` (unknown).
    source: str = ""


@dataclass(frozen=True)
class KubernetesConfig:
    """How the daemon reaches the API server (for DRA, and per-node profiles)."""

    #: A kubeconfig file; ``None``: the pod's service account (in-cluster).
    kubeconfig: Path | None = None


def _where(source: str, *keys: str) -> str:
    return f"{source}: " + ".".join(f'"{k}"' if ("." in k or "/" in k) else k for k in keys)


def _check_keys(table: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in table:
        if key not in allowed:
            raise ConfigError(f"{where}.{key}: unknown key; known keys: {', '.join(allowed)}")


def parse_node(data: Mapping[str, Any], source: str) -> NodeConfig:
    """``[node]``: the name from the config, else from ``NODE_NAME``."""
    table = data.get("node", {})
    where = _where(source, "node")
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table, got {table!r}")
    _check_keys(table, ("name",), where)
    if "name" in table:
        name, origin = table["name"], "config"
    else:
        name, origin = os.environ.get(NODE_NAME_ENV, ""), NODE_NAME_ENV
        if not name:
            return NodeConfig()
    if not isinstance(name, str):
        raise ConfigError(f"{where}.name: expected the node's name as a string, got {name!r}")
    problem = dns_subdomain_problem(name)
    if problem is not None:
        said = f"{where}.name" if origin == "config" else f"{source}: the environment variable {NODE_NAME_ENV}"
        raise ConfigError(f"{said}: {name!r} is not a node name: {problem}")
    return NodeConfig(name, origin)


def parse_kubernetes(data: Mapping[str, Any], source: str, base: Path | None) -> KubernetesConfig:
    """``[kubernetes]``: a kubeconfig path (relative to the config file's folder), or in-cluster."""
    table = data.get("kubernetes", {})
    where = _where(source, "kubernetes")
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table, got {table!r}")
    _check_keys(table, ("kubeconfig",), where)
    value = table.get("kubeconfig")
    if value is None:
        return KubernetesConfig()
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}.kubeconfig: expected the path of a kubeconfig file, got {value!r}")
    path = Path(value)
    if not path.is_absolute() and base is not None:
        path = base / path
    return KubernetesConfig(path)


def parse_api(table: Mapping[str, Any], name: str, where: str) -> tuple[str, DraConfig | None]:
    """A resource's ``api`` and ``dra`` keys: the API it is served through, and its DRA settings."""
    api = table.get("api", API_DEVICE_PLUGIN)
    if api not in APIS:
        raise ConfigError(f"{where}.api: expected one of {', '.join(repr(a) for a in APIS)}, got {api!r}")
    dra_t = table.get("dra")
    if api != API_DRA:
        if dra_t is not None:
            raise ConfigError(f'{where}.dra: only for a resource served through DRA (api = "{API_DRA}")')
        return api, None
    if importlib.util.find_spec("lightkube") is None:
        raise ConfigError(
            f"{where}.api: a resource served through DRA needs lightkube (its ResourceSlices and ResourceClaims "
            "go through the API server), which is not installed; pip install 'devplug[kubernetes]'"
        )
    if dra_t is None:
        dra_t = {}
    if not isinstance(dra_t, dict):
        raise ConfigError(f"{where}.dra: expected a table, got {dra_t!r}")
    _check_keys(dra_t, ("driver_name", "pool"), f"{where}.dra")
    driver_name = dra_t.get("driver_name", default_driver_name(name))
    if not isinstance(driver_name, str):
        raise ConfigError(
            f'{where}.dra.driver_name: expected a DNS subdomain like "fpga.example.com", got {driver_name!r}'
        )
    problem = dns_subdomain_problem(driver_name)
    if problem is not None:
        said = f"{where}.dra.driver_name" if "driver_name" in dra_t else f"{where}: the default DRA driver name"
        raise ConfigError(
            f'{said} {driver_name!r} is not a DNS subdomain: {problem}; set dra.driver_name = "name.example.com"'
        )
    pool = dra_t.get("pool")
    if pool is not None and (not isinstance(pool, str) or dns_subdomain_problem(pool) is not None):
        raise ConfigError(f"{where}.dra.pool: expected a DNS subdomain (the node name by default), got {pool!r}")
    return api, DraConfig(driver_name, pool)
