"""deploy/dra/<driver>: each overlay served through DRA (its overlay, components/dra, a DeviceClass per resource and
the overlay's config with ``api = "dra"``) renders with ``kubectl kustomize``, every object is valid for each
Kubernetes version that has ``resource.k8s.io/v1`` (1.34 on), and it holds what the DRA front end needs: a
DeviceClass per resource mapping the resource name (KEP-5004's ``extendedResourceName``), RBAC for exactly the
slices, claims and node it uses, the account's token, the pod's UID, the kubelet's plugin folders (never their
sockets) and the host's CDI folder at the paths the config names, the overlay's config otherwise unchanged, and a
config devplug accepts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml  # type: ignore[import-untyped]

from devplug.config.dra import default_driver_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DRA = ROOT / "deploy" / "dra"
#: The DRA variants, by the overlay each serves through DRA (devplug-shared's has none: its slots are claimed
#: across nodes through Leases, which a node's ResourceSlice pool does not express).
VARIANTS = sorted(p.name for p in DRA.iterdir() if (p / "kustomization.yaml").is_file())
#: DRA's v1 API is GA from 1.34; kubernetes-validate's newest schemas are 1.37's.
VERSIONS = ("1.34", "1.35", "1.36", "1.37")


def test_every_driver_but_shared_has_a_dra_variant() -> None:
    drivers = sorted(p.parent.name for p in (ROOT / "drivers").glob("*/pyproject.toml"))
    assert [d for d in drivers if d != "shared"] == VARIANTS


@pytest.fixture(scope="module", params=VARIANTS)
def variant(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def objects(kubectl: str, variant: str) -> list[dict[str, Any]]:
    done = subprocess.run([kubectl, "kustomize", str(DRA / variant)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def _config(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return tomllib.loads(_one(objects, "ConfigMap")["data"]["config.toml"])


@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_is_valid(objects: list[dict[str, Any]], version: str) -> None:
    for obj in objects:
        name = f"{obj['kind']} {obj['metadata']['name']}"
        try:
            assert kubernetes_validate.validate(obj, version, strict=True) == version, name
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name} is not valid for Kubernetes {version}: {exc.message}")


def test_a_device_class_serves_each_resource_name_through_its_driver(objects: list[dict[str, Any]]) -> None:
    resources = _config(objects)["resources"]
    assert resources
    classes = {c["spec"]["extendedResourceName"]: c for c in objects if c["kind"] == "DeviceClass"}
    assert sorted(classes) == sorted(resources)
    for name, table in resources.items():
        assert table["api"] == "dra", name
        driver = (table.get("dra") or {}).get("driver_name") or default_driver_name(name)
        assert classes[name]["spec"]["selectors"] == [{"cel": {"expression": f'device.driver == "{driver}"'}}]


def test_the_config_is_the_overlays_but_for_the_api_and_the_plugin_folders(
    objects: list[dict[str, Any]], variant: str
) -> None:
    """The variant's config.toml is a copy of its overlay's (the mock's is the base's): nothing else may drift."""
    overlay = ROOT / "deploy" / "overlays" / variant / "config.toml"
    source = overlay if overlay.is_file() else ROOT / "deploy" / "base" / "config.toml"
    device_plugin = tomllib.loads(source.read_text())
    dra = _config(objects)
    for table in dra["resources"].values():
        assert table.pop("api") == "dra"
    assert dra["kubelet"].pop("plugins_registry_dir") == "/var/lib/kubelet/plugins_registry"
    assert dra["kubelet"].pop("plugins_dir") == "/var/lib/kubelet/plugins"
    assert dra["handover"]["enabled"] is True  # DRA nodes are handed over between instances too
    assert dra == device_plugin


def test_a_dra_variant_starts_the_new_pod_beside_the_old_one_but_on_the_nodes_network(
    objects: list[dict[str, Any]], variant: str
) -> None:
    """The new pod takes the node over from the old one (a handover; DRA kubelets, 1.34 and later, call the newest
    instance of a driver). The sriov variant's pod has the node's network, so its port: the old pod goes first."""
    daemonset = _one(objects, "DaemonSet")
    strategy = daemonset["spec"]["updateStrategy"]
    if variant == "sriov":
        assert daemonset["spec"]["template"]["spec"]["hostNetwork"] is True
        assert strategy["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}, strategy
    else:
        assert strategy["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}, strategy


def test_rbac_is_exactly_what_the_dra_front_end_uses(objects: list[dict[str, Any]]) -> None:
    rules = {(r["apiGroups"][0], r["resources"][0]): set(r["verbs"]) for r in _one(objects, "ClusterRole")["rules"]}
    assert rules == {
        ("resource.k8s.io", "resourceslices"): {"get", "list", "watch", "create", "update", "patch", "delete"},
        ("resource.k8s.io", "resourceclaims"): {"get", "list", "watch"},
        ("", "nodes"): {"get"},
        ("", "namespaces"): {"get"},
        ("resource.k8s.io", "resourceclaims/status"): {"patch"},
        ("resource.k8s.io", "resourceclaims/driver"): {"associated-node:patch"},
    }
    [status_rule] = [r for r in _one(objects, "ClusterRole")["rules"] if r["resources"] == ["resourceclaims/driver"]]
    drivers = {
        (t.get("dra") or {}).get("driver_name") or default_driver_name(n)
        for n, t in _config(objects)["resources"].items()
    }
    assert drivers <= set(status_rule["resourceNames"]), "each driver may write its claims' device status"
    binding = _one(objects, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "devplug", "namespace": "devplug"}]
    assert binding["roleRef"]["name"] == _one(objects, "ClusterRole")["metadata"]["name"]
    assert [o["kind"] for o in objects if o["kind"] in ("Role", "RoleBinding")] == []


def test_the_pod_has_the_token_its_uid_and_the_kubelets_plugin_folders(objects: list[dict[str, Any]]) -> None:
    daemonset = _one(objects, "DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is True
    [container] = spec["containers"]
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container["env"]}
    assert env["POD_UID"] == "metadata.uid" and env["NODE_NAME"] == "spec.nodeName"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    config = _config(objects)
    for folder in (
        config["kubelet"]["plugins_registry_dir"],
        config["kubelet"]["plugins_dir"],
        config.get("cdi", {}).get("spec_dir", "/var/run/cdi"),
    ):
        assert folder in mounts and not mounts[folder].get("readOnly"), folder
        host = volumes[mounts[folder]["name"]]["hostPath"]
        assert host["path"] == folder, "the kubelet dials the path the plugin gives: the same inside and out"
        assert host.get("type") in ("Directory", "DirectoryOrCreate") and not folder.endswith(".sock")


def test_devplug_accepts_the_config(objects: list[dict[str, Any]], variant: str, tmp_path: Path) -> None:
    """``devplug check-config`` on the config the pod runs on, on this machine (without the nodes' hardware)."""
    text = _one(objects, "ConfigMap")["data"]["config.toml"]
    if variant == "fpga":  # the bitstream comes from the node's /opt/devplug/fpga: give it one here
        (tmp_path / "blank.gbs").write_bytes(b"\0")
        text = text.replace("/opt/devplug/fpga/", f"{tmp_path}/")
    path = tmp_path / "config.toml"
    path.write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "devplug", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "NODE_NAME": "node-1"},
    )
    if variant == "sriov":  # its set-up checks the node: this machine has no PF ens1f0, and nothing else may fail
        assert done.returncode == 2, done.stdout + done.stderr
        assert "pfs: 'ens1f0' names no SR-IOV physical function on this node" in done.stderr
        return
    assert done.returncode == 0, done.stderr
    assert f"{path}: ok" in done.stdout
