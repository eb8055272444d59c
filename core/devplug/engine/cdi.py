"""Container Device Interface (CDI) spec files, and the Allocate answers that name their devices.

A driver describes what a container gets for each device once, as the
device's :attr:`~devplug.types.Device.allocation` (device nodes, mounts, envs,
annotations). From that the engine both

* writes one CDI spec file per resource, ``<spec_dir>/devplug-<vendor>_<class>.json``
  (atomically: a temporary file renamed over it), with one CDI device per
  described device and its device nodes, mounts and envs as ``containerEdits``;
  rewritten when the descriptions change, removed when none is left; and
* answers Allocate with the CDI names (``cdi_devices``, ``<kind>=<name>``) of
  the requested devices, plus, unless ``[cdi] fallback = false``, the same
  device nodes, mounts and envs as plain fields for runtimes that ignore CDI
  names. A runtime that applies both gets each node and mount once: CDI's
  container edits replace a device node or mount at the same container path
  (``pkg/cdi/container-edits.go`` in cncf-tags/container-device-interface).

The JSON follows the CDI specification (``SPEC.md`` of
github.com/cncf-tags/container-device-interface, spec version 1.1.0 at the
time of writing). ``cdiVersion`` is the lowest version that has every field
the file uses, as that project's ``MinimumRequiredVersion`` computes it, so
runtimes built on older CDI libraries load it: ``0.3.0``, ``0.5.0`` once a
device node has a ``hostPath`` or a device name starts with a digit, ``0.6.0``
when the kind's class holds a dot. Annotations stay in the Allocate answer
(they are the container's, which a CDI spec cannot carry).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from devplug.atomic import write_atomic
from devplug.engine.devicetable import DeviceTable
from devplug.engine.driver import AsyncDriver
from devplug.errors import AllocationConflictError, DriverError
from devplug.types import CDIDevice, ContainerAllocation, Replicas, merge_allocations

__all__ = [
    "AllocationAnswers",
    "CdiSpecs",
    "SPEC_FILE_PREFIX",
    "build_spec",
    "cdi_device_name",
    "minimum_version",
    "remove_stale_specs",
    "spec_file_name",
]

log = logging.getLogger("devplug.engine")

#: Every spec file devplug writes is named ``devplug-<vendor>_<class>.json``; others in the folder are left alone.
SPEC_FILE_PREFIX = "devplug-"
#: Spec files are read by the container runtime (root), and name only host paths: world-readable like /etc files.
SPEC_FILE_MODE = 0o644
#: How long a burst of device changes may run before the spec is rewritten (an Allocate never waits for this).
FOLLOW_DEBOUNCE_S = 0.1
#: How soon a failed spec write is tried again.
RETRY_S = 1.0

# CDI's pkg/parser ValidateDeviceName: letters, digits, '_', '-', '.', ':', starting and ending alphanumeric.
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
_NOT_NAME_CHAR = re.compile(r"[^A-Za-z0-9_.:-]")


def spec_file_name(kind: str) -> str:
    """The spec file of a kind: ``example.com/gpu`` -> ``devplug-example.com_gpu.json``."""
    vendor, _, cls = kind.partition("/")
    return f"{SPEC_FILE_PREFIX}{vendor}_{cls}.json"


@functools.lru_cache(maxsize=65536)
def cdi_device_name(device_id: str) -> str:
    """The CDI device name of a device ID: the ID itself when CDI accepts it, else a stable, distinct form.

    IDs with characters CDI refuses (``/``, ``@``, ...) have them replaced by
    ``_`` and get ``-`` and 8 hex digits of the ID's SHA-256, so two IDs never
    map to one name.
    """
    if _DEVICE_NAME.match(device_id):
        return device_id
    import hashlib  # only here: the run path does not load OpenSSL otherwise

    digest = hashlib.sha256(device_id.encode(errors="surrogatepass")).hexdigest()[:8]
    stem = _NOT_NAME_CHAR.sub("_", device_id).strip("_.:-")
    return f"{stem}-{digest}" if stem and stem[0].isalnum() else f"d-{digest}"


def _edits(allocation: ContainerAllocation) -> dict[str, Any]:
    edits: dict[str, Any] = {}
    if allocation.envs:
        edits["env"] = [f"{k}={v}" for k, v in sorted(allocation.envs.items())]
    if allocation.devices:
        nodes = []
        for spec in allocation.devices:
            node: dict[str, Any] = {"path": spec.container_path}
            if spec.host_path != spec.container_path:
                node["hostPath"] = spec.host_path
            node["permissions"] = spec.permissions
            nodes.append(node)
        edits["deviceNodes"] = nodes
    if allocation.mounts:
        edits["mounts"] = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "options": ["bind", "ro"] if m.read_only else ["bind"],
            }
            for m in allocation.mounts
        ]
    return edits


def minimum_version(spec: Mapping[str, Any]) -> str:
    """The lowest CDI spec version with every field ``spec`` uses (the rules of CDI's ``specs-go/version.go``)."""
    _, _, cls = str(spec["kind"]).partition("/")
    if "." in cls:
        return "0.6.0"
    for device in spec["devices"]:
        if device["name"][:1].isdigit():
            return "0.5.0"
        if any("hostPath" in node for node in device["containerEdits"].get("deviceNodes", ())):
            return "0.5.0"
    return "0.3.0"


def build_spec(kind: str, described: Iterable[tuple[str, ContainerAllocation]]) -> dict[str, Any] | None:
    """The CDI spec of ``kind`` for the described devices (ID, allocation), or ``None`` when there are none
    (a spec needs at least one device)."""
    devices = [
        {"name": cdi_device_name(device_id), "containerEdits": _edits(allocation)}
        for device_id, allocation in sorted(described, key=lambda item: item[0])
    ]
    if not devices:
        return None
    spec: dict[str, Any] = {"cdiVersion": "", "kind": kind, "devices": devices}
    spec["cdiVersion"] = minimum_version(spec)
    return spec


def remove_stale_specs(spec_dir: Path, keep: Iterable[str]) -> list[Path]:
    """Delete devplug's spec files in ``spec_dir`` other than ``keep`` (file names); returns what was deleted.

    At start-up: the files of resources no longer configured (or of another
    ``cdi_kind``) must not keep offering devices nobody serves.
    """
    kept = set(keep)
    removed = []
    try:
        names = os.listdir(spec_dir)
    except FileNotFoundError:
        return []
    for name in sorted(names):
        if name.startswith(SPEC_FILE_PREFIX) and name.endswith(".json") and name not in kept:
            path = spec_dir / name
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path)
                log.info("removed the stale CDI spec %s (no configured resource has its kind)", path)
    return removed


