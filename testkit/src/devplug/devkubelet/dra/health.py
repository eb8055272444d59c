"""The kubelet's DRA device health: the cache fed by each driver's NodeWatchResources stream.

Follows ``pkg/kubelet/cm/dra/healthinfo.go`` and ``Manager.HandleWatchResourcesStream``
in ``pkg/kubelet/cm/dra/manager.go`` (Kubernetes 1.36, KEP-4680):

* each message is the driver's complete list. A reported device gets the
  health sent (anything but HEALTHY or UNHEALTHY is Unknown), its message
  (over 1024 bytes: cut to 1021 and ``...`` appended, ``truncateHealthMessage``),
  its timeout (``health_check_timeout_seconds`` when above 0, else
  ``DefaultHealthTimeout``, 30 s) and, as its last update, the time the
  kubelet received the message: the plugin's ``last_updated_time`` is
  overwritten (``updateHealthInfo`` sets ``LastUpdated = now``);
* a device the cache knows but the message leaves out turns Unknown (message
  cleared) when a later message arrives after its timeout (``updateHealthInfo``
  phase 2); and whoever reads a device whose last update is older than its
  timeout gets Unknown with no message (``getHealthInfo``), so a device the
  driver stops reporting, or whose driver goes silent, reads Unknown once its
  timeout has passed;
* a device never reported reads Unknown;
* when a stream ends (end of stream, error, or the plugin deregistered) the
  driver's whole entry is cleared (``clearDriver``): its devices read Unknown;
* the cache is saved to ``dra_health_state`` in the kubelet's root directory
  when something changed and read back at start (``newHealthInfoCache``; a
  file that does not parse is ignored).

A device whose report times out raises no event in the kubelet; here the
cache calls ``changed`` at that moment too, so that tests can wait for it.

Per release (``k8s.io/kubelet`` ``pkg/apis/dra-health/v1alpha1/api.proto`` at
each ``kubernetes-1.3x.0`` tag, ``state/state.go``): 1.32 and 1.33 have no DRA
health at all (no API, no ``healthinfo.go``: the cache stays empty and no file
is kept); 1.34 knows fields 1 to 3 only, so every device has
``DefaultHealthTimeout`` and no message (``read_timeouts``, ``read_messages``
False), and its ``DeviceHealth`` has no ``HealthCheckTimeout`` nor
``Message``; 1.35 adds ``health_check_timeout_seconds`` (and
``HealthCheckTimeout``); 1.36 adds ``message``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from devplug.api.gen.drahealth.v1alpha1 import api_pb2 as health_pb
from devplug.devkubelet.checkpointing import write_file_atomically
from devplug.devkubelet.dra.model import DeviceHealth, HealthStatus

__all__ = ["DEFAULT_HEALTH_TIMEOUT", "HEALTH_STATE_FILE", "MESSAGE_MAX_LENGTH", "HealthInfoCache", "truncate_message"]

_log = logging.getLogger("devplug.devkubelet")

#: ``DefaultHealthTimeout``: how long a report stays valid when the plugin gives no timeout.
DEFAULT_HEALTH_TIMEOUT = 30.0
#: ``v1.ResourceHealthMessageMaxLength``, in bytes.
MESSAGE_MAX_LENGTH = 1024
#: The health cache's file, in the kubelet's root directory.
HEALTH_STATE_FILE = "dra_health_state"

_HEALTH = {health_pb.HEALTHY: HealthStatus.HEALTHY, health_pb.UNHEALTHY: HealthStatus.UNHEALTHY}


def truncate_message(message: str) -> str:
    """``truncateHealthMessage``: at most 1024 bytes; longer ones cut to 1021 bytes and ``...`` appended.

    The cut is on bytes, as Go slices a string; a character cut in two shows as U+FFFD.
    """
    raw = message.encode("utf-8")
    if len(raw) <= MESSAGE_MAX_LENGTH:
        return message
    return raw[: MESSAGE_MAX_LENGTH - 3].decode("utf-8", errors="replace") + "..."


@dataclass(frozen=True)
class _Entry:
    """``state.DeviceHealth`` in the cache: the last report of one device."""

    pool: str
    device: str
    health: HealthStatus
    message: str
    timeout: float  # seconds
    updated: float  # wall-clock seconds: when the kubelet received it


def _go_time(seconds: float) -> str:
    """``time.Time`` as Go's JSON writes it (RFC 3339 with nanoseconds, UTC)."""
    stamp = datetime.fromtimestamp(seconds, tz=timezone.utc)
    nanos = round((seconds - int(seconds)) * 1e9) % 1_000_000_000
    text = stamp.strftime("%Y-%m-%dT%H:%M:%S")
    return text + (f".{nanos:09d}".rstrip("0") if nanos else "") + "Z"


