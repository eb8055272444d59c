"""The container runtime's check of a container's devices: every DeviceSpec host path must be a device node.

The kubelet passes the device plugins' ``DeviceSpec`` entries to the runtime
in ``CreateContainer``; containerd 1.6 turns each into an OCI device while it
generates the container's spec, and fails the creation when it cannot
(``pkg/cri/opts/spec_linux.go`` ``WithDevices``, ``oci/spec_opts_linux.go``
``WithDevices``, ``oci/utils_unix.go`` ``getDevices`` and ``DeviceFromPath``):

* the host path is resolved first when it is a symlink
  (``RealOS.ResolveSymbolicLink`` in ``pkg/os/os_unix.go``: ``lstat``, then
  ``filepath.EvalSymlinks``); a path that does not exist fails with the
  ``lstat`` error;
* a path that is not a directory must be a block device, a character device
  or a FIFO (``DeviceFromPath`` on its ``lstat``); anything else is
  ``ErrNotADevice``, ``"not a device node"``;
* a directory is walked: every block or character device in it (and in its
  sub-folders, except ``pts``, ``shm``, ``fd``, ``mqueue``, ``.lxc``,
  ``.lxd-mounts``, ``.udev``) is added; other files, FIFOs and ``console``
  are skipped;
* the error reaches the kubelet wrapped as ``failed to generate container
  "<id>" spec: failed to generate spec: <error>`` (``containerSpec`` and
  ``runtimeSpec`` in ``pkg/cri/server/container_create.go``), and the kubelet
  reports the container as ``CreateContainerError``
  (``kubeGenericRuntimeManager.startContainer`` in
  ``pkg/kubelet/kuberuntime/kuberuntime_container.go``): the pod stays, the
  container never runs, and the kubelet retries the creation on its next sync.

runc and CRI-O take devices the same way (runc's ``devices.DeviceFromPath``,
CRI-O's ``devicesFromPath``). A driver that hands out regular files as
devices therefore works with no kubelet but a kinder stand-in.

``dev_root`` stands for the node's ``/dev``: a host path under ``/dev`` is
looked up there, so that a test's kernel model (whose device nodes live in a
folder of its own) can play the node.

**Where the dev kubelet checks** (:func:`check_device_specs`): the check
arrived after drivers in the field had written tests that hand out device
nodes their test machine does not have (``/dev/nvme0n1``, ``/dev/qat_vf0``),
so under devplug's compatibility promise (``docs/driver/compatibility.md``)
it is opt-in until devplug :data:`DEVICE_NODE_CHECK_DEFAULT_IN`: the dev
kubelet refuses such a DeviceSpec as containerd does only where the test
asked for the check (``check_device_nodes=True``, or a node ``/dev`` of its
own as ``dev_root``); elsewhere it warns
(:class:`DeviceNodeDeprecationWarning`, naming what to change) and starts the
container. A test run that turns that warning into an error (``-W
error::DeprecationWarning``) gets the refusal, as it will be by default.
"""

from __future__ import annotations

import os
import stat
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEVICE_NODE_CHECK_DEFAULT_IN",
    "NOT_A_DEVICE",
    "DeviceNode",
    "DeviceNodeDeprecationWarning",
    "RuntimeDeviceError",
    "check_device_specs",
    "host_path_on_node",
    "resolve_devices",
]

#: containerd's ``oci.ErrNotADevice``.
NOT_A_DEVICE = "not a device node"

_SKIPPED_FOLDERS = frozenset({"pts", "shm", "fd", "mqueue", ".lxc", ".lxd-mounts", ".udev"})


#: The devplug release from which the dev kubelet checks every container's device nodes by default.
DEVICE_NODE_CHECK_DEFAULT_IN = "1.0"


class RuntimeDeviceError(Exception):
    """A DeviceSpec the runtime cannot turn into a device; the message is containerd's."""


class DeviceNodeDeprecationWarning(DeprecationWarning):
    """A container got a DeviceSpec host path that is not a device node, which the dev kubelet took only because
    the test did not ask for the check; from devplug :data:`DEVICE_NODE_CHECK_DEFAULT_IN` it refuses it."""


@dataclass(frozen=True)
class DeviceNode:
    """One device a container gets: its type (``b``, ``c`` or ``p``), number, host and container paths."""

    type: str
    major: int
    minor: int
    host_path: str
    container_path: str


def host_path_on_node(host_path: str, dev_root: Path) -> Path:
    """Where ``host_path`` is on the node whose ``/dev`` is ``dev_root``."""
    path = Path(host_path)
    dev = Path("/dev")
    if dev_root != dev and (path == dev or dev in path.parents):
        return dev_root / path.relative_to(dev)
    return path


