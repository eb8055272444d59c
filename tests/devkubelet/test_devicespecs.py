"""containerd's device check (``oci.WithDevices``), on real files: device nodes, regular files, links, folders;
and where the dev kubelet applies it (issue 38): where the test asked for it, with a DeprecationWarning elsewhere
until devplug 1.0."""

from __future__ import annotations

import asyncio
import os
import re
import warnings
from pathlib import Path

import pytest

from devplug.devkubelet import ContainerSpec, ContainerStartError, DeviceNodeDeprecationWarning, PodSpec
from devplug.devkubelet.containers import ContainerRuntime
from devplug.devkubelet.devicespecs import (
    DEVICE_NODE_CHECK_DEFAULT_IN,
    DeviceNode,
    RuntimeDeviceError,
    check_device_specs,
    host_path_on_node,
    resolve_devices,
)
from devplug.testing.devnodes import make_char_device
from tests.devkubelet.fakeplugin import Behaviour, devs, plugin_on, running_kubelet

#: The device the fake plugin hands out as /dev/<id>, which no test machine has.
ABSENT = "devplug-test-absent0"


@pytest.fixture
def node(tmp_path: Path) -> Path:
    path = tmp_path / "node"
    if not make_char_device(path, (1, 3)):
        pytest.skip("cannot mknod here (no CAP_MKNOD): a real character device is needed")
    return path


def test_a_char_device_is_taken_with_its_number(node: Path) -> None:
    assert resolve_devices([(str(node), "/dev/x")]) == [DeviceNode("c", 1, 3, str(node), "/dev/x")]


def test_a_regular_file_is_not_a_device_node(tmp_path: Path) -> None:
    regular = tmp_path / "file"
    regular.write_text("")
    with pytest.raises(RuntimeDeviceError, match=r"^not a device node$"):
        resolve_devices([(str(regular), "/dev/x")])


def test_a_missing_path_fails_with_the_lstat_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeDeviceError, match=f"^lstat {re.escape(str(tmp_path))}/gone: no such file or directory$"):
        resolve_devices([(str(tmp_path / "gone"), "/dev/x")])