def _from_go_time(text: str) -> float:
    head, _, frac = text.rstrip("Z").partition(".")
    base = datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    return base + (int(frac.ljust(9, "0")[:9]) / 1e9 if frac else 0.0)


class HealthInfoCache:
    """``healthInfoCache``: the last report of every device, per driver, with timeouts.

    ``changed`` is called whenever what a reader would get may have changed
    (a report, a clear, a timeout passing); ``clock`` gives wall-clock seconds;
    ``read_timeouts`` and ``read_messages`` say whether the release's API has
    those fields (see the module docstring).
    """

    def __init__(
        self,
        state_file: Path | None,
        *,
        default_timeout: float = DEFAULT_HEALTH_TIMEOUT,
        changed: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
        read_timeouts: bool = True,
        read_messages: bool = True,
    ) -> None:
        self.state_file = state_file
        self.default_timeout = default_timeout
        #: Whether the release reads ``health_check_timeout_seconds`` (1.35+) and ``message`` (1.36+).
        self.read_timeouts = read_timeouts
        self.read_messages = read_messages
        self._changed = changed
        self._clock = clock
        self._drivers: dict[str, dict[str, _Entry]] = {}
        self._timers: dict[tuple[str, str], asyncio.TimerHandle] = {}
        self._load()

    # -- reading ---------------------------------------------------------------------------------

    def get(self, driver: str, pool: str, device: str) -> DeviceHealth:
        """``getHealthInfo``: the device's health now (Unknown, no message, when unknown or timed out)."""
        entry = self._drivers.get(driver, {}).get(f"{pool}/{device}")
        if entry is None or self._clock() - entry.updated > entry.timeout:
            return DeviceHealth(driver, pool, device, HealthStatus.UNKNOWN, "")
        return DeviceHealth(driver, pool, device, entry.health, entry.message)

    def devices(self, driver: str) -> list[DeviceHealth]:
        """Every device the cache holds for ``driver``, as :meth:`get` answers for it, by pool and name."""
        keys = sorted((e.pool, e.device) for e in self._drivers.get(driver, {}).values())
        return [self.get(driver, pool, device) for pool, device in keys]

    # -- writing ---------------------------------------------------------------------------------

    def update(self, driver: str, message: Any) -> list[DeviceHealth]:
        """``updateHealthInfo`` with one ``NodeWatchResourcesResponse``; the devices whose report changed."""
        now = self._clock()
        current = self._drivers.setdefault(driver, {})
        reported: set[str] = set()
        changed: list[_Entry] = []
        for item in message.devices:
            timeout = float(item.health_check_timeout_seconds) if self.read_timeouts else 0.0
            entry = _Entry(
                pool=item.device.pool_name,
                device=item.device.device_name,
                health=_HEALTH.get(item.health, HealthStatus.UNKNOWN),
                message=truncate_message(item.message) if self.read_messages else "",
                timeout=timeout if timeout > 0 else self.default_timeout,
                updated=now,
            )
            key = f"{entry.pool}/{entry.device}"
            reported.add(key)
            old = current.get(key)
            if old is None or (old.health, old.message, old.timeout) != (entry.health, entry.message, entry.timeout):
                changed.append(entry)
            current[key] = entry
        for key, old in list(current.items()):
            if key not in reported and old.health is not HealthStatus.UNKNOWN and now - old.updated > old.timeout:
                expired = replace(old, health=HealthStatus.UNKNOWN, message="", updated=now)
                current[key] = expired
                changed.append(expired)
        if changed:
            self._save()
        for entry in current.values():
            self._arm_expiry(driver, entry)
        self._changed()
        return [DeviceHealth(driver, e.pool, e.device, e.health, e.message) for e in changed]

    def clear_driver(self, driver: str) -> None:
        """``clearDriver``: forget every report of ``driver`` (its devices read Unknown)."""
        self._drivers.pop(driver, None)
        for key in [k for k in self._timers if k[0] == driver]:
            self._timers.pop(key).cancel()
        self._save()
        self._changed()

    def close(self) -> None:
        """Cancel the expiry notifications (the cache keeps its content)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def _arm_expiry(self, driver: str, entry: _Entry) -> None:
        key = (driver, f"{entry.pool}/{entry.device}")
        old = self._timers.pop(key, None)
        if old is not None:
            old.cancel()
        if entry.health is HealthStatus.UNKNOWN:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        delay = entry.updated + entry.timeout - self._clock()
        self._timers[key] = loop.call_later(max(delay, 0.0) + 0.001, self._expired, key)

    def _expired(self, key: tuple[str, str]) -> None:
        self._timers.pop(key, None)
        self._changed()

    # -- dra_health_state ------------------------------------------------------------------------

    def _save(self) -> None:
        """``saveToCheckpointInternal``: the whole cache as JSON; a failure is logged, never raised."""
        if self.state_file is None:
            return
        data = {
            driver: {"Devices": {key: self._saved(e) for key, e in sorted(entries.items())}}
            for driver, entries in sorted(self._drivers.items())
        }
        try:
            write_file_atomically(self.state_file, json.dumps(data, separators=(",", ":")).encode())
        except OSError as exc:
            _log.warning("dev kubelet: saving %s failed (device health is lost at a restart): %s", self.state_file, exc)

    def _saved(self, entry: _Entry) -> dict[str, Any]:
        """One ``state.DeviceHealth`` with the fields of the release's struct."""
        saved: dict[str, Any] = {
            "PoolName": entry.pool,
            "DeviceName": entry.device,
            "Health": entry.health.value,
            "LastUpdated": _go_time(entry.updated),
        }
        if self.read_timeouts:
            saved["HealthCheckTimeout"] = round(entry.timeout * 1e9)
        if self.read_messages:
            saved["Message"] = entry.message
        return saved

    def _load(self) -> None:
        """``loadFromCheckpoint``; a file that cannot be read is logged and ignored (an empty cache)."""
        if self.state_file is None or not self.state_file.exists():
            return
        try:
            data = json.loads(self.state_file.read_bytes())
            for driver, state in data.items():
                entries = self._drivers.setdefault(driver, {})
                for key, raw in (state.get("Devices") or {}).items():
                    timeout = float(raw.get("HealthCheckTimeout", 0)) / 1e9
                    entries[key] = _Entry(
                        pool=str(raw["PoolName"]),
                        device=str(raw["DeviceName"]),
                        health=HealthStatus(raw["Health"]),
                        message=str(raw.get("Message", "")),
                        timeout=timeout if timeout > 0 else self.default_timeout,
                        updated=_from_go_time(str(raw["LastUpdated"])),
                    )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            _log.warning("dev kubelet: %s does not load, starting with no device health: %s", self.state_file, exc)
            self._drivers.clear()

    def arm(self) -> None:
        """Arm the expiry notifications of what was loaded (once an event loop runs)."""
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop()
            for driver, entries in self._drivers.items():
                for entry in entries.values():
                    self._arm_expiry(driver, entry)
