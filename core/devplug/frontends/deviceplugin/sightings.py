"""What devplug saw the kubelet do between its answers: the evidence of how a forgotten tenancy is ending.

An Allocate may name devices whose previous tenancy the kubelet forgot while
its containers may still run. Whether waiting for them can end while the
kubelet waits for that Allocate (it admits and removes every pod of the node in
one loop, ``syncLoopIteration`` in ``pkg/kubelet/kubelet.go``, and calls
Allocate with no deadline, ``pkg/kubelet/cm/devicemanager/endpoint.go``) turns
on two things the kubelet shows only in passing:

* **Which kubelet run listed the pod.** A pod the kubelet's pod manager held
  during its current run and then forgot (``HandlePodRemoves``: a static pod's
  manifest removed, a forced deletion) is being killed by its pod worker, which
  does not need the sync loop. A pod listed only before the kubelet restarted
  is an orphan its housekeeping kills (``HandlePodCleanups``), in the sync loop
  itself: a wait for it inside Allocate cannot end. PodResources lists only the
  pods of the pod manager, so :meth:`KubeletSightings.listed` stamps each
  allocation it lists with the kubelet's run, the identity of the
  ``kubelet.sock`` the kubelet creates at each start (device-plugin folder).
* **Every rewrite of the kubelet's checkpoint.** The device manager writes it at
  the end of each container's allocation (``writeCheckpoint`` in
  ``pkg/kubelet/cm/devicemanager/manager.go``), never for a pod whose admission
  failed, and the file keeps naming a pod until a later write after its
  in-memory prune (``UpdateAllocatedDevices``). The folder is watched
  (inotify), and every rewrite is read at once (:meth:`CheckpointView.current`
  tells its listeners), so each allocation learns its pod's UID from the first
  write naming it, and an allocation no write named, although the kubelet wrote
  after it while the watch ran without a gap, belongs to a pod the kubelet
  rejected at admission.

What cannot be seen: two rewrites within the moment it takes to read one (the
first is read as the second). That would need a pod admitted, forgotten and
pruned by the next pod's allocation within that moment; its containers, whose
sandbox is not even made by then, never had the devices, and a driver with
``pre_start`` has a second witness (the kubelet calls PreStartContainer before
a container gets its devices).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from devplug.api.checkpoint import CHECKPOINT_FILE, KubeletCheckpoint
from devplug.frontends.deviceplugin.checkpointview import CheckpointView

__all__ = ["KubeletRun", "KubeletSightings"]

log = logging.getLogger("devplug.engine")

#: The identity of one kubelet run: ``kubelet.sock``'s inode and change time (the kubelet creates it at start).
KubeletRun = tuple[int, int]

#: The kubelet's own registration socket in the device-plugin folder (``pkg/kubelet/apis/deviceplugin``).
KUBELET_SOCKET = "kubelet.sock"


class KubeletSightings:
    """The kubelet runs that listed each allocation, and the rewrites of its checkpoint, for one daemon."""

    def __init__(self, device_plugin_dir: Path, checkpoint: CheckpointView) -> None:
        self.folder = device_plugin_dir
        self.checkpoint = checkpoint
        #: Record ID -> the kubelet run in which PodResources last listed its devices (in memory: a restarted
        #: daemon knows nothing, which only makes an Allocate refuse sooner instead of waiting).
        self._listed: dict[str, KubeletRun] = {}
        #: Since when (``time.time()``) every rewrite of the checkpoint was read; None while there is a gap (no
        #: watch, or the kernel's event queue overflowed).
        self.continuous_since: float | None = None
        #: The newest checkpoint rewrite read (its mtime, ``time.time()`` scale; 0.0: none).
        self.last_write = 0.0
        checkpoint.listeners.append(self._written)

    # --- kubelet runs

    def kubelet_run(self) -> KubeletRun | None:
        """The kubelet's run now (None: no ``kubelet.sock``, no kubelet)."""
        try:
            st = os.stat(self.folder / KUBELET_SOCKET)
        except OSError:
            return None
        return (st.st_ino, st.st_ctime_ns)

    def listed(self, record_ids: list[str]) -> None:
        """PodResources lists these records' devices now: their pods are in the kubelet's pod manager."""
        run = self.kubelet_run()
        if run is None:
            return
        for record_id in record_ids:
            self._listed[record_id] = run

    def in_pod_manager_this_run(self, record_id: str, created: float) -> bool:
        """Whether the kubelet's pod manager held the record's pod during the kubelet's current run: the record
        was allocated after the kubelet started (its admission ran in this run), or PodResources listed it since."""
        run = self.kubelet_run()
        if run is None:
            return False
        return created > run[1] / 1e9 or self._listed.get(record_id) == run

    def forget(self, alive: set[str]) -> None:
        """Drop what is kept about records not in ``alive`` (released)."""
        for record_id in [i for i in self._listed if i not in alive]:
            del self._listed[record_id]

    # --- the checkpoint's rewrites

    def watching(self, uses_inotify: bool) -> None:
        """The device-plugin folder is watched from now on (:class:`~.pluginfolder.PluginFolder`): with inotify,
        every rewrite of the checkpoint is reported; when polled (``DEVPLUG_WATCH_POLL=1``) some may be missed."""
        if not uses_inotify:
            log.info(
                "the device-plugin folder is polled, not watched: rewrites of the kubelet's checkpoint may be missed"
            )
            return
        self.continuous_since = time.time()
        self.checkpoint.current()  # as it stands now: later rewrites are all read

    def not_watching(self) -> None:
        """The watch ended (the daemon stops)."""
        self.continuous_since = None

    def folder_changed(self, names: frozenset[str]) -> None:
        """On the event loop: the folder changed (``names``; empty: anything may have, as after an overflow)."""
        if not names:
            if self.continuous_since is not None:
                log.info("the device-plugin folder's events overflowed: rewrites of the checkpoint may be missed")
                self.continuous_since = time.time()
        elif CHECKPOINT_FILE not in names:
            return
        self.checkpoint.current()

    def _written(self, checkpoint: KubeletCheckpoint | None, mtime: float) -> None:
        """:class:`CheckpointView` read a rewrite of the file (``checkpoint`` None: unreadable)."""
        self.last_write = max(self.last_write, mtime)

    def read_after(self, moment: float) -> bool:
        """Whether every rewrite since before ``moment`` was read, and one written after it was."""
        since = self.continuous_since
        return since is not None and since <= moment and self.last_write > moment
