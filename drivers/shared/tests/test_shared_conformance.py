"""devplug-shared against the kit's driver contract checks: one node, two statically discovered devices of one
slot each, claims coordinated through the ``local`` store (a SQLite file in the test's folder).

The two slow-release checks are skipped: a release is one call to the slot store, which serves every slot of the
node in turn (claims and releases one at a time, so that the store and ``held.json`` agree), so a store made slow
makes every slot slow alike and no release can be stretched on one slot only.
Its hook calls are recorded by the kit's stand-in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from devplug import ContainerAllocation
from devplug.testing.conformance import DriverConformance

NODE = "node-a"


class TestSharedConformance(DriverConformance):
    driver = "shared"
    resource = "example.com/shared"
    records_itself = False
    device_count = 2
    release_hooks = ("deallocate",)  # the shared driver has no post_stop hook
    bad_option_key = "capacity"

    def options(self, folder: Path) -> Mapping[str, Any]:
        return {
            "discovery": {"handler": "static", "devices": ["cam-a", "cam-b"]},
            "node_name": NODE,
            "coordination": {"backend": "local", "path": str(folder / "slots.sqlite")},
        }

    def check_allocation(self, device_ids: Sequence[str], allocation: ContainerAllocation, folder: Path) -> None:
        assert allocation == ContainerAllocation(
            envs={"DEVPLUG_SHARED_SLOTS": ",".join(device_ids), "DEVPLUG_SHARED_NODE": NODE}
        )

    def bad_options(self, folder: Path) -> Mapping[str, Any]:
        return {**self.options(folder), "capacity": 0}
