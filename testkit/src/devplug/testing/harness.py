"""A driver instance driven as the engine drives it, in the test's own process: for unit and scenario tests.

:class:`DriverHarness` puts a driver behind the engine's own facade (the one
that checks what hooks return and passes only the arguments a hook declares),
with a :class:`devplug.DriverContext` on a fresh state folder (created, as the
daemon creates ``ctx.state_dir`` before ``start``; a bare ``DriverContext``
does not) and a :class:`devplug.testing.sink.RecordingSink` that keeps what the
driver pushes. The ``driver_harness`` fixture of devplug's pytest plugin makes
them and stops each at the end of the test::

    def test_a_drive_is_erased_on_release(driver_harness, nvme_tree):
        harness = driver_harness(NvmeDriver(NvmeDriver.Options(sysfs_root=nvme_tree.sysfs_root, ...)))
        harness.start()
        (dev,) = harness.ids()
        harness.hooks.allocate([dev])
        harness.release([dev])                      # post_stop, then deallocate: what the engine does
        assert harness.sink.table[dev].healthy

Hooks the driver does not implement are skipped by the facade, as by the engine.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devplug.context import DriverContext
from devplug.testing.sink import PUSH_KINDS, RecordingSink
from devplug.types import Device

if TYPE_CHECKING:
    from devplug.drivers import DriverHooks

__all__ = ["DriverHarness", "make_harness"]


@dataclass
class DriverHarness:
    """One driver instance behind the engine's facade (:attr:`hooks`), with its context and sink."""

    driver: Any
    hooks: DriverHooks
    ctx: DriverContext
    sink: RecordingSink

    def start(self) -> DriverHarness:
        """The ``start`` hook with :attr:`ctx`; returns the harness."""
        self.hooks.start(self.ctx)
        return self

    def list_devices(self) -> list[Device]:
        """``list_devices`` through the facade, its answer loaded into the sink's table as the engine does."""
        devices = self.hooks.list_devices()
        self.sink.load(devices)
        return devices

    def ids(self) -> list[str]:
        """The IDs ``list_devices`` returns now (checked as the engine checks them)."""
        return [d.id for d in self.hooks.list_devices()]

    def release(self, device_ids: Sequence[str], retry: bool = False) -> None:
        """What the engine does once a pod is gone: ``post_stop``, then ``deallocate`` (those implemented)."""
        self.hooks.post_stop(device_ids, retry)
        self.hooks.deallocate(device_ids, retry)

    def stop(self) -> None:
        """The ``stop`` hook."""
        self.hooks.stop()


def make_harness(
    driver: Any, resource: str, state_dir: Path, *, push_kinds: Collection[str] = PUSH_KINDS, replicas: int = 1
) -> DriverHarness:
    """A harness for ``driver`` serving ``resource``, its state in ``state_dir`` (created).

    ``push_kinds`` are the pushes the driver may make (see :class:`RecordingSink`: a driver documented to push
    whole lists passes ``("replace",)``); ``replicas`` is the resource's replicas per device.
    """
    from devplug.drivers import DriverHooks

    Path(state_dir).mkdir(parents=True, exist_ok=True)
    sink = RecordingSink(kinds=push_kinds)
    hooks = DriverHooks(resource, driver, replicas=replicas)
    return DriverHarness(driver, hooks, DriverContext(resource, Path(state_dir), sink), sink)
