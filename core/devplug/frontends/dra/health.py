"""The DRA health service (KEP-4680): every device's health, with the driver's reason, streamed to the kubelet.

``v1alpha1.DRAResourceHealth/NodeWatchResources`` (``k8s.io/kubelet/pkg/apis/dra-health/v1alpha1``,
Kubernetes 1.36) is a server stream; each message is the driver's complete list
of devices (``DeviceHealth``: pool and device name, ``HEALTHY``/``UNHEALTHY``,
``last_updated_time`` in Unix seconds, ``health_check_timeout_seconds`` and, from
1.36, ``message``). The kubelet keeps what the last message said per device and
turns a device it has not heard of for ``health_check_timeout_seconds`` into
``Unknown`` (its default when the field is 0: 30 s); it shows the result in the
pod's ``status.containerStatuses[].allocatedResourcesStatus``.

What is sent, from the device table:

* a device the driver reports unhealthy: ``UNHEALTHY`` with the driver's reason
  (:class:`~devplug.types.HealthReport`) as the message, cut to the kubelet's
  1024 bytes;
* a device the core withholds (being released) or a degraded resource:
  ``UNHEALTHY`` with why;
* every other device: ``HEALTHY``, a part withheld only because its parent's
  counters are taken (issue 41, KEP-4815) among them: it is sound, only in use
  elsewhere (the scheduler learns that from the counters, or from the slice's
  ``blocked`` taint);
* a shared device published as one device with consumable capacity (issue 41,
  KEP-5075, ``consumable``): one entry under the physical device's name, as the
  pool publishes it (the kubelet matches health to a claim's devices by pool and
  name), ``UNHEALTHY`` when the device is, or when every replica is withheld,
  as :mod:`~devplug.frontends.dra.slicecontent` taints it.

A message is sent when the stream opens, at every change of the table, and at
least every :data:`RESEND_S` seconds, with a timeout of :data:`TIMEOUT_S` (three
resends): a daemon that stops answering turns its devices ``Unknown`` within
that time, and a live one never does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from devplug.api.gen.drahealth.v1alpha1 import api_pb2 as health_pb
from devplug.api.gen.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from devplug.engine import DeviceTable
from devplug.frontends.dra.devicenames import device_name

__all__ = ["MAX_MESSAGE_BYTES", "RESEND_S", "TIMEOUT_S", "HealthService", "health_report"]

#: How often the full list is sent even when nothing changed.
RESEND_S = 10.0
#: ``health_check_timeout_seconds``: a device not heard of for this long is Unknown to the kubelet.
TIMEOUT_S = 30
#: The kubelet keeps at most this many bytes of a message.
MAX_MESSAGE_BYTES = 1024


def _cut(message: str) -> str:
    data = message.encode()
    if len(data) <= MAX_MESSAGE_BYTES:
        return message
    return data[:MAX_MESSAGE_BYTES].decode(errors="ignore")


def _published(table: DeviceTable, consumable: bool) -> list[tuple[str, tuple[str, ...]]]:
    """Each device as the pool publishes it: its ID and the advertised IDs it stands for (a shared device in the
    consumable form: the physical ID and its replicas; else each advertised ID alone)."""
    if not consumable or not table.shared:
        return [(i, (i,)) for i in table.ids]
    out = []
    for dev in table.physical_devices():
        replicas = table.replica_ids(dev.id)
        if len(replicas) > 1:
            out.append((dev.id, replicas))
        else:
            out.extend((i, (i,)) for i in replicas)
    return out


def health_report(
    table: DeviceTable, pool: str, now: float, timeout: int = TIMEOUT_S, *, consumable: bool = False
) -> Any:
    """One ``NodeWatchResourcesResponse``: every published device of ``table`` (see the module's docstring);
    ``consumable``: shared devices are published as one device with consumable capacity."""
    devices = []
    degraded = table.degraded
    withheld = table.withheld.difference(table.partition_blocked)
    for device_id, advertised in sorted(_published(table, consumable)):
        dev = table.reported(advertised[0])
        if dev is None:
            continue
        if degraded is not None:
            status, message = health_pb.UNHEALTHY, f"the resource is degraded: {degraded}"
        elif not dev.healthy:
            status, message = health_pb.UNHEALTHY, dev.reason or "the driver reports it unhealthy"
        elif all(i in withheld for i in advertised):
            status, message = health_pb.UNHEALTHY, "being released (cleaned) after its previous claim"
            if len(advertised) > 1:
                message = f"every share is {message}"
        else:
            status, message = health_pb.HEALTHY, ""
        devices.append(
            health_pb.DeviceHealth(
                device=health_pb.DeviceIdentifier(pool_name=pool, device_name=device_name(device_id)),
                health=status,
                last_updated_time=int(now),
                health_check_timeout_seconds=timeout,
                message=_cut(message),
            )
        )
    return health_pb.NodeWatchResourcesResponse(devices=devices)


class HealthService(health_grpc.DRAResourceHealthServicer):  # type: ignore[misc]
    """``v1alpha1.DRAResourceHealth`` for one resource's device table."""

    def __init__(
        self,
        table: DeviceTable,
        pool: str,
        *,
        resend: float = RESEND_S,
        timeout: int = TIMEOUT_S,
        clock: Callable[[], float] = time.time,
        on_stream: Callable[[], None] = lambda: None,
        consumable: Callable[[], bool] = lambda: False,
    ) -> None:
        self.table = table
        self.pool = pool
        #: Whether shared devices are published as one device with consumable capacity now (the publisher's
        #: choice, which a rediscovery may change).
        self._consumable = consumable
        self.resend = resend
        self.timeout = timeout
        self._clock = clock
        #: Called when the kubelet opens a stream (a kubelet of 1.34 or later: see the DRA kubelet rule).
        self._on_stream = on_stream
        #: How many NodeWatchResources streams are open (for status).
        self.streams = 0

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        self.streams += 1
        self._on_stream()
        try:
            async for report in self.reports():
                yield report
        finally:
            self.streams -= 1

    async def reports(self) -> AsyncIterator[Any]:
        """The stream's messages: now, after each change of the table, and every ``resend`` seconds."""
        while True:
            version = self.table.version
            yield health_report(self.table, self.pool, self._clock(), self.timeout, consumable=self._consumable())
            change = self.table.next_change(version)  # shared with other waiters: never cancelled here
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(change), self.resend)
