"""An idxd-like driver on the kit's bus helper: Intel DSA/IAA work queues handed to containers.

Each work queue the admin configured for user space (``accel-config``: ``type``
``user``) under ``/sys/bus/dsa/devices/wqX.Y`` is a device. The driver binds it
to the kernel's ``user`` driver (``/sys/bus/dsa/drivers/user/bind``), which
makes its character device ``/dev/dsa/wqX.Y``; a container gets that node. On
release the queue is rebound (unbound and bound again: the kernel drains and
resets it) so the next pod finds no work of the last one; a rebind the kernel
refuses raises, and the engine keeps the queue out of service and retries.
Every move goes through :class:`devplug.kit.SysBus`, which checks the ``driver``
link after each write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from devplug import ContainerAllocation, Device, DeviceSpec, DriverContext, DriverError, Health, HealthReport, hookimpl
from devplug.host.sysfs import HostSysfs, SysfsAccess, check_roots
from devplug.kit import DriverRuntime, SysBus


class IdxdDriver:
    """Driver ``idxd-example``: DSA/IAA work queues through the kernel's ``user`` driver."""

    hook_contract = "1.0"
    health_interval = 10.0

    @dataclass(frozen=True)
    class Options:
        """The resource's ``options`` table."""

        sysfs_root: Path = Path("/sys")
        dev_root: Path = Path("/dev")
        #: ``dsa`` (the idxd bus, DSA and IAA alike).
        bus: str = "dsa"
        #: The kernel driver that gives user space a queue's node.
        user_driver: str = "user"
        #: Seconds between two looks at the bus; 0: only when the engine asks.
        rescan_interval: float = 30.0

        def __post_init__(self) -> None:
            check_roots(self.sysfs_root, self.dev_root)
            if not self.bus or "/" in self.bus:
                raise ValueError(f"bus: must be a folder of /sys/bus, got {self.bus!r}")

    def __init__(self, options: Options, access: SysfsAccess | None = None) -> None:
        self.options = options
        self.access = access if access is not None else HostSysfs(options.sysfs_root, options.dev_root)
        self.bus = SysBus(self.access, options.bus)
        self.runtime = DriverRuntime(self.scan, rescan_interval=options.rescan_interval, name="idxd")
        #: Queues the user driver could not take, with the kernel's reason.
        self.refused: dict[str, str] = {}

    @hookimpl
    def start(self, ctx: DriverContext) -> None:
        self.runtime.start(ctx)
        self.runtime.start_rescans()

    @hookimpl
    def stop(self) -> None:
        self.runtime.stop()

    def queues(self) -> list[str]:
        """The work queues configured for user space."""
        found = []
        for name in self.bus.devices():
            try:
                if name.startswith("wq") and self.bus.attribute(name, "type") == "user":
                    found.append(name)
            except OSError:
                continue  # removed while we looked
        return found

    def scan(self) -> list[Device]:
        """Every user queue, bound to the user driver when it can be (tried again each scan), with its health."""
        names = self.queues()
        for name in names:
            if self.bus.driver(name) != self.options.user_driver:
                try:
                    self.bus.rebind(name, self.options.user_driver)
                    self.refused.pop(name, None)
                except DriverError as exc:
                    self.refused[name] = str(exc)
        return [Device(name, health=r.health, reason=r.reason) for name, r in self.check(names).items()]

    def check(self, names: Sequence[str]) -> dict[str, HealthReport]:
        return {name: self.health(name) for name in names}

    def health(self, name: str) -> HealthReport:
        """Healthy while the user driver holds the queue and its node is there."""
        if name in self.refused:
            return HealthReport(Health.UNHEALTHY, self.refused[name])
        driver = self.bus.driver(name)
        if driver != self.options.user_driver:
            return HealthReport(Health.UNHEALTHY, f"held by {driver or 'no driver'}, not {self.options.user_driver}")
        if not self.access.exists(self.access.dev_root / "dsa" / name):
            return HealthReport(Health.UNHEALTHY, f"no device node dsa/{name}")
        return HealthReport(Health.HEALTHY)

    @hookimpl
    def list_devices(self) -> list[Device]:
        return self.runtime.refresh(push=False)

    @hookimpl
    def check_health(self, devices: Sequence[Device]) -> Mapping[str, Health | HealthReport]:
        return self.check([device.id for device in devices])

    @hookimpl
    def allocate(self, device_ids: Sequence[str]) -> ContainerAllocation:
        return ContainerAllocation(
            devices=tuple(DeviceSpec(f"/dev/dsa/{name}", f"/dev/dsa/{name}", "rw") for name in device_ids),
            envs={"DSA_WQS": ",".join(device_ids)},
        )

    @hookimpl
    def deallocate(self, device_ids: Sequence[str], retry: bool) -> None:
        for name in device_ids:
            if not self.bus.exists(name):
                continue  # removed: nothing to drain
            self.refused.pop(name, None)
            try:
                self.bus.unbind(name)
                self.bus.bind(name, self.options.user_driver)
            except DriverError as exc:
                self.refused[name] = str(exc)
                self.runtime.trigger()
                raise DriverError(f"{name}: the queue was not reset, it stays out of service: {exc}") from exc
        self.runtime.trigger()
