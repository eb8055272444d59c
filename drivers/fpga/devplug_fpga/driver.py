"""The FPGA driver: whole cards and partial-reconfiguration regions, deprogrammed and verified on release.

Per resource, a backend (:mod:`devplug_fpga.dfl` or :mod:`devplug_fpga.vendor`)
finds the cards; the mode decides the devices (:mod:`devplug_fpga.devices`).
``allocate`` hands out the device nodes (optionally programming a default image
first, all or nothing); ``post_stop`` deprograms and verifies; ``deallocate``
frees the device (deprogramming first if that never happened, as for an
allocation undone after a crash) and saves power when a whole card is free.
Every step is recorded before it is taken (:mod:`devplug_fpga.state`), so a
crash is finished after the restart, and finished work is never redone.

A device that fails to deprogram or verify is quarantined: never handed out,
reported unhealthy, and its release keeps failing with the reason (shown by
``devplug status``) until the operator deletes its marker file.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import ClassVar, cast

from devplug import (
    ConfigError,
    ContainerAllocation,
    Device,
    DriverContext,
    DriverError,
    Health,
    Mount,
    Topology,
    hookimpl,
)
from devplug.kit import DeviceOwners, DriverRuntime, kill_left_behind, process_stamp
from devplug_fpga.backend import FpgaBackend
from devplug_fpga.command import FpgaError, PidRecorder, shown_output
from devplug_fpga.devices import Target, overlapping, partition, targets
from devplug_fpga.dfl import DflBackend
from devplug_fpga.door import DflAccess, HostDfl
from devplug_fpga.options import FpgaOptions
from devplug_fpga.state import FpgaState
from devplug_fpga.status import device_status
from devplug_fpga.vendor import CommandBackend

__all__ = ["KERNEL_MODELS", "FpgaDriver", "env_suffix", "make_access"]


def env_suffix(resource_name: str) -> str:
    """The resource name as an env suffix: upper case, ``.``, ``/`` and ``-`` as ``_``."""
    return re.sub(r"[./-]", "_", resource_name.upper())


#: The entry-point group of kernel models a config may put behind the driver instead of the host (``model_root``):
#: devplug's test kit (the devplug-testing distribution) registers its DFL model as ``dfl``. Loaded only when a
#: config sets ``model_root``: the driver's code never imports the test kit.
KERNEL_MODELS = "devplug.kernel_models"


def make_access(options: FpgaOptions) -> DflAccess:
    """The host's sysfs and /dev under the configured roots, or the DFL model in ``model_root`` (the test kit's,
    found through its entry point :data:`KERNEL_MODELS` ``dfl``).

    Raises :class:`devplug.ConfigError` when ``model_root`` is set and no DFL model is installed.
    """
    if options.model_root is not None:
        return _dfl_model(options.model_root)
    return HostDfl(options.sysfs_root, options.dev_root)


def _dfl_model(root: Path) -> DflAccess:
    found = entry_points(group=KERNEL_MODELS, name="dfl")
    if not found:
        raise ConfigError(
            f"model_root = {str(root)!r}: no DFL model is installed (entry point {KERNEL_MODELS!r}, name 'dfl'); "
            "it comes with devplug's test kit: pip install devplug-testing"
        )
    model = next(iter(found)).load()
    return cast("DflAccess", model(root))


def _backend(options: FpgaOptions, access: DflAccess) -> FpgaBackend:
    return DflBackend(options, access) if options.backend == "dfl" else CommandBackend(options)


class FpgaDriver:
    """devplug's FPGA driver (entry point ``fpga``); one instance per resource.

    ``access`` replaces the door to the kernel (tests may pass the test kit's
    ``devplug.testing.dflsysfs.DflModel``); by default it follows the
    ``sysfs_root``, ``dev_root`` and ``model_root`` options.
    """

    #: The hook contract this driver was written against (see devplug.contract); the core refuses a mismatch.
    hook_contract: ClassVar[str] = "1.1"

    Options: ClassVar[type[FpgaOptions]] = FpgaOptions

    @classmethod
    def check_resources(cls, options_by_resource: Mapping[str, FpgaOptions]) -> None:
        """Refuse a card claimed by two resources (listed in both, or found by two taking every card)."""
        owners = DeviceOwners("card", hint=" (use mode = 'both' to offer it whole and by region)")
        takes_all: dict[str, str] = {}
        for resource, options in options_by_resource.items():
            root = os.path.realpath(options.model_root or options.sysfs_root)
            addresses = list(options.cards)
            if not addresses:
                other = takes_all.setdefault(root, resource)
                if other != resource:
                    raise ValueError(
                        f"both {other} and {resource} take every card under {root}: a card belongs to one "
                        "resource; list each resource's cards in `cards`"
                    )
                try:
                    addresses = [c.address for c in _backend(options, make_access(options)).scan()]
                except OSError:
                    continue
            owners.take_all([((root, address), f"card {address}") for address in addresses], resource)

    def __init__(self, options: FpgaOptions, *, access: DflAccess | None = None) -> None:
        self.options = options
        self.access = access if access is not None else make_access(options)
        self.backend = _backend(options, self.access)
        self._lock = threading.RLock()
        self.runtime = DriverRuntime(self._scan, name="fpga")
        self._state: FpgaState | None = None
        self._targets: dict[str, Target] = {}
        self._present: set[str] = set()
        self._reasons: dict[str, str] = {}

    # --- lifecycle ----------------------------------------------------------------------

    @hookimpl
    def start(self, ctx: DriverContext) -> None:
        """Load the state, stop tools a killed daemon left running, find the cards."""
        with self._lock:
            self.runtime.start(ctx)
            self._state = FpgaState(ctx.state_dir)
            for device, record in self._state.devices.items():
                pid, program = record.pid, record.program
                # A record without its stamp (written before it was kept) kills nothing: kill_left_behind warns.
                if pid is not None and program is not None and kill_left_behind(pid, program, record.started):
                    ctx.log.warning(
                        "%s: killed %s (pid %d), left running by a daemon that died", device, record.program, record.pid
                    )
            self._refresh()
            if not self._targets:
                ctx.log.warning(
                    "no FPGA cards found (%s backend); the resource advertises no devices", self.options.backend
                )

    @property
    def state(self) -> FpgaState:
        """The driver's records and quarantine markers (read by ``start``)."""
        if self._state is None:
            raise DriverError("fpga: the driver was not started")
        return self._state

    # --- devices and health -----------------------------------------------------------------

    def _refresh(self) -> None:
        """Scan the cards; devices seen before that vanished stay known (unhealthy)."""
        found = targets(self.backend.scan(), self.options.mode)
        self._present = set(found)
        merged = dict(self._targets)
        merged.update(found)
        self._targets = dict(sorted(merged.items()))

    def _reason(self, target: Target, quarantined: Mapping[str, str]) -> str:
        """Why the device may not be handed out now (empty: it may)."""
        store = self.state
        if target.id not in self._present:
            return "the device is gone"
        if target.id in quarantined:
            return f"out of service: {quarantined[target.id]} (clear: rm {store.marker(target.id)})"
        for other in overlapping(target, self._targets.values()):
            if other in quarantined:
                return f"overlaps {other}, which is out of service"
            phase = store.phase(other)
            if phase is not None:
                return f"overlaps {other}, which is {phase}"
        problems = self.backend.problems(target)
        return "; ".join(problems)

    def _devices(self) -> list[Device]:
        quarantined = self.state.quarantined()
        cards = {t.card.address: t.card for t in self._targets.values() if t.id in self._present}
        devices = []
        for target in self._targets.values():
            reason = self._reason(target, quarantined)
            if reason != self._reasons.get(target.id, ""):
                if reason:
                    self.runtime.log.warning("%s is unhealthy: %s", target.id, reason, extra={"device": target.id})
                else:
                    self.runtime.log.info("%s is healthy again", target.id, extra={"device": target.id})
            self._reasons[target.id] = reason
            node = target.card.numa_node
            topology = Topology((node,)) if node >= 0 else Topology()
            health = Health.UNHEALTHY if reason else Health.HEALTHY
            part = partition(target, cards.get(target.card.address)) if self.options.partitions else None
            devices.append(Device(target.id, health, topology, reason, partition=part))
        return devices

    def _scan(self) -> list[Device]:
        """The cards read again; every device with its health and reason."""
        with self._lock:
            self._refresh()
            return self._devices()

    def _push(self) -> None:
        """Send the device list to the engine when a health changed (overlaps, quarantine)."""
        self.runtime.advertised.set(self._devices())

    @hookimpl
    def list_devices(self) -> Sequence[Device]:
        """Every card or region (by mode), unhealthy while overlapped, quarantined, failing or gone."""
        return self.runtime.refresh(push=False)

    @hookimpl
    def check_health(self, devices: Sequence[Device]) -> Mapping[str, Health] | None:
        """Errors, temperature, nodes and cards, overlaps and quarantine markers, read again.

        Changes are pushed whole (with their reasons, for ``devplug status``), so nothing is returned.
        """
        with self._lock:
            current = self.runtime.advertised.set(self._scan(), push=False)
            if {d.id: d for d in current} != {d.id: d for d in devices}:
                self.runtime.ctx.set_devices(current)
            return {}

    # --- allocation ---------------------------------------------------------------------------

    def _recorder(self, device: str) -> PidRecorder:
        held = self.state.devices

        def record(pid: int, program: str) -> None:
            started = process_stamp(pid)  # the tool is the runner's unreaped child: the pid is still its
            with self._lock:
                if device in held:
                    held.replace(device, pid=pid, program=program, started=started)

        return record

    def _targets_of(self, device_ids: Sequence[str]) -> list[Target]:
        unknown = [d for d in device_ids if d not in self._targets]
        if unknown:
            raise DriverError(f"{', '.join(unknown)}: not a device of this resource")
        return [self._targets[d] for d in device_ids]

    @hookimpl
    def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation | None:
        """Hand out the device nodes, after programming the default image if one is configured.

        With ``device_status``, the answer carries each device's :func:`devplug_fpga.status.device_status`
        (the AFU IDs its regions hold now and a ``Programmed`` condition) for the DRA claim's status."""
        with self._lock:
            store = self.state
            wanted = self._targets_of(device_ids)
            quarantined = store.quarantined()
            conflicts = []
            for target in wanted:
                if target.id in quarantined:
                    conflicts.append(f"{target.id} is out of service: {quarantined[target.id]}")
                for other in overlapping(target, self._targets.values()):
                    if other in device_ids:
                        conflicts.append(f"{target.id} and {other} overlap; request one of them")
                    elif store.phase(other) is not None or other in quarantined:
                        conflicts.append(
                            f"{target.id} overlaps {other}, which is {store.phase(other) or 'out of service'}"
                        )
            if conflicts:
                raise DriverError("; ".join(conflicts))
            fresh = [t for t in wanted if store.phase(t.id) in (None, "clean")]
            programming = self.options.default_image is not None and bool(fresh)
            if programming:  # overlapping devices see the phase and are refused meanwhile
                store.set([t.id for t in fresh], "programming")
        if programming:
            self._program_default(fresh)  # the vendor tool, without the lock: other devices' hooks go on
        with self._lock:
            store.set([t.id for t in fresh], "allocated")
            self._restore_power({t.card.address for t in wanted})
            self._push()
            return self._allocation(wanted)

    def _program_default(self, fresh: list[Target]) -> None:
        """Load the default image into every region of ``fresh`` (their phase already ``programming``); on failure
        deprogram them all and raise. Runs without the lock."""
        store = self.state
        image = self.options.default_image
        assert image is not None
        try:
            for target in fresh:
                for region in target.regions:
                    self.backend.program(
                        target.card, region, image, self.options.default_afu_id, self._recorder(target.id)
                    )
        except FpgaError as exc:
            with self._lock:
                store.set([t.id for t in fresh], "programming")  # the tool is done: forget its PID
            self.runtime.log.error("programming %s failed: %s%s", image, exc, shown_output(exc.output))
            undone = []
            for target in fresh:
                try:
                    self._clean(target)
                except FpgaError as again:
                    undone.append(str(again))
                    continue
                with self._lock:
                    store.devices.drop(target.id)
            if undone:
                raise DriverError(f"programming the default image failed: {exc}; " + "; ".join(undone)) from exc
            raise DriverError(f"programming the default image failed (the devices were deprogrammed): {exc}") from exc

    def _allocation(self, wanted: list[Target]) -> ContainerAllocation:
        suffix = env_suffix(self.runtime.ctx.resource_name)
        specs = {s.container_path: s for t in wanted for s in self.backend.device_specs(t)}
        regions = [r for t in wanted for r in t.regions]
        envs = {
            f"FPGA_DEVICES_{suffix}": ",".join(t.id for t in wanted),
            f"FPGA_ADDRESSES_{suffix}": ",".join(dict.fromkeys(t.card.address for t in wanted)),
            f"FPGA_REGIONS_{suffix}": ",".join(r.port or str(r.index) for r in regions),
        }
        afu_ids = [self.backend.afu_id(r) for r in regions]
        if any(a is not None for a in afu_ids):
            envs[f"FPGA_AFU_IDS_{suffix}"] = ",".join(a or "" for a in afu_ids)
        mounts = tuple(Mount(m, m, read_only=True) for m in self.options.mounts)
        statuses = {}
        if self.options.device_status:  # contract 1.1: the claim's status.devices shows what each device holds
            read = iter(afu_ids)
            statuses = {t.id: device_status(t, [next(read) for _ in t.regions], self.options) for t in wanted}
        return ContainerAllocation(envs=envs, devices=tuple(specs.values()), mounts=mounts, device_status=statuses)

    # --- release --------------------------------------------------------------------------------

    def _clean(self, target: Target, retry: bool = False) -> None:
        """Deprogram and verify ``target``, exactly once: a clean record is never redone; failures quarantine.

        ``retry`` (the engine calling again after a crash or a failure) only changes what is logged: the
        driver's own record says what was done. The vendor tool runs without the driver's lock, so a slow
        deprogram of one device never holds up the other devices' hooks (the engine runs no two hooks on one
        device at once; overlapping devices see the ``deprogramming`` phase and are refused meanwhile).
        """
        store = self.state
        with self._lock:
            quarantined = store.quarantined()
            if target.id in quarantined:
                raise FpgaError(
                    f"{target.id} is out of service: {quarantined[target.id]}; once the card is fixed, clear it: "
                    f"rm {store.marker(target.id)}"
                )
            phase = store.phase(target.id)
            if phase == "clean":
                if retry:
                    self.runtime.log.info("%s was deprogrammed and verified before; not again", target.id)
                return
            if phase == "deprogramming":
                self.runtime.log.info(
                    "%s: finishing a deprogram that was cut short", target.id, extra={"device": target.id}
                )
            store.set([target.id], "deprogramming")
        try:
            for region in target.regions:
                self.backend.deprogram(target.card, region, self._recorder(target.id))
                self.backend.verify(target.card, region, self._recorder(target.id))
        except FpgaError as exc:
            marker = store.marker(target.id)
            self.runtime.log.error(  # before the marker: whoever sees the marker finds the reason logged
                "%s failed to deprogram; out of service until %s is deleted: %s%s",
                target.id,
                marker,
                exc,
                shown_output(exc.output),
                extra={"device": target.id},
            )
            with self._lock:
                store.set([target.id], "deprogramming")  # the tool is done: forget its PID, never kill a namesake
                store.quarantine(target.id, str(exc), exc.output)
            raise FpgaError(
                f"{target.id} failed to deprogram and is out of service: {exc}; once the card is fixed, clear it: "
                f"rm {marker}",
                exc.output,
            ) from exc
        with self._lock:
            store.set([target.id], "clean")
        self.runtime.log.info("%s deprogrammed and verified", target.id, extra={"device": target.id})

    @hookimpl
    def post_stop(self, device_ids: Sequence[str], retry: bool = False) -> None:
        """Deprogram, then verify, each device; on a retry, devices already clean are left alone."""
        with self._lock:
            wanted = self._targets_of(device_ids)
        failures = []
        for target in wanted:
            try:
                self._clean(target, retry)
            except FpgaError as exc:
                failures.append(str(exc))
        with self._lock:
            self._push()
        if failures:
            raise DriverError("; ".join(failures))

    @hookimpl
    def deallocate(self, device_ids: Sequence[str], retry: bool = False) -> None:
        """Free the devices (deprogramming any never cleaned), then save power on cards left wholly free."""
        store = self.state
        with self._lock:
            wanted = [t for t in self._targets_of(device_ids) if store.phase(t.id) is not None]
        failures = []
        for target in wanted:
            try:
                self._clean(target, retry)
            except FpgaError as exc:
                failures.append(str(exc))
                continue
            with self._lock:
                store.devices.drop(target.id)
        with self._lock:
            self._save_power()
            self._push()
        if failures:
            raise DriverError("; ".join(failures))

    # --- power --------------------------------------------------------------------------------

    def _save_power(self) -> None:
        store = self.state
        if self.options.power_save_watts is None and not self.options.power_save_command:
            return
        held = {self._targets[d].card.address for d in store.devices if d in self._targets}
        held |= {self._targets[d].card.address for d in store.quarantined() if d in self._targets}
        for card in {t.card.address: t.card for t in self._targets.values() if t.id in self._present}.values():
            if card.address in held or card.address in store.power:
                continue
            try:
                previous = self.backend.power_save(card)
            except (FpgaError, OSError) as exc:
                self.runtime.log.warning("%s: power save failed: %s", card.address, exc)
                continue
            store.power.put(card.address, previous or "")
            self.runtime.log.info("%s: free, power save on", card.address)

    def _restore_power(self, addresses: set[str]) -> None:
        store = self.state
        for address in sorted(addresses & set(store.power)):
            card = next(t.card for t in self._targets.values() if t.card.address == address)
            try:
                if store.power[address]:
                    self.backend.power_restore(card, store.power[address])
            except (FpgaError, OSError) as exc:
                self.runtime.log.warning("%s: restoring power after power save failed: %s", address, exc)
            store.power.drop(address)
