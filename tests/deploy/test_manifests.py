"""deploy/: every overlay renders with ``kubectl kustomize``, every object it renders is valid for Kubernetes
:data:`KUBERNETES_VERSION` (kubernetes-validate's bundled schemas, strict: unknown fields are errors), and the
DaemonSet is the one the README promises: folders of the kubelet mounted (never its sockets), the state dir on the
host, /sys and /dev only for drivers that need them, no two daemons on a node, probes on the daemon's HTTP
server, requests sized from ``make bench``, and a config devplug itself accepts."""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml  # type: ignore[import-untyped]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = sorted(p.name for p in (DEPLOY / "overlays").iterdir() if (p / "kustomization.yaml").is_file())

#: The Kubernetes version the manifests are validated against (the kubelet behaviour devplug follows is v1.32's).
KUBERNETES_VERSION = "1.32"

#: Drivers that work on the host's hardware through sysfs and device nodes, and so get the host's /sys and /dev.
HOST_TREE_DRIVERS = frozenset({"vfio", "sriov", "fpga"})


def test_there_is_an_overlay_per_driver() -> None:
    drivers = sorted(p.parent.name for p in (ROOT / "drivers").glob("*/pyproject.toml"))
    assert drivers == OVERLAYS


@cache
def _render(kubectl: str, overlay: str) -> tuple[dict[str, Any], ...]:
    done = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / "overlays" / overlay)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"kubectl kustomize deploy/overlays/{overlay}: {done.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def _one(objects: tuple[dict[str, Any], ...], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def _config(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    return tomllib.loads(_one(objects, "ConfigMap")["data"]["config.toml"])


