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
from collections.abc import Iterable
from pathlib import Path

from devplug import DriverError
from devplug.kit import DeviceOwners

__all__ = ["Claims"]


#: Every resource's devices in this process, by (sysfs root, address).
_OWNERS = DeviceOwners(verb="selected", hint="; narrow one resource's options (exclude_addresses)")


class Claims:
    """The process-wide registry: (sysfs root, address) -> resource name."""

    @classmethod
    def claim(cls, sysfs_root: Path, resource: str, addresses: Iterable[str]) -> None:
        """Take ``addresses`` for ``resource``, all or none; :class:`DriverError` names the other owner."""
        root = os.path.realpath(sysfs_root)
        try:
            _OWNERS.take_all([((root, a), a) for a in sorted(set(addresses))], resource)
        except ValueError as exc:
            raise DriverError(str(exc)) from None

    @classmethod
    def owner(cls, sysfs_root: Path, address: str) -> str | None:
        """The resource holding the device, if any."""
        return _OWNERS.owner((os.path.realpath(sysfs_root), address))

    @classmethod
    def release(cls, sysfs_root: Path, resource: str) -> None:
        """Drop every claim of ``resource`` (on this sysfs root)."""
        root = os.path.realpath(sysfs_root)
        _OWNERS.release(resource, only=lambda key: isinstance(key, tuple) and key[0] == root)