def test_a_symlink_is_resolved_first(node: Path, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(node)
    assert resolve_devices([(str(link), "/dev/x")]) == [DeviceNode("c", 1, 3, str(node), "/dev/x")]
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    gone = f"^lstat {re.escape(str(tmp_path))}/nowhere: no such file or directory$"
    with pytest.raises(RuntimeDeviceError, match=gone):
        resolve_devices([(str(dangling), "/dev/y")])
    to_file = tmp_path / "to-file"
    (tmp_path / "plain").write_text("")
    to_file.symlink_to(tmp_path / "plain")
    with pytest.raises(RuntimeDeviceError, match=r"^not a device node$"):
        resolve_devices([(str(to_file), "/dev/z")])


def test_a_fifo_alone_is_taken_but_skipped_in_a_folder(tmp_path: Path, node: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert [d.type for d in resolve_devices([(str(fifo), "/dev/f")])] == ["p"]
    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    (folder / "pts").mkdir()
    os.mkfifo(folder / "fifo")
    (folder / "plain").write_text("")
    make_char_device(folder / "a")
    make_char_device(folder / "sub" / "b")
    make_char_device(folder / "pts" / "skipped")
    make_char_device(folder / "console")
    found = resolve_devices([(str(folder), "/dev/set")])
    assert [(d.host_path, d.container_path) for d in found] == [
        (str(folder / "a"), "/dev/set/a"),
        (str(folder / "sub" / "b"), "/dev/set/sub/b"),
    ]


def test_the_first_bad_spec_fails_the_whole_container(tmp_path: Path, node: Path) -> None:
    regular = tmp_path / "file"
    regular.write_text("")
    with pytest.raises(RuntimeDeviceError, match="not a device node"):
        resolve_devices([(str(node), "/dev/a"), (str(regular), "/dev/b")])


def test_dev_paths_are_looked_up_in_the_nodes_dev(tmp_path: Path, node: Path) -> None:
    assert host_path_on_node("/dev/vfio/7", tmp_path) == tmp_path / "vfio" / "7"
    assert host_path_on_node("/dev", tmp_path) == tmp_path
    assert host_path_on_node("/devices/x", tmp_path) == Path("/devices/x")
    assert host_path_on_node("/opt/x", tmp_path) == Path("/opt/x")
    assert host_path_on_node("/dev/vfio/7", Path("/dev")) == Path("/dev/vfio/7")
    (tmp_path / "vfio").mkdir()
    make_char_device(tmp_path / "vfio" / "7", (1, 3))
    assert resolve_devices([("/dev/vfio/7", "/dev/vfio/7")], tmp_path) == [
        DeviceNode("c", 1, 3, str(tmp_path / "vfio" / "7"), "/dev/vfio/7")
    ]


# -- where the dev kubelet checks (issue 38) ----------------------------------------------------------------------
# devplug's own suite makes the DeprecationWarning an error (pyproject.toml): the tests of the default take it back.
DEFAULT = pytest.mark.filterwarnings("default:DeviceSpec host path:DeprecationWarning")


@DEFAULT
def test_unasked_a_path_that_is_no_device_node_is_taken_with_a_warning_naming_what_to_change(tmp_path: Path) -> None:
    regular = tmp_path / "file"
    regular.write_text("")
    with pytest.warns(DeviceNodeDeprecationWarning) as caught:
        taken = check_device_specs([(str(regular), "/dev/a"), ("/dev/nvme-absent0n1", "/dev/b")], check=False)
    assert taken == []
    first, second = (str(w.message) for w in caught)
    assert first.startswith(f"DeviceSpec host path {regular} (container path /dev/a) is not a device node (not a")
    assert "lstat /dev/nvme-absent0n1: no such file or directory" in second
    for message in (first, second):
        assert f"from devplug {DEVICE_NODE_CHECK_DEFAULT_IN} it refuses it as containerd does" in message
        assert "check_device_nodes=True" in message and "dev_root=" in message
        assert "devplug_device_nodes" in message and "make_char_device" in message
    assert issubclass(DeviceNodeDeprecationWarning, DeprecationWarning)


def test_unasked_a_warning_made_an_error_is_the_refusal_to_come(tmp_path: Path) -> None:
    regular = tmp_path / "file"
    regular.write_text("")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        with pytest.raises(RuntimeDeviceError, match=r"^not a device node$"):
            check_device_specs([(str(regular), "/dev/a")], check=False)


def test_asked_the_check_is_containerds(tmp_path: Path, node: Path) -> None:
    regular = tmp_path / "file"
    regular.write_text("")
    with pytest.raises(RuntimeDeviceError, match=r"^not a device node$"):
        check_device_specs([(str(regular), "/dev/a")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning for a device node, asked or not
        assert check_device_specs([(str(node), "/dev/x")], check=False) == [DeviceNode("c", 1, 3, str(node), "/dev/x")]


def test_the_runtime_checks_where_asked_or_given_a_node_dev(tmp_path: Path) -> None:
    runtime = ContainerRuntime(None, lambda kind, detail: None)
    assert not runtime.checks_device_nodes  # the default until devplug 1.0
    assert ContainerRuntime(None, lambda kind, detail: None, check_device_nodes=True).checks_device_nodes
    assert ContainerRuntime(None, lambda kind, detail: None, dev_root=tmp_path).checks_device_nodes
    runtime.dev_root = tmp_path  # a test pointing the kubelet at its node's /dev asks for the check
    assert runtime.checks_device_nodes


@DEFAULT
@pytest.mark.parametrize("check", [False, True], ids=["default", "check_device_nodes"])
def test_a_dev_kubelet_starts_the_container_unless_asked_to_check(plugin_dir: Path, check: bool) -> None:
    """A driver's test handing out /dev/nvme0n1 on a machine without it (devplug-nvme, devplug-qat): the dev
    kubelet on the host's /dev starts the container with a warning by default, refuses it when asked."""

    async def body() -> None:
        async with running_kubelet(plugin_dir, dev_root=Path("/dev"), check_device_nodes=check, cgroups=None) as k:
            assert k.check_device_nodes is check
            plugin = await plugin_on(k, devs(ABSENT), behaviour=Behaviour(regular_files=True))
            spec = PodSpec("p", [ContainerSpec("app", {"example.com/gpu": 1})])
            if check:
                with pytest.raises(ContainerStartError, match=f"lstat /dev/{ABSENT}: no such file or directory$"):
                    await k.admit_pod(spec)
                assert not k.containers_running("p")
            else:
                with pytest.warns(DeviceNodeDeprecationWarning, match=f"DeviceSpec host path /dev/{ABSENT} "):
                    await k.admit_pod(spec)
                assert k.containers_running("p")
                k.check_device_nodes = True  # settable: the next creation is checked
                assert k.check_device_nodes
            await plugin.stop()

    asyncio.run(body())