def _container(daemonset: dict[str, Any]) -> dict[str, Any]:
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _host_paths(daemonset: dict[str, Any]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Each hostPath volume by its host path: (the volume's hostPath, the container's mount of it)."""
    mounts = {m["name"]: m for m in _container(daemonset)["volumeMounts"]}
    out = {}
    for volume in daemonset["spec"]["template"]["spec"]["volumes"]:
        if "hostPath" in volume:
            assert volume["name"] in mounts, f"hostPath volume {volume['name']} is not mounted"
            out[volume["hostPath"]["path"]] = (volume["hostPath"], mounts[volume["name"]])
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_is_valid_for_the_named_kubernetes_version(kubectl: str, overlay: str) -> None:
    objects = _render(kubectl, overlay)
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == ["ConfigMap", "DaemonSet", "Namespace", "Role", "RoleBinding", "ServiceAccount"]
    for obj in objects:
        name = f"{overlay}: {obj['kind']}/{obj['metadata']['name']}"
        try:
            validated = kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{name} is not valid for Kubernetes {KUBERNETES_VERSION}: {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            pytest.fail(f"{name}: {exc.message}")
        assert validated == KUBERNETES_VERSION, name
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == "devplug", name


def test_the_validation_catches_a_mistake() -> None:
    """The check above can fail: a DaemonSet with a misspelt field and one with a wrong type are refused."""
    daemonset = yaml.safe_load((DEPLOY / "base" / "daemonset.yaml").read_text())
    daemonset["spec"]["updateStrategy"]["rollingUpdate"]["maxSurgee"] = 0
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, KUBERNETES_VERSION, strict=True)
    daemonset = yaml.safe_load((DEPLOY / "base" / "daemonset.yaml").read_text())
    daemonset["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "thirty"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_kubelet_folders_are_mounted_never_its_sockets(kubectl: str, overlay: str) -> None:
    objects = _render(kubectl, overlay)
    daemonset, config = _one(objects, "DaemonSet"), _config(objects)
    host = _host_paths(daemonset)
    plugin_dir = config["kubelet"]["device_plugin_dir"]
    pod_resources_dir = str(Path(config["kubelet"]["pod_resources_socket"]).parent)
    for folder in (plugin_dir, pod_resources_dir):
        assert folder in host, f"{overlay}: {folder} is not mounted from the host"
        volume, mount = host[folder]
        assert volume.get("type") == "Directory", f"{overlay}: {folder} must be mounted as a folder: {volume}"
        assert mount["mountPath"] == folder, f"{overlay}: {folder} is mounted at {mount['mountPath']}"
    assert not host[plugin_dir][1].get("readOnly"), "the daemon creates its sockets in the device-plugins folder"
    for path, (volume, mount) in host.items():
        assert not path.endswith(".sock") and volume.get("type") not in ("Socket", "File", "FileOrCreate"), path
        assert not mount["mountPath"].endswith(".sock"), mount
    state = config["state"]["dir"]
    assert host[state][0].get("type") in ("Directory", "DirectoryOrCreate"), "the state dir is a folder of the host"
    assert host[state][1]["mountPath"] == state


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_sys_and_dev_only_for_drivers_that_need_them(kubectl: str, overlay: str) -> None:
    objects = _render(kubectl, overlay)
    daemonset, config = _one(objects, "DaemonSet"), _config(objects)
    drivers = {table["driver"] for table in config["resources"].values()}
    needs = bool(drivers & HOST_TREE_DRIVERS)
    host = _host_paths(daemonset)
    kernel_trees = sorted(p for p in host if p in ("/sys", "/dev") or p.startswith(("/sys/", "/dev/", "/proc")))
    security = _container(daemonset)["securityContext"]
    if needs:
        assert kernel_trees == ["/dev", "/sys"], f"{overlay} ({drivers}) needs the host's /sys and /dev"
        assert host["/sys"][1]["mountPath"] == "/sys" and host["/dev"][1]["mountPath"] == "/dev"
        assert not host["/sys"][1].get("readOnly"), "vfio, sriov and fpga write to sysfs"
        assert security.get("privileged") is True
    else:
        assert kernel_trees == [], f"{overlay} ({drivers}) must not mount {kernel_trees}"
        assert not security.get("privileged") and security.get("allowPrivilegeEscalation") is False
        assert security["capabilities"]["drop"] == ["ALL"]
    host_network = daemonset["spec"]["template"]["spec"].get("hostNetwork", False)
    assert host_network == ("sriov" in drivers), "only sriov needs the host's network namespace (netlink on its PFs)"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_two_daemons_never_overlap_on_a_node(kubectl: str, overlay: str) -> None:
    daemonset = _one(_render(kubectl, overlay), "DaemonSet")
    strategy = daemonset["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_reach_the_daemons_http_server(kubectl: str, overlay: str) -> None:
    objects = _render(kubectl, overlay)
    daemonset, config = _one(objects, "DaemonSet"), _config(objects)
    metrics = config["metrics"]
    # The kubelet probes the pod's IP: the server must be on and listen beyond loopback.
    assert metrics["enabled"] is True and metrics["address"] == "0.0.0.0"
    container = _container(daemonset)
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert (get["path"], get["port"]) == (path, metrics["port"]), f"{overlay}: {probe}"
    assert {p["containerPort"] for p in container["ports"]} == {metrics["port"]}


def _bench_figure(key: str) -> float:
    match = re.search(rf"^\| `{key}` \| ([0-9.]+) \|", (ROOT / "README.md").read_text(), re.M)
    assert match, f"README's Performance table has no {key}"
    return float(match.group(1))


def _mebibytes(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    match = re.fullmatch(r"([0-9]+)(Ki|Mi|Gi)", quantity)
    assert match, f"memory quantity {quantity!r}: use Ki, Mi or Gi"
    return int(match.group(1)) * units[match.group(2)]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_resources_are_sized_from_the_bench_and_shutdown_fits_the_grace_period(kubectl: str, overlay: str) -> None:
    objects = _render(kubectl, overlay)
    daemonset, config = _one(objects, "DaemonSet"), _config(objects)
    resources = _container(daemonset)["resources"]
    idle_rss = _bench_figure("idle_rss_mb")
    request, limit = _mebibytes(resources["requests"]["memory"]), _mebibytes(resources["limits"]["memory"])
    assert idle_rss * 1.2 <= request <= limit, (idle_rss, request, limit)
    assert resources["requests"]["cpu"] and resources["limits"]["cpu"]
    grace = daemonset["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert config["shutdown"]["timeout"] < grace, "SIGTERM must be allowed to finish before the kubelet kills"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rbac_and_references_hold_together(kubectl: str, overlay: str) -> None:
    objects = _render(kubectl, overlay)
    daemonset = _one(objects, "DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    account = _one(objects, "ServiceAccount")
    assert spec["serviceAccountName"] == account["metadata"]["name"]
    binding = _one(objects, "RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "devplug", "namespace": "devplug"}]
    assert binding["roleRef"]["name"] == _one(objects, "Role")["metadata"]["name"]
    shipped = [d for d in yaml.safe_load_all((ROOT / "drivers/shared/devplug_shared/rbac.yaml").read_text())]
    (shipped_role,) = [d for d in shipped if d["kind"] == "Role"]
    assert _one(objects, "Role")["rules"] == shipped_role["rules"], "devplug-shared's own RBAC and the base differ"
    (config_volume,) = [v for v in spec["volumes"] if "configMap" in v]
    assert config_volume["configMap"]["name"] == _one(objects, "ConfigMap")["metadata"]["name"]
    selector = daemonset["spec"]["selector"]["matchLabels"]
    assert selector.items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()


def _check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devplug", "check-config", str(path)], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_devplug_accepts_the_config(kubectl: str, overlay: str, tmp_path: Path) -> None:
    """``devplug check-config`` on the ConfigMap's config.toml, on this machine (without the nodes' hardware)."""
    text = _one(_render(kubectl, overlay), "ConfigMap")["data"]["config.toml"]
    if overlay == "fpga":  # the bitstream comes from the node's /opt/devplug/fpga: give it one here
        (tmp_path / "blank.gbs").write_bytes(b"\0")
        text = text.replace("/opt/devplug/fpga/", f"{tmp_path}/")
    path = tmp_path / "config.toml"
    path.write_text(text)
    result = _check_config(path)
    if f"{path}: metrics: unknown key" in result.stderr:
        # A core without the daemon's HTTP server (the [metrics] table) refuses just that table; the rest of
        # the config must still pass. The probes test above checks the table itself.
        path.write_text(re.sub(r"^\[metrics\]\n(?:(?!\[).*\n)*", "", text, flags=re.M))
        result = _check_config(path)
    if overlay == "sriov":  # its set-up checks the node: this machine has no PF ens1f0, and nothing else may fail
        assert result.returncode == 2, result.stdout + result.stderr
        assert "pfs: 'ens1f0' names no SR-IOV physical function on this node" in result.stderr
        return
    assert result.returncode == 0, result.stderr
    assert f"{path}: ok" in result.stdout
