"""The image's smoke test (``tools/image/smoke.py``, run by ``make image`` as root) translates every DaemonSet that
``deploy/`` renders into podman options. ``make image`` cannot run in ``make test`` (root, a Debian mirror), so its
translation is checked here on every overlay and DRA variant: a manifest change the smoke test cannot run (a new
``env`` source, a new volume kind) fails here first instead of at the next image build.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

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
