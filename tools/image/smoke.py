"""The image's smoke test (run by ``make image``): the image as a node runs it, with podman.

    python tools/image/smoke.py ARCHIVE REFERENCE        (e.g. build/image/devplug-0.1.0.oci.tar devplug:0.1.0)

1. ``podman load`` takes the OCI archive; the DaemonSet's image (``kubectl kustomize deploy/overlays/mock``) must
   be ``REFERENCE`` and resolve to the loaded image by that very name.
2. ``devplug --version`` and ``devplug drivers --json`` in it: this version, every driver of ``drivers/``, none
   broken; its OCI labels (``org.opencontainers.image.*``), and the SBOM at ``/opt/devplug/sbom.cdx.json``: the
   build's, listing every distribution the image's Python has.
3. ``devplug check-config`` in it on the config of every overlay of ``deploy/overlays``, alone and with the CDI
   component, as the DaemonSet runs it: the ConfigMap's files where the pod mounts them, the container's own
   command (the CDI component assembles the config in it), the host folders the config names (the FPGA
   bitstreams) from a stand-in node folder. Every config must pass, but for the sriov overlay's on a machine
   without its PF ens1f0, which must fail for exactly that reason and no other.
4. The daemon of the mock overlay, with the CDI component, and again with the microk8s kubelet-root component,
   run from the image as the DaemonSet runs it (its command, mounts, security context and limits translated to
   podman's options; the hostPath volumes from a stand-in node folder) against a dev kubelet on this machine
   serving that folder's kubelet sockets: it must register, advertise its four devices healthy, answer an
   Allocate (the CDI device named, its spec file in the node's CDI folder), answer its probes (``/healthz``,
   ``/readyz``; ``/metrics``) and, on SIGTERM, exit 0 having removed its socket.
5. A pod's container with the allocated device, run for real: the Allocate answer (or, with the CDI component, the
   device's edits in the node's CDI spec) turned into ``podman run`` options as the node's container runtime would
   carry it out, each host path it names read on the stand-in node (``/dev`` is this machine's): a path on no
   hostPath volume of the DaemonSet is a file of the daemon's own pod, which no runtime finds, and fails the test.
   In the container (the image, as an unprivileged user with no capabilities): each device node is a character or
   block device with the host node's numbers, opened for reading and writing; each mount is the very file the
   daemon reads as the device (same inode), read-only where the answer says so; the envs are the answer's.

Every container gets ``--ulimit nofile=1024:1024 --ulimit nproc=1000:1000`` (podman from Debian's packages cannot
start containers here without) and runs with runc (tools/image/setup.sh says why). podman keeps its images and
containers in a folder of this run, removed at the end, so nothing is left in the machine's own podman storage.
Needs root, podman and kubectl; run with a Python that has devplug installed (its dev kubelet).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
ULIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000")
#: Host trees a check-config run does not get: the drivers then read the container's own /sys and /dev.
KERNEL_TREES = ("/sys", "/dev", "/proc", "/host/dev")
#: The one config that checks this machine's hardware, and the one error it must give where that is missing.
SRIOV_ON_ANOTHER_MACHINE = "pfs: 'ens1f0' names no SR-IOV physical function on this node"
MOCK_RESOURCE = "example.com/mock"
MOCK_DEVICES = 4
NODE_NAME = "smoke-node"
#: The pod's UID the downward API gives (``DEVPLUG_INSTANCE``, ``POD_UID``): the instance's name in a handover.
POD_UID = "5a0e0000-0000-4000-8000-000000000001"
#: The pod's IP the downward API gives (``POD_IP``, the HTTP server's address): the only address a container of
#: ``--network none`` has, and one of the host's under ``--network host``.
POD_IP = "127.0.0.1"
#: The UID of the rolling update's new pod.
NEXT_POD_UID = "5a0e0000-0000-4000-8000-000000000002"
#: The host's cgroup tree (container liveness): on the stand-in node, a cgroup v2 root with the kubelet's
#: ``kubepods`` cgroup and no pod in it, so a daemon whose config requires liveness finds it and is ready.
CGROUP_TREE = "/sys/fs/cgroup"


def stand_in_cgroups(source: Path) -> None:
    """The stand-in node's cgroup tree: what devplug looks for (``cgroup.controllers``, ``kubepods/``). Where a daemon
    runs, :func:`kernel_cgroups` puts a real cgroup there first (devplug reads only the kernel's cgroups)."""
    (source / "kubepods").mkdir(parents=True, exist_ok=True)
    if not (source / "cgroup.controllers").exists():
        (source / "cgroup.controllers").touch()


@contextmanager
def kernel_cgroups(tree: Path) -> Iterator[None]:
    """At ``tree`` (the stand-in node's cgroup tree), a cgroup of this machine's cgroup2 hierarchy made for this run,
    with an empty ``kubepods`` in it, bind-mounted; removed at the end. devplug reads only the kernel's cgroups: a
    folder imitating one is refused (container liveness unknown, so /readyz answers 503 under ``[liveness]
    required``, as the DaemonSet's config sets)."""
    fields = [line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    roots = [Path(f[4]) for f in fields if "-" in f and f[f.index("-") + 1] == "cgroup2"]
    if not roots:
        raise SmokeFailure("no cgroup2 hierarchy is mounted here: the node's cgroup tree cannot be stood in for")
    own = roots[0] / f"devplug-smoke-{os.getpid()}-{time.monotonic_ns()}"
    (own / "kubepods").mkdir(parents=True)
    tree.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(own), str(tree)], check=True, capture_output=True, timeout=30)
    try:
        yield
    finally:
        subprocess.run(["umount", str(tree)], check=False, capture_output=True, timeout=30)
        for folder in (own / "kubepods", own):
            with contextlib.suppress(OSError):
                folder.rmdir()


