"""containerd's device check (``oci.WithDevices``), on real files: device nodes, regular files, links, folders."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from devplug.devkubelet.devicespecs import DeviceNode, RuntimeDeviceError, host_path_on_node, resolve_devices
from devplug.testing.devnodes import make_char_device


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
