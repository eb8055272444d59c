"""deploy/: every overlay renders with ``kubectl kustomize``, alone and with each optional component (CDI, a PodMonitor,
another kubelet root), every object it renders is valid for each Kubernetes version of :data:`KUBERNETES_VERSIONS`
(kubernetes-validate's bundled schemas, strict: unknown fields are errors), and the DaemonSet is the one the operator
guide (docs/operator/deploy.md) promises: folders of the kubelet mounted (never its sockets), the state dir on the
host, of the host's /sys and /dev only the trees each driver reads or writes (derived here from its config), nodes
chosen by a label with device taints tolerated, the runtime's seccomp filter, the namespace's Pod Security level, API
access only for the Lease backend, updates that hand the node over, probes on the daemon's HTTP server, requests sized
from ``make bench``, and a config devplug itself accepts."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml  # type: ignore[import-untyped]

from devplug.config import DEFAULT_METRICS_PORT, POD_IP_ENV
from devplug.config.dra import default_driver_name
from devplug.config.tomlwrite import dumps_toml
from devplug.daemon.handover import handover_bound
from devplug.frontends.dra.frontend import instance_name
from devplug.frontends.dra.registration import registration_socket, service_socket
from devplug.kube.names import MAX_SOCKET_PATH

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = sorted(p.name for p in (DEPLOY / "overlays").iterdir() if (p / "kustomization.yaml").is_file())

#: The Kubernetes versions the manifests are validated against: the kubelet behaviour devplug follows is v1.32's,
#: and the newest schemas kubernetes-validate bundles are 1.37's.
KUBERNETES_VERSIONS = ("1.32", "1.33", "1.34", "1.35", "1.36", "1.37")

#: Components an operator adds in an overlay of their own (the others are parts of the shipped overlays).
OPTIONAL_COMPONENTS = (
    "cdi",
    "podmonitor",
    "node-profiles",
    "kubelet-root/microk8s",
    "kubelet-root/k0s",
    "metrics-networkpolicy",
    "prometheusrule",
    "grafana-dashboard",
)

#: Kubelet root dirs of the kubelet-root components.
KUBELET_ROOTS = {
    "kubelet-root/microk8s": "/var/snap/microk8s/common/var/lib/kubelet",
    "kubelet-root/k0s": "/var/lib/k0s/kubelet",
}

VARIANTS = [(overlay, ()) for overlay in OVERLAYS] + [
    (overlay, (component,)) for overlay in OVERLAYS for component in OPTIONAL_COMPONENTS
]


def _variant_id(variant: tuple[str, tuple[str, ...]]) -> str:
    overlay, components = variant
    return "+".join([overlay, *components])


def test_there_is_an_overlay_per_driver() -> None:
    drivers = sorted(p.parent.name for p in (ROOT / "drivers").glob("*/pyproject.toml"))
    assert drivers == OVERLAYS


def test_every_optional_component_is_tested() -> None:
    found = sorted(
        str(p.parent.relative_to(DEPLOY / "components")) for p in DEPLOY.glob("components/**/kustomization.yaml")
    )
    used = set()
    # the overlays' components, and those of their DRA variants (tests/deploy/test_dra_manifests.py)
    for path in [
        *(DEPLOY / "overlays" / o / "kustomization.yaml" for o in OVERLAYS),
        *DEPLOY.glob("dra/*/kustomization.yaml"),
    ]:
        kustomization = yaml.safe_load(path.read_text())
        used |= {Path(c).relative_to("../../components").as_posix() for c in kustomization.get("components", [])}
    assert sorted(set(found) - used) == sorted(OPTIONAL_COMPONENTS)


def _render(kubectl: str, overlay: str, components: tuple[str, ...] = ()) -> tuple[dict[str, Any], ...]:
    """``kubectl kustomize`` of an overlay, with components through a kustomization of the test's own."""
    return _render_target(kubectl, f"overlays/{overlay}", components)


