"""The Dockerfile (linted by hadolint in ``make lint``): its last stage carries the installed environment alone,
and it runs ``devplug run`` on the config the DaemonSet mounts, as the image of ``make image`` does."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import yaml  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parents[2]


def _stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's stages, each a list of (instruction, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    stages: list[list[tuple[str, str]]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, arguments = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instruction.upper(), arguments.strip()))
    return stages


def test_the_last_stage_is_the_installed_environment_alone() -> None:
    stages = _stages()
    assert len(stages) >= 2, "a multi-stage build"
    final = stages[-1]
    instructions = [i for i, _ in final]
    assert "RUN" not in instructions, "the last stage installs nothing itself: no compilers, caches or wheels"
    copies = [a for i, a in final if i in ("COPY", "ADD")]
    assert copies == ["--from=install /opt/devplug /opt/devplug"], copies
    install = next(s for s in stages if s[0][1].endswith(" AS install"))
    (run,) = [a for i, a in install if i == "RUN"]
    assert "--no-cache-dir" in run and "--requirement /wheels/requirements.txt" in run and "--only-binary=:all:" in run


def test_it_runs_devplug_run_on_the_config_the_daemonset_mounts() -> None:
    final = dict(_stages()[-1])
    entrypoint, command = json.loads(final["ENTRYPOINT"]), json.loads(final["CMD"])
    assert entrypoint == ["devplug"]
    assert command == ["run", "--config", "/etc/devplug/config.toml"]
    daemonset = yaml.safe_load((ROOT / "deploy" / "base" / "daemonset.yaml").read_text())
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert container["args"][:3] == command
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    assert str(Path(command[2]).parent) == mount["mountPath"]


def test_make_image_gives_its_image_the_same_command() -> None:
    script = re.sub(r"\\\n", " ", (ROOT / "tools" / "image" / "build.sh").read_text())
    (config,) = [line for line in script.splitlines() if line.lstrip().startswith("umoci config ")]
    words = shlex.split(config)
    cmd = [words[i + 1] for i, word in enumerate(words) if word == "--config.cmd"]
    (entrypoint,) = [words[i + 1] for i, word in enumerate(words) if word == "--config.entrypoint"]
    final = dict(_stages()[-1])
    assert cmd == json.loads(final["CMD"])
    assert Path(entrypoint).name == json.loads(final["ENTRYPOINT"])[0] and entrypoint.startswith("/opt/devplug/bin/")
