"""Issue 37, item 1: how the node's kubelet keys DRA plugins is learnt from its Node before registering."""

from __future__ import annotations

from pathlib import Path

import pytest

from devplug.frontends.dra.kubeletrule import KubeletRule, PluginKeying, keying_of, learn_rule
from devplug.kube.client import make_client
from devplug.testing.apiserver import ApiServer
from tests.frontends.dra.conftest import NODE, node, run


@pytest.mark.parametrize(
    ("version", "keying"),
    [
        ("v1.32.9", PluginKeying.BY_NAME),
        ("v1.31.4-eks-1a2b3c", PluginKeying.BY_NAME),
        ("v1.32.0-rc.1", PluginKeying.BY_NAME),
        ("v1.33.0", PluginKeying.BY_ENDPOINT),
        ("v1.33.1+k3s1", PluginKeying.BY_ENDPOINT),
        ("v1.37.2", PluginKeying.BY_ENDPOINT),
        ("v2.0.0", PluginKeying.BY_ENDPOINT),
        ("1.34.1", PluginKeying.BY_ENDPOINT),
        ("", PluginKeying.UNKNOWN),
        ("v1", PluginKeying.UNKNOWN),
        ("kubelet", PluginKeying.UNKNOWN),
    ],
)
def test_the_keying_follows_the_release_that_changed_it(version: str, keying: PluginKeying) -> None:
    assert keying_of(version) is keying


def _learn(api: ApiServer, kubeconfig: Path) -> KubeletRule:
    async def scenario() -> KubeletRule:
        client = make_client(kubeconfig, field_manager="test")
        try:
            return await learn_rule(client, NODE, timeout=5.0)
        finally:
            await client.close()

    return run(scenario)


def test_a_node_reporting_1_32_keys_plugins_by_name(api: ApiServer, kubeconfig: Path) -> None:
    api.create("nodes", {**node(), "status": {"nodeInfo": {"kubeletVersion": "v1.32.9"}}})
    rule = _learn(api, kubeconfig)
    assert rule.keying is PluginKeying.BY_NAME and rule.by_name
    assert rule.kubelet_version == "v1.32.9"
    assert rule.describe() == {
        "kubelet_version": "v1.32.9",
        "plugin_keying": "by-name",
        "learnt_from": f"Node {NODE} status.nodeInfo.kubeletVersion",
    }


def test_a_node_reporting_1_34_keys_plugins_by_endpoint(api: ApiServer, kubeconfig: Path) -> None:
    api.create("nodes", {**node(), "status": {"nodeInfo": {"kubeletVersion": "v1.34.2"}}})
    rule = _learn(api, kubeconfig)
    assert rule.keying is PluginKeying.BY_ENDPOINT and not rule.by_name


def test_a_node_that_cannot_be_read_leaves_the_rule_unknown_and_treated_as_by_name(
    api: ApiServer, kubeconfig: Path
) -> None:
    rule = _learn(api, kubeconfig)  # no Node at all: 404
    assert rule.keying is PluginKeying.UNKNOWN and rule.by_name
    assert f"reading Node {NODE} failed: 404" in rule.learnt_from, rule.learnt_from


def test_a_node_without_a_kubelet_version_leaves_the_rule_unknown(api: ApiServer, kubeconfig: Path) -> None:
    api.create("nodes", node())
    rule = _learn(api, kubeconfig)
    assert rule.keying is PluginKeying.UNKNOWN
    assert "reports kubelet version ''" in rule.learnt_from


def test_a_health_stream_shows_a_kubelet_keying_by_endpoint() -> None:
    rule = KubeletRule(PluginKeying.UNKNOWN, "", "reading Node node-a failed: 403 Forbidden")
    rule.seen_health_stream()
    assert rule.keying is PluginKeying.BY_ENDPOINT and not rule.by_name
    assert "NodeWatchResources" in rule.learnt_from