class SmokeFailure(Exception):
    """What the image got wrong, with the evidence."""


def say(message: str) -> None:
    print(f"smoke: {message}", flush=True)


# --- podman --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Podman:
    """podman on a storage of its own (a folder of this run)."""

    root: Path

    def command(self, *argv: str) -> list[str]:
        storage = ["--root", str(self.root / "storage"), "--runroot", str(self.root / "run")]
        # runc: crun, podman's default runtime, refuses a hybrid cgroup hierarchy (cgroup v1 with a v2 mount).
        engine = ["--runtime", "runc", "--cgroup-manager", "cgroupfs", "--events-backend", "file"]
        return ["podman", *storage, *engine, *argv]

    def run(self, *argv: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(self.command(*argv), capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise SmokeFailure(f"podman {' '.join(argv)}: exit {done.returncode}\n{done.stdout}{done.stderr}")
        return done


# --- deploy/ as kubectl renders it ---------------------------------------------------------------------------------


def render(variant: str, components: Sequence[str], scratch: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of a variant of ``deploy/`` (``overlays/<driver>``, ``dra/<driver>``) with components
    (through a kustomization of this run's own)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise SmokeFailure("kubectl is not on PATH: it renders deploy/ as an operator's kubectl apply -k would")
    folder = Path(tempfile.mkdtemp(prefix="kustomization-", dir=scratch))
    relative = os.path.relpath(DEPLOY, folder)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [f"{relative}/{variant}"],
        "components": [f"{relative}/components/{c}" for c in components],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    done = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise SmokeFailure(f"kubectl kustomize {variant} with {list(components)}: {done.stderr}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def one(objects: Sequence[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    if len(found) != 1:
        raise SmokeFailure(f"expected one {kind} in the rendered manifests, got {len(found)}")
    return found[0]


@dataclass(frozen=True)
class PodRun:
    """The DaemonSet's one container as podman options, for a given stand-in node folder."""

    options: list[str]
    entrypoint: list[str] | None
    args: list[str]
    host_paths: dict[str, str]  # volume hostPath -> mountPath
    config_path: str


def pod_run(
    objects: Sequence[dict[str, Any]], node: Path, config_dir: Path, *, kernel_trees: bool, pod_uid: str = POD_UID
) -> PodRun:
    """Translate the rendered DaemonSet's container: mounts, security context, limits, env (the downward API's
    node name, ``pod_uid`` and the pod's IP), command."""
    daemonset = one(objects, "DaemonSet")
    spec = daemonset["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    configmap = one(objects, "ConfigMap")
    config_dir.mkdir(parents=True, exist_ok=True)
    for name, text in configmap["data"].items():
        (config_dir / name).write_text(text)
    volumes = {v["name"]: v for v in spec["volumes"]}
    options: list[str] = []
    host_paths: dict[str, str] = {}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        target, read_only = mount["mountPath"], bool(mount.get("readOnly"))
        if "hostPath" in volume:
            path = volume["hostPath"]["path"]
            if not kernel_trees and path.startswith(KERNEL_TREES):
                continue
            source = node / path.lstrip("/")
            if volume["hostPath"].get("type") == "DirectoryOrCreate":
                source.mkdir(parents=True, exist_ok=True)
            if path == CGROUP_TREE:
                stand_in_cgroups(source)
            if not source.is_dir():
                raise SmokeFailure(f"hostPath {path} (type Directory) is not on the stand-in node at {source}")
            host_paths[path] = target
            options += ["--volume", f"{source}:{target}:{'ro' if read_only else 'rw'}"]
        elif "configMap" in volume:
            if volume["configMap"]["name"] != configmap["metadata"]["name"]:
                raise SmokeFailure(f"volume {mount['name']} names another ConfigMap than the rendered one")
            options += ["--volume", f"{config_dir}:{target}:ro"]
        elif "emptyDir" in volume:
            options += ["--mount", f"type=tmpfs,destination={target}"]
        else:
            raise SmokeFailure(f"volume {mount['name']}: a kind the smoke test does not translate: {volume}")
    security = container.get("securityContext", {})
    if security.get("readOnlyRootFilesystem"):
        options += ["--read-only", "--read-only-tmpfs=false"]
    if "runAsUser" in security:
        options += ["--user", str(security["runAsUser"])]
    if security.get("privileged"):
        options += ["--privileged"]
    if "ALL" in security.get("capabilities", {}).get("drop", []):
        options += ["--cap-drop", "all"]
    if security.get("allowPrivilegeEscalation") is False:
        options += ["--security-opt", "no-new-privileges"]
    seccomp = spec.get("securityContext", {}).get("seccompProfile", {}).get("type")
    if seccomp not in (None, "RuntimeDefault"):
        raise SmokeFailure(f"seccompProfile {seccomp}: podman's default filter stands for RuntimeDefault only")
    options += ["--network", "host" if spec.get("hostNetwork") else "none"]
    limits = container.get("resources", {}).get("limits", {})
    if "memory" in limits:
        options += ["--memory", limits["memory"].replace("Mi", "m").replace("Gi", "g")]
    if "cpu" in limits:
        cpu = limits["cpu"]
        options += ["--cpus", str(int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu))]
    for env in container.get("env", []):
        value = env.get("value")
        field = env.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if value is None and field == "spec.nodeName":
            value = NODE_NAME
        if value is None and field == "metadata.uid":
            value = pod_uid
        if value is None and field == "status.podIP":  # the container's address: loopback (--network none or host)
            value = POD_IP
        if value is None:
            raise SmokeFailure(f"env {env['name']}: a source the smoke test does not translate")
        options += ["--env", f"{env['name']}={value}"]
    args = list(container.get("args", []))
    if "--config" not in args:
        raise SmokeFailure(f"the container's args name no --config: {args}")
    return PodRun(options, container.get("command"), args, host_paths, args[args.index("--config") + 1])


def podman_run_argv(run: PodRun, reference: str, args: Sequence[str]) -> list[str]:
    entry = ["--entrypoint", json.dumps(run.entrypoint)] if run.entrypoint else []
    return [*ULIMITS, *run.options, *entry, reference, *args]


# --- the checks ----------------------------------------------------------------------------------------------------


def check_load(podman: Podman, archive: Path, reference: str, scratch: Path) -> None:
    loaded = podman.run("load", "--input", str(archive)).stdout
    say(loaded.strip())
    image = one(render("overlays/mock", [], scratch), "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["image"]
    if image != reference:
        raise SmokeFailure(f"the DaemonSet runs {image!r}, but the image built is {reference!r}")
    found = podman.run("image", "inspect", "--format", "{{.RepoTags}}", image).stdout.strip()
    say(f"the DaemonSet's image {image} is the loaded image {found}")


def check_version_and_drivers(podman: Podman, reference: str, version: str) -> None:
    got = podman.run("run", "--rm", *ULIMITS, "--network", "none", reference, "--version").stdout.strip()
    if not got.startswith(f"devplug {version} (hook contract "):
        raise SmokeFailure(f"devplug --version printed {got!r}, expected 'devplug {version} (hook contract ...)'")
    say(got)
    rows = json.loads(podman.run("run", "--rm", *ULIMITS, "--network", "none", reference, "drivers", "--json").stdout)
    shipped = sorted(p.parent.name for p in (ROOT / "drivers").glob("*/pyproject.toml"))
    found = {row["name"]: row for row in rows}
    if sorted(found) != shipped:
        raise SmokeFailure(f"the image's drivers are {sorted(found)}, drivers/ has {shipped}")
    for name, row in found.items():
        if "error" in row or row["version"] != version:
            raise SmokeFailure(f"driver {name} in the image: {row}")
    listed = ", ".join(f"{n} {r['version']}" for n, r in sorted(found.items()))
    say(f"drivers: {listed}")


#: The OCI labels every image carries (tools/image/metadata.py; ``source`` only where the build knew it).
REQUIRED_LABELS = ("title", "description", "version", "licenses", "revision", "created")
#: Where the image keeps the SBOM of its Python environment.
SBOM_IN_IMAGE = "/opt/devplug/sbom.cdx.json"


def check_labels_and_sbom(podman: Podman, reference: str, version: str, sbom: Path | None) -> None:
    """The image's OCI labels (``podman image inspect``: its config's), and the SBOM in it: the build's copy, listing
    every distribution of /opt/devplug at the version the image's own Python reports."""
    found = json.loads(podman.run("image", "inspect", "--format", "{{json .Labels}}", reference).stdout) or {}
    prefix = "org.opencontainers.image."
    missing = [key for key in REQUIRED_LABELS if not found.get(prefix + key)]
    if missing or found.get(prefix + "version") != version:
        raise SmokeFailure(f"the image's OCI labels lack {missing} or say another version: {found}")
    say("OCI labels: " + ", ".join(f"{k.removeprefix(prefix)}={v}" for k, v in sorted(found.items())))
    if sbom is None:
        return
    inside = podman.run("run", "--rm", *ULIMITS, "--network", "none", "--entrypoint", "cat", reference, SBOM_IN_IMAGE)
    document = json.loads(inside.stdout)
    if document != json.loads(sbom.read_text()):
        raise SmokeFailure(f"{SBOM_IN_IMAGE} in the image is not the build's {sbom}")
    listing = (
        "import json, importlib.metadata as m; "
        "print(json.dumps({d.metadata['Name'].lower().replace('_', '-'): d.version for d in m.distributions()}))"
    )
    run = ["run", "--rm", *ULIMITS, "--network", "none", "--entrypoint", "/opt/devplug/bin/python", reference]
    installed = json.loads(podman.run(*run, "-c", listing).stdout)
    components = [*document.get("components", []), document.get("metadata", {}).get("component", {})]
    listed = {c["name"].lower().replace("_", "-"): c.get("version") for c in components if c.get("name")}
    wrong = sorted(f"{name} {v}" for name, v in installed.items() if listed.get(name) != v)
    if wrong:
        raise SmokeFailure(f"the SBOM does not list {', '.join(wrong)}, which the image holds")
    say(f"SBOM: CycloneDX {document.get('specVersion')}, all {len(installed)} distributions of the image listed")


def check_configs(podman: Podman, reference: str, scratch: Path) -> int:
    """``devplug check-config`` in the image on the config of every variant of ``deploy/`` (each overlay and each
    DRA variant, alone and with the CDI component), through the DaemonSet's own mounts and environment."""
    variants = [
        f"{kind}/{p.name}"
        for kind in ("overlays", "dra")
        for p in sorted((DEPLOY / kind).iterdir())
        if (p / "kustomization.yaml").is_file()
    ]
    checked = 0
    for variant in variants:
        overlay = variant.rpartition("/")[2]
        for components in ([], ["cdi"]):
            label = variant.removeprefix("overlays/") + "".join(f" + {c}" for c in components)
            case = Path(tempfile.mkdtemp(prefix=f"check-{overlay}-", dir=scratch))
            node = case / "node"
            objects = render(variant, components, scratch)
            for volume in one(objects, "DaemonSet")["spec"]["template"]["spec"]["volumes"]:
                host = volume.get("hostPath")
                if host and host.get("type") == "Directory" and not host["path"].startswith(KERNEL_TREES):
                    (node / host["path"].lstrip("/")).mkdir(parents=True, exist_ok=True)
            # The node's files the configs name: the FPGA overlay's blank bitstream.
            if overlay == "fpga":
                (node / "opt/devplug/fpga/blank.gbs").write_bytes(b"\0")
            run = pod_run(objects, node, case / "config", kernel_trees=False)
            argv = podman_run_argv(run, reference, ["check-config", run.config_path])
            done = podman.run("run", "--rm", *argv, check=False, timeout=120)
            output = (done.stdout + done.stderr).strip()
            if overlay == "sriov" and done.returncode == 2 and SRIOV_ON_ANOTHER_MACHINE in done.stderr:
                say(f"check-config {label}: refused as expected on a machine without its PF: {done.stderr.strip()}")
            elif done.returncode == 0 and f"{run.config_path}: ok" in done.stdout:
                say(f"check-config {label}: ok")
            else:
                raise SmokeFailure(f"devplug check-config in the image, {label}: exit {done.returncode}\n{output}")
            checked += 1
    return checked


def _probe(podman: Podman, container: str, port: int, path: str) -> tuple[int, str]:
    """An HTTP GET from inside the pod's network namespace, as the kubelet's probe would (on the pod's address)."""
    source = (
        "import sys, urllib.request, urllib.error\n"
        "try:\n"
        f"    r = urllib.request.urlopen('http://127.0.0.1:{port}{path}', timeout=5)\n"
        "    print(r.status); print(r.read().decode())\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code); print(e.read().decode())\n"
    )
    out = podman.run("exec", container, "/opt/devplug/bin/python", "-c", source, timeout=60).stdout
    status, _, body = out.partition("\n")
    return int(status), body


def _poll(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise SmokeFailure(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.2)


@contextmanager
def dev_kubelet(device_plugin_dir: Path, pod_resources_socket: Path) -> Iterator[Any]:
    from devplug.devkubelet import DevKubeletThread

    device_plugin_dir.mkdir(parents=True, exist_ok=True)
    pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
    kubelet = DevKubeletThread(device_plugin_dir, pod_resources_socket=pod_resources_socket)
    try:
        kubelet.start()
        yield kubelet
    finally:
        kubelet.close()


@contextlib.contextmanager
def _short_link(target: Path) -> Iterator[Path]:
    """A symbolic link to ``target`` (made) at the shortest free ``/tmp/dp<N>``, removed afterwards."""
    target.mkdir(parents=True, exist_ok=True)
    for n in range(10_000):
        link = Path(f"/tmp/dp{n}")
        try:
            link.symlink_to(target)
        except FileExistsError:
            continue
        try:
            yield link
        finally:
            link.unlink()
        return
    raise SmokeFailure("no free /tmp/dp<N> name for the stand-in node's short link")


def check_daemon(podman: Podman, reference: str, scratch: Path, components: Sequence[str], index: int) -> None:
    from devplug.devkubelet import ContainerSpec, PodSpec

    label = "mock" + "".join(f" + {c}" for c in components)
    # Short names: the kubelet dials the plugin's socket by its host path, which a unix address limits to 107 bytes.
    case = scratch / f"d{index}"
    node = case / "n"
    objects = render("overlays/mock", components, scratch)
    volumes = {v["name"]: v for v in one(objects, "DaemonSet")["spec"]["template"]["spec"]["volumes"]}
    plugin_dir = node / volumes["device-plugins"]["hostPath"]["path"].lstrip("/")
    pod_resources = node / volumes["pod-resources"]["hostPath"]["path"].lstrip("/") / "kubelet.sock"
    started = time.monotonic()
    # The dev kubelet reaches the node's folders through a short link, so the socket paths it dials are as short as a
    # kubelet's at / (the kubelet-root components' longest is 97 bytes, within a unix address's 107).
    with (
        kernel_cgroups(node / CGROUP_TREE.lstrip("/")),
        _short_link(node) as short,
        dev_kubelet(short / plugin_dir.relative_to(node), short / pod_resources.relative_to(node)) as kubelet,
    ):
        run = pod_run(objects, node, case / "config", kernel_trees=True)
        name = f"devplug-smoke-{os.getpid()}-{index}"
        containers = [name]
        podman.run("run", "--detach", "--name", name, *podman_run_argv(run, reference, run.args))
        try:
            kubelet.wait_registered(MOCK_RESOURCE, timeout=60)

            def advertised() -> bool:
                view = kubelet.resource(MOCK_RESOURCE)
                return view is not None and sum(d.healthy for d in view.devices) == MOCK_DEVICES

            _poll(f"{MOCK_DEVICES} healthy {MOCK_RESOURCE} devices", advertised, 60)
            view = kubelet.resource(MOCK_RESOURCE)
            assert view is not None
            say(
                f"{label}: registered (endpoint {view.endpoint}) and advertised {len(view.devices)} healthy devices "
                f"in {time.monotonic() - started:.1f} s, through {plugin_dir.relative_to(node)}"
            )
            pod = kubelet.admit_pod(PodSpec("smoke", [ContainerSpec("app", requests={MOCK_RESOURCE: 1})]))
            allocation = pod.containers[0].allocations[MOCK_RESOURCE]
            device = pod.containers[0].devices[MOCK_RESOURCE][0]
            if not allocation.devices:
                raise SmokeFailure(f"{label}: the Allocate answer for {device} has no device node: {allocation}")
            if "cdi" in components:
                wanted = f"{MOCK_RESOURCE}={device}"
                if [c.name for c in allocation.cdi_devices] != [wanted]:
                    raise SmokeFailure(f"{label}: Allocate named CDI devices {allocation.cdi_devices}, not {wanted}")
                spec = node / "var/run/cdi/devplug-example.com_mock.json"
                names = [d["name"] for d in json.loads(spec.read_text())["devices"]] if spec.is_file() else []
                if device not in names:
                    raise SmokeFailure(f"{label}: the node's CDI spec {spec} does not describe {device}: {names}")
                say(f"{label}: Allocate of {device} named {wanted}; {spec.relative_to(node)} describes it")
                edits = cdi_edits(json.loads(spec.read_text()), [c.name for c in allocation.cdi_devices])
            else:
                say(f"{label}: Allocate of {device} answered {allocation.devices[0].host_path}")
                edits = answer_edits(allocation)
            check_workload(podman, reference, edits, node, run.host_paths, f"{name}-pod", label)
            (container,) = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
            port = int(container["ports"][0]["containerPort"])
            for path, body in (("/healthz", "ok"), ("/readyz", "ready")):
                status, text = _poll(f"{path} to answer 200", lambda p=path: _ok(_probe(podman, name, port, p)), 30)
                if body not in text:
                    raise SmokeFailure(f"{label}: {path} answered {status} {text!r}")
            status, metrics = _probe(podman, name, port, "/metrics")
            registered = f'devplug_resource_registered{{resource="{MOCK_RESOURCE}"}} 1.0'
            if status != 200 or registered not in metrics:
                raise SmokeFailure(f"{label}: /metrics answered {status} without {registered}")
            say(f"{label}: /healthz, /readyz and /metrics answer on port {port}")
            if index == 0:  # a rolling update: the DaemonSet's new pod beside the old one, on the same node
                containers.append(f"{name}-next")
                check_rolling_update(podman, reference, objects, node, case, kubelet, containers, label)
                name = containers[-1]
            sockets = sorted(p.name for p in plugin_dir.iterdir() if p.is_socket() and p.name != "kubelet.sock")
            podman.run("stop", "--time", "30", name, timeout=60)
            exit_code = int(podman.run("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip())
            left = sorted(p.name for p in plugin_dir.iterdir() if p.is_socket() and p.name != "kubelet.sock")
            if exit_code != 0 or left:
                raise SmokeFailure(f"{label}: on SIGTERM the daemon exited {exit_code}, sockets left: {left}")
            say(f"{label}: SIGTERM: exit 0, its socket {', '.join(sockets)} removed")
        except BaseException:
            for each in containers:
                logs = podman.run("logs", each, check=False)
                print(f"--- the daemon's log ({label}, {each}) ---\n{logs.stdout}{logs.stderr}", file=sys.stderr)
            raise
        finally:
            for each in containers:
                podman.run("rm", "--force", each, check=False, timeout=60)


#: The host tree an Allocate answer may name on any node: the stand-in node's is this machine's own.
NODE_DEVICE_TREE = "/dev"


@dataclass(frozen=True)
class Edits:
    """What a container gets for its devices, as the node's container runtime applies it (the Allocate answer's
    device specs, mounts and envs, or a CDI device's ``containerEdits``); paths on the host as the answer names them."""

    devices: tuple[tuple[str, str, str], ...] = ()  # (host path, container path, permissions)
    mounts: tuple[tuple[str, str, bool], ...] = ()  # (host path, container path, read-only)
    envs: tuple[tuple[str, str], ...] = ()


def answer_edits(allocation: Any) -> Edits:
    """The edits of a kubelet's Allocate answer for a container (a ``devplug.types.ContainerAllocation``)."""
    return Edits(
        devices=tuple((d.host_path, d.container_path, d.permissions) for d in allocation.devices),
        mounts=tuple((m.host_path, m.container_path, bool(m.read_only)) for m in allocation.mounts),
        envs=tuple(sorted(allocation.envs.items())),
    )


def cdi_edits(spec: dict[str, Any], names: Sequence[str]) -> Edits:
    """The edits a CDI runtime applies for the fully qualified device ``names`` (``vendor/class=device``) of one
    spec: the spec's own ``containerEdits``, then each named device's (CDI's ``specs-go``: a device node's
    ``hostPath`` defaults to its ``path``; a mount is read-only when its options hold ``ro``)."""
    kind = spec["kind"]
    devices = {f"{kind}={d['name']}": d for d in spec.get("devices", [])}
    missing = [n for n in names if n not in devices]
    if missing:
        raise SmokeFailure(f"the CDI spec of {kind} describes no {', '.join(missing)}: {sorted(devices)}")
    edits = [spec.get("containerEdits", {})] + [devices[n].get("containerEdits", {}) for n in names]
    return Edits(
        devices=tuple(
            (node.get("hostPath", node["path"]), node["path"], node.get("permissions", "rwm"))
            for e in edits
            for node in e.get("deviceNodes", [])
        ),
        mounts=tuple(
            (m["hostPath"], m["containerPath"], "ro" in m.get("options", []))
            for e in edits
            for m in e.get("mounts", [])
        ),
        envs=tuple((key, value) for e in edits for key, _, value in (v.partition("=") for v in e.get("env", []))),
    )


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def node_source(path: str, node: Path, host_paths: dict[str, str]) -> str:
    """Where the node's container runtime finds ``path``, a host path an answer names, on the stand-in node: in
    ``/dev``, this machine's own; on a hostPath volume of the DaemonSet, under ``node``. Anything else is no file of
    the node (the daemon named a path of its own pod: an emptyDir, its image), which fails the test."""
    if _under(path, NODE_DEVICE_TREE):
        return path
    if any(_under(path, host) for host in host_paths):
        return str(node / path.lstrip("/"))
    raise SmokeFailure(
        f"the answer names {path}, on no hostPath volume of the DaemonSet ({', '.join(sorted(host_paths))}): a "
        "path in the daemon's pod only, which the node's container runtime cannot mount"
    )


def daemon_file(path: str, node: Path, host_paths: dict[str, str]) -> Path | None:
    """The file the daemon means by ``path`` (its own view), on the stand-in node: through the hostPath volume
    mounted deepest above it; None when no hostPath volume holds it."""
    mounted = [(target, host) for host, target in host_paths.items() if _under(path, target)]
    if not mounted:
        return None
    target, host = max(mounted, key=lambda m: len(m[0]))
    return node / host.lstrip("/") / os.path.relpath(path, target)


def workload_options(edits: Edits, node: Path, host_paths: dict[str, str]) -> list[str]:
    """``edits`` as podman options on the stand-in node (see :func:`node_source`)."""
    options: list[str] = []
    for host, target, permissions in edits.devices:
        options += ["--device", f"{node_source(host, node, host_paths)}:{target}:{permissions}"]
    for host, target, read_only in edits.mounts:
        options += ["--volume", f"{node_source(host, node, host_paths)}:{target}:{'ro' if read_only else 'rw'}"]
    for key, value in edits.envs:
        options += ["--env", f"{key}={value}"]
    return options


#: Run in the workload's container by the image's Python: what the container sees of its devices, as JSON.
WORKLOAD_PROBE = """
import json, os, stat, sys
wanted = json.loads(sys.argv[1])
seen = {"devices": {}, "mounts": {}, "envs": {k: os.environ.get(k) for k in wanted["envs"]}}
for path in wanted["devices"]:
    st = os.stat(path)
    entry = {"char": stat.S_ISCHR(st.st_mode), "block": stat.S_ISBLK(st.st_mode),
             "rdev": [os.major(st.st_rdev), os.minor(st.st_rdev)]}
    try:
        with open(path, "r+b", buffering=0) as f:
            f.write(b"devplug smoke")
        entry["opened"] = "rw"
    except OSError as e:
        entry["opened"] = str(e)
    seen["devices"][path] = entry
for path in wanted["mounts"]:
    st = os.stat(path)
    with open(path, "rb") as f:
        f.read()
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
        writable = "yes"
    except OSError as e:
        writable = os.strerror(e.errno)
    seen["mounts"][path] = {"ino": [st.st_dev, st.st_ino], "writable": writable}
print(json.dumps(seen))
"""

#: The workload's user: a pod's unprivileged container, no capabilities.
WORKLOAD_USER = "65534:65534"


def check_workload(
    podman: Podman, reference: str, edits: Edits, node: Path, host_paths: dict[str, str], name: str, label: str
) -> None:
    """A container with ``edits`` run for real from the image (no pull): its device nodes are the host's, usable,
    its mounts the daemon's device files, its envs the answer's."""
    if not edits.devices or not edits.mounts:
        raise SmokeFailure(f"{label}: the container would get no device node or no mount: {edits}")
    wanted = {
        "devices": [target for _, target, _ in edits.devices],
        "mounts": [target for _, target, _ in edits.mounts],
        "envs": [key for key, _ in edits.envs],
    }
    options = workload_options(edits, node, host_paths)
    argv = ["run", "--rm", "--name", name, *ULIMITS, "--network", "none", "--cap-drop", "all"]
    argv += ["--user", WORKLOAD_USER, *options, "--entrypoint", "/opt/devplug/bin/python", reference]
    done = podman.run(*argv, "-c", WORKLOAD_PROBE, json.dumps(wanted), timeout=120)
    seen = json.loads(done.stdout)
    problems = []
    for host, target, _ in edits.devices:
        source = os.stat(node_source(host, node, host_paths)).st_rdev
        got = seen["devices"][target]
        if not (got["char"] or got["block"]) or got["rdev"] != [os.major(source), os.minor(source)]:
            problems.append(f"{target} is not the node's {host} ({os.major(source)}:{os.minor(source)}): {got}")
        elif got["opened"] != "rw":
            problems.append(f"{target} cannot be opened for reading and writing: {got['opened']}")
    for host, target, read_only in edits.mounts:
        meant = daemon_file(host, node, host_paths)
        got = seen["mounts"][target]
        if meant is None or not meant.exists():
            problems.append(f"{target}: the daemon's {host} is no file of the node")
        elif got["ino"] != [os.stat(meant).st_dev, os.stat(meant).st_ino]:
            problems.append(f"{target} is not the daemon's device file {host}")
        if read_only and got["writable"] == "yes":
            problems.append(f"{target} is writable, though the answer mounts it read-only")
    if dict(edits.envs) != seen["envs"]:
        problems.append(f"envs {seen['envs']}, the answer's are {dict(edits.envs)}")
    if problems:
        raise SmokeFailure(f"{label}: in the pod's container: " + "; ".join(problems))
    nodes = ", ".join(f"{t} <- {h}" for h, t, _ in edits.devices)
    files = ", ".join(f"{t} <- {h}" for h, t, _ in edits.mounts)
    say(f"{label}: a container ran with the device: {nodes} (opened rw); {files} (the daemon's file, read-only)")


def check_rolling_update(
    podman: Podman,
    reference: str,
    objects: Sequence[dict[str, Any]],
    node: Path,
    case: Path,
    kubelet: Any,
    containers: list[str],
    label: str,
) -> None:
    """The DaemonSet's rolling update (``maxSurge: 1``): a second pod of the image (another UID) on the node while
    the first runs; the first hands the node over and exits 0, and the second serves the resource on its own socket
    with the first pod's allocation in its ledger."""
    old, new = containers[-2], containers[-1]
    before = kubelet.resource(MOCK_RESOURCE)
    assert before is not None
    run = pod_run(objects, node, case / "config-next", kernel_trees=True, pod_uid=NEXT_POD_UID)
    started = time.monotonic()
    podman.run("run", "--detach", "--name", new, *podman_run_argv(run, reference, run.args))
    code = podman.run("wait", old, timeout=120).stdout.strip()
    if code != "0":
        raise SmokeFailure(f"{label}: the old pod's daemon exited {code} instead of handing the node over")

    def serving() -> bool:
        view = kubelet.resource(MOCK_RESOURCE)
        return (
            view is not None
            and view.endpoint != before.endpoint
            and view.registered
            and sum(d.healthy for d in view.devices) == MOCK_DEVICES
        )

    _poll("the new pod's daemon serving the node", serving, 60)
    view = kubelet.resource(MOCK_RESOURCE)
    assert view is not None
    say(
        f"{label}: rolling update: the old pod exited 0 and the new one serves on {view.endpoint} "
        f"({time.monotonic() - started:.1f} s from its start)"
    )
    volumes = {v["name"]: v for v in one(objects, "DaemonSet")["spec"]["template"]["spec"]["volumes"]}
    state_dir = node / volumes["state"]["hostPath"]["path"].lstrip("/")

    def recorded() -> dict[str, Any] | None:
        status = json.loads((state_dir / "status.json").read_text())
        found: dict[str, Any] = status.get("handover", {}).get("took_over", {})
        return found if found.get("state") == "done" else None

    took_over = _poll("the handover recorded in the new daemon's status", recorded, 30)
    held = took_over.get("resources", {}).get(MOCK_RESOURCE, {}).get("held_allocations")
    if took_over.get("from") != POD_UID or took_over.get("to") != NEXT_POD_UID or held != 1:
        raise SmokeFailure(f"{label}: the new daemon's status does not show the handover of 1 allocation: {took_over}")
    say(f"{label}: the new daemon's status: took the node over from {POD_UID}, 1 allocation handed over")


def _ok(probe: tuple[int, str]) -> tuple[int, str] | None:
    return probe if probe[0] == 200 else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The image's smoke test (make image).")
    parser.add_argument("archive", type=Path, help="the OCI archive make image built")
    parser.add_argument("reference", help="the name it carries, devplug:VERSION")
    parser.add_argument("--sbom", type=Path, help="the SBOM the build wrote, which the image must hold")
    args = parser.parse_args(argv)
    version = args.reference.rpartition(":")[2]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dp", dir="/tmp") as folder:
        scratch = Path(folder)
        podman = Podman(scratch / "podman")
        try:
            check_load(podman, args.archive, args.reference, scratch)
            check_version_and_drivers(podman, args.reference, version)
            check_labels_and_sbom(podman, args.reference, version, args.sbom)
            checked = check_configs(podman, args.reference, scratch)
            for index, components in enumerate((["cdi"], ["kubelet-root/microk8s"])):
                check_daemon(podman, args.reference, scratch, components, index)
        except (SmokeFailure, TimeoutError) as exc:
            print(f"smoke: FAILED: {exc}", file=sys.stderr)
            return 1
        finally:
            podman.run("rmi", "--all", "--force", check=False, timeout=120)
    say(f"ok: {checked} configs checked, 2 daemon runs and a rolling update, in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
