"""The engine's one way to call a driver: the driver facade (:class:`~devplug.drivers.facade.DriverFacade`, one
plugin manager and a checked call per hook) with an async method per hook, each run in the resource's hook thread
under its timeout (:class:`~devplug.engine.hookrunner.HookRunner`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from devplug.context import DriverContext
from devplug.drivers.facade import DriverCapabilities, DriverFacade, DriverHooks
from devplug.engine.hookrunner import HookRunner
from devplug.types import Claim, ContainerAllocation, Device, Health, HealthReport, Replicas

__all__ = ["AsyncDriver"]


class AsyncDriver(DriverFacade):
    """One resource's driver, as the event loop calls it.

    Every method runs its hook's checked call in the resource's hook thread,
    one hook at a time, and raises :class:`~devplug.errors.DriverError` when
    the hook fails or :class:`~devplug.errors.HookTimeoutError` when it
    outlives ``hook_timeout``. :attr:`capabilities` says which optional hooks
    exist. Device IDs are copied into tuples on the event loop, so the hook
    thread never sees a list the loop goes on changing.
    """

    def __init__(
        self,
        resource_name: str,
        driver: object,
        runner: HookRunner,
        extra_plugins: Iterable[object] = (),
        *,
        replicas: int = 1,
    ) -> None:
        super().__init__(resource_name, driver, extra_plugins, replicas=replicas)
        self.runner = runner
        self.capabilities = DriverCapabilities(tuple(self.implemented()))
        #: The driver's ``allocate`` changes state that outlives a reboot (firmware, persistent modes): the
        #: ledger's record of an Allocate's intent is fdatasync'ed before the hook runs (class attribute
        #: ``durable_allocate = True``; a plain write, which survives ``kill -9``, otherwise).
        self.durable_allocate = bool(getattr(driver, "durable_allocate", False))
        #: The same hooks called directly (``devplug status`` lists them; a plugin registered here is called too).
        self.hooks = DriverHooks.sharing(self)
        if getattr(driver, "nonblocking_hooks", False):
            runner.run_inline()

    async def start(self, ctx: DriverContext) -> None:
        await self.runner.call("start", self.call_start, ctx)

    async def stop(self) -> None:
        await self.runner.call("stop", self.call_stop)

    async def list_devices(self) -> list[Device]:
        return await self.runner.call("list_devices", self.call_list_devices)

    async def check_health(self, devices: Sequence[Device]) -> dict[str, Health | HealthReport]:
        return await self.runner.call("check_health", self.call_check_health, devices)

    async def preferred_allocation(
        self, available: Sequence[Device], must_include: Sequence[str], size: int, replicas: Replicas | None = None
    ) -> list[str]:
        return await self.runner.call(
            "preferred_allocation", self.call_preferred_allocation, available, tuple(must_include), size, replicas
        )

    async def allocate(
        self, device_ids: Sequence[str], replicas: Replicas | None = None, claim: Claim | None = None
    ) -> ContainerAllocation:
        return await self.runner.call("allocate", self.call_allocate, tuple(device_ids), replicas, claim)

    async def pre_start(self, device_ids: Sequence[str], replicas: Replicas | None = None) -> None:
        await self.runner.call("pre_start", self.call_pre_start, tuple(device_ids), replicas)

    async def post_stop(self, device_ids: Sequence[str], retry: bool, replicas: Replicas | None = None) -> None:
        await self.runner.call("post_stop", self.call_post_stop, tuple(device_ids), retry, replicas)

    async def deallocate(self, device_ids: Sequence[str], retry: bool, replicas: Replicas | None = None) -> None:
        await self.runner.call("deallocate", self.call_deallocate, tuple(device_ids), retry, replicas)

    def close(self) -> None:
        """Let the hook thread go (a hook still running finishes in the background)."""
        self.runner.close()
