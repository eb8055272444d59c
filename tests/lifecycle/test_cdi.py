"""CDI end to end (issue 15): a real daemon with ``[cdi] enabled`` and the mock driver, whose devices describe
their node and mount. The spec file it writes is checked against the CDI schema, the kubelet's Allocate answer
carries the CDI names and (unless ``fallback = false``) the same nodes and mounts as plain fields; stale spec
files are removed at start and a device unplugged leaves the spec."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema

from devplug.devkubelet import ContainerSpec, DevKubeletThread, PodSpec
from devplug.testing.configs import dev_config, write_toml
from devplug.testing.conformance import poll_until
from devplug.types import CDIDevice, DeviceSpec, Mount
from devplug_mock import NODE_FOLDER

RESOURCE = "example.com/mock"
SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "cdi_schema.json").read_text())
SPEC_FILE = "devplug-example.com_mock.json"


#: The kit's poll_until, bounded at 20 s.
_poll = functools.partial(poll_until, timeout=20.0)


def _spec(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except FileNotFoundError:
        return None


def _start(devplug_daemon: Any, root: Path, count: int, **cdi: Any) -> tuple[Path, Path]:
    folder = root / "mock"
    spec_dir = root / "cdi"
    devplug_daemon(
        {RESOURCE: {"driver": "mock", "options": {"directory": str(folder), "count": count}}},
        cdi={"enabled": True, "spec_dir": str(spec_dir), **cdi},
    )
    return folder, spec_dir


def test_spec_written_and_allocate_names_cdi_devices_with_fallback(
    dev_kubelet: DevKubeletThread, devplug_daemon: Any, devplug_root: Path
) -> None:
    spec_dir = devplug_root / "cdi"
    spec_dir.mkdir()
    (spec_dir / "devplug-example.com_gone.json").write_text("{}")  # a resource no longer configured
    (spec_dir / "vendor.json").write_text("{}")  # not devplug's
    folder, _ = _start(devplug_daemon, devplug_root, 3)
    path = spec_dir / SPEC_FILE
    spec = _poll(lambda: _spec(path), "the CDI spec file")
    jsonschema.validate(spec, SCHEMA)
    assert spec["kind"] == RESOURCE and spec["cdiVersion"] == "0.5.0"
    assert [d["name"] for d in spec["devices"]] == ["mock0", "mock1", "mock2"]
    assert spec["devices"][1]["containerEdits"] == {
        "deviceNodes": [{"path": "/dev/mock/mock1", "hostPath": str(folder / ".dev" / "mock1"), "permissions": "rw"}],
        "mounts": [
            {"hostPath": str(folder / "mock1"), "containerPath": "/var/run/mock/mock1", "options": ["bind", "ro"]}
        ],
    }
    assert sorted(p.name for p in spec_dir.iterdir()) == [SPEC_FILE, "vendor.json"]

    pod = dev_kubelet.admit_pod(PodSpec("p", [ContainerSpec("c", {RESOURCE: 2})]))
    container = pod.container("c")
    ids = container.devices[RESOURCE]
    answer = container.allocations[RESOURCE]
    assert answer.cdi_devices == tuple(CDIDevice(f"{RESOURCE}={i}") for i in ids)
    # the fallback, for runtimes without CDI: the same nodes and mounts as plain fields, and the driver's env
    assert sorted(answer.devices, key=lambda d: d.container_path) == [
        DeviceSpec(f"/dev/mock/{i}", str(folder / ".dev" / i), "rw") for i in sorted(ids)
    ]
    assert sorted(answer.mounts, key=lambda m: m.container_path) == [
        Mount(f"/var/run/mock/{i}", str(folder / i), read_only=True) for i in sorted(ids)
    ]
    assert dict(answer.envs) == {"MOCK_DEVICES": ",".join(ids)}

    free = next(d for d in ("mock0", "mock1", "mock2") if d not in ids)
    (folder / free).unlink()  # unplugged: it leaves the spec
    _poll(
        lambda: (s := _spec(path)) is not None and sorted(d["name"] for d in s["devices"]) == sorted(ids),
        f"{free} to leave the CDI spec",
    )
    jsonschema.validate(_spec(path), SCHEMA)


def test_without_fallback_allocate_sends_only_cdi_names(
    dev_kubelet: DevKubeletThread, devplug_daemon: Any, devplug_root: Path
) -> None:
    _start(devplug_daemon, devplug_root, 1, fallback=False)
    pod = dev_kubelet.admit_pod(PodSpec("p", [ContainerSpec("c", {RESOURCE: 1})]))
    answer = pod.container("c").allocations[RESOURCE]
    assert answer.cdi_devices == (CDIDevice(f"{RESOURCE}=mock0"),)
    assert answer.devices == () and answer.mounts == ()
    assert dict(answer.envs) == {"MOCK_DEVICES": "mock0"}  # the driver's allocate answer still comes


def test_cdi_off_answers_as_before_and_touches_no_spec(
    dev_kubelet: DevKubeletThread, devplug_daemon: Any, devplug_root: Path
) -> None:
    folder = devplug_root / "mock"
    spec_dir = devplug_root / "cdi"
    spec_dir.mkdir()
    (spec_dir / "devplug-example.com_gone.json").write_text("{}")
    devplug_daemon(
        {RESOURCE: {"driver": "mock", "options": {"directory": str(folder), "count": 1}}},
        cdi={"enabled": False, "spec_dir": str(spec_dir)},
    )
    pod = dev_kubelet.admit_pod(PodSpec("p", [ContainerSpec("c", {RESOURCE: 1})]))
    answer = pod.container("c").allocations[RESOURCE]
    assert answer.cdi_devices == ()
    assert answer.devices == (DeviceSpec("/dev/mock/mock0", str(folder / ".dev" / "mock0"), "rw"),)
    assert answer.mounts == (Mount("/var/run/mock/mock0", str(folder / "mock0"), read_only=True),)
    assert sorted(p.name for p in spec_dir.iterdir()) == ["devplug-example.com_gone.json"]  # nothing written or removed


def test_a_cdi_spec_dir_that_is_a_file_stops_the_daemon_naming_it(devplug_root: Path) -> None:
    (devplug_root / "cdi").write_text("not a folder")
    tables = {RESOURCE: {"driver": "mock", "options": {"directory": str(devplug_root / "mock")}}}
    config = dev_config(devplug_root, tables, cdi={"enabled": True, "spec_dir": str(devplug_root / "cdi")})
    path = write_toml(devplug_root / "devplug.toml", config)
    result = subprocess.run(
        [sys.executable, "-m", "devplug", "run", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert f"cdi.spec_dir: cannot use {devplug_root / 'cdi'}: Not a directory" in result.stderr


# --- issue 24 item 4: names, litter, and the spec of a removed resource


def test_two_ids_that_used_to_share_a_cdi_name_get_two_end_to_end(
    dev_kubelet: DevKubeletThread, devplug_daemon: Any, devplug_root: Path
) -> None:
    folder = devplug_root / "mock"
    folder.mkdir()
    ids = ("a@b", "a_b-7508d8b5")  # the first used to be named like the second, which passed through
    for device_id in ids:
        (folder / device_id).write_text("")
    spec_dir = devplug_root / "cdi"
    devplug_daemon(
        {RESOURCE: {"driver": "mock", "options": {"directory": str(folder)}}},
        cdi={"enabled": True, "spec_dir": str(spec_dir)},
    )
    spec = _poll(lambda: _spec(spec_dir / SPEC_FILE), "the CDI spec file")
    jsonschema.validate(spec, SCHEMA)
    by_name = {d["name"]: d["containerEdits"]["deviceNodes"][0]["hostPath"] for d in spec["devices"]}
    nodes = folder / NODE_FOLDER  # the mock's device nodes
    assert by_name == {"a_b-x614062": str(nodes / "a@b"), "a_b-7508d8b5": str(nodes / "a_b-7508d8b5")}
    named = {}
    for pod_name in ("p1", "p2"):
        container = dev_kubelet.admit_pod(PodSpec(pod_name, [ContainerSpec("c", {RESOURCE: 1})])).container("c")
        ((device_id,), (cdi,)) = container.devices[RESOURCE], container.allocations[RESOURCE].cdi_devices
        named[device_id] = cdi.name.partition("=")[2]
    assert sorted(named) == sorted(ids)
    assert len(set(named.values())) == 2, f"both Allocates named one CDI device: {named}"
    assert all(by_name[name] == str(nodes / device_id) for device_id, name in named.items())


def test_temporary_files_a_killed_writer_left_are_removed_at_start(
    dev_kubelet: DevKubeletThread, devplug_daemon: Any, devplug_root: Path
) -> None:
    spec_dir = devplug_root / "cdi"
    spec_dir.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    litter = spec_dir / f".{SPEC_FILE}.{int(dead.stdout)}.0.tmp"
    litter.write_text('{"cdiVersion": "0.3.0", "kind": "example.com/mock", "devi')  # cut short by kill -9
    _start(devplug_daemon, devplug_root, 1)
    _poll(lambda: _spec(spec_dir / SPEC_FILE), "the CDI spec file")
    assert sorted(p.name for p in spec_dir.iterdir()) == [SPEC_FILE]


def test_the_spec_of_a_resource_a_reload_removed_goes_once_it_drained(
    dev_kubelet: DevKubeletThread, devplug_daemon: Any, devplug_root: Path
) -> None:
    other = "example.com/other"
    other_file = "devplug-example.com_other.json"
    spec_dir = devplug_root / "cdi"
    tables = {
        name: {"driver": "mock", "options": {"directory": str(devplug_root / name.rsplit("/", 1)[1]), "count": 1}}
        for name in (RESOURCE, other)
    }
    daemon = devplug_daemon(tables, cdi={"enabled": True, "spec_dir": str(spec_dir)})
    _poll(lambda: (spec_dir / other_file).exists() and (spec_dir / SPEC_FILE).exists(), "both spec files")
    dev_kubelet.admit_pod(PodSpec("holder", [ContainerSpec("c", {other: 1})]))
    write_toml(daemon.config_path, {**daemon.config, "resources": {RESOURCE: tables[RESOURCE]}})
    reload = subprocess.run(
        [sys.executable, "-m", "devplug", "reload", "--config", str(daemon.config_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert reload.returncode == 0, reload.stderr
    assert f"removed: {other}" in reload.stdout
    # a pod still holds its device: a restart of its container still needs the spec
    _poll(lambda: f"[{other}] removed from the config" in daemon.log_text(), "the removal to be logged")
    assert (spec_dir / other_file).exists()
    dev_kubelet.remove_pod("holder")
    _poll(lambda: f"[{other}] torn down" in daemon.log_text(), f"{other} to drain and be torn down")
    _poll(lambda: not (spec_dir / other_file).exists(), f"{other_file} to be removed")
    assert sorted(p.name for p in spec_dir.iterdir()) == [SPEC_FILE]
