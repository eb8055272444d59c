"""The engine's one way to call a driver: an async method per hook, run in the resource's hook thread under its
timeout (:class:`~devplug.engine.hookrunner.HookRunner`), results checked by the typed facade
(:class:`~devplug.drivers.DriverHooks`)."""

from __future__ import annotations

from collections.abc import Sequence

from devplug.context import DriverContext
from devplug.drivers import DriverCapabilities, DriverHooks
from devplug.engine.hookrunner import HookRunner
from devplug.types import ContainerAllocation, Device, Health, Replicas

__all__ = ["AsyncDriver"]


class AsyncDriver:
    """One resource's driver, as the event loop calls it.

    Every method runs its hook in the resource's hook thread, one hook at a
    time, and raises :class:`~devplug.errors.DriverError` when the hook fails
    or :class:`~devplug.errors.HookTimeoutError` when it outlives
    ``hook_timeout``. :attr:`capabilities` says which optional hooks exist.
    """

    def __init__(self, hooks: DriverHooks, runner: HookRunner) -> None:
        self.hooks = hooks
        self.runner = runner
        self.capabilities: DriverCapabilities = hooks.capabilities()
        #: The driver's ``allocate`` changes state that outlives a reboot (firmware, persistent modes): the
        #: ledger's record of an Allocate's intent is fdatasync'ed before the hook runs (class attribute
        #: ``durable_allocate = True``; a plain write, which survives ``kill -9``, otherwise).
        self.durable_allocate = bool(getattr(hooks.driver, "durable_allocate", False))
        if getattr(hooks.driver, "nonblocking_hooks", False):
            runner.run_inline()

    async def start(self, ctx: DriverContext) -> None:
        await self.runner.call("start", self.hooks.start, ctx)

    async def stop(self) -> None:
        await self.runner.call("stop", self.hooks.stop)

    async def list_devices(self) -> list[Device]:
        return await self.runner.call("list_devices", self.hooks.list_devices)

    async def check_health(self, devices: Sequence[Device]) -> dict[str, Health]:
        return await self.runner.call("check_health", self.hooks.check_health, devices)

    async def preferred_allocation(
        self, available: Sequence[Device], must_include: Sequence[str], size: int, replicas: Replicas | None = None
    ) -> list[str]:
        return await self.runner.call(
            "preferred_allocation", self.hooks.preferred_allocation, available, tuple(must_include), size, replicas
        )

    async def allocate(self, device_ids: Sequence[str], replicas: Replicas | None = None) -> ContainerAllocation:
        return await self.runner.call("allocate", self.hooks.allocate, tuple(device_ids), replicas)

    async def pre_start(self, device_ids: Sequence[str], replicas: Replicas | None = None) -> None:
        await self.runner.call("pre_start", self.hooks.pre_start, tuple(device_ids), replicas)

    async def post_stop(self, device_ids: Sequence[str], retry: bool, replicas: Replicas | None = None) -> None:
        await self.runner.call("post_stop", self.hooks.post_stop, tuple(device_ids), retry, replicas)

    async def deallocate(self, device_ids: Sequence[str], retry: bool, replicas: Replicas | None = None) -> None:
        await self.runner.call("deallocate", self.hooks.deallocate, tuple(device_ids), retry, replicas)

    def close(self) -> None:
        """Let the hook thread go (a hook still running finishes in the background)."""
        self.runner.close()
