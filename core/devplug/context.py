"""What a driver instance gets from the engine when it starts.

A :class:`DriverContext` is handed to the ``start`` hook. Through it a driver
learns its resource name and its own state folder, logs with the resource name
attached, and pushes device changes (hot-plug, health) as they happen instead
of waiting to be polled. Its push methods are thread-safe: a driver may call
them from its own watcher threads.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import Any, Protocol

from devplug.types import Device

__all__ = ["DeviceSink", "DriverContext"]


#: The most a driver may publish with :meth:`DriverContext.publish_status`, encoded as JSON.
MAX_STATUS_BYTES = 64 * 1024


class DeviceSink(Protocol):
    """Where pushed device changes go: the engine's device table, or a test's recorder."""

    def replace_devices(self, devices: list[Device]) -> None:
        """Replace the whole device list (thread-safe)."""

    def update_devices(self, changed: list[Device], removed: list[str]) -> None:
        """Add or replace ``changed`` and drop the IDs in ``removed`` (thread-safe)."""

    def request_relist(self) -> None:
        """Ask for a fresh call of ``list_devices`` soon (thread-safe)."""

    def publish_status(self, data: dict[str, Any]) -> None:
        """Replace the driver's own status shown by ``devplug status`` (thread-safe; already checked as JSON)."""

    def report_problem(self, problem: str | None) -> None:
        """Note why the driver cannot follow its devices now, or ``None`` once it can again (thread-safe).

        Optional for sinks written before it: :meth:`DriverContext.report_problem` only logs without it.
        """


class _ResourceLogAdapter(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Prefixes every message with the resource name and puts it in ``extra`` for JSON logs."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        extra = dict(self.extra or {})
        extra.update(kwargs.get("extra") or {})
        kwargs["extra"] = extra
        device = extra.get("device")
        where = f"{extra['resource']}" + (f" {device}" if device else "")
        return f"[{where}] {msg}", kwargs


class DriverContext:
    """The engine's side of one driver instance: identity, storage, logging, and device pushes."""

    def __init__(self, resource_name: str, state_dir: Path, sink: DeviceSink) -> None:
        self._resource_name = resource_name
        self._state_dir = state_dir
        self._sink = sink
        self._log = _ResourceLogAdapter(logging.getLogger("devplug.driver"), {"resource": resource_name})

    @property
    def resource_name(self) -> str:
        """The extended resource name this driver instance serves, e.g. ``example.com/mock``."""
        return self._resource_name

    @property
    def state_dir(self) -> Path:
        """A folder of this resource's own, kept across restarts and reboots, for the driver's durable files.

        It exists when ``start`` is called. Write files in it atomically
        (:func:`devplug.atomic.write_atomic`).
        """
        return self._state_dir

    @property
    def log(self) -> logging.LoggerAdapter:  # type: ignore[type-arg]
        """A logger whose lines carry the resource name; pass ``extra={"device": id}`` to name a device."""
        return self._log

    def set_devices(self, devices: Iterable[Device]) -> None:
        """Replace the resource's whole device list; the kubelet sees it at once."""
        self._sink.replace_devices(list(devices))

    def update_devices(self, changed: Iterable[Device] = (), removed: Iterable[str] = ()) -> None:
        """Add or replace the ``changed`` devices and drop the ``removed`` IDs.

        Cheaper than :meth:`set_devices` for large resources: only what
        changed is encoded again.
        """
        self._sink.update_devices(list(changed), list(removed))

    def request_relist(self) -> None:
        """Ask the engine to call ``list_devices`` again soon (e.g. after an event the driver cannot decode)."""
        self._sink.request_relist()

    def publish_status(self, data: Mapping[str, Any]) -> None:
        """Show ``data`` under the resource in ``devplug status`` (``driver_status``), replacing what was there.

        For what an operator needs beyond the devices' health: who holds a
        shared slot, which card is quarantined and why. ``data`` must be JSON
        (objects, lists, strings, numbers) and at most
        :data:`MAX_STATUS_BYTES` once encoded; :class:`ValueError` otherwise.
        Callable from any thread; cheap enough to call on every change.
        """
        try:
            encoded = json.dumps(data, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{self._resource_name}: publish_status needs JSON data: {exc}") from None
        if len(encoded) > MAX_STATUS_BYTES:
            raise ValueError(
                f"{self._resource_name}: publish_status data is {len(encoded)} bytes, more than {MAX_STATUS_BYTES}"
            )
        self._sink.publish_status(json.loads(encoded))

    def report_problem(self, problem: str | None) -> None:
        """Say why the driver cannot follow its devices now (a one-line reason), or ``None`` once it can again.

        For a long-running part of the driver that is broken while the
        resource still serves: a folder watch whose folder became a file
        (:class:`devplug.host.watch.DirectoryWatcher` takes this method as its
        ``on_problem``), an event stream that keeps failing. While a problem
        is set, ``devplug status`` names it under the resource
        (``driver_problem``) and exits non-zero, and ``/readyz`` answers 503.
        The latest call wins; a driver's stop clears it. Callable from any
        thread; cheap when nothing changed.
        """
        if problem is not None and (not isinstance(problem, str) or not problem.strip()):
            raise ValueError(f"{self._resource_name}: report_problem needs a reason (a non-empty string) or None")
        report = getattr(self._sink, "report_problem", None)
        if report is None:  # a sink written before report_problem
            if problem is not None:
                self._log.warning("problem: %s", problem)
            return
        report(problem)
