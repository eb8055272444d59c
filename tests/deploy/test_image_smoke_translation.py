"""The image's smoke test (``tools/image/smoke.py``, run by ``make image`` as root) translates every DaemonSet that
``deploy/`` renders into podman options. ``make image`` cannot run in ``make test`` (root, a Debian mirror), so its
translation is checked here on every overlay and DRA variant: a manifest change the smoke test cannot run (a new
``env`` source, a new volume kind) fails here first instead of at the next image build.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from devplug.engine.cdi import build_spec
from devplug.types import ContainerAllocation, DeviceSpec, Mount

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
VARIANTS = [f"overlays/{p.name}" for p in sorted((DEPLOY / "overlays").iterdir())] + [
    f"dra/{p.name}" for p in sorted((DEPLOY / "dra").iterdir())
]


def _load_smoke() -> ModuleType:
    spec = importlib.util.spec_from_file_location("devplug_image_smoke", ROOT / "tools" / "image" / "smoke.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


smoke = _load_smoke()


def _render(kubectl: str, variant: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / variant)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_smoke_test_translates_every_shipped_daemonset(kubectl: str, variant: str, tmp_path: Path) -> None:
    objects = _render(kubectl, variant)
    spec = smoke.one(objects, "DaemonSet")["spec"]["template"]["spec"]
    node = tmp_path / "node"
    for volume in spec["volumes"]:  # the stand-in node has every host folder the DaemonSet mounts
        if "hostPath" in volume:
            (node / volume["hostPath"]["path"].lstrip("/")).mkdir(parents=True, exist_ok=True)
    run = smoke.pod_run(objects, node, tmp_path / "config", kernel_trees=True, pod_uid="uid-of-this-pod")
    env = dict(run.options[i + 1].split("=", 1) for i, o in enumerate(run.options) if o == "--env")
    [container] = spec["containers"]
    assert sorted(env) == sorted(e["name"] for e in container.get("env", []))
    assert env["DEVPLUG_INSTANCE"] == "uid-of-this-pod"  # the instance's name in a handover
    assert env["POD_IP"] == smoke.POD_IP == "127.0.0.1"  # the HTTP server's address: the container's loopback
    if variant.startswith("dra/"):
        assert env["POD_UID"] == "uid-of-this-pod" and env["NODE_NAME"] == smoke.NODE_NAME
    assert run.config_path.endswith("config.toml")


def _mock_answer(directory: str, device: str = "mock0") -> ContainerAllocation:
    """The mock driver's answer for ``device`` when it may not make device nodes, as under the overlay's
    securityContext (no CAP_MKNOD): its file read-only at /var/run/mock/<id>, /dev/null as /dev/mock/<id>
    (devplug_mock.driver.MockDriver.describe and allocate)."""
    return ContainerAllocation(
        envs={"MOCK_DEVICES": device},
        mounts=(Mount(container_path=f"/var/run/mock/{device}", host_path=f"{directory}/{device}", read_only=True),),
        devices=(DeviceSpec(container_path=f"/dev/mock/{device}", host_path="/dev/null", permissions="rw"),),
    )


def _mock_run(kubectl: str, variant: str, tmp_path: Path, drop: str | None = None) -> tuple[Any, str]:
    """The smoke test's translation of ``variant``'s DaemonSet (without volume ``drop``), and the mock's folder."""
    objects = _render(kubectl, variant)
    spec = smoke.one(objects, "DaemonSet")["spec"]["template"]["spec"]
    if drop is not None:
        spec["volumes"] = [v for v in spec["volumes"] if v["name"] != drop]
        (container,) = spec["containers"]
        container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != drop]
    for volume in spec["volumes"]:
        if "hostPath" in volume:
            (tmp_path / "node" / volume["hostPath"]["path"].lstrip("/")).mkdir(parents=True, exist_ok=True)
    run = smoke.pod_run(objects, tmp_path / "node", tmp_path / "config", kernel_trees=True)
    config = tomllib.loads(smoke.one(objects, "ConfigMap")["data"]["config.toml"])
    return run, config["resources"][smoke.MOCK_RESOURCE]["options"]["directory"]


