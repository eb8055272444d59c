"""``devplug check-config`` on fpga resources: errors name the file, the resource and the key."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from devplug.testing.configs import dumps_toml
from devplug.testing.dflsysfs import DflModel, model_image

AFU = "0b1a4c0000000000000000000000b1a4"


def _check(tmp_path: Path, resources: Mapping[str, Mapping[str, object]]) -> subprocess.CompletedProcess[str]:
    config = {"state": {"dir": str(tmp_path / "state")}, "resources": resources}
    path = tmp_path / "devplug.toml"
    path.write_text(dumps_toml(config))
    return subprocess.run(
        [sys.executable, "-m", "devplug", "check-config", str(path)], capture_output=True, text=True, timeout=60
    )


def _tool(tmp_path: Path) -> str:
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    return str(tool)


def test_a_missing_image_is_named_with_file_resource_and_key(tmp_path: Path) -> None:
    result = _check(
        tmp_path,
        {"example.com/fpga": {"driver": "fpga", "options": {"blank_image": "no-such.gbs", "blank_afu_id": AFU}}},
    )
    assert result.returncode == 2, result
    assert "devplug.toml" in result.stderr
    assert "example.com/fpga" in result.stderr
    assert "blank_image" in result.stderr
    assert "does not exist" in result.stderr


def test_an_unknown_placeholder_is_refused(tmp_path: Path) -> None:
    options = {
        "backend": "command",
        "cards": ["0000:3b:00.0"],
        "deprogram_command": [_tool(tmp_path), "--device", "{adress}"],
    }
    result = _check(tmp_path, {"example.com/fpga": {"driver": "fpga", "options": options}})
    assert result.returncode == 2, result
    assert "example.com/fpga" in result.stderr
    assert "deprogram_command: unknown placeholder {adress}" in result.stderr


@pytest.mark.parametrize("second_cards", [["0000:3b:00.0"], []], ids=["listed-twice", "taken-by-every-card"])
def test_a_card_claimed_by_two_resources_is_refused(tmp_path: Path, second_cards: list[str]) -> None:
    model = DflModel(tmp_path / "machine")
    model.add_card("0000:3b:00.0")
    blank = model_image(tmp_path / "blank.gbs", AFU)
    common = {"model_root": str(tmp_path / "machine"), "blank_image": str(blank), "blank_afu_id": AFU}
    resources = {
        "example.com/fpga-a": {"driver": "fpga", "options": {**common, "cards": ["0000:3b:00.0"]}},
        "example.com/fpga-b": {"driver": "fpga", "options": {**common, "cards": second_cards, "mode": "whole"}},
    }
    result = _check(tmp_path, resources)
    assert result.returncode == 2, result
    assert "example.com/fpga-a" in result.stderr
    assert "example.com/fpga-b" in result.stderr
    assert "card 0000:3b:00.0 is claimed by both" in result.stderr


def test_a_good_config_passes(tmp_path: Path) -> None:
    options = {
        "backend": "command",
        "mode": "both",
        "cards": ["0000:3b:00.0"],
        "regions_per_card": 2,
        "deprogram_command": [_tool(tmp_path), "--device", "{address}", "--region", "{region}"],
        "verify_command": [_tool(tmp_path), "{address}"],
    }
    result = _check(tmp_path, {"example.com/fpga": {"driver": "fpga", "options": options}})
    assert result.returncode == 0, result.stderr


def test_the_commented_fpga_resource_of_the_example_config_is_valid_once_uncommented(tmp_path: Path) -> None:
    example = (Path(__file__).resolve().parents[3] / "config.example.toml").read_text()
    block = example[example.index('# [resources."example.com/fpga-region"]') :].split("\n\n")[0]  # up to the next one
    lines = [line[2:] for line in block.splitlines() if line.startswith("# ") and not line.startswith("# #")]
    blank = tmp_path / "blank.gbs"
    blank.write_bytes(b"")
    text = "\n".join(lines).replace("/opt/fpga/blank.gbs", str(blank)).replace("/var/lib/devplug", str(tmp_path))
    path = tmp_path / "fpga.toml"
    path.write_text(f'[state]\ndir = "{tmp_path / "state"}"\n\n{text}\n')
    result = subprocess.run(
        [sys.executable, "-m", "devplug", "check-config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "example.com/fpga-region: driver fpga" in result.stdout


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("blank_image", "/proc/self/environ", "blank_image: /proc/self/environ is inside /proc"),
        ("default_image", "/sys/kernel/notes", "default_image: /sys/kernel/notes is inside /sys"),
        ("mounts", ["/proc"], "mounts: /proc is inside /proc"),
        ("deprogram_command", ["/proc/self/exe", "-c", "pass"], "deprogram_command: /proc/self/exe is inside /proc"),
    ],
    ids=["blank_image", "default_image", "mounts", "program"],
)
def test_paths_into_kernel_trees_are_refused_naming_the_key(tmp_path: Path, key: str, value: object, said: str) -> None:
    options: dict[str, object] = {
        "backend": "command",
        "cards": ["0000:3b:00.0"],
        "deprogram_command": [_tool(tmp_path), "{address}"],
        "blank_afu_id": AFU,
    }
    options[key] = value
    if key == "default_image":
        options["program_command"] = [_tool(tmp_path), "{bitstream}"]
    result = _check(tmp_path, {"example.com/fpga": {"driver": "fpga", "options": options}})
    assert result.returncode == 2, result.stderr
    assert 'resources."example.com/fpga".options' in result.stderr and said in result.stderr, result.stderr


def test_a_link_from_an_image_into_proc_is_refused(tmp_path: Path) -> None:
    (tmp_path / "blank.gbs").symlink_to("/proc/self/environ")
    options = {"backend": "command", "cards": ["0000:3b:00.0"], "deprogram_command": [_tool(tmp_path), "{address}"]}
    options["blank_image"] = str(tmp_path / "blank.gbs")
    result = _check(tmp_path, {"example.com/fpga": {"driver": "fpga", "options": options}})
    assert result.returncode == 2
    assert "is inside /proc (it leads to /proc/" in result.stderr


def _check_offline(tmp_path: Path, options: Mapping[str, object]) -> subprocess.CompletedProcess[str]:
    config = {
        "state": {"dir": str(tmp_path / "state")},
        "resources": {"example.com/fpga": {"driver": "fpga", "options": options}},
    }
    path = tmp_path / "devplug.toml"
    path.write_text(dumps_toml(config))
    return subprocess.run(
        [sys.executable, "-m", "devplug", "check-config", "--offline", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_offline_the_nodes_files_and_tools_are_not_looked_for_but_values_are_checked(tmp_path: Path) -> None:
    """Issue 40, item 6: a pipeline checks a config off the node; on the node the same config is refused."""
    node_only = {
        "backend": "command",
        "cards": ["0000:3b:00.0"],
        "blank_image": "/opt/devplug/fpga/blank.gbs",  # the node's bitstream
        "deprogram_command": ["/opt/vendor/bin/fpga-tool", "deprogram", "--card", "{address}"],
        "verify_command": ["fpga-vendor-tool", "verify", "--card", "{address}"],  # on the node's PATH
    }
    assert _check_offline(tmp_path, node_only).returncode == 0
    online = _check(tmp_path, {"example.com/fpga": {"driver": "fpga", "options": node_only}})
    assert online.returncode == 2 and "blank_image: /opt/devplug/fpga/blank.gbs does not exist" in online.stderr
    for bad, said in (
        ({"mode": "halves"}, "options.mode: expected one of"),
        ({"cards": ["3b:00.0"]}, "is not a PCI address"),
        ({"blank_image_typo": "x"}, "blank_image_typo"),
        ({"deprogram_command": ["fpga-tool", "{slot}"]}, "unknown placeholder {slot}"),
    ):
        result = _check_offline(tmp_path, {**node_only, **bad})
        assert result.returncode == 2 and said in result.stderr, (bad, result.stderr)
