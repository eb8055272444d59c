"""Which PFs a resource sets up and which VFs it pools, as (PF address, VF index) pairs."""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase

from devplug_sriov.options import PfSelector, SriovOptions
from devplug_sriov.sriov import PhysFn, VirtFn

__all__ = ["matches_pf", "resolve_pfs", "selects_vf"]


def matches_pf(selector: PfSelector, pf: PhysFn) -> bool:
    """True when ``selector`` names ``pf``."""
    if selector.address is not None:
        return fnmatchcase(pf.address, selector.address)
    if selector.netdev is not None:
        return pf.netdev == selector.netdev
    return selector.ids == (pf.dev.vendor, pf.dev.device)


def resolve_pfs(options: SriovOptions, present: Mapping[str, PhysFn]) -> tuple[dict[str, PhysFn], list[str]]:
    """The PFs ``pfs`` names, and one message per selector that names none."""
    found: dict[str, PhysFn] = {}
    errors = []
    for selector in options.pf_selectors:
        hits = [pf for pf in present.values() if matches_pf(selector, pf)]
        if not hits:
            errors.append(
                f"pfs: {selector.text!r} names no SR-IOV physical function on this node "
                f"(SR-IOV PFs here: {', '.join(_describe(p) for p in present.values()) or 'none'})"
            )
        for pf in hits:
            found[pf.address] = pf
    return found, errors


def _describe(pf: PhysFn) -> str:
    name = f" {pf.netdev}" if pf.netdev else ""
    return f"{pf.address}{name} ({pf.dev.vendor:04x}:{pf.dev.device:04x})"


def selects_vf(
    options: SriovOptions, vf: VirtFn, pf: PhysFn, own_driver: str | None, set_up: Mapping[str, PhysFn]
) -> bool:
    """True when the resource pools ``vf``; ``own_driver`` is its driver before devplug moved it."""
    ranges = options.vf_ranges
    if ranges:
        if not any(vf.index in r and matches_pf(r.pf, pf) for r in ranges):
            return False
    elif options.pfs and pf.address not in set_up:
        return False
    if options.vf_devices and f"{vf.dev.vendor:04x}:{vf.dev.device:04x}" not in options.vf_devices:
        return False
    return not (options.vf_kernel_drivers and own_driver not in options.vf_kernel_drivers)
