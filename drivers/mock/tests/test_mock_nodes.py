"""The mock's device nodes: what a container runtime takes as devices, in a folder that is never a device."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devplug import DriverContext, DriverError
from devplug.drivers import DriverHooks
from devplug.options import without_node_checks
from devplug.testing.devnodes import is_device_node
from devplug.testing.kubelet import ContainerSpec, DevKubeletThread, PodSpec
from devplug.testing.sink import RecordingSink
from devplug_mock import NODE_FOLDER, MockDriver, MockOptions

RESOURCE = "example.com/mock"
WAIT = 5.0  # seconds: a generous bound on "soon"; tests wait on conditions


def _null_node(path: Path) -> bool:
    st = os.lstat(path)
    return stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)


@pytest.fixture
def started(tmp_path: Path) -> Iterator[tuple[Path, DriverHooks, RecordingSink]]:
    """The mock on ``tmp_path/devices`` with two devices, listed once (as the engine does at start)."""
    directory = tmp_path / "devices"
    hooks = DriverHooks(RESOURCE, MockDriver(MockOptions(directory=directory, count=2)))
    sink = RecordingSink()
    (tmp_path / "state").mkdir()
    hooks.start(DriverContext(RESOURCE, tmp_path / "state", sink))
    sink.load(hooks.list_devices())
    yield directory, hooks, sink
    hooks.stop()


def test_every_device_is_a_char_device_in_the_hidden_folder(
    started: tuple[Path, DriverHooks, RecordingSink],
) -> None:
    directory, hooks, _ = started
    nodes = directory / NODE_FOLDER
    assert sorted(os.listdir(nodes)) == ["mock0", "mock1"]
    assert all(_null_node(nodes / name) for name in ("mock0", "mock1"))
    listed = {d.id: d for d in hooks.list_devices()}
    assert set(listed) == {"mock0", "mock1"}  # the folder of nodes is not a device
    assert listed["mock0"].allocation is not None
    assert listed["mock0"].allocation.devices[0].host_path == str(nodes / "mock0")


def test_a_hot_plugged_device_has_its_node_when_it_reaches_the_engine(
    started: tuple[Path, DriverHooks, RecordingSink],
) -> None:
    directory, _, sink = started
    (directory / "mock7").write_text("")
    node_when_pushed: list[bool] = []

    def pushed(table: dict[str, Any]) -> bool:
        if "mock7" not in table:
            return False
        node_when_pushed.append(_null_node(directory / NODE_FOLDER / "mock7"))
        return True

    assert sink.wait_for(pushed, timeout=WAIT)
    assert node_when_pushed == [True]
    (directory / "mock7").unlink()
    assert sink.wait_for(lambda t: "mock7" not in t, timeout=WAIT)
    assert not (directory / NODE_FOLDER / "mock7").exists()  # the node goes with its device
    assert set(sink.table) == {"mock0", "mock1"}


def test_the_node_folder_never_shows_as_a_device(started: tuple[Path, DriverHooks, RecordingSink]) -> None:
    directory, hooks, sink = started
    shutil.rmtree(directory / NODE_FOLDER)
    (directory / NODE_FOLDER).mkdir()
    (directory / NODE_FOLDER / "stray").write_text("")
    (directory / "marker").write_text("")  # pushed after the changes above were handled
    assert sink.wait_for(lambda t: "marker" in t, timeout=WAIT)
    assert set(sink.table) == {"mock0", "mock1", "marker"}
    assert {d.id for d in hooks.list_devices()} == {"mock0", "mock1", "marker"}
    assert all(_null_node(directory / NODE_FOLDER / n) for n in ("mock0", "mock1", "marker"))  # made again


def test_device_node_must_be_a_device(tmp_path: Path) -> None:
    """Refused when the options are read (so `check-config` finds it), and again at start (the node may be gone)."""
    regular = tmp_path / "not-a-node"
    regular.write_text("")
    with pytest.raises(ValueError, match=f"device_node: {regular} is not a character or block device"):
        MockOptions(directory=tmp_path / "devices", device_node=regular)
    with without_node_checks():  # check-config --offline reads the options off the node: no look at the file
        options = MockOptions(directory=tmp_path / "devices", device_node=regular)
    hooks = DriverHooks(RESOURCE, MockDriver(options))
    (tmp_path / "state").mkdir()
    with pytest.raises(DriverError, match=f"device_node {regular} is not a character or block device"):
        hooks.start(DriverContext(RESOURCE, tmp_path / "state", RecordingSink()))


def test_device_node_must_be_an_absolute_path() -> None:
    with pytest.raises(ValueError, match="device_node: expected an absolute path"):
        MockOptions(directory=Path("/tmp/x"), device_node="dev/null")  # type: ignore[arg-type]


_CHILD = textwrap.dedent(
    """
    import json, logging, sys
    from pathlib import Path
    from devplug import DriverContext
    from devplug.drivers import DriverHooks
    from devplug.testing.sink import RecordingSink
    from devplug_mock import MockDriver, MockOptions

    warnings = []
    class Keep(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())
    logging.getLogger().addHandler(Keep(logging.WARNING))
    options, state = json.loads(sys.argv[1]), Path(sys.argv[2])
    state.mkdir()
    hooks = DriverHooks("example.com/mock", MockDriver(MockOptions(**options)))
    hooks.start(DriverContext("example.com/mock", state, RecordingSink()))
    hosts = [d.allocation.devices[0].host_path for d in hooks.list_devices() + hooks.list_devices()]
    hooks.stop()
    print(json.dumps({"hosts": hosts, "warnings": warnings}))
    """
)


def _without_mknod(tmp_path: Path, options: dict[str, Any]) -> dict[str, Any]:
    """Run the mock in a child process that may not make device nodes (no CAP_MKNOD)."""
    prefix: list[str] = []
    if os.geteuid() == 0:  # root: drop CAP_MKNOD for the child (util-linux's setpriv)
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("setpriv (util-linux) is needed to run without CAP_MKNOD as root")
        prefix = [setpriv, "--bounding-set=-mknod"]
    state = tmp_path / f"state-{len(list(tmp_path.iterdir()))}"
    command = [*prefix, sys.executable, "-c", _CHILD, json.dumps(options), str(state)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_without_mknod_every_device_is_dev_null_with_one_warning(tmp_path: Path) -> None:
    found = _without_mknod(tmp_path, {"directory": str(tmp_path / "devices"), "count": 3})
    assert found["hosts"] == ["/dev/null"] * 6
    assert len(found["warnings"]) == 1
    assert "cannot make device nodes" in found["warnings"][0]
    assert "device_node" in found["warnings"][0]
    assert not (tmp_path / "devices" / NODE_FOLDER).exists() or not os.listdir(tmp_path / "devices" / NODE_FOLDER)


def test_without_mknod_the_configured_node_is_handed_out(tmp_path: Path) -> None:
    options = {"directory": str(tmp_path / "devices"), "count": 2, "device_node": "/dev/zero"}
    found = _without_mknod(tmp_path, options)
    assert found["hosts"] == ["/dev/zero"] * 4
    assert found["warnings"] == []


def test_an_allocation_of_the_mock_starts_a_container(
    dev_kubelet: DevKubeletThread, devplug_daemon: Any, devplug_root: Path
) -> None:
    devplug_daemon({RESOURCE: {"driver": "mock", "options": {"directory": str(devplug_root / "mock"), "count": 2}}})
    pod = dev_kubelet.admit_pod(PodSpec("p", [ContainerSpec("app", {RESOURCE: 2})]))  # raises when refused
    allocation = pod.container("app").allocations[RESOURCE]
    assert [is_device_node(Path(d.host_path)) for d in allocation.devices] == [True, True]
    assert dev_kubelet.container_failure("p", "app") is None
    assert dev_kubelet.containers_running("p")
    if dev_kubelet.cgroup_layout is not None:
        assert dev_kubelet.container_pids("p", "app")
