"""The ``tcp`` discovery handler: network devices that accept a TCP connection.

::

    discovery = { handler = "tcp", targets = { cam-a = "10.0.0.5:554", plc-1 = "[fd00::7]:4840" },
                  interval = 5.0, timeout = 1.0 }

Every ``interval`` seconds each target is probed with a TCP connect (closed at
once) that must succeed within ``timeout`` seconds. A target that refuses,
times out or is unreachable is reported unavailable, so its slots are
advertised unhealthy; one that answers again is available again. The container
gets the address as ``DEVPLUG_SHARED_ADDRESS_<DEVICE>`` (see the driver).
"""

from __future__ import annotations

import math
import socket
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar

from devplug_shared.discovery import DiscoveredDevice, OnChange
from devplug_shared.slots import check_device_name

__all__ = ["TcpDiscovery", "TcpOptions", "parse_address"]


def parse_address(text: str, where: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port); ``ValueError`` naming ``where`` otherwise."""
    host, sep, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{where}: {text!r} is not host:port (a port 1-65535; IPv6 as [addr]:port)")
    return host, int(port_text)


@dataclass(frozen=True)
class TcpOptions:
    """``targets``: device name -> ``host:port``; ``interval``/``timeout``: seconds between probes / per probe."""

    targets: dict[str, str] = field(default_factory=dict)
    interval: float = 5.0
    timeout: float = 1.0

    def __post_init__(self) -> None:
        if not self.targets:
            raise ValueError("targets: name at least one device = 'host:port'")
        for name, address in self.targets.items():
            check_device_name(name, f"targets.{name}")
            parse_address(address, f"targets.{name}")
        for key in ("interval", "timeout"):
            value = getattr(self, key)
            if not math.isfinite(value) or not 0.01 <= value <= 3600:
                raise ValueError(f"{key}: must be 0.01-3600 seconds, got {value!r}")


class TcpDiscovery:
    """Probes each target with a TCP connect on an interval, from a thread of its own."""

    Options: ClassVar[type[TcpOptions]] = TcpOptions

    def __init__(self, options: TcpOptions) -> None:
        self.options = options
        self._targets = {name: parse_address(addr, f"targets.{name}") for name, addr in options.targets.items()}
        self._state: dict[str, bool] = dict.fromkeys(self._targets, False)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=min(16, len(self._targets)), thread_name_prefix="shared-tcp")

    def probe(self, name: str) -> bool:
        """Whether ``name``'s target accepts a TCP connection within the timeout now."""
        host, port = self._targets[name]
        try:
            with socket.create_connection((host, port), timeout=self.options.timeout):
                return True
        except OSError:
            return False

    def _probe_all(self) -> bool:
        """Probe every target at once; True when any availability changed."""
        names = list(self._targets)
        results = dict(zip(names, self._pool.map(self.probe, names), strict=True))
        with self._lock:
            changed = results != self._state
            self._state = results
        return changed

    def start(self, on_change: OnChange) -> None:
        """Probe once now (so the first device list is true), then every ``interval`` in a thread."""
        self._stopping.clear()
        self._probe_all()

        def loop() -> None:
            while not self._stopping.wait(self.options.interval):
                if self._probe_all() and not self._stopping.is_set():
                    on_change(self.devices())

        self._thread = threading.Thread(target=loop, name="shared-tcp-discovery", daemon=True)
        self._thread.start()

    def devices(self) -> Sequence[DiscoveredDevice]:
        """Every target, available when its last probe connected."""
        with self._lock:
            state = dict(self._state)
        return [
            DiscoveredDevice(name, state[name], MappingProxyType({"address": self.options.targets[name]}))
            for name in self._targets
        ]

    def stop(self) -> None:
        """Stop probing."""
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(self.options.timeout + 1.0)
