"""A :class:`~devplug.context.DeviceSink` that records what a driver pushes, for unit tests of a driver.

Give it to a :class:`~devplug.DriverContext` where the engine would give its
device table::

    sink = RecordingSink()
    driver.start(DriverContext("example.com/x", state_dir, sink))
    (folder / "dev7").touch()
    assert sink.wait_for(lambda table: "dev7" in table)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

from devplug.types import Device

__all__ = ["PUSH_KINDS", "Push", "RecordingSink"]

#: The kinds of push a driver can make through its context.
PUSH_KINDS = ("replace", "update", "relist")


@dataclass(frozen=True)
class Push(Sequence[Device]):
    """One push a driver made through its context; as a sequence, the devices it sent.

    ``kind``: ``"replace"`` (``ctx.set_devices``), ``"update"``
    (``ctx.update_devices``; ``removed`` holds the IDs it dropped) or
    ``"relist"`` (``ctx.request_relist``, no devices).
    """

    kind: str
    devices: tuple[Device, ...] = ()
    removed: tuple[str, ...] = ()

    @overload
    def __getitem__(self, index: int) -> Device: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Device]: ...

    def __getitem__(self, index: int | slice) -> Device | Sequence[Device]:
        return self.devices[index]

    def __len__(self) -> int:
        return len(self.devices)

    def __iter__(self) -> Iterator[Device]:
        return iter(self.devices)


class RecordingSink:
    """Keeps every push (:attr:`pushes`, oldest first) and the engine's resulting view (:attr:`table`).

    Thread-safe: drivers push from their own threads. ``kinds`` are the pushes
    the driver under test may make; any other fails the test with an
    ``AssertionError`` in the pushing thread (a driver documented to push
    whole lists passes ``kinds=("replace",)``).
    """

    def __init__(self, kinds: Collection[str] = PUSH_KINDS) -> None:
        unknown = set(kinds) - set(PUSH_KINDS)
        if unknown:
            raise ValueError(f"unknown push kinds {sorted(unknown)}; expected some of {PUSH_KINDS}")
        self.kinds = frozenset(kinds)
        self.pushes: list[Push] = []
        self.table: dict[str, Device] = {}
        #: The latest ``ctx.publish_status`` data, or None.
        self.published: dict[str, Any] | None = None
        #: The latest ``ctx.report_problem`` reason, or None.
        self.problem: str | None = None
        self._cond = threading.Condition()

    def _allow(self, kind: str) -> None:
        if kind not in self.kinds:
            raise AssertionError(f"the driver made a {kind!r} push; this test expects only {sorted(self.kinds)}")

    def replace_devices(self, devices: list[Device]) -> None:
        """``ctx.set_devices``: the whole list."""
        self._allow("replace")
        with self._cond:
            self.pushes.append(Push("replace", tuple(devices)))
            self.table = {d.id: d for d in devices}
            self._cond.notify_all()

    def update_devices(self, changed: list[Device], removed: list[str]) -> None:
        """``ctx.update_devices``: added or changed devices, and the IDs removed."""
        self._allow("update")
        with self._cond:
            self.pushes.append(Push("update", tuple(changed), tuple(removed)))
            for dev in changed:
                self.table[dev.id] = dev
            for dev_id in removed:
                self.table.pop(dev_id, None)
            self._cond.notify_all()

    def publish_status(self, data: dict[str, Any]) -> None:
        """``ctx.publish_status``: the latest is kept as :attr:`published`."""
        with self._cond:
            self.published = data
            self._cond.notify_all()

    def report_problem(self, problem: str | None) -> None:
        """``ctx.report_problem``: the latest is kept as :attr:`problem`."""
        with self._cond:
            self.problem = problem
            self._cond.notify_all()

    def request_relist(self) -> None:
        """``ctx.request_relist``: recorded only (a test calls ``list_devices`` itself)."""
        self._allow("relist")
        with self._cond:
            self.pushes.append(Push("relist"))
            self._cond.notify_all()

    def load(self, devices: Sequence[Device]) -> None:
        """Set the table as the engine does after calling ``list_devices`` (not a push)."""
        with self._cond:
            self.table = {d.id: d for d in devices}

    def wait_for(self, predicate: Callable[[dict[str, Device]], bool], timeout: float = 5.0) -> bool:
        """Wait until the table satisfies ``predicate``; False when ``timeout`` seconds passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self.table), timeout=timeout)
