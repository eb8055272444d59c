"""What operators monitor devplug with (issue 40, item 8): the alerts of ``components/prometheusrule``, the Grafana
dashboard of ``components/grafana-dashboard``, and ``components/metrics-networkpolicy``, which keeps the unauthenticated
``/metrics`` to the Prometheus an operator names.

The alerts and the dashboard's queries name only metrics devplug exports (those its metrics module registers,
collected here as a scrape would); ``promtool check rules`` accepts the rules and ``promtool test rules`` runs
``alerts.test.yaml``, a firing and a quiet case for every alert. The NetworkPolicy admits the daemon's metrics port,
by the container's port name, from the namespace and pods the operator sets, and its documented patch does that."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from tests.support.metricfamilies import every_family

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPONENTS = DEPLOY / "components"
ALERT_TESTS = Path(__file__).with_name("alerts.test.yaml")

#: A metric's name in a PromQL expression (devplug's own, and prometheus-client's process collector's).
METRIC_NAME = re.compile(r"\b((?:devplug|process)_[a-z0-9_]+)\b")


@cache
def exported_names() -> frozenset[str]:
    """Every sample name a scrape of a daemon can give: each family devplug's metrics module registers, with a
    resource of each front end (the DRA families exist only for a DRA resource) and every event counted once, as
    ``tests/test_docs.py`` collects them for the metrics reference."""
    return frozenset(sample.name for family in every_family() for sample in family.samples)


def _unknown_metrics(expr: str) -> list[str]:
    return sorted(set(METRIC_NAME.findall(expr)) - exported_names())


def _rule() -> dict[str, Any]:
    return dict(yaml.safe_load((COMPONENTS / "prometheusrule" / "prometheusrule.yaml").read_text()))


def _alerts() -> list[dict[str, Any]]:
    return [rule for group in _rule()["spec"]["groups"] for rule in group["rules"]]


def _dashboard() -> dict[str, Any]:
    return dict(json.loads((COMPONENTS / "grafana-dashboard" / "devplug.json").read_text()))


def _dashboard_queries() -> list[str]:
    panels = _dashboard()["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def _render(kubectl: str, components: tuple[str, ...], patches: list[dict[str, Any]] | None = None) -> list[Any]:
    """``kubectl kustomize`` of the mock overlay with ``components`` (and ``patches``), as an operator's overlay."""
    with tempfile.TemporaryDirectory() as folder:
        relative = os.path.relpath(DEPLOY, folder)
        kustomization: dict[str, Any] = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [f"{relative}/overlays/mock"],
            "components": [f"{relative}/components/{c}" for c in components],
        }
        if patches:
            kustomization["patches"] = patches
        (Path(folder) / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        done = subprocess.run([kubectl, "kustomize", folder], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def _one(objects: list[Any], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return dict(found[0])


# --- the alerts ----------------------------------------------------------------------------------------------------


def test_the_alerts_name_only_metrics_devplug_exports() -> None:
    for alert in _alerts():
        assert METRIC_NAME.search(alert["expr"]), alert["alert"]
        assert _unknown_metrics(alert["expr"]) == [], alert["alert"]


def test_the_metric_check_catches_a_name_devplug_does_not_export() -> None:
    """The check above can fail: a misspelt metric, a counter without its _total, a histogram's bare name."""
    assert "devplug_releases_failing" in exported_names() and "devplug_releases_total" in exported_names()
    assert _unknown_metrics("devplug_release_failing > 0") == ["devplug_release_failing"]
    assert _unknown_metrics("rate(devplug_releases[5m])") == ["devplug_releases"]
    assert _unknown_metrics("devplug_release_duration_seconds > 1") == ["devplug_release_duration_seconds"]
    assert _unknown_metrics("rate(devplug_release_duration_seconds_bucket[5m])") == []


def test_an_alert_for_each_failure_devplug_reports() -> None:
    """The failures issue 40 lists, each by the metric that reports it, and a few more devplug reports."""
    by_metric: dict[str, set[str]] = {}
    for alert in _alerts():
        for name in METRIC_NAME.findall(alert["expr"]):
            by_metric.setdefault(name, set()).add(alert["alert"])
    assert by_metric["devplug_releases_failing"] == {"DevplugReleaseFailing"}
    assert "DevplugResourceDegraded" in by_metric["devplug_devices"]
    assert by_metric["devplug_podresources_read_failures_total"] == {"DevplugPodResourcesUnreadable"}
    assert by_metric["devplug_devices_busy"] == {"DevplugDevicesBusy"}  # a quarantined record, or a hung hook
    assert by_metric["devplug_handovers_total"] == {"DevplugHandoverFailed"}
    assert by_metric["devplug_resource_registered"] == {"DevplugResourceNotRegistered"}
    for alert in _alerts():
        assert alert["labels"]["severity"] in ("warning", "critical"), alert["alert"]
        assert {"summary", "description"} <= set(alert["annotations"]), alert["alert"]


def test_the_prometheusrule_component_renders_the_rules(kubectl: str) -> None:
    rule = _one(_render(kubectl, ("prometheusrule",)), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"] == {"name": "devplug", "namespace": "devplug"}
    assert rule["spec"] == _rule()["spec"]


def _template(text: str, labels: dict[str, str], value: str | None, where: str) -> str:
    """An annotation as Prometheus renders it, for the two forms the rules use: ``{{ $labels.x }}`` and
    ``{{ $value }}``; any other template action fails here, so it gets a test of its own before it is used."""

    def label(match: re.Match[str]) -> str:
        assert match.group(1) in labels, f"{where}: {{{{ $labels.{match.group(1)} }}}} is not a label of the alert"
        return labels[match.group(1)]

    text = re.sub(r"\{\{ \$labels\.([a-zA-Z_][a-zA-Z0-9_]*) \}\}", label, text)
    if "{{ $value }}" in text:
        assert value is not None, f"{where}: the annotation prints {{{{ $value }}}}: give the test's value"
        text = text.replace("{{ $value }}", value)
    assert "{{" not in text, f"{where}: a template action this test does not render: {text}"
    return text


def _promtool_tests(rules: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """alerts.test.yaml with each expected alert's annotations rendered from its rule (see the file's header)."""
    tests = yaml.safe_load(ALERT_TESTS.read_text())
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            rule = rules[check["alertname"]]
            for expected in check.get("exp_alerts", []):
                value = expected.pop("value", None)
                labels = {k: v for k, v in expected["exp_labels"].items() if k not in rule.get("labels", {})}
                where = f"{check['alertname']} at {check['eval_time']}"
                expected["exp_annotations"] = {
                    key: _template(text, labels, value, where) for key, text in rule["annotations"].items()
                }
    return dict(tests)


def test_promtool_accepts_the_rules_and_every_alert_passes_its_tests(promtool: str, tmp_path: Path) -> None:
    rules = {alert["alert"]: alert for alert in _alerts()}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_rule()["spec"], sort_keys=False))
    checked = subprocess.run(
        [promtool, "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules)} rules found" in checked.stdout + checked.stderr
    tests = _promtool_tests(rules)
    firing = {check["alertname"] for case in tests["tests"] for check in case["alert_rule_test"] if check["exp_alerts"]}
    assert firing == set(rules), f"alerts without a firing test: {sorted(set(rules) - firing)}"
    (tmp_path / "alerts.test.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    done = subprocess.run(
        [promtool, "test", "rules", str(tmp_path / "alerts.test.yaml")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def test_promtool_tests_fail_on_a_wrong_expectation(promtool: str, tmp_path: Path) -> None:
    """The test above can fail: an alert expected a minute before its ``for:`` has passed."""
    rules = {alert["alert"]: alert for alert in _alerts()}
    tests = _promtool_tests(rules)
    (case,) = [c for c in tests["tests"] if c["alert_rule_test"][0]["alertname"] == "DevplugReleaseFailing"]
    case["alert_rule_test"] = [dict(case["alert_rule_test"][1], eval_time="11m")]
    tests["tests"] = [case]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(_rule()["spec"], sort_keys=False))
    (tmp_path / "alerts.test.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    done = subprocess.run(
        [promtool, "test", "rules", str(tmp_path / "alerts.test.yaml")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0 and "DevplugReleaseFailing" in done.stdout + done.stderr


# --- the dashboard -------------------------------------------------------------------------------------------------


def test_the_dashboards_queries_name_only_metrics_devplug_exports() -> None:
    queries = _dashboard_queries()
    assert len(queries) >= 20
    for query in queries:
        assert METRIC_NAME.search(query), query
        assert _unknown_metrics(query) == [], query
    for variable in _dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            assert _unknown_metrics(variable["query"]["query"]) == [], variable["name"]


def test_the_dashboard_shows_what_the_alerts_watch() -> None:
    """Each metric an alert fires on is on the dashboard too, so the page an alert sends you to shows it."""
    shown = {name for query in _dashboard_queries() for name in METRIC_NAME.findall(query)}
    alerted = {name for alert in _alerts() for name in METRIC_NAME.findall(alert["expr"])}
    missing = alerted - shown - {"devplug_container_liveness_known", "devplug_profiles_refused"}
    missing -= {"devplug_dra_registration_state"}  # in devplug status: the kubelet's error is what helps
    assert missing == set()


def test_the_dashboard_is_a_configmap_grafanas_sidecar_loads(kubectl: str) -> None:
    dashboard = _dashboard()
    assert dashboard["uid"] == "devplug" and dashboard["title"] == "devplug"
    datasources = {json.dumps(p.get("datasource")) for p in dashboard["panels"] if p["type"] != "row"}
    assert datasources == {json.dumps({"type": "prometheus", "uid": "${datasource}"})}, "one chosen data source"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    objects = _render(kubectl, ("grafana-dashboard",))
    configmap = _one(objects, "ConfigMap", "devplug-grafana-dashboard")
    assert configmap["metadata"]["namespace"] == "devplug"
    assert configmap["metadata"]["labels"] == {"grafana_dashboard": "1"}
    assert json.loads(configmap["data"]["devplug.json"]) == dashboard
    # kubectl apply keeps the object in an annotation of at most 256 KiB
    assert len(configmap["data"]["devplug.json"]) < 128 * 1024


# --- the NetworkPolicy ---------------------------------------------------------------------------------------------


def test_the_networkpolicy_admits_the_metrics_port_from_the_named_prometheus_only(kubectl: str) -> None:
    objects = _render(kubectl, ("metrics-networkpolicy",))
    policy, daemonset = _one(objects, "NetworkPolicy"), _one(objects, "DaemonSet")
    spec = policy["spec"]
    assert policy["metadata"]["namespace"] == "devplug"
    template = daemonset["spec"]["template"]
    assert spec["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert spec["policyTypes"] == ["Ingress"], "the daemon's egress (the API server, etcd) is not touched"
    (container,) = template["spec"]["containers"]
    (port,) = container["ports"]
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"port": port["name"], "protocol": "TCP"}], "the port by name: it follows the config"
    # One peer with both selectors: the pods of that namespace with that label (two peers would admit either).
    assert rule["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        }
    ]


def test_the_networkpolicys_documented_patch_names_another_prometheus(kubectl: str) -> None:
    """The patch the component's kustomization.yaml shows an operator works as written there."""
    text = (COMPONENTS / "metrics-networkpolicy" / "kustomization.yaml").read_text()
    block = re.search(r"^#   patches:\n((?:#     .*\n|#       .*\n)+)", text, re.M)
    assert block, "the kustomization's comment shows a patches: block"
    shown = yaml.safe_load("\n".join(line[4:] for line in block.group(1).splitlines()))
    objects = _render(kubectl, ("metrics-networkpolicy",), shown)
    (peer,) = _one(objects, "NetworkPolicy")["spec"]["ingress"][0]["from"]
    assert peer == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/instance": "my-prometheus"}},
    }


@pytest.mark.parametrize("overlay", ["sriov"])
def test_a_host_network_overlay_says_the_networkpolicy_does_not_reach_it(overlay: str) -> None:
    """A NetworkPolicy does not apply to a pod in the host's network namespace: the overlay and the component say
    so, and what does keep the port there (the node's primary address only, the nodes' firewall)."""
    kustomization = (DEPLOY / "overlays" / overlay / "kustomization.yaml").read_text()
    assert "hostNetwork" in kustomization and "NetworkPolicy does not reach" in kustomization
    component = (COMPONENTS / "metrics-networkpolicy" / "kustomization.yaml").read_text()
    assert "host's network namespace" in component and "firewall" in component