def _write_spec(path: Path, data: bytes | None) -> None:
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    if data is None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    else:
        write_atomic(path, data, SPEC_FILE_MODE)


class CdiSpecs:
    """One resource's CDI spec file, kept in step with what its devices describe. Used on the event loop."""

    def __init__(
        self,
        resource_name: str,
        kind: str,
        spec_dir: Path,
        table: DeviceTable,
        fallback: bool = True,
        run: Callable[[Callable[[], None]], Awaitable[None]] | None = None,
    ) -> None:
        self.resource_name = resource_name
        self.kind = kind
        self.path = spec_dir / spec_file_name(kind)
        self.table = table
        self.fallback = fallback
        self._run: Callable[[Callable[[], None]], Awaitable[None]] = run or asyncio.to_thread
        #: What the file on disk holds: device ID -> its description (None: not written yet).
        self._written: dict[str, ContainerAllocation] | None = None
        self._lock = asyncio.Lock()

    def names(self, device_ids: Iterable[str]) -> tuple[CDIDevice, ...]:
        """The fully qualified CDI names of ``device_ids``."""
        return tuple(CDIDevice(f"{self.kind}={cdi_device_name(i)}") for i in device_ids)

    def _described(self) -> dict[str, ContainerAllocation]:
        return {d.id: d.allocation for d in self.table.reported_devices() if d.allocation is not None}

    async def sync(self) -> None:
        """Write (or remove) the spec file if the devices' descriptions changed since it was written.

        Raises ``OSError`` when the folder or file cannot be written.
        """
        async with self._lock:
            described = self._described()
            if described == self._written:
                return
            spec = build_spec(self.kind, described.items())
            data = None if spec is None else (json.dumps(spec, indent=2) + "\n").encode()
            await self._run(functools.partial(_write_spec, self.path, data))
            self._written = described
            log.debug("[%s] CDI spec %s: %d device(s)", self.resource_name, self.path, len(described))

    async def ensure(self, described: Sequence[tuple[str, ContainerAllocation]]) -> None:
        """Before an Allocate answers with these devices' CDI names: the file must hold them as described now."""
        written = self._written
        if written is not None and all(written.get(i) == a for i, a in described):
            return
        try:
            await self.sync()
        except OSError as exc:
            raise DriverError(
                f"{self.resource_name}: cannot write the CDI spec {self.path}: {exc.strerror or exc}; "
                "nothing was allocated"
            ) from exc

    async def follow(self) -> None:
        """Rewrite the file after device changes (hot-plug, removal), until cancelled."""
        version = -1
        while True:
            if version != self.table.version:
                version = self.table.version
                try:
                    await self.sync()
                except OSError as exc:
                    log.error("[%s] cannot write the CDI spec %s: %s", self.resource_name, self.path, exc)
                    await asyncio.sleep(RETRY_S)
                    version = -1
                    continue
            await self.table.next_change(version)
            await asyncio.sleep(FOLLOW_DEBOUNCE_S)