@pytest.mark.parametrize("variant", ["overlays/mock", "dra/mock"])
def test_a_mock_device_becomes_a_container_of_the_node(kubectl: str, variant: str, tmp_path: Path) -> None:
    """Issue 40, item 3: the answer for a device of the mock overlay names paths of the node, which the workload's
    podman run takes from the stand-in node (/dev from this machine), and the mounted file is the daemon's own."""
    run, directory = _mock_run(kubectl, variant, tmp_path)
    node = tmp_path / "node"
    edits = smoke.answer_edits(_mock_answer(directory))
    assert edits == smoke.Edits(
        devices=(("/dev/null", "/dev/mock/mock0", "rw"),),
        mounts=((f"{directory}/mock0", "/var/run/mock/mock0", True),),
        envs=(("MOCK_DEVICES", "mock0"),),
    )
    assert smoke.workload_options(edits, node, run.host_paths) == [
        "--device",
        "/dev/null:/dev/mock/mock0:rw",
        "--volume",
        f"{node}{directory}/mock0:/var/run/mock/mock0:ro",
        "--env",
        "MOCK_DEVICES=mock0",
    ]
    # The runtime's file is the one the daemon writes: its folder is mounted at the node's path.
    assert smoke.daemon_file(f"{directory}/mock0", node, run.host_paths) == node / directory.lstrip("/") / "mock0"


def test_the_cdi_spec_of_a_mock_device_gives_the_same_container(kubectl: str, tmp_path: Path) -> None:
    """With components/cdi the runtime applies the device's edits in the spec devplug writes (devplug.engine.cdi)."""
    run, directory = _mock_run(kubectl, "overlays/mock", tmp_path)
    spec = build_spec(
        smoke.MOCK_RESOURCE, [("mock0", _mock_answer(directory)), ("mock1", _mock_answer(directory, "mock1"))]
    )
    assert spec is not None
    edits = smoke.cdi_edits(spec, [f"{smoke.MOCK_RESOURCE}=mock1"])
    assert edits == smoke.answer_edits(_mock_answer(directory, "mock1"))
    assert smoke.workload_options(edits, tmp_path / "node", run.host_paths)[:2] == [
        "--device",
        "/dev/null:/dev/mock/mock1:rw",
    ]
    with pytest.raises(smoke.SmokeFailure, match=re.escape("describes no example.com/mock=mock7")):
        smoke.cdi_edits(spec, [f"{smoke.MOCK_RESOURCE}=mock7"])


def test_the_smoke_test_refuses_a_path_of_the_daemons_own_pod(kubectl: str, tmp_path: Path) -> None:
    """The check can fail, on issue 40's case: without its hostPath the mock's folder is the pod's emptyDir
    /var/run/devplug, and the answer names a file no runtime on the node finds."""
    run, directory = _mock_run(kubectl, "overlays/mock", tmp_path, drop="mock-devices")
    edits = smoke.answer_edits(_mock_answer(directory))
    with pytest.raises(smoke.SmokeFailure, match=re.escape(f"names {directory}/mock0, on no hostPath volume")):
        smoke.workload_options(edits, tmp_path / "node", run.host_paths)
    assert smoke.daemon_file(f"{directory}/mock0", tmp_path / "node", run.host_paths) is None


def test_a_folder_mounted_elsewhere_than_the_nodes_path_is_another_file(tmp_path: Path) -> None:
    """A hostPath mounted at another path in the pod: the runtime looks at the node's path the daemon named, which
    is not where the daemon's file is (the workload check compares the two by inode)."""
    host_paths = {"/var/lib/mock-on-node": "/var/run/devplug/mock"}
    with pytest.raises(smoke.SmokeFailure, match="on no hostPath volume"):
        smoke.node_source("/var/run/devplug/mock/mock0", tmp_path, host_paths)
    assert (
        smoke.daemon_file("/var/run/devplug/mock/mock0", tmp_path, host_paths)
        == tmp_path / "var/lib/mock-on-node/mock0"
    )
    assert smoke.node_source("/dev/null", tmp_path, host_paths) == "/dev/null"  # the node's /dev is the machine's
