"""The NodeFeatureRule examples of docs/operator/deploy.md, "Labelling nodes with Node Feature Discovery" (issue 40,
item 8): valid against Node Feature Discovery's published CRD schema (vendored in ``tests/deploy/nfd/``, see its
header; offline), with unknown fields refused as ``kubectl apply``'s strict validation refuses them; each labels
nodes as its overlay's ``nodeSelector`` wants, with features NFD discovers, and matches the devices its overlay's
``config.toml`` names."""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml  # type: ignore[import-untyped]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "operator" / "deploy.md"
CRD = Path(__file__).with_name("nfd") / "nodefeaturerule-crd.yaml"
#: The drivers whose overlays need something of the node (mock and shared need nothing: labelled by hand).
DRIVERS = ("vfio", "sriov", "fpga")
#: The features of NFD's customization guide the rules use, by type: instance features match per element.
NFD_FEATURES = {"pci.device", "network.device", "kernel.loadedmodule", "kernel.enabledmodule", "kernel.config"}


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The CRD's OpenAPI schema with unknown fields refused (``additionalProperties: false`` wherever it lists
    ``properties`` and says nothing of others), as the API server's strict field validation does."""
    out = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node and node.get("type") == "object":
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(out)
    return out


def _schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    assert crd["spec"]["names"]["kind"] == "NodeFeatureRule" and crd["spec"]["scope"] == "Cluster"
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1"
    return _strict(version["schema"]["openAPIV3Schema"])


def _rules() -> dict[str, dict[str, Any]]:
    """Each NodeFeatureRule of the page, by the driver its label names."""
    found: dict[str, dict[str, Any]] = {}
    for block in re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), re.S):
        if "kind: NodeFeatureRule" not in block:
            continue
        document = yaml.safe_load(block)
        ((label, value),) = document["spec"]["rules"][0]["labels"].items()
        assert label.startswith("devplug/") and value == "true", label
        found[label.removeprefix("devplug/")] = document
    return found


def _validate(document: dict[str, Any]) -> None:
    jsonschema.validate(document, _schema(), cls=jsonschema.Draft7Validator)


def test_the_page_has_a_rule_for_each_driver_that_needs_the_node() -> None:
    assert sorted(_rules()) == sorted(DRIVERS)


@pytest.mark.parametrize("driver", DRIVERS)
def test_each_rule_is_valid_against_nfds_crd_schema(driver: str) -> None:
    rule = _rules()[driver]
    assert (rule["apiVersion"], rule["kind"]) == ("nfd.k8s-sigs.io/v1alpha1", "NodeFeatureRule")
    assert set(rule["metadata"]) == {"name"}, "cluster-scoped: no namespace"
    _validate(rule)


def test_the_validation_catches_a_mistake() -> None:
    """The check above can fail: an unknown operator, a misspelt field, a term without its feature."""
    rule = _rules()["vfio"]
    bad_op = copy.deepcopy(rule)
    bad_op["spec"]["rules"][0]["matchFeatures"][0]["matchExpressions"]["class"]["op"] = "Equals"
    misspelt = copy.deepcopy(rule)
    misspelt["spec"]["rules"][0]["matchFeature"] = misspelt["spec"]["rules"][0].pop("matchFeatures")
    no_feature = copy.deepcopy(rule)
    del no_feature["spec"]["rules"][0]["matchFeatures"][1]["feature"]
    for bad in (bad_op, misspelt, no_feature):
        with pytest.raises(jsonschema.ValidationError):
            _validate(bad)


def _node_selector(driver: str) -> dict[str, str]:
    """The nodeSelector entries the overlay's patch adds (``/spec/template/spec/nodeSelector/<key>``)."""
    kustomization = yaml.safe_load((ROOT / "deploy" / "overlays" / driver / "kustomization.yaml").read_text())
    found = {}
    for patch in kustomization.get("patches", []):
        for op in yaml.safe_load(patch.get("patch", "[]")) or []:
            if op["path"].startswith("/spec/template/spec/nodeSelector/"):
                key = op["path"].rsplit("/", 1)[1].replace("~1", "/").replace("~0", "~")
                found[key] = op["value"]
    return found


@pytest.mark.parametrize("driver", DRIVERS)
def test_each_rule_labels_nodes_as_its_overlay_selects_them_with_features_nfd_has(driver: str) -> None:
    (rule,) = _rules()[driver]["spec"]["rules"]
    assert rule["labels"] == _node_selector(driver)
    assert {term["feature"] for term in rule["matchFeatures"]} <= NFD_FEATURES


def _config(driver: str) -> dict[str, Any]:
    return tomllib.loads((ROOT / "deploy" / "overlays" / driver / "config.toml").read_text())


def _terms(driver: str) -> dict[str, dict[str, Any]]:
    (rule,) = _rules()[driver]["spec"]["rules"]
    return {term["feature"]: term["matchExpressions"] for term in rule["matchFeatures"]}


def test_the_vfio_rule_matches_the_configured_class_behind_an_iommu() -> None:
    (resource,) = _config("vfio")["resources"].values()
    classes = {c[:4] for c in resource["options"]["classes"]}  # NFD keeps class and subclass, four hex digits
    terms = _terms("vfio")
    assert set(terms["pci.device"]["class"]["value"]) == classes
    assert terms["pci.device"]["iommu_group/type"] == {"op": "Exists"}
    assert "vfio_pci" in terms["kernel.loadedmodule"]  # /proc/modules spells it with an underscore


def test_the_sriov_rule_matches_the_configured_pf_and_its_vf_count() -> None:
    (resource,) = _config("sriov")["resources"].values()
    options = resource["options"]
    terms = _terms("sriov")["network.device"]
    assert terms["name"] == {"op": "In", "value": options["pfs"]}
    assert terms["sriov_totalvfs"] == {"op": "Gt", "value": [str(options["num_vfs"] - 1)]}  # Gt is strict


def test_the_fpga_rule_asks_for_the_dfl_modules_its_backend_uses() -> None:
    (resource,) = _config("fpga")["resources"].values()
    assert resource.get("options", {}).get("backend", "dfl") == "dfl"
    terms = _terms("fpga")
    assert set(terms["kernel.loadedmodule"]) == {"dfl_pci", "dfl_fme", "dfl_afu"}
    assert terms["pci.device"]["class"] == {"op": "In", "value": ["1200"]}  # processing accelerators
