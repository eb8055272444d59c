"""Which resource of this process has taken which PCI device.

Two resources that select the same device would fight over it, but the
engine knows nothing of PCI, and each driver instance sees only its own
resource. So instances record their devices in a registry shared by the
process (the daemon serves every resource of the config), keyed by the sysfs
root and the address; a second resource selecting a taken device fails its
``start`` with an error naming both resources.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar

from devplug import DriverError

__all__ = ["Claims"]


class Claims:
    """The process-wide registry: (sysfs root, address) -> resource name."""

    _owners: ClassVar[dict[tuple[str, str], str]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def claim(cls, sysfs_root: Path, resource: str, addresses: Iterable[str]) -> None:
        """Take ``addresses`` for ``resource``, all or none; :class:`DriverError` names the other owner."""
        root = os.path.realpath(sysfs_root)
        wanted = sorted(set(addresses))
        with cls._lock:
            for address in wanted:
                owner = cls._owners.get((root, address))
                if owner is not None and owner != resource:
                    raise DriverError(
                        f"{address} is selected by both {owner} and {resource}: a device belongs to one "
                        "resource; narrow one resource's options (exclude_addresses)"
                    )
            for address in wanted:
                cls._owners[(root, address)] = resource

    @classmethod
    def owner(cls, sysfs_root: Path, address: str) -> str | None:
        """The resource holding the device, if any."""
        with cls._lock:
            return cls._owners.get((os.path.realpath(sysfs_root), address))

    @classmethod
    def release(cls, sysfs_root: Path, resource: str) -> None:
        """Drop every claim of ``resource``."""
        root = os.path.realpath(sysfs_root)
        with cls._lock:
            for key in [k for k, v in cls._owners.items() if k[0] == root and v == resource]:
                del cls._owners[key]
