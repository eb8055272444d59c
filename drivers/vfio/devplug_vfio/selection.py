"""Which devices a resource takes, and the IOMMU groups they come in.

A device is taken when every selection key given matches it (and no
``exclude_addresses`` glob does). Devices move to vfio-pci a whole IOMMU group
at a time, so a group is usable only when the resource takes all of its
members; with ``allow_partial_groups``, bridges left on pcieport (or without a
driver) may stay behind, as the kernel's vfio permits. The kernel's view of
groups: ``Documentation/ABI/testing/sysfs-kernel-iommu_groups`` and
``Documentation/driver-api/vfio.rst``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase

from devplug.kit.pci import PciDevice
from devplug_vfio.options import VfioOptions

__all__ = ["Group", "GroupPlan", "plan_groups", "selects"]

_BRIDGE_DRIVERS = (None, "pcieport")


def selects(options: VfioOptions, dev: PciDevice, own_driver: str | None) -> bool:
    """True when the resource takes ``dev``; ``own_driver`` is its driver before devplug moved it."""
    if dev.is_bridge:
        return False
    if any(fnmatchcase(dev.address, pat) for pat in options.exclude_addresses):
        return False
    if options.vendors and f"{dev.vendor:04x}" not in options.vendors:
        return False
    if options.devices and f"{dev.vendor:04x}:{dev.device:04x}" not in options.devices:
        return False
    if options.addresses and not any(fnmatchcase(dev.address, pat) for pat in options.addresses):
        return False
    if options.classes and not any(f"{dev.class_:06x}".startswith(c) for c in options.classes):
        return False
    return not (options.drivers and own_driver not in options.drivers)


@dataclass(frozen=True)
class Group:
    """A usable IOMMU group: the members that move to vfio-pci, and the bridges that stay."""

    number: int
    members: tuple[str, ...]
    left_behind: tuple[str, ...] = ()


@dataclass(frozen=True)
class GroupPlan:
    """The usable groups, and why the others are refused (one message per refused group)."""

    groups: dict[int, Group]
    errors: tuple[str, ...]

    def device_group(self) -> dict[str, int]:
        """Group number by member address."""
        return {a: g.number for g in self.groups.values() for a in g.members}


def plan_groups(
    selected: Mapping[str, PciDevice],
    present: Mapping[str, PciDevice],
    group_members: Callable[[int], list[str]],
    allow_partial: bool,
) -> GroupPlan:
    """Split the selected devices into usable groups and refused ones."""
    by_group: dict[int, list[str]] = {}
    errors: list[str] = []
    for address, dev in sorted(selected.items()):
        if dev.iommu_group is None:
            errors.append(f"{dev.describe()} has no IOMMU group, so vfio-pci cannot take it")
            continue
        by_group.setdefault(dev.iommu_group, []).append(address)
    groups: dict[int, Group] = {}
    for number, members in sorted(by_group.items()):
        left: list[str] = []
        refused = False
        for address in group_members(number):
            if address in selected:
                continue
            other = present.get(address)
            if other is None:  # vanished between two reads
                continue
            if allow_partial and other.is_bridge and other.driver in _BRIDGE_DRIVERS:
                left.append(address)
                continue
            hint = (
                "select it too, or exclude "
                if not other.is_bridge or allow_partial
                else "set allow_partial_groups = true to leave a bridge behind, or exclude "
            )
            errors.append(
                f"IOMMU group {number} holds {other.describe()}, which this resource does not select; "
                f"a group moves to vfio-pci as a whole: {hint}{', '.join(members)}"
            )
            refused = True
        if not refused:
            groups[number] = Group(number, tuple(members), tuple(left))
    return GroupPlan(groups, tuple(errors))
