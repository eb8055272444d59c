"""The config of a resource served through DRA (issue 28): ``api``, ``dra.driver_name``, ``dra.pool``, the node's
name and the API server's credentials; every error names the file, the resource and the key."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from devplug.config import Config, parse_config
from devplug.config.dra import NODE_NAME_ENV, DraConfig, default_driver_name, dns_subdomain_problem
from devplug.errors import ConfigError


def _config(resources: dict[str, dict[str, Any]], **top: Any) -> Config:
    tables = {name: {"driver": "mock", "options": {"directory": "/tmp/unused"}, **t} for name, t in resources.items()}
    return parse_config({"resources": tables, **top}, "c.toml")


@pytest.fixture(autouse=True)
def _no_node_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NODE_NAME_ENV, raising=False)


def test_the_device_plugin_api_is_the_default_and_takes_no_dra_table() -> None:
    (rc,) = _config({"example.com/a": {}}).resources
    assert (rc.api, rc.dra) == ("device-plugin", None)
    with pytest.raises(ConfigError, match=r'c.toml: resources."example.com/a".dra: only for a resource served'):
        _config({"example.com/a": {"dra": {"pool": "x"}}})


def test_a_dra_resource_defaults_its_driver_name_and_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NODE_NAME_ENV, "node-7")
    config = _config({"example.com/fpga": {"api": "dra"}})
    (rc,) = config.resources
    assert rc.dra == DraConfig("fpga.example.com", None)
    assert (config.node.name, config.node.source) == ("node-7", NODE_NAME_ENV)
    assert rc.dra.pool_on(config.node.name) == "node-7"


def test_a_dra_resource_takes_its_driver_name_and_pool_from_the_config() -> None:
    config = _config(
        {"example.com/fpga": {"api": "dra", "dra": {"driver_name": "fpga.acme.io", "pool": "rack-1.node-2"}}},
        node={"name": "node-2"},
        kubernetes={"kubeconfig": "/etc/kube.conf"},
        kubelet={"plugins_registry_dir": "/k/reg", "plugins_dir": "/k/plugins"},
    )
    (rc,) = config.resources
    assert rc.dra == DraConfig("fpga.acme.io", "rack-1.node-2")
    assert (config.node.name, config.node.source) == ("node-2", "config")
    assert config.kubernetes.kubeconfig == Path("/etc/kube.conf")
    assert (config.kubelet.plugins_registry_dir, config.kubelet.plugins_dir) == (Path("/k/reg"), Path("/k/plugins"))


@pytest.mark.parametrize(
    ("resources", "top", "expected"),
    [
        ({"example.com/a": {"api": "grpc"}}, {}, r'resources."example.com/a".api: expected one of \'device-plugin\''),
        (
            {"example.com/a": {"api": "dra", "dra": {"driver_name": "Not_A_Name"}}},
            {"node": {"name": "n"}},
            r'resources."example.com/a".dra.driver_name \'Not_A_Name\' is not a DNS subdomain',
        ),
        (
            {"example.com/a": {"api": "dra", "dra": {"pool": "a pool"}}},
            {"node": {"name": "n"}},
            r'resources."example.com/a".dra.pool: expected a DNS subdomain',
        ),
        (
            {"example.com/a": {"api": "dra", "dra": {"size": 3}}},
            {"node": {"name": "n"}},
            r'resources."example.com/a".dra.size: unknown key',
        ),
        ({"example.com/a": {"api": "dra"}}, {}, r"needs the node's name: set \[node\] name, or the environment"),
        ({"example.com/a": {}}, {"node": {"name": "Node_1"}}, r"c.toml: node.name: 'Node_1' is not a node name"),
        ({"example.com/a": {}}, {"node": {"zone": "x"}}, r"c.toml: node.zone: unknown key"),
        ({"example.com/a": {}}, {"kubernetes": {"kubeconfig": ""}}, r"kubernetes.kubeconfig: expected the path"),
        (
            {
                "example.com/a": {"api": "dra", "dra": {"driver_name": "x.example.com"}},
                "example.com/b": {"api": "dra", "dra": {"driver_name": "x.example.com"}},
            },
            {"node": {"name": "n"}},
            r'resources."example.com/b".dra.driver_name: "x.example.com" is also the DRA driver of resource',
        ),
        (
            {"example.com/a": {"api": "dra"}, "example.com/b": {"rename": "example.com/a"}},
            {"node": {"name": "n"}},
            r'resources "example.com/a" and "example.com/b" would both be advertised as "example.com/a" \(one '
            r"through DRA, one through the device-plugin API: on one node a resource name comes from one API only\)",
        ),
    ],
)
def test_bad_dra_settings_are_refused_naming_the_key(
    resources: dict[str, dict[str, Any]], top: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigError, match=expected):
        _config(resources, **top)


def test_a_bad_node_name_from_the_environment_is_named_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NODE_NAME_ENV, "bad name")
    with pytest.raises(ConfigError, match=r"c.toml: the environment variable NODE_NAME: 'bad name' is not a node"):
        _config({"example.com/a": {}})


def test_default_driver_names_and_dns_subdomains() -> None:
    assert default_driver_name("example.com/fpga") == "fpga.example.com"
    assert default_driver_name("intel.com/sriov_vf") == "sriov-vf.intel.com"
    assert dns_subdomain_problem("fpga.example.com") is None
    assert "more than 253" in (dns_subdomain_problem("a." * 130) or "")
    assert "is not a DNS label" in (dns_subdomain_problem("a..b") or "")


def test_a_dra_resource_without_lightkube_installed_is_refused_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "lightkube", None)  # how Python marks a module as not importable
    with pytest.raises(ConfigError) as info:
        _config({"example.com/fpga": {"api": "dra"}}, node={"name": "node-2"})
    assert str(info.value) == (
        'c.toml: resources."example.com/fpga".api: a resource served through DRA needs lightkube (its '
        "ResourceSlices and ResourceClaims go through the API server), which is not installed; "
        "pip install 'devplug[kubernetes]'"
    )
    (rc,) = _config({"example.com/fpga": {}}).resources  # the device-plugin API needs no lightkube
    assert rc.api == "device-plugin"


def test_a_dra_resource_may_be_handed_over_between_instances() -> None:
    """Both front ends take part in handovers (issue 30): ``[handover] enabled`` is accepted with a DRA resource."""
    config = _config({"example.com/fpga": {"api": "dra"}}, node={"name": "node-a"}, handover={"enabled": True})
    assert config.handover.enabled is True
    assert _config({"example.com/fpga": {"api": "dra"}}, node={"name": "node-a"}).handover.enabled is False