class AllocationAnswers:
    """What one container gets: the driver's ``allocate`` answer merged with what its devices describe.

    Without CDI, the descriptions are merged in as they are. With CDI, the
    answer names the described devices' CDI devices (their spec written first)
    and, with ``fallback``, carries the descriptions too.
    """

    def __init__(self, resource_name: str, table: DeviceTable, driver: AsyncDriver, cdi: CdiSpecs | None) -> None:
        self.resource_name = resource_name
        self.table = table
        self.driver = driver
        self.cdi = cdi

    def _described(self, device_ids: Sequence[str]) -> list[tuple[str, ContainerAllocation]]:
        out = []
        for device_id in device_ids:
            device = self.table.reported(device_id)
            if device is not None and device.allocation is not None:
                out.append((device_id, device.allocation))
        return out

    async def build(
        self,
        device_ids: Sequence[str],
        shared: tuple[Sequence[str], Replicas, ContainerAllocation] | None = None,
    ) -> ContainerAllocation:
        """The answer for one container's advertised ``device_ids`` (raises :class:`DriverError`).

        ``shared``, when they are replicas of shared devices: the physical
        devices and the :class:`Replicas` the driver's ``allocate`` gets, and
        what the core adds to the answer (the shared devices' env and annotation).
        """
        parts: list[ContainerAllocation] = []
        if self.driver.capabilities.allocate:
            if shared is None:
                parts.append(await self.driver.allocate(device_ids))
            else:
                parts.append(await self.driver.allocate(shared[0], shared[1]))
        if shared is not None:
            parts.append(shared[2])
        described = self._described(device_ids)
        if described and self.cdi is not None:
            await self.cdi.ensure(described)
            parts.append(ContainerAllocation(cdi_devices=self.cdi.names(i for i, _ in described)))
            if not self.cdi.fallback:  # the annotations are the container's: they still go in the answer
                parts.extend(ContainerAllocation(annotations=a.annotations) for _, a in described if a.annotations)
                described = []
        parts.extend([a for _, a in described])
        try:
            return merge_allocations(parts) if parts else ContainerAllocation()
        except AllocationConflictError as exc:
            raise DriverError(f"{self.resource_name}: the devices' allocation data conflict: {exc}") from exc
