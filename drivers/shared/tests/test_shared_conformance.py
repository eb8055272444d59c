"""devplug-shared against the kit's driver contract checks: one node, two statically discovered devices of one
slot each, claims coordinated through the ``local`` store (a SQLite file in the test's folder), and again through
a real etcd (the suite's ``etcd_server``, a key prefix of the test's own) and through the Lease API model
(:class:`devplug.testing.leaseapi.LeaseApiServer`, one per test).

The daemon under test loads ``shared-slow-store`` (:mod:`shared_on_slow_store`, a test double declared through
``test_drivers``): the real driver, its store calls for the slots named in ``<folder>/slow-store`` waiting while
that file exists, which is how :meth:`TestSharedConformance.slow_release` stretches one slot's release (its store
call hangs) while the other slot is claimed and released as ever. Its hook calls are recorded by the kit's
stand-in.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from devplug import ContainerAllocation
from devplug.testing.conformance import DriverConformance
from devplug.testing.leaseapi import LeaseApiServer

HERE = Path(__file__).resolve().parent
NODE = "node-a"
#: The flag file of :class:`shared_on_slow_store.SlowStore`, in the test's folder: the slots whose store calls wait.
SLOW_STORE_FILE = "slow-store"


class TestSharedConformance(DriverConformance):
    driver = "shared-slow-store"
    test_drivers: ClassVar[Mapping[str, str]] = {"shared-slow-store": "shared_on_slow_store:SharedOnSlowStore"}
    python_path = (HERE,)
    resource = "example.com/shared"
    records_itself = False
    device_count = 2
    release_hooks = ("deallocate",)  # the shared driver has no post_stop hook
    bad_option_key = "capacity"

    def options(self, folder: Path) -> Mapping[str, Any]:
        return {
            "discovery": {"handler": "static", "devices": ["cam-a", "cam-b"]},
            "node_name": NODE,
            "coordination": self.coordination(folder),
            "slow_store": str(folder / SLOW_STORE_FILE),
        }

    def coordination(self, folder: Path) -> dict[str, Any]:
        """The ``coordination`` table: the ``local`` store in ``folder``."""
        return {"backend": "local", "path": str(folder / "slots.sqlite")}

    def check_allocation(self, device_ids: Sequence[str], allocation: ContainerAllocation, folder: Path) -> None:
        assert allocation == ContainerAllocation(
            envs={"DEVPLUG_SHARED_SLOTS": ",".join(device_ids), "DEVPLUG_SHARED_NODE": NODE}
        )

    def slow_release(self, folder: Path, device_id: str) -> bool:
        (folder / SLOW_STORE_FILE).write_text(f"{device_id}\n")  # only this slot's store calls wait
        return True

    def fast_release(self, folder: Path, device_id: str) -> None:
        (folder / SLOW_STORE_FILE).unlink()

    def bad_options(self, folder: Path) -> Mapping[str, Any]:
        return {**self.options(folder), "capacity": 0}


class TestSharedConformanceOnEtcd(TestSharedConformance):
    """The same checks with the claims in a real etcd (Debian's ``etcd``; skipped loudly without it, failed with
    ``DEVPLUG_REQUIRE_ETCD=1``), each test under a key prefix of its own."""

    etcd_url: str = ""
    prefix: str = ""

    @pytest.fixture(autouse=True)
    def _etcd(self, etcd_server: Any) -> None:
        self.etcd_url = etcd_server.url
        self.prefix = f"/devplug-conformance/{uuid.uuid4().hex[:12]}"

    def coordination(self, folder: Path) -> dict[str, Any]:
        return {"backend": "etcd", "endpoints": [self.etcd_url], "prefix": self.prefix}


class TestSharedConformanceOnKubernetes(TestSharedConformance):
    """The same checks with each slot's claim a ``coordination.k8s.io/v1`` Lease on the API server model."""

    api_url: str = ""

    @pytest.fixture(autouse=True)
    def _api(self) -> Iterator[None]:
        with LeaseApiServer() as api:
            self.api_url = api.url
            yield

    def coordination(self, folder: Path) -> dict[str, Any]:
        return {"backend": "kubernetes", "server": self.api_url, "namespace": "conformance"}
