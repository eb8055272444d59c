"""The kubelet's device-manager checkpoint, read as evidence of which pod holds which device.

The kubelet keeps ``kubelet_internal_checkpoint`` in the device-plugin folder
(Kubernetes v1.32 ``pkg/kubelet/cm/devicemanager/manager.go``, writeCheckpoint):
every device it attributes to a container, by pod UID and container name,
init containers included, which PodResources never shows. It is rewritten

* at the end of ``allocateContainerResources``, after every container whose
  allocation called a plugin's Allocate, and
* in ``genericDeviceUpdateCallback``, on every ListAndWatch message any plugin
  sends, even one that changes nothing;

and it holds the device manager's ``podDevices`` as they are at that moment.
Inactive pods (finished, rejected, deleted) leave ``podDevices`` at the next
``UpdateAllocatedDevices``, which runs before each container's allocation and
in every PodResources ``List``, once the kubelet's pod sources are ready; until
then (right after a kubelet restart) nothing is dropped.

So a plugin learns exactly what the kubelet attributes right now by sending a
ListAndWatch message and reading the file once it was rewritten: the
:meth:`CheckpointView.fresh` probe. A file that is missing, unreadable or
never rewritten is no evidence (``None``); it is logged, never fatal.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from devplug.api.checkpoint import CHECKPOINT_FILE, CheckpointError, KubeletCheckpoint, read_checkpoint

__all__ = ["CHECKPOINT_FILE", "CheckpointView", "pods_holding"]

log = logging.getLogger("devplug.engine")

#: How often the probe looks at the file while it waits for the kubelet to rewrite it (seconds).
POLL_S = 0.005

_Stamp = tuple[int, int, int]


def pods_holding(checkpoint: KubeletCheckpoint, resource: str, device_ids: Iterable[str]) -> set[str]:
    """The UIDs of the pods the checkpoint attributes any of ``device_ids`` (of ``resource``) to."""
    wanted = set(device_ids)
    return {e.pod_uid for e in checkpoint.entries_for(resource) if wanted & e.device_ids}


class CheckpointView:
    """Reads the kubelet's checkpoint at ``path``, cached until the file changes."""

    def __init__(self, path: Path, rewrite_timeout: float = 1.0) -> None:
        self.path = path
        self.rewrite_timeout = rewrite_timeout
        self._cached: tuple[_Stamp, KubeletCheckpoint | None] | None = None
        self._reported: _Stamp | None = None
        #: Why the last read gave no evidence (for ``devplug status``), or None.
        self.last_problem: str | None = None
        #: Called with each version of the file read for the first time (None: unreadable) and its mtime
        #: (``time.time()`` scale), so that no reader misses what another read (:mod:`.sightings`).
        self.listeners: list[Callable[[KubeletCheckpoint | None, float], None]] = []

    def _stamp(self) -> _Stamp | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def exists(self) -> bool:
        return self._stamp() is not None

    def current(self) -> KubeletCheckpoint | None:
        """The checkpoint as the file holds it now; None when missing or unreadable (logged once)."""
        stamp = self._stamp()
        if stamp is None:
            self.last_problem = f"{self.path} does not exist"
            return None
        if self._cached is not None and self._cached[0] == stamp:
            return self._cached[1]
        try:
            checkpoint = read_checkpoint(self.path)
        except CheckpointError as exc:
            checkpoint = None
            self.last_problem = str(exc)
            if self._reported != stamp:
                self._reported = stamp
                log.warning("ignoring the kubelet's checkpoint: %s", exc)
        else:
            self.last_problem = None if checkpoint is not None else f"{self.path} does not exist"
        self._cached = (stamp, checkpoint)
        for listener in self.listeners:
            listener(checkpoint, stamp[1] / 1e9)
        return checkpoint

    async def fresh(self, trigger: Callable[[], bool]) -> KubeletCheckpoint | None:
        """The checkpoint as the kubelet rewrites it after ``trigger()`` (which sends a ListAndWatch message).

        ``trigger`` returns False when it could not reach the kubelet (no
        stream open). Returns None, no evidence, when there is no checkpoint
        file, the trigger failed, or the file was not rewritten within
        ``rewrite_timeout`` seconds.
        """
        before = self._stamp()
        if before is None:
            self.last_problem = f"{self.path} does not exist"
            return None
        if not trigger():
            self.last_problem = "no ListAndWatch stream to the kubelet to ask for a fresh checkpoint"
            return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.rewrite_timeout
        while loop.time() < deadline:
            await asyncio.sleep(POLL_S)
            now = self._stamp()
            if now is not None and now != before:
                return self.current()
        self.last_problem = f"the kubelet did not rewrite {self.path} within {self.rewrite_timeout:g} s"
        log.debug("%s", self.last_problem)
        return None