@cache
def _render_target(kubectl: str, variant: str, components: tuple[str, ...] = ()) -> tuple[dict[str, Any], ...]:
    """``kubectl kustomize`` of ``deploy/<variant>`` (``overlays/<driver>`` or ``dra/<driver>``), with components
    through a kustomization of the test's own, as an operator adds them."""
    target = DEPLOY / variant
    with tempfile.TemporaryDirectory() as folder:
        if components:
            relative = os.path.relpath(DEPLOY, folder)
            kustomization = {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [f"{relative}/{variant}"],
                "components": [f"{relative}/components/{c}" for c in components],
            }
            (Path(folder) / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
            target = Path(folder)
        done = subprocess.run([kubectl, "kustomize", str(target)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"kubectl kustomize {variant} with {components}: {done.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def _one(objects: tuple[dict[str, Any], ...], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def _config_text(objects: tuple[dict[str, Any], ...]) -> str:
    """The config the daemon runs on: config.toml, with the CDI component's cdi.toml appended as its command does."""
    (configmap,) = [o for o in objects if o["kind"] == "ConfigMap" and "config.toml" in o["data"]]
    data = configmap["data"]
    return str(data["config.toml"]) + str(data.get("cdi.toml", ""))


def _config(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    return tomllib.loads(_config_text(objects))


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


def _kinds(overlay: str, components: tuple[str, ...]) -> list[str]:
    kinds = ["ConfigMap", "DaemonSet", "Namespace", "ServiceAccount"]
    if overlay == "shared":  # its Leases; and, cluster-wide and read-only, the nodes' kubelet Leases and pods
        kinds += ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]
    if "podmonitor" in components:
        kinds.append("PodMonitor")
    if "node-profiles" in components:  # reading and watching Nodes, cluster-wide (no RBAC rule says "its own")
        kinds += ["ClusterRole", "ClusterRoleBinding"]
    if "metrics-networkpolicy" in components:
        kinds.append("NetworkPolicy")
    if "prometheusrule" in components:
        kinds.append("PrometheusRule")
    if "grafana-dashboard" in components:  # the dashboard's ConfigMap, beside the config's
        kinds.append("ConfigMap")
    return sorted(kinds)


@pytest.mark.parametrize("variant", VARIANTS, ids=_variant_id)
def test_every_object_is_valid_for_each_kubernetes_version(kubectl: str, variant: tuple[str, tuple[str, ...]]) -> None:
    overlay, components = variant
    objects = _render(kubectl, overlay, components)
    assert sorted(o["kind"] for o in objects) == _kinds(overlay, components)
    for obj in objects:
        name = f"{_variant_id(variant)}: {obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):  # the cluster-scoped kinds
            assert obj["metadata"]["namespace"] == "devplug", name
        if obj["apiVersion"] == "monitoring.coreos.com/v1":
            continue  # a CRD's object: no Kubernetes schema (test_the_podmonitor_scrapes_the_daemons_port)
        for version in KUBERNETES_VERSIONS:
            try:
                validated = kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                pytest.fail(f"{name} is not valid for Kubernetes {version}: {path}: {exc.message}")
            except kubernetes_validate.SchemaNotFoundError as exc:
                pytest.fail(f"{name}: {exc.message}")
            assert validated == version, name


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_validation_catches_a_mistake(version: str) -> None:
    """The check above can fail: a DaemonSet with a misspelt field and one with a wrong type are refused."""
    daemonset = yaml.safe_load((DEPLOY / "base" / "daemonset.yaml").read_text())
    daemonset["spec"]["updateStrategy"]["rollingUpdate"]["maxSurgee"] = 0
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, version, strict=True)
    daemonset = yaml.safe_load((DEPLOY / "base" / "daemonset.yaml").read_text())
    daemonset["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "thirty"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, version, strict=True)


@pytest.mark.parametrize("variant", VARIANTS, ids=_variant_id)
def test_the_kubelet_folders_are_mounted_never_its_sockets(kubectl: str, variant: tuple[str, tuple[str, ...]]) -> None:
    overlay, components = variant
    objects = _render(kubectl, overlay, components)
    daemonset, config = _one(objects, "DaemonSet"), _config(objects)
    mounts = {m["mountPath"]: m for m in _container(daemonset)["volumeMounts"]}
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    kubelet_root = next((KUBELET_ROOTS[c] for c in components if c in KUBELET_ROOTS), "/var/lib/kubelet")
    plugin_dir = config["kubelet"]["device_plugin_dir"]
    pod_resources_dir = str(Path(config["kubelet"]["pod_resources_socket"]).parent)
    for folder in (plugin_dir, pod_resources_dir):
        assert folder in mounts, f"{overlay}: nothing is mounted at {folder}"
        volume = volumes[mounts[folder]["name"]]["hostPath"]
        assert volume.get("type") == "Directory", f"{overlay}: {folder} must be mounted as a folder: {volume}"
        # The container sees the kubelet's folder where config.toml says; the host's is under the kubelet's root.
        assert volume["path"] == folder.replace("/var/lib/kubelet", kubelet_root, 1), (folder, volume)
    assert not mounts[plugin_dir].get("readOnly"), "the daemon creates its sockets in the device-plugins folder"
    host = _host_paths(daemonset)
    for path, (volume, mount) in host.items():
        assert not path.endswith(".sock") and volume.get("type") not in ("Socket", "File", "FileOrCreate"), path
        assert not mount["mountPath"].endswith(".sock"), mount
    state = config["state"]["dir"]
    assert host[state][0].get("type") in ("Directory", "DirectoryOrCreate"), "the state dir is a folder of the host"
    assert host[state][1]["mountPath"] == state


def _driver_mounts(driver: str, options: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """The host trees a driver reads or writes, from reading drivers/<name>/: host path -> (mount path, read-only).

    The roots are the driver's sysfs_root and dev_root options (where the container sees the host's trees)."""
    sys_root = str(options.get("sysfs_root", "/sys"))
    dev_root = str(options.get("dev_root", "/dev"))
    pci = {  # devplug.kit.pci.PciBus: bus/pci/{devices,drivers,drivers_probe}, and where devices/ links lead
        "/sys/bus/pci": (f"{sys_root}/bus/pci", False),
        "/sys/devices": (f"{sys_root}/devices", False),
    }
    vfio_nodes = {  # PciBus.groups_dir and vfio_dir: group members; /dev/vfio/<group> appearing after a bind
        "/sys/kernel/iommu_groups": (f"{sys_root}/kernel/iommu_groups", True),
        "/dev/vfio": (f"{dev_root}/vfio", True),
    }
    if driver == "vfio":
        return pci | vfio_nodes
    if driver == "sriov":
        return pci | (vfio_nodes if options.get("vf_driver") == "vfio-pci" else {})
    if driver == "fpga":  # devplug_fpga.dfl: class/fpga_region, bus/platform/devices, hwmon, the DFL nodes
        mounts = {
            "/sys/class/fpga_region": (f"{sys_root}/class/fpga_region", True),
            "/sys/bus/platform/devices": (f"{sys_root}/bus/platform/devices", True),
            "/sys/devices": (f"{sys_root}/devices", "power_save_watts" not in options),
            "/dev": (dev_root, True),
        }
        for key in ("blank_image", "default_image"):
            if key in options:
                folder = str(Path(options[key]).parent)
                mounts[folder] = (folder, True)
        return mounts
    if driver == "mock":  # its folder, at the same path on the node: the Allocate answer names its files
        directory = str(options["directory"])
        return {directory: (directory, False)}
    return {}  # shared (the network and the API server)


def _needed_mounts(config: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    kubelet = config["kubelet"]
    plugin_dir = kubelet["device_plugin_dir"]
    pod_resources = str(Path(kubelet["pod_resources_socket"]).parent)
    needed = {
        plugin_dir: (plugin_dir, False),
        pod_resources: (pod_resources, True),
        config["state"]["dir"]: (config["state"]["dir"], False),
    }
    liveness = config.get("liveness", {})
    if "cgroup_mount" in liveness:  # container liveness: the host's cgroup tree, read only
        needed["/sys/fs/cgroup"] = (liveness["cgroup_mount"], True)
    if config.get("cdi", {}).get("enabled"):
        spec_dir = config["cdi"].get("spec_dir", "/var/run/cdi")
        needed[spec_dir] = (spec_dir, False)
    for table in config["resources"].values():
        for host, (target, read_only) in _driver_mounts(table["driver"], table.get("options", {})).items():
            # Read-write wins where two drivers share a tree.
            needed[host] = (target, read_only and needed.get(host, (target, True))[1])
    return needed


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_container_liveness_is_required_and_reads_the_hosts_cgroup_tree(kubectl: str, overlay: str) -> None:
    objects = _render(kubectl, overlay, ())
    liveness = _config(objects).get("liveness", {})
    assert liveness.get("required") is True, f"{overlay}: [liveness] required is not set"
    host = _host_paths(_one(objects, "DaemonSet"))
    assert "/sys/fs/cgroup" in host, f"{overlay}: the host's cgroup tree is not mounted"
    volume, mount = host["/sys/fs/cgroup"]
    assert mount.get("readOnly") and mount["mountPath"] == liveness["cgroup_mount"], (overlay, mount, liveness)
    assert volume.get("type") == "Directory"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_host_mounts_are_the_trees_the_driver_needs_and_no_more(kubectl: str, overlay: str) -> None:
    for components in ((), ("cdi",)):
        objects = _render(kubectl, overlay, components)
        host = _host_paths(_one(objects, "DaemonSet"))
        mounted = {path: (mount["mountPath"], bool(mount.get("readOnly"))) for path, (_, mount) in host.items()}
        assert mounted == _needed_mounts(_config(objects)), f"{overlay} with {components}"


def test_the_mount_check_sees_a_missing_or_extra_tree() -> None:
    """The check above can fail: sriov with vfio-pci VFs needs /dev/vfio; fpga writing power1_max needs /sys rw."""
    base = {"kubelet": {"device_plugin_dir": "/p", "pod_resources_socket": "/r/k.sock"}, "state": {"dir": "/s"}}
    kernel_vfs = _needed_mounts({**base, "resources": {"a/b": {"driver": "sriov", "options": {}}}})
    vfio_vfs = _needed_mounts({**base, "resources": {"a/b": {"driver": "sriov", "options": {"vf_driver": "vfio-pci"}}}})
    assert set(vfio_vfs) - set(kernel_vfs) == {"/dev/vfio", "/sys/kernel/iommu_groups"}
    quiet = _needed_mounts({**base, "resources": {"a/b": {"driver": "fpga", "options": {"dev_root": "/host/dev"}}}})
    saving = {"driver": "fpga", "options": {"power_save_watts": 40}}
    assert quiet["/sys/devices"] == ("/sys/devices", True) and quiet["/dev"] == ("/host/dev", True)
    assert _needed_mounts({**base, "resources": {"a/b": saving}})["/sys/devices"] == ("/sys/devices", False)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_privileged_only_for_drivers_that_change_the_hosts_hardware(kubectl: str, overlay: str) -> None:
    objects = _render(kubectl, overlay)
    daemonset, config = _one(objects, "DaemonSet"), _config(objects)
    drivers = {table["driver"] for table in config["resources"].values()}
    security = _container(daemonset)["securityContext"]
    assert security["runAsUser"] == 0 and security["readOnlyRootFilesystem"] is True
    if drivers & {"vfio", "sriov", "fpga"}:
        assert security.get("privileged") is True, f"{overlay} ({drivers}) writes sysfs, netlink or DFL ioctls"
    else:
        assert not security.get("privileged") and security.get("allowPrivilegeEscalation") is False
        assert security["capabilities"]["drop"] == ["ALL"]
    host_network = daemonset["spec"]["template"]["spec"].get("hostNetwork", False)
    assert host_network == ("sriov" in drivers), "only sriov needs the host's network namespace (netlink on its PFs)"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_nodes_opt_in_by_label_and_device_taints_are_tolerated(kubectl: str, overlay: str) -> None:
    objects = _render(kubectl, overlay)
    spec = _one(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux", f"devplug/{overlay}": "true"}
    tolerations = spec["tolerations"]
    assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in tolerations
    for resource, table in _config(objects)["resources"].items():
        advertised = table.get("rename", resource)
        assert {"key": advertised, "operator": "Exists"} in tolerations, f"{overlay}: no toleration of {advertised}"
    assert all(t.get("key") for t in tolerations), "a toleration without a key tolerates every taint"
    assert len(tolerations) == 1 + len(_config(objects)["resources"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_seccomp_and_the_namespaces_pod_security_level(kubectl: str, overlay: str) -> None:
    objects = _render(kubectl, overlay)
    spec = _one(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "seccompProfile" not in _container(_one(objects, "DaemonSet"))["securityContext"]
    labels = _one(objects, "Namespace")["metadata"]["labels"]
    # hostPath volumes (every overlay) are refused under "baseline": only "privileged" admits the DaemonSet.
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    assert any(v.get("hostPath") for v in spec["volumes"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_an_update_hands_the_node_over_and_never_leaves_it_without_a_daemon(kubectl: str, overlay: str) -> None:
    objects = _render(kubectl, overlay)
    daemonset, config = _one(objects, "DaemonSet"), _config(objects)
    strategy = daemonset["spec"]["updateStrategy"]
    if daemonset["spec"]["template"]["spec"].get("hostNetwork"):
        # the daemon's port is the node's: a second pod could not be scheduled beside the first
        assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    else:
        assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert config["handover"]["enabled"] is True  # the new pod asks the old one to hand over, not refused
    env = {e["name"]: e for e in _container(daemonset)["env"]}
    assert env["DEVPLUG_INSTANCE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    grace = daemonset["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert handover_bound(config["handover"]["timeout"]) < grace, "a handover under way must end before the kill"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_for_older_kubelets_no_surge_stops_the_old_pod_first(kubectl: str, overlay: str) -> None:
    daemonset = _one(_render(kubectl, overlay, ("no-surge",)), "DaemonSet")
    strategy = daemonset["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    assert daemonset["spec"]["template"] == _one(_render(kubectl, overlay), "DaemonSet")["spec"]["template"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_reach_the_daemons_http_server(kubectl: str, overlay: str) -> None:
    objects = _render(kubectl, overlay)
    daemonset, config = _one(objects, "DaemonSet"), _config(objects)
    metrics = config["metrics"]
    # The kubelet probes the pod's IP: the server must be on and listen there, and there alone (under hostNetwork,
    # 0.0.0.0 would be every address of the node): no address in the config, POD_IP from the downward API.
    assert metrics["enabled"] is True and "address" not in metrics
    container = _container(daemonset)
    env = {e["name"]: e for e in container["env"]}
    assert env[POD_IP_ENV] == {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    # The default port, which no common exporter has (9400, the earlier one, is NVIDIA dcgm-exporter's)
    assert metrics["port"] == DEFAULT_METRICS_PORT != 9400
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert (get["path"], get["port"]) == (path, metrics["port"]), f"{overlay}: {probe}"
    assert {p["containerPort"] for p in container["ports"]} == {metrics["port"]}


def _bench_figure(key: str) -> float:
    """A figure of the bench's record (``bench/record.json``, which the Performance page quotes)."""
    record = json.loads((ROOT / "bench" / "record.json").read_text())
    rows = {row["key"]: row for group in ("goals", "context") for row in record.get(group) or ()}
    assert key in rows and rows[key].get("figure") is not None, f"bench/record.json has no figure for {key}"
    return float(rows[key]["figure"])


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


def _uses_the_lease_backend(config: dict[str, Any]) -> bool:
    return any(
        table["driver"] == "shared" and table.get("options", {}).get("coordination", {}).get("backend") == "kubernetes"
        for table in config["resources"].values()
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_api_access_only_where_the_lease_backend_uses_it(kubectl: str, overlay: str) -> None:
    objects = _render(kubectl, overlay)
    daemonset = _one(objects, "DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    account = _one(objects, "ServiceAccount")
    assert spec["serviceAccountName"] == account["metadata"]["name"]
    assert account["automountServiceAccountToken"] is False
    leases = _uses_the_lease_backend(_config(objects))
    assert spec["automountServiceAccountToken"] is leases, f"{overlay}: the token only for the Lease backend"
    roles = [o for o in objects if o["kind"] in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")]
    if not leases:
        assert roles == [], f"{overlay} uses no API: no RBAC"
        return
    binding = _one(objects, "RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "devplug", "namespace": "devplug"}]
    assert binding["roleRef"]["name"] == _one(objects, "Role")["metadata"]["name"]
    shipped = [d for d in yaml.safe_load_all((ROOT / "drivers/shared/devplug_shared/rbac.yaml").read_text())]
    (shipped_role,) = [d for d in shipped if d["kind"] == "Role"]
    assert _one(objects, "Role")["rules"] == shipped_role["rules"], "devplug-shared's own RBAC and the overlay differ"
    (shipped_cluster_role,) = [d for d in shipped if d["kind"] == "ClusterRole"]
    cluster_role = _one(objects, "ClusterRole")
    assert cluster_role["rules"] == shipped_cluster_role["rules"], "the node-liveness reads differ"
    assert all(set(rule["verbs"]) <= {"get", "list"} for rule in cluster_role["rules"]), "read-only cluster-wide"
    cluster_binding = _one(objects, "ClusterRoleBinding")
    assert cluster_binding["subjects"] == binding["subjects"]
    assert cluster_binding["roleRef"]["name"] == cluster_role["metadata"]["name"]
    namespaces = {t["options"]["coordination"].get("namespace") for t in _config(objects)["resources"].values()}
    assert namespaces == {"devplug"}, "the Leases live in the namespace the Role is in"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_node_profiles_component_grants_get_and_watch_of_nodes_only(kubectl: str, overlay: str) -> None:
    objects = _render(kubectl, overlay, ("node-profiles",))
    spec = _one(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is True, "the daemon reads its Node with the pod's token"
    env = {e["name"]: e for e in _container(_one(objects, "DaemonSet"))["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    roles = [o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "devplug-node-profiles"]
    assert [r["rules"] for r in roles] == [[{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "watch"]}]]
    (binding,) = [
        o for o in objects if o["kind"] == "ClusterRoleBinding" and o["roleRef"]["name"] == "devplug-node-profiles"
    ]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "devplug", "namespace": "devplug"}]
    assert spec["serviceAccountName"] == "devplug"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_references_hold_together(kubectl: str, overlay: str) -> None:
    daemonset = _one(_render(kubectl, overlay), "DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    (config_volume,) = [v for v in spec["volumes"] if "configMap" in v]
    assert config_volume["configMap"]["name"] == _one(_render(kubectl, overlay), "ConfigMap")["metadata"]["name"]
    selector = daemonset["spec"]["selector"]["matchLabels"]
    assert selector.items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()
    assert _container(daemonset)["image"] == f"devplug:{_core_version()}", "the name make image gives the image"


def _core_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_cdi_component_mounts_the_spec_dir_and_turns_cdi_on(kubectl: str, overlay: str) -> None:
    objects = _render(kubectl, overlay, ("cdi",))
    daemonset, config = _one(objects, "DaemonSet"), _config(objects)
    assert config["cdi"] == {"enabled": True, "spec_dir": "/var/run/cdi", "fallback": True}
    host = _host_paths(daemonset)
    assert host["/var/run/cdi"][1]["mountPath"] == config["cdi"]["spec_dir"]
    assert host["/var/run/cdi"][0]["type"] == "DirectoryOrCreate" and not host["/var/run/cdi"][1].get("readOnly")
    container = _container(daemonset)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    config_dir = next(mounts[n] for n, v in volumes.items() if "configMap" in v)
    merged = container["args"][container["args"].index("--config") + 1]
    # The command writes the merged config into an emptyDir (the root filesystem is read-only), then runs devplug:
    # config.toml, then cdi.toml (_assembled_config runs it).
    (shell,) = [a for a in container["command"] if f"{config_dir}/cdi.toml" in a]
    assert container["command"] == ["/bin/sh", "-c", shell, "devplug"]
    assert f"cat {config_dir}/config.toml;" in shell and shell.endswith(f'> {merged} && exec devplug "$@"')
    assert _assembled_config(objects) == _config(objects)
    assert container["args"][0] == "run"
    assert any("emptyDir" in volumes[n] and merged.startswith(p + "/") for n, p in mounts.items())
    without = _container(_one(_render(kubectl, overlay), "DaemonSet"))
    assert container["args"][3:] == without["args"][3:], "the same options as without CDI"


@pytest.mark.parametrize("component", sorted(KUBELET_ROOTS))
def test_a_kubelet_root_component_changes_only_the_host_folders(kubectl: str, component: str) -> None:
    plain, moved = _render(kubectl, "mock"), _render(kubectl, "mock", (component,))
    assert _config(plain) == _config(moved)
    before, after = _host_paths(_one(plain, "DaemonSet")), _host_paths(_one(moved, "DaemonSet"))
    assert sorted(set(before) - set(after)) == ["/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources"]
    root = KUBELET_ROOTS[component]
    assert sorted(set(after) - set(before)) == [f"{root}/device-plugins", f"{root}/pod-resources"]
    for folder in ("device-plugins", "pod-resources"):
        assert after[f"{root}/{folder}"][1] == before[f"/var/lib/kubelet/{folder}"][1], "mounted where it was"
    assert {p: v for p, v in after.items() if not p.startswith(root)} == {
        p: v for p, v in before.items() if not p.startswith("/var/lib/kubelet")
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_podmonitor_scrapes_the_daemons_port(kubectl: str, overlay: str) -> None:
    objects = _render(kubectl, overlay, ("podmonitor",))
    monitor, daemonset = _one(objects, "PodMonitor"), _one(objects, "DaemonSet")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    spec = monitor["spec"]
    assert set(spec) == {"selector", "podMetricsEndpoints"}, "fields of PodMonitor's spec only"
    assert spec["selector"]["matchLabels"].items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()
    ports = {p["name"]: p["containerPort"] for p in _container(daemonset)["ports"]}
    (endpoint,) = spec["podMetricsEndpoints"]
    assert endpoint["port"] in ports and ports[endpoint["port"]] == _config(objects)["metrics"]["port"]
    assert endpoint["path"] == "/metrics" and re.fullmatch(r"[0-9]+s", endpoint["interval"])


def _check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devplug", "check-config", str(path)], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("variant", [(o, c) for o in OVERLAYS for c in ((), ("cdi",))], ids=_variant_id)
def test_devplug_accepts_the_config(kubectl: str, variant: tuple[str, tuple[str, ...]], tmp_path: Path) -> None:
    """``devplug check-config`` on the config the pod runs on, on this machine (without the nodes' hardware)."""
    overlay, components = variant
    text = _config_text(_render(kubectl, overlay, components))
    if overlay == "fpga":  # the bitstream comes from the node's /opt/devplug/fpga: give it one here
        (tmp_path / "blank.gbs").write_bytes(b"\0")
        text = text.replace("/opt/devplug/fpga/", f"{tmp_path}/")
    path = tmp_path / "config.toml"
    path.write_text(text)
    result = _check_config(path)
    if overlay == "sriov":  # its set-up checks the node: this machine has no PF ens1f0, and nothing else may fail
        assert result.returncode == 2, result.stdout + result.stderr
        assert "pfs: 'ens1f0' names no SR-IOV physical function on this node" in result.stderr
        return
    assert result.returncode == 0, result.stderr
    assert f"{path}: ok" in result.stdout


# --- What the API server checks beyond the schema -------------------------------------------------------------------
#
# kubernetes-validate checks each object against the OpenAPI schema: field names, types, required fields. The API
# server then runs Kubernetes' own validation code on a DaemonSet's pod template (pkg/apis/core/validation/
# validation.go, ValidatePodTemplateSpec -> ValidatePodSpec), whose rules over several fields together no schema
# states. _pod_rule_errors applies those of them a devplug DaemonSet can break, each citing the function it follows
# (kubernetes/kubernetes, pkg/apis/core/validation/validation.go), to every shipped combination: each overlay and
# each DRA variant, alone, with each component an operator adds, and with CDI beside each of the others.

#: Every variant deploy/ ships: the overlays (device plugin) and the DRA variants.
SHIPPED = [f"overlays/{o}" for o in OVERLAYS] + [
    f"dra/{p.name}" for p in sorted((DEPLOY / "dra").iterdir()) if (p / "kustomization.yaml").is_file()
]
#: Components an operator adds to any variant (OPTIONAL_COMPONENTS and no-surge), alone and with CDI beside each.
ADDED = (*OPTIONAL_COMPONENTS, "no-surge")
COMBINATIONS = [(), *((c,) for c in ADDED), *(("cdi", c) for c in ADDED if c != "cdi")]
#: ``validateHostPathType``'s ``supportedHostPathTypes``: HostPathUnset (""), DirectoryOrCreate, Directory,
#: FileOrCreate, File, Socket, CharDevice, BlockDevice.
HOST_PATH_TYPES = {"", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice", "BlockDevice"}
#: ``ValidateDNS1123Label`` (k8s.io/apimachinery validation.IsDNS1123Label): at most 63 characters.
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
#: The volume sources ``validateVolumeSource`` counts ("may not specify more than 1 volume type").
VOLUME_SOURCES = {
    "hostPath", "emptyDir", "gcePersistentDisk", "awsElasticBlockStore", "gitRepo", "secret", "nfs", "iscsi",
    "glusterfs", "persistentVolumeClaim", "rbd", "flexVolume", "cinder", "cephfs", "flocker", "downwardAPI", "fc",
    "azureFile", "configMap", "vsphereVolume", "quobyte", "azureDisk", "photonPersistentDisk", "projected",
    "portworxVolume", "scaleIO", "storageos", "csi", "ephemeral", "image",
}  # fmt: skip


def _has_backsteps(path: str) -> bool:
    """``validatePathNoBacksteps``: no element of the path is ``..``."""
    return ".." in path.split("/")


def _pod_rule_errors(spec: dict[str, Any]) -> list[str]:
    """What the API server's validation of a pod spec refuses that schema validation cannot see, as its messages."""
    errors: list[str] = []
    volumes: dict[str, dict[str, Any]] = {}
    for i, volume in enumerate(spec.get("volumes", [])):
        where, name = f"spec.volumes[{i}]", volume.get("name", "")
        # ValidateVolumes: the name is required and a DNS-1123 label ...
        if not name:
            errors.append(f"{where}.name: Required value (ValidateVolumes)")
        elif len(name) > 63 or not DNS1123_LABEL.fullmatch(name):
            errors.append(f"{where}.name: Invalid value: {name!r}: not a DNS-1123 label (ValidateVolumes)")
        # ... and unique: field.Duplicate.
        if name in volumes:
            errors.append(f"{where}.name: Duplicate value: {name!r} (ValidateVolumes)")
        # validateVolumeSource: exactly one source.
        sources = sorted(set(volume) & VOLUME_SOURCES)
        if len(sources) != 1:
            errors.append(f"{where}: {sources or 'no source'}: exactly one volume type (validateVolumeSource)")
        host = volume.get("hostPath")
        if host is not None:
            # validateHostPathVolumeSource: a path without backsteps; validateHostPathType: a supported type.
            path = host.get("path", "")
            if not path:
                errors.append(f"{where}.hostPath.path: Required value (validateHostPathVolumeSource)")
            elif _has_backsteps(path):
                errors.append(f"{where}.hostPath.path: Invalid value: {path!r}: must not contain '..' "
                              "(validatePathNoBacksteps)")  # fmt: skip
            if host.get("type", "") not in HOST_PATH_TYPES:
                errors.append(f"{where}.hostPath.type: Unsupported value: {host['type']!r} (validateHostPathType)")
        volumes.setdefault(name, volume)
    containers = [("initContainers", c) for c in spec.get("initContainers", [])]
    containers += [("containers", c) for c in spec.get("containers", [])]
    names: set[str] = set()
    for kind, container in containers:
        where = f"spec.{kind}[{container.get('name')}]"
        # validateContainers / validateInitContainers: container names unique across both lists.
        if container.get("name") in names:
            errors.append(f"{where}.name: Duplicate value (validateContainers)")
        names.add(container.get("name"))
        mount_paths: set[str] = set()
        for j, mount in enumerate(container.get("volumeMounts", [])):
            at = f"{where}.volumeMounts[{j}]"
            # ValidateVolumeMounts: the name is required and names a volume of the pod (field.NotFound) ...
            if not mount.get("name"):
                errors.append(f"{at}.name: Required value (ValidateVolumeMounts)")
            elif mount["name"] not in volumes:
                errors.append(f"{at}.name: Not found: {mount['name']!r} (ValidateVolumeMounts)")
            # ... the mount path is required and unique in the container ("must be unique") ...
            path = mount.get("mountPath", "")
            if not path:
                errors.append(f"{at}.mountPath: Required value (ValidateVolumeMounts)")
            elif path in mount_paths:
                errors.append(f"{at}.mountPath: Invalid value: {path!r}: must be unique (ValidateVolumeMounts)")
            mount_paths.add(path)
            # ... and a subPath is a relative path without backsteps (validateLocalDescendingPath).
            sub = mount.get("subPath", "")
            if sub and (sub.startswith("/") or _has_backsteps(sub)):
                errors.append(f"{at}.subPath: Invalid value: {sub!r} (validateLocalDescendingPath)")
    return errors


def _unmounted_volumes(spec: dict[str, Any]) -> list[str]:
    """devplug's own rule, not the API server's: every volume is mounted (one nobody mounts is what is left of a
    component whose mount went elsewhere; the kubelet skips it, so a wrong one would go unnoticed on a node)."""
    mounted = {m["name"] for c in spec.get("containers", []) for m in c.get("volumeMounts", [])}
    return [v["name"] for v in spec.get("volumes", []) if v["name"] not in mounted]


@pytest.mark.parametrize("variant", SHIPPED)
@pytest.mark.parametrize("components", COMBINATIONS, ids=lambda c: "+".join(c) or "alone")
def test_every_shipped_combination_passes_the_api_servers_pod_rules(
    kubectl: str, variant: str, components: tuple[str, ...]
) -> None:
    objects = _render_target(kubectl, variant, components)
    spec = _one(objects, "DaemonSet")["spec"]["template"]["spec"]
    label = "+".join([variant, *components])
    assert _pod_rule_errors(spec) == [], f"{label}: the API server would refuse the DaemonSet"
    assert _unmounted_volumes(spec) == [], f"{label}: volumes nobody mounts"


def _mutated(change: Any) -> list[str]:
    """The pod rules' errors on the mock overlay's pod spec after ``change(spec)``."""
    spec = yaml.safe_load((DEPLOY / "base" / "daemonset.yaml").read_text())["spec"]["template"]["spec"]
    assert _pod_rule_errors(spec) == []
    change(spec)
    return _pod_rule_errors(spec)


def test_the_pod_rules_catch_each_mistake() -> None:
    """The check above can fail, on each rule; the first case is issue 40's: components/dra and components/cdi
    each mounting the host's /var/run/cdi, under two volume names."""

    def mount(spec: dict[str, Any], name: str, path: str) -> None:
        spec["containers"][0]["volumeMounts"].append({"name": name, "mountPath": path})

    def host(spec: dict[str, Any], name: str, path: str, kind: str = "DirectoryOrCreate") -> None:
        spec["volumes"].append({"name": name, "hostPath": {"path": path, "type": kind}})

    def cdi_twice(spec: dict[str, Any]) -> None:
        for name in ("cdi", "cdi-specs"):
            host(spec, name, "/var/run/cdi")
            mount(spec, name, "/var/run/cdi")

    assert ["must be unique (ValidateVolumeMounts)" in e for e in _mutated(cdi_twice)] == [True]
    assert "Not found: 'plugins'" in " ".join(_mutated(lambda s: mount(s, "plugins", "/var/lib/kubelet/plugins")))
    assert "Duplicate value: 'state'" in " ".join(_mutated(lambda s: host(s, "state", "/var/lib/devplug")))
    assert "Unsupported value: 'Dir'" in " ".join(_mutated(lambda s: host(s, "a", "/a", "Dir")))
    assert "must not contain '..'" in " ".join(_mutated(lambda s: host(s, "b", "/var/lib/../etc")))
    assert "not a DNS-1123 label" in " ".join(_mutated(lambda s: host(s, "plugins_registry", "/c")))
    assert "exactly one volume type" in " ".join(_mutated(lambda s: s["volumes"][0].update(emptyDir={})))
    assert _unmounted_volumes({"volumes": [{"name": "x", "emptyDir": {}}], "containers": [{"name": "c"}]}) == ["x"]


def _assembled_config(objects: tuple[dict[str, Any], ...], env: dict[str, str] | None = None) -> dict[str, Any]:
    """The config the daemon runs on, assembled by the container's own command where it has one (components/cdi,
    components/dra): the ConfigMap's files in a folder standing for /etc/devplug, the command run by /bin/sh with
    the pod's env (``env``, the values the test gives the downward API's fields) and the paths moved into that
    folder, and a ``devplug`` that prints the file its ``--config`` names."""
    container = _container(_one(objects, "DaemonSet"))
    if "command" not in container:
        return _config(objects)
    config_dir = next(
        m["mountPath"]
        for m in container["volumeMounts"]
        for v in _one(objects, "DaemonSet")["spec"]["template"]["spec"]["volumes"]
        if v["name"] == m["name"] and "configMap" in v
    )
    merged = container["args"][container["args"].index("--config") + 1]
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "etc").mkdir()
        (root / "run").mkdir()
        (root / "bin").mkdir()
        for name, text in _one(objects, "ConfigMap")["data"].items():
            (root / "etc" / name).write_text(text)
        fake = root / "bin" / "devplug"
        fake.write_text('#!/bin/sh\nwhile [ "$1" != --config ]; do shift; done\ncat "$2"\n')
        fake.chmod(0o755)

        def moved(text: str) -> str:
            return text.replace(config_dir, str(root / "etc")).replace(str(Path(merged).parent), str(root / "run"))

        values = {e["name"]: e.get("value", "from-the-downward-api") for e in container.get("env", [])}
        done = subprocess.run(
            [moved(a) for a in container["command"]] + [moved(a) for a in container["args"]],
            capture_output=True,
            text=True,
            timeout=30,
            env={**values, **(env or {}), "PATH": f"{root / 'bin'}:/usr/bin:/bin"},
        )
    assert done.returncode == 0, done.stderr
    return tomllib.loads(done.stdout)


def _is_dra(objects: tuple[dict[str, Any], ...]) -> bool:
    return bool(_one(objects, "DaemonSet")["metadata"].get("annotations", {}).get("devplug/api") == "dra")


@pytest.mark.parametrize("variant", SHIPPED)
@pytest.mark.parametrize("component", sorted(KUBELET_ROOTS))
@pytest.mark.parametrize("cdi", [(), ("cdi",)], ids=["", "cdi"])
def test_a_kubelet_root_component_moves_every_kubelet_folder_devplug_mounts(
    kubectl: str, variant: str, component: str, cdi: tuple[str, ...]
) -> None:
    """Issue 40, item 2: DRA's plugins_registry and plugins too. The daemon's view of each folder stays where its
    config names it, but for the plugins folder: the kubelet dials the DRA service socket at the path the plugin
    gives, so that folder is mounted where the host has it and the config the daemon runs on names it there."""
    root = KUBELET_ROOTS[component]
    plain = _render_target(kubectl, variant, cdi)
    moved = _render_target(kubectl, variant, (component, *cdi))
    before, after = _host_paths(_one(plain, "DaemonSet")), _host_paths(_one(moved, "DaemonSet"))
    assert [p for p in after if p.startswith("/var/lib/kubelet")] == [], f"{variant} + {component}: not moved"
    kubelet_folders = sorted(p.removeprefix("/var/lib/kubelet/") for p in before if p.startswith("/var/lib/kubelet/"))
    assert sorted(p.removeprefix(f"{root}/") for p in after if p.startswith(f"{root}/")) == kubelet_folders
    assert {p: v for p, v in after.items() if not p.startswith(root)} == {
        p: v for p, v in before.items() if not p.startswith("/var/lib/kubelet")
    }, "nothing else changes"
    config = _assembled_config(moved)
    if not _is_dra(plain):
        assert kubelet_folders == ["device-plugins", "pod-resources"]
        assert config == _assembled_config(plain)
        return
    assert kubelet_folders == ["device-plugins", "plugins", "plugins_registry", "pod-resources"]
    plugins = after[f"{root}/plugins"][1]["mountPath"]
    assert str(config["kubelet"]["plugins_dir"]) == plugins == f"{root}/plugins", "mounted and named where it is"
    registry = after[f"{root}/plugins_registry"][1]["mountPath"]
    assert str(config["kubelet"]["plugins_registry_dir"]) == registry
    config["kubelet"]["plugins_dir"] = "/var/lib/kubelet/plugins"
    assert config == _assembled_config(plain), "the config changes in plugins_dir only"
    assert _assembled_config(plain)["kubelet"]["plugins_dir"] == "/var/lib/kubelet/plugins"


#: A pod's UID (the downward API's metadata.uid, ``POD_UID``), from which the DRA sockets' instance name begins.
POD_UID = "5a0e0000-0000-4000-8000-000000000001"


@pytest.mark.parametrize("variant", [v for v in SHIPPED if v.startswith("dra/")])
@pytest.mark.parametrize("component", ["", "kubelet-root/k0s", "kubelet-root/microk8s"])
def test_the_dra_sockets_fit_a_unix_socket_path_where_the_kubelet_dials_them(
    kubectl: str, variant: str, component: str
) -> None:
    """The kubelet dials the registration socket at its path on the host (in its plugins_registry folder) and the
    service socket at the path the plugin gives: each must fit ``sun_path``."""
    objects = _render_target(kubectl, variant, (component,) if component else ())
    config = _assembled_config(objects)
    host = {m["mountPath"]: p for p, (_, m) in _host_paths(_one(objects, "DaemonSet")).items()}
    registry_on_host = Path(host[str(config["kubelet"]["plugins_registry_dir"])])
    for name, table in config["resources"].items():
        driver = (table.get("dra") or {}).get("driver_name") or default_driver_name(name)
        instance = instance_name(POD_UID)
        for path in (
            registration_socket(registry_on_host, driver, instance),
            service_socket(Path(config["kubelet"]["plugins_dir"]), driver, instance),
        ):
            assert len(str(path).encode()) <= MAX_SOCKET_PATH, f"{path}: {len(str(path).encode())} bytes"


@pytest.mark.parametrize("variant", SHIPPED)
@pytest.mark.parametrize("cdi", [(), ("cdi",)], ids=["", "cdi"])
def test_every_shipped_config_passes_check_config_offline_anywhere(
    kubectl: str, variant: str, cdi: tuple[str, ...], tmp_path: Path
) -> None:
    """Issue 40, item 6: a pipeline checks the config a pod runs on off the node (no NODE_NAME, no bitstream, no
    NIC) with ``check-config --offline``; on the node, ``test_devplug_accepts_the_config`` checks it whole."""
    objects = _render_target(kubectl, variant, cdi)
    path = tmp_path / "config.toml"
    path.write_text(dumps_toml(_assembled_config(objects)))
    done = subprocess.run(
        [sys.executable, "-m", "devplug", "check-config", "--offline", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert f"{path}: ok (offline" in done.stdout
