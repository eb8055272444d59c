"""``check_resources``: what no single resource's options show, checked against the node without changing it.

* every ``pfs`` selector names an SR-IOV PF, and ``num_vfs`` fits its ``sriov_totalvfs``;
* two resources that set one PF up agree on ``num_vfs`` and ``sriov_drivers_autoprobe``;
* no VF (a PF and an index, whether it exists yet or will be created) is in two resources' pools.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from devplug.host.sysfs import HostSysfs
from devplug.kit import DeviceOwners
from devplug.kit.pci import PciBus
from devplug.options import node_checks
from devplug_sriov.options import SriovOptions
from devplug_sriov.selection import matches_pf, resolve_pfs
from devplug_sriov.sriov import PhysFn, SriovBus

__all__ = ["check_resources"]


def check_resources(options_by_resource: Mapping[str, SriovOptions]) -> None:
    """Raise ``ValueError`` naming the resources (and the PF or VF) of the first conflict found; nothing off the
    node (``devplug check-config --offline``: every check here reads the node's PFs)."""
    if not node_checks():
        return
    nodes: dict[str, dict[str, PhysFn] | None] = {}
    targets: dict[tuple[str, str], tuple[str, int]] = {}
    autoprobes: dict[tuple[str, str], tuple[str, bool]] = {}
    set_ups: dict[str, dict[str, PhysFn]] = {}
    for resource, options in options_by_resource.items():
        root = os.path.realpath(options.sysfs_root)
        if root not in nodes:
            nodes[root] = _read_node(options)
        present = nodes[root]
        if present is None:
            continue  # no sysfs to read here (checking on another machine): start checks the rest
        set_up, errors = resolve_pfs(options, present)
        if errors:
            raise ValueError(f"{resource}: " + "; ".join(errors))
        set_ups[resource] = set_up
        for address, pf in set_up.items():
            if options.num_vfs is not None:
                if options.num_vfs > pf.total_vfs:
                    raise ValueError(
                        f"{resource}: num_vfs = {options.num_vfs} but {address} supports at most {pf.total_vfs} "
                        "VFs (sriov_totalvfs)"
                    )
                other, count = targets.setdefault((root, address), (resource, options.num_vfs))
                if count != options.num_vfs:
                    raise ValueError(
                        f"{other} and {resource} both set up {address}, with num_vfs = {count} and "
                        f"{options.num_vfs}: give it one count"
                    )
            other_a, probe = autoprobes.setdefault((root, address), (resource, options.wanted_autoprobe))
            if probe != options.wanted_autoprobe:
                raise ValueError(
                    f"{other_a} and {resource} both set up {address}, with different sriov_drivers_autoprobe "
                    f"({int(probe)} and {int(options.wanted_autoprobe)}; vf_driver = 'vfio-pci' wants 0): "
                    "set autoprobe the same on both"
                )
    owners = DeviceOwners("VF", hint="; narrow one resource's vfs ranges")
    for resource, options in options_by_resource.items():
        root = os.path.realpath(options.sysfs_root)
        if resource not in set_ups:
            continue
        per_root = {a: c for (r, a), (_, c) in targets.items() if r == root}
        for pf in (nodes[root] or {}).values():
            count = per_root.get(pf.address, pf.num_vfs)
            for index in range(count):
                if not _pools(options, pf, index, set_ups[resource]):
                    continue
                owners.take((root, pf.address, index), resource, f"VF {index} of {pf.address}")


def _read_node(options: SriovOptions) -> dict[str, PhysFn] | None:
    """The node's SR-IOV PFs, or ``None`` where there is no PCI sysfs to read."""
    sysfs = HostSysfs(options.sysfs_root, options.dev_root)
    if not sysfs.is_dir(options.sysfs_root / "bus" / "pci" / "devices"):
        return None
    try:
        return SriovBus(PciBus(sysfs)).physfns()
    except OSError:
        return None


def _pools(options: SriovOptions, pf: PhysFn, index: int, set_up: Mapping[str, PhysFn]) -> bool:
    """Whether the resource's pool would hold VF ``index`` of ``pf`` (ID and driver filters need the VF itself)."""
    ranges = options.vf_ranges
    if ranges:
        return any(index in r and matches_pf(r.pf, pf) for r in ranges)
    if options.pfs:
        return pf.address in set_up
    return not options.vf_devices or f"{pf.dev.vendor:04x}:{pf.dev.device:04x}" in options.vf_devices
