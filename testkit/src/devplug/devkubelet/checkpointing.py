"""The device manager's checkpoint: what goes into ``kubelet_internal_checkpoint``, and how the file is written.

Modelled on Kubernetes v1.32.10:

* ``writeCheckpoint`` (``pkg/kubelet/cm/devicemanager/manager.go``): the
  ``podDevices`` entries as they are at that moment (``toCheckpointData`` in
  ``pod_devices.go``; entries of pods that are no longer active included
  until ``UpdateAllocatedDevices`` dropped them) and ``RegisteredDevices``, the
  healthy devices of every resource the manager has a device list for;
* the checkpoint manager (``pkg/kubelet/checkpointmanager/checkpoint_manager.go``
  ``CreateCheckpoint``) writes through ``pkg/kubelet/util/store/filestore.go``
  ``writeFile``: a temporary file named ``.<random>`` in the same folder,
  written, fsynced, closed, then renamed over the checkpoint, so every write
  is a new inode and a reader never sees half a file;
* ``readCheckpoint``/``fromCheckpointData``: at start the manager restores
  ``podDevices`` from the file, skipping entries whose ``AllocResp`` does not
  unmarshal, and recreates every registered resource with no devices; a
  missing file restores nothing, a corrupt one restores nothing either (the
  kubelet logs "Continue after failing to read checkpoint file" and goes on).

The byte format itself is :mod:`devplug.api.checkpoint`'s.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from google.protobuf.message import DecodeError

from devplug.api.checkpoint import (
    CHECKPOINT_FILE,
    CheckpointEntry,
    CheckpointError,
    KubeletCheckpoint,
    read_checkpoint,
    serialize_checkpoint,
)
from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.devkubelet.poddevices import DeviceAllocateInfo, PodDevices

__all__ = [
    "CHECKPOINT_FILE",
    "build_checkpoint",
    "load_checkpoint",
    "restore_pod_devices",
    "write_checkpoint",
    "write_file_atomically",
]


def build_checkpoint(pod_devices: PodDevices, registered: Mapping[str, Iterable[str]]) -> KubeletCheckpoint:
    """``checkpoint.New(podDevices.toCheckpointData(), registeredDevs)`` as ``writeCheckpoint`` builds it."""
    entries = tuple(
        CheckpointEntry(uid, container, resource, dict(info.devices_by_numa), info.alloc_response)
        for uid, container, resource, info in pod_devices.entries()
    )
    return KubeletCheckpoint(entries, {resource: tuple(ids) for resource, ids in registered.items()})


def write_file_atomically(path: Path, data: bytes) -> None:
    """``filestore.go`` ``writeFile``: temp file ``.<random>`` beside ``path``, write, fsync, close, rename.

    Raises OSError as the kubelet's write would fail (the temp file is removed).
    """
    fd, tmp = tempfile.mkstemp(prefix=".", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_checkpoint(path: Path, checkpoint: KubeletCheckpoint) -> None:
    """``CreateCheckpoint``: the serialized checkpoint, written atomically at ``path``."""
    write_file_atomically(path, serialize_checkpoint(checkpoint))


def load_checkpoint(path: Path) -> tuple[KubeletCheckpoint | None, str]:
    """``getCheckpoint``: the checkpoint and a description; None when missing or unreadable (nothing restored)."""
    try:
        checkpoint = read_checkpoint(path)
    except CheckpointError as exc:
        return None, f"failed to read the checkpoint, continuing without it: {exc}"
    if checkpoint is None:
        return None, "no checkpoint file"
    return checkpoint, f"{len(checkpoint.entries)} entries, {len(checkpoint.registered_devices)} registered resource(s)"


def restore_pod_devices(checkpoint: KubeletCheckpoint, pod_devices: PodDevices) -> int:
    """``fromCheckpointData``: insert every entry whose ``AllocResp`` unmarshals; the number skipped."""
    skipped = 0
    for entry in checkpoint.entries:
        try:
            dp.ContainerAllocateResponse.FromString(entry.alloc_response)
        except DecodeError:
            skipped += 1
            continue
        info = DeviceAllocateInfo(dict(entry.devices_by_numa), entry.alloc_response)
        pod_devices.insert(entry.pod_uid, entry.container, entry.resource, info)
    return skipped
