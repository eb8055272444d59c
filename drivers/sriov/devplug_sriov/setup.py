"""Node set-up from config: ``sriov_drivers_autoprobe`` and ``sriov_numvfs`` on the selected PFs.

The driver runs it at ``start``; operators can see it first::

    python -m devplug_sriov.setup --config /etc/devplug.toml --dry-run

prints every write the set-up would make (nothing is changed), and without
``--dry-run`` makes them. The plan is computed from what the kernel shows now,
so running it again writes nothing (idempotent), and a set-up a crash
interrupted is finished by the next run:

* ``sriov_drivers_autoprobe`` first, when it differs from the wanted value
  (0 for ``vf_driver = "vfio-pci"``: the VF's own driver must not grab it);
* ``sriov_numvfs``: nothing when the count is right; the count when the PF
  has none (or to remove them all); between two non-zero counts the kernel
  answers ``EBUSY``, so 0 then the count -- only when no VF of that PF is
  allocated, otherwise the set-up is refused naming the allocated VFs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devplug import ConfigError, DriverError
from devplug.host.sysfs import HostSysfs
from devplug.kit.pci import PciBus
from devplug.options import parse_options
from devplug_sriov.options import SriovOptions
from devplug_sriov.selection import resolve_pfs
from devplug_sriov.sriov import PhysFn, SriovBus
from devplug_sriov.state import open_records

__all__ = ["Write", "apply", "main", "plan_setup"]


@dataclass(frozen=True)
class Write:
    """One sysfs write of the set-up."""

    pf: str
    attribute: str
    value: int
    why: str

    def describe(self, sysfs_root: Path) -> str:
        return f"write {self.value} to {sysfs_root}/bus/pci/devices/{self.pf}/{self.attribute}  # {self.why}"


def plan_pf(pf: PhysFn, options: SriovOptions, allocated: Collection[str], resource: str) -> list[Write]:
    """The writes that bring one PF to what ``options`` want."""
    writes = []
    autoprobe = options.wanted_autoprobe
    if pf.autoprobe != autoprobe:
        why = "VFs stay without a driver until vfio-pci takes them" if not autoprobe else "VFs get their driver"
        writes.append(Write(pf.address, "sriov_drivers_autoprobe", int(autoprobe), why))
    target = options.num_vfs
    if target is None or target == pf.num_vfs:
        return writes
    if target > pf.total_vfs:
        raise DriverError(
            f"{resource}: num_vfs = {target} but {pf.address} supports at most {pf.total_vfs} VFs (sriov_totalvfs)"
        )
    if pf.dev.driver is None:
        raise DriverError(
            f"{resource}: {pf.address} has no driver bound; the kernel creates VFs only through the PF's driver "
            "(load it, or bind the PF)"
        )
    if pf.num_vfs == 0 or target == 0:
        if target == 0:
            _refuse_if_allocated(pf, allocated, resource, target)
        return [*writes, Write(pf.address, "sriov_numvfs", target, f"{pf.num_vfs} -> {target} VFs")]
    _refuse_if_allocated(pf, allocated, resource, target)
    return [
        *writes,
        Write(pf.address, "sriov_numvfs", 0, f"the kernel changes {pf.num_vfs} -> {target} VFs only through 0"),
        Write(pf.address, "sriov_numvfs", target, f"0 -> {target} VFs"),
    ]


def _refuse_if_allocated(pf: PhysFn, allocated: Collection[str], resource: str, target: int) -> None:
    held = sorted(a for a in pf.vfs.values() if a in allocated)
    if held:
        raise DriverError(
            f"{resource}: cannot change {pf.address} from {pf.num_vfs} to {target} VFs: the kernel goes through 0, "
            f"which would remove {', '.join(held)}, allocated to pods; release them first (or keep num_vfs = "
            f"{pf.num_vfs})"
        )


def plan_setup(sriov: SriovBus, options: SriovOptions, allocated: Collection[str], resource: str) -> list[Write]:
    """Every write for the resource's PFs; :class:`DriverError` when a selector names none or a PF refuses."""
    pfs, errors = resolve_pfs(options, sriov.physfns())
    if errors:
        raise DriverError(f"{resource}: " + "; ".join(errors))
    writes: list[Write] = []
    for address in sorted(pfs):
        writes += plan_pf(pfs[address], options, allocated, resource)
    return writes


def apply(sriov: SriovBus, writes: Sequence[Write]) -> None:
    """Make the writes in order."""
    for write in writes:
        if write.attribute == "sriov_numvfs":
            sriov.set_num_vfs(write.pf, write.value)
        else:
            sriov.set_autoprobe(write.pf, bool(write.value))


# --- the command ------------------------------------------------------------------------


def _load_toml(path: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc}") from exc


def sriov_resources(path: Path) -> dict[str, SriovOptions]:
    """The options of every resource of the config using the sriov driver."""
    data = _load_toml(path)
    found = {}
    for name, table in (data.get("resources") or {}).items():
        if isinstance(table, Mapping) and table.get("driver") == "sriov":
            options = parse_options(SriovOptions, table.get("options", {}), f'{path}: resources."{name}".options')
            assert options is not None
            found[name] = options
    return found


def allocated_vfs(path: Path, resources: Collection[str]) -> set[str]:
    """VFs the daemon's state records as held by pods (from each resource's driver state)."""
    data = _load_toml(path)
    state_dir = Path((data.get("state") or {}).get("dir", "/var/lib/devplug"))
    if not state_dir.is_absolute():
        state_dir = path.parent / state_dir
    held: set[str] = set()
    for name in resources:
        held.update(open_records(state_dir / "resources" / name / "driver"))
    return held


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m devplug_sriov.setup --config FILE [--dry-run]``."""
    parser = argparse.ArgumentParser(prog="python -m devplug_sriov.setup", description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="the devplug config (TOML)")
    parser.add_argument("--dry-run", action="store_true", help="print what would be written; change nothing")
    ns = parser.parse_args(argv)
    try:
        resources = sriov_resources(ns.config)
        if not resources:
            print(f"{ns.config}: no resource uses the sriov driver; nothing to set up")
            return 0
        held = allocated_vfs(ns.config, resources)
        for name, options in resources.items():
            sriov = SriovBus(PciBus(HostSysfs(options.sysfs_root, options.dev_root)))
            writes = plan_setup(sriov, options, held, name)
            for write in writes:
                print(("would " if ns.dry_run else "") + write.describe(options.sysfs_root) + f" [{name}]")
            if not writes:
                print(f"[{name}] nothing to write: the PFs are set up")
            if not ns.dry_run:
                apply(sriov, writes)
    except (ConfigError, DriverError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