def _go_error(op: str, path: Path, exc: OSError) -> str:
    """An ``os.PathError`` as Go prints it: ``lstat /x: no such file or directory``."""
    text = os.strerror(exc.errno) if exc.errno is not None else str(exc)
    return f"{op} {path}: {text[:1].lower()}{text[1:]}"


def _device_from_path(path: Path, container_path: str) -> DeviceNode:
    """``DeviceFromPath``: the node's type and number from its ``lstat``; ``ErrNotADevice`` otherwise."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise RuntimeDeviceError(_go_error("lstat", path, exc)) from exc
    if stat.S_ISBLK(st.st_mode):
        kind = "b"
    elif stat.S_ISCHR(st.st_mode):
        kind = "c"
    elif stat.S_ISFIFO(st.st_mode):
        kind = "p"
    else:
        raise RuntimeDeviceError(NOT_A_DEVICE)
    return DeviceNode(kind, os.major(st.st_rdev), os.minor(st.st_rdev), str(path), container_path)


def _get_devices(path: Path, container_path: str) -> list[DeviceNode]:
    """``getDevices``: one node, or every node in a folder (walked)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise RuntimeDeviceError(f"error stating device path: {_go_error('stat', path, exc)}") from exc
    if not stat.S_ISDIR(st.st_mode):
        return [_device_from_path(path, container_path or str(path))]
    found: list[DeviceNode] = []
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        inside = f"{container_path}/{entry.name}" if container_path else ""
        if entry.is_dir(follow_symlinks=False):
            if entry.name not in _SKIPPED_FOLDERS:
                found += _get_devices(Path(entry.path), inside)
            continue
        if entry.name == "console":
            continue
        try:
            node = _device_from_path(Path(entry.path), inside or entry.path)
        except RuntimeDeviceError as exc:
            if isinstance(exc.__cause__, FileNotFoundError) or str(exc) == NOT_A_DEVICE:
                continue
            raise
        if node.type != "p":
            found.append(node)
    return found


def resolve_devices(specs: Iterable[tuple[str, str]], dev_root: Path = Path("/dev")) -> list[DeviceNode]:
    """containerd's ``WithDevices`` over ``(host_path, container_path)`` pairs: the devices, or the first error.

    Raises :class:`RuntimeDeviceError` with containerd's text (before its
    ``failed to generate container ... spec`` wrapping).
    """
    devices: list[DeviceNode] = []
    for host_path, container_path in specs:
        path = host_path_on_node(host_path, dev_root)
        try:
            st = os.lstat(path)
        except OSError as exc:
            raise RuntimeDeviceError(_go_error("lstat", path, exc)) from exc
        if stat.S_ISLNK(st.st_mode):  # filepath.EvalSymlinks
            try:
                path = Path(os.path.realpath(path, strict=True))
            except OSError as exc:
                raise RuntimeDeviceError(_go_error("lstat", Path(exc.filename or path), exc)) from exc
        devices += _get_devices(path, container_path)
    return devices


def check_device_specs(
    specs: Iterable[tuple[str, str]], dev_root: Path = Path("/dev"), *, check: bool = True
) -> list[DeviceNode]:
    """The dev kubelet's check of one container's ``(host_path, container_path)`` pairs (see the module docstring).

    With ``check``: :func:`resolve_devices`, raising :class:`RuntimeDeviceError`
    with containerd's text. Without: each pair containerd would refuse is
    taken as it is, with a :class:`DeviceNodeDeprecationWarning` naming the
    path, containerd's error and what to change; a warning filter that turns it
    into an error makes it the refusal. Returns the device nodes resolved.
    """
    if check:
        return resolve_devices(specs, dev_root)
    devices: list[DeviceNode] = []
    for host_path, container_path in specs:
        try:
            devices += resolve_devices([(host_path, container_path)], dev_root)
        except RuntimeDeviceError as exc:
            message = (
                f"DeviceSpec host path {host_path} (container path {container_path}) is not a device node "
                f"({exc}); the dev kubelet starts the container anyway because the test did not ask for the device "
                f"node check, but from devplug {DEVICE_NODE_CHECK_DEFAULT_IN} it refuses it as containerd does "
                "(CreateContainerError). Hand out device nodes in the test (devplug.testing.devnodes."
                "make_char_device, in a node /dev of the test's own) and check now: pass check_device_nodes=True "
                "to the dev kubelet, or give it that /dev as dev_root=... (the conformance class's node_dev_root; "
                "the dev_kubelet fixture: @pytest.mark.devplug_device_nodes, or devplug_check_device_nodes = true "
                "in the pytest config)"
            )
            try:
                warnings.warn(DeviceNodeDeprecationWarning(message), stacklevel=2)
            except DeviceNodeDeprecationWarning as error:  # a filter made it an error: the refusal to come
                raise RuntimeDeviceError(str(exc)) from error
    return devices
