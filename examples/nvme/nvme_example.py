"""An NVMe-like driver: the worked example of devplug's driver guide (docs/driver/writing.md, "A worked example").

Each controller under ``/sys/class/nvme/`` is a device. Its ``state`` attribute
says whether it serves (``live``); a drive whose last erase failed is out of
service, with the reason. A container gets the drive's node. On release the
drive is erased by an external tool (``nvme format /dev/nvmeN --ses=1``) run
through the kit's command runner, within ``erase_timeout``; a failed erase
raises, so the engine keeps the drive out of service and retries the release
(``retry=True``) until an erase succeeds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from devplug import (
    ContainerAllocation,
    Device,
    DeviceSpec,
    DriverContext,
    DriverError,
    Health,
    HealthReport,
    ResourceSettings,
    hookimpl,
)
from devplug.host.sysfs import HostSysfs, SysfsAccess
from devplug.kit import CommandError, DriverRuntime, run_command
from devplug.options import refuse_kernel_trees


class NvmeDriver:
    """Driver ``nvme-example``: NVMe controllers, erased between pods."""

    hook_contract = "1.0"
    #: Seconds between health checks when the resource's config sets no ``health_interval``.
    health_interval = 10.0

    @dataclass(frozen=True)
    class Options:
        """The resource's ``options`` table."""

        #: Where sysfs and the device nodes are, as the daemon sees them (a container mounts the host's elsewhere).
        sysfs_root: Path = Path("/sys")
        dev_root: Path = Path("/dev")
        #: The erase tool and its arguments; ``{device}`` is the drive's node. No shell is involved.
        erase_command: tuple[str, ...] = ("nvme", "format", "{device}", "--ses=1")
        #: Seconds an erase may take before its process group is killed and the release fails.
        erase_timeout: float = 300.0
        #: Seconds between two looks at /sys/class/nvme (drives come and go); 0: only when the engine asks.
        rescan_interval: float = 30.0

        def __post_init__(self) -> None:
            refuse_kernel_trees(self.sysfs_root, "sysfs_root", allowed=Path("/sys"))
            refuse_kernel_trees(self.dev_root, "dev_root", allowed=Path("/dev"))
            if not self.erase_command or not any("{device}" in arg for arg in self.erase_command):
                raise ValueError(f"erase_command: must name the drive as {{device}}, got {list(self.erase_command)}")
            if self.erase_timeout <= 0:
                raise ValueError(f"erase_timeout: must be above 0 seconds, got {self.erase_timeout}")

    @classmethod
    def check_resources(cls, options: Mapping[str, Options], settings: Mapping[str, ResourceSettings]) -> None:
        """A drive erased between pods cannot be shared: refuse ``replicas`` above 1 (settings also carry each
        resource's ``hook_timeout`` and ``health_interval``)."""
        for resource in options:
            if settings[resource].replicas > 1:
                raise ValueError(f"{resource}: replicas must be 1, a drive is erased between pods")

    def __init__(self, options: Options, sysfs: SysfsAccess | None = None) -> None:
        self.options = options
        self.sysfs = sysfs if sysfs is not None else HostSysfs(options.sysfs_root, options.dev_root)
        self.runtime = DriverRuntime(self.scan, rescan_interval=options.rescan_interval, name="nvme")
        #: Drives whose last erase failed, with the reason (until an erase succeeds).
        self.failed_erases: dict[str, str] = {}

    @hookimpl
    def start(self, ctx: DriverContext) -> None:
        self.runtime.start(ctx)
        self.runtime.start_rescans()

    @hookimpl
    def stop(self) -> None:
        self.runtime.stop()

    def scan(self) -> list[Device]:
        """Every controller under /sys/class/nvme, with its health."""
        folder = self.sysfs.sysfs_root / "class" / "nvme"
        names = self.sysfs.listdir(folder) if self.sysfs.exists(folder) else []
        reports = {name: self.health(name) for name in names}
        return [Device(name, health=r.health, reason=r.reason) for name, r in reports.items()]

    def health(self, name: str) -> HealthReport:
        """A drive's health and why: a failed erase, then its controller's ``state``."""
        if name in self.failed_erases:
            return HealthReport(Health.UNHEALTHY, f"erase failed: {self.failed_erases[name]}")
        try:
            state = self.sysfs.read_text(self.sysfs.sysfs_root / "class" / "nvme" / name / "state")
        except OSError as exc:
            return HealthReport(Health.UNHEALTHY, f"state unreadable: {exc.strerror or exc}")
        if state != "live":
            return HealthReport(Health.UNHEALTHY, f"controller state is {state!r}, not 'live'")
        return HealthReport(Health.HEALTHY)

    @hookimpl
    def list_devices(self) -> list[Device]:
        return self.runtime.refresh(push=False)

    @hookimpl
    def check_health(self, devices: Sequence[Device]) -> Mapping[str, Health | HealthReport]:
        return {device.id: self.health(device.id) for device in devices}

    @hookimpl
    def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation:
        return ContainerAllocation(
            devices=tuple(DeviceSpec(f"/dev/{name}", f"/dev/{name}", "rw") for name in device_ids),
            envs={"NVME_DEVICES": ",".join(device_ids)},
        )

    @hookimpl
    def deallocate(self, device_ids: Sequence[str], retry: bool) -> None:
        for name in device_ids:
            if not self.sysfs.exists(self.sysfs.sysfs_root / "class" / "nvme" / name):
                continue  # hot-removed: nothing left to erase
            node = str(self.sysfs.dev_root / name)
            argv = [arg.replace("{device}", node) for arg in self.options.erase_command]
            try:
                run_command(argv, timeout=self.options.erase_timeout)
            except CommandError as exc:
                timed_out = f"timed out after {self.options.erase_timeout} s"
                self.failed_erases[name] = timed_out if exc.timed_out else exc.excerpt
                self.runtime.log.warning("erasing %s failed: %s", name, exc, extra={"device": name})
                self.runtime.trigger()  # advertise it unhealthy, with the reason, now
                raise DriverError(f"{name}: erase failed, the drive stays out of service: {exc}") from exc
            if self.failed_erases.pop(name, None) is not None:
                self.runtime.trigger()  # healthy again
