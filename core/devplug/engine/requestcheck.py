"""The checks a request passes before any hook sees it: device IDs known, healthy, each named once, not beyond a
device's replicas; a refusal names every bad ID and says that nothing was done."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from devplug.engine.devicetable import DeviceTable
from devplug.engine.ledger import Ledger
from devplug.errors import DeviceBusyError, RequestError
from devplug.text.logsafe import id_list

__all__ = ["RequestChecks"]


def _ids(ids: Iterable[str]) -> str:
    """Device IDs for a message: at most a few, escaped, and a count of the rest."""
    return id_list(list(ids))


class RequestChecks:
    """Checks of requested device IDs against one resource's device table and ledger."""

    def __init__(self, resource_name: str, table: DeviceTable, ledger: Ledger) -> None:
        self.resource_name = resource_name
        self.table = table
        self.ledger = ledger

    def reported_healthy(self, device_id: str) -> bool:
        """The driver reports the device healthy and the resource is not degraded."""
        dev = self.table.reported(device_id)
        return dev is not None and dev.healthy and self.table.degraded is None

    def known(self, containers: Sequence[Sequence[str]], call: str) -> None:
        """Unknown (neither advertised nor held), duplicate or no IDs: refuse the whole request."""
        self._refuse_bad_ids(
            containers,
            known=lambda i: i in self.table or self.ledger.holds(i),
            healthy=None,
            prefix=f"{self.resource_name}: {call}: ",
            outcome="nothing was done",
        )

    def servable(self, containers: Sequence[Sequence[str]], flat: Sequence[str]) -> None:
        """Every device must be known and healthy as the driver reports it, and the resource not retired.

        A device withheld (advertised unhealthy) only while a release of it
        runs passes: the admission waits for that release. ``flat``: every ID of ``containers``, in order.
        """
        unique = set(flat)
        if len(unique) == len(flat) and unique and self.table.all_reported_healthy(unique):
            return  # the common case, in set operations; otherwise the checks below name what is wrong
        self.not_retired("nothing was allocated")
        self._refuse_bad_ids(
            containers,
            known=lambda i: self.table.reported(i) is not None,
            healthy=self.reported_healthy,
            prefix=f"{self.resource_name}: ",
            outcome="nothing was allocated",
        )

    def not_retired(self, outcome: str) -> None:
        """A resource removed from the config (draining) advertises nothing: no kubelet asks it for devices."""
        if self.table.retired is not None:
            raise RequestError(f"{self.resource_name}: {self.table.retired}; {outcome}")

    def within_replicas(self, requested: Sequence[str]) -> None:
        """A device whose replica count was lowered while more allocations held it takes no new tenant until the
        excess ended: the replicas held and requested together may not outnumber its count now."""
        wanted: dict[str, set[str]] = {}
        for dev_id in requested:
            wanted.setdefault(self.table.physical_of(dev_id), set()).add(dev_id)
        for phys, ids in wanted.items():
            held = set(self.table.held_replicas(phys, self.ledger.holds))
            count = self.table.replica_count(phys)
            if len(held | ids) > count:
                raise DeviceBusyError(
                    f"{self.resource_name}: {phys} is advertised as {count} replica(s) now (its count was lowered) "
                    f"and allocations still hold {len(held)} of its replicas ({_ids(sorted(held))}): no new tenant "
                    "until they end; nothing was allocated"
                )

    def one_each(self, containers: Sequence[Sequence[str]]) -> None:
        """``fail_requests_greater_than_one``: a container asking for several devices (replicas) is refused."""
        for number, ids in enumerate(containers):
            if len(ids) > 1:
                raise RequestError(
                    f"{self.resource_name}: container #{number} of the request asks for {len(ids)} devices "
                    f"({_ids(ids)}) and the resource sets fail_requests_greater_than_one: each container may have "
                    "one replica; nothing was allocated"
                )

    def _refuse_bad_ids(
        self,
        containers: Sequence[Sequence[str]],
        *,
        known: Callable[[str], bool],
        healthy: Callable[[str], bool] | None,
        prefix: str,
        outcome: str,
    ) -> None:
        """Raise one :class:`RequestError` naming unknown, unhealthy and duplicate IDs (or none at all)."""
        unknown: list[str] = []
        unhealthy: list[str] = []
        duplicate: list[str] = []
        seen: set[str] = set()
        for ids in containers:
            for dev_id in ids:
                if dev_id in seen:
                    duplicate.append(dev_id)
                seen.add(dev_id)
                if not known(dev_id):
                    unknown.append(dev_id)
                elif healthy is not None and not healthy(dev_id):
                    unhealthy.append(dev_id)
        problems = []
        if unknown:
            problems.append(f"unknown device IDs: {_ids(unknown)}")
        if unhealthy:
            problems.append(f"unhealthy device IDs: {_ids(unhealthy)}")
        if duplicate:
            problems.append(f"duplicate device IDs: {_ids(sorted(set(duplicate)))}")
        if not seen and not problems:
            problems.append("no device IDs requested")
        if problems:
            raise RequestError(prefix + "; ".join(problems) + f"; {outcome}")
