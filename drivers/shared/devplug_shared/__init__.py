"""devplug-shared: a devplug driver for devices many nodes reach, one slot one node, freed the moment a pod ends.

Configure it with::

    [resources."example.com/camera"]
    driver = "shared"
    options = { capacity = 2, discovery = { handler = "static", devices = ["cam-a"] } }

Each device offers ``capacity`` slots ``<device>-<n>``, the same IDs on every
node; a coordination store (``local`` SQLite, ``etcd``, or Kubernetes Leases)
holds which node has which slot. Discovery handlers come from the entry-point
group ``devplug.discovery`` (:mod:`devplug_shared.discovery`).
"""

from __future__ import annotations

from devplug_shared.driver import SharedDriver
from devplug_shared.options import SharedOptions

__all__ = ["SharedDriver", "SharedOptions"]
