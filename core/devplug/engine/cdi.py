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
from devplug.text.logsafe import id_list
from devplug.types import CDIDevice, Claim, ContainerAllocation, Replicas, merge_allocations

__all__ = [
    "AllocationAnswers",
    "CdiNameCollisionError",
    "CdiSpecs",
    "SPEC_FILE_PREFIX",
    "build_spec",
    "cdi_device_name",
    "device_id_of_name",
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
#: A temporary file of a spec being written (``write_atomic``): ``.devplug-<kind>.json.<pid>.<n>.tmp``.
_TEMPORARY = re.compile(r"^\." + re.escape(SPEC_FILE_PREFIX) + r".*\.json\.([0-9]+)\.[0-9]+\.tmp\Z")
#: How an encoded name ends (see :func:`cdi_device_name`); an ID that ends so is encoded too.
_ENCODED = re.compile(r"-x(?:[0-9a-f]{2})+\Z")


def spec_file_name(kind: str) -> str:
    """The spec file of a kind: ``example.com/gpu`` -> ``devplug-example.com_gpu.json``."""
    vendor, _, cls = kind.partition("/")
    return f"{SPEC_FILE_PREFIX}{vendor}_{cls}.json"


@functools.lru_cache(maxsize=65536)
def cdi_device_name(device_id: str) -> str:
    """The CDI device name of a device ID: the ID itself when CDI accepts it, else a stable, distinct form.

    An ID CDI refuses (``/``, ``@``, a leading ``_`` ...) becomes a readable
    stem (those characters as ``_``) followed by ``-x`` and the hex digits of
    the whole ID's UTF-8 bytes: ``a@b`` -> ``a_b-x614062``. An ID CDI accepts
    but that ends like such a name (``-x`` and pairs of hex digits) is encoded
    the same way, so no ID passes through unchanged onto another ID's name. The
    mapping is injective for every set of IDs: a name ending in that form holds
    its ID (the hex digits after its last ``-x``), and any other name is the ID
    itself. Device IDs are never empty (:class:`~devplug.types.Device`); an empty
    one is a ``ValueError``.
    """
    if not device_id:
        raise ValueError("an empty device ID has no CDI name")
    if _DEVICE_NAME.match(device_id) and not _ENCODED.search(device_id):
        return device_id
    stem = _NOT_NAME_CHAR.sub("_", device_id)
    if not stem[:1].isascii() or not stem[:1].isalnum():
        stem = "d" + stem
    return f"{stem}-x{device_id.encode(errors='surrogatepass').hex()}"


def device_id_of_name(name: str) -> str:
    """The device ID a CDI device name stands for (the inverse of :func:`cdi_device_name`)."""
    if not _ENCODED.search(name):
        return name
    return bytes.fromhex(name[name.rindex("-x") + 2 :]).decode(errors="surrogatepass")


class CdiNameCollisionError(ValueError):
    """Two devices of one spec would get one CDI name; the spec is not written."""


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


def build_spec(
    kind: str,
    described: Iterable[tuple[str, ContainerAllocation]],
    name: Callable[[str], str] = cdi_device_name,
) -> dict[str, Any] | None:
    """The CDI spec of ``kind`` for the described devices (ID, allocation), or ``None`` when there are none
    (a spec needs at least one device). ``name`` maps a device ID to its CDI name.

    Raises :class:`CdiNameCollisionError` naming the devices when two would get
    one name: CDI refuses a spec with a duplicate name, which would break every
    device of the kind, and two Allocates would name one device.
    """
    devices = []
    owners: dict[str, str] = {}
    clashes: list[str] = []
    for device_id, allocation in sorted(described, key=lambda item: item[0]):
        cdi_name = name(device_id)
        if cdi_name in owners:
            clashes.append(f"{id_list([owners[cdi_name], device_id])} -> {cdi_name}")
        owners[cdi_name] = device_id
        devices.append({"name": cdi_name, "containerEdits": _edits(allocation)})
    if clashes:
        raise CdiNameCollisionError(
            f"devices that would share one CDI name in the spec of {kind}: {'; '.join(clashes[:5])}"
            + (f"; and {len(clashes) - 5} more" if len(clashes) > 5 else "")
        )
    if not devices:
        return None
    spec: dict[str, Any] = {"cdiVersion": "", "kind": kind, "devices": devices}
    spec["cdiVersion"] = minimum_version(spec)
    return spec


def remove_stale_specs(spec_dir: Path, keep: Iterable[str]) -> list[Path]:
    """Delete devplug's spec files in ``spec_dir`` other than ``keep`` (file names), and the temporary files a
    devplug writer that is gone left behind (a ``kill -9`` between writing and renaming); returns what was deleted.

    At start-up, and when a reload tore a resource down: the files of
    resources no longer configured (or of another ``cdi_kind``) must not keep
    offering devices nobody serves.
    """
    kept = set(keep)
    removed = []
    try:
        names = os.listdir(spec_dir)
    except FileNotFoundError:
        return []
    for name in sorted(names):
        if name.startswith(SPEC_FILE_PREFIX) and name.endswith(".json") and name not in kept:
            why = "no configured resource has its kind"
        elif _abandoned_temporary(name):
            why = "a temporary file its writer left behind"
        else:
            continue
        path = spec_dir / name
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
            log.info("removed the stale CDI spec file %s (%s)", path, why)
    return removed


def _abandoned_temporary(name: str) -> bool:
    """Whether ``name`` is a temporary spec file (:func:`devplug.atomic.write_atomic`'s
    ``.<file>.<pid>.<n>.tmp``) of a devplug process no longer running."""
    match = _TEMPORARY.match(name)
    if match is None:
        return False
    pid = int(match.group(1))
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's live process
        return False
    return False


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
        name: Callable[[str], str] = cdi_device_name,
    ) -> None:
        self.resource_name = resource_name
        #: While True nothing is written: a handover is under way and the file may be the successor's already
        #: (see :meth:`~devplug.engine.resource.Resource.pause`).
        self.held = False
        #: A device ID's CDI name (:func:`cdi_device_name`; a test may pass another).
        self._name = name
        self.kind = kind
        self.path = spec_dir / spec_file_name(kind)
        self.table = table
        self.fallback = fallback
        self._run: Callable[[Callable[[], None]], Awaitable[None]] = run or asyncio.to_thread
        #: What the file on disk holds: device ID -> its description (None: not written yet).
        self._written: dict[str, ContainerAllocation] | None = None
        self._lock = asyncio.Lock()
        #: The write running in a thread, if any (it runs on when the coroutine awaiting it is cancelled).
        self._writing: asyncio.Future[None] | None = None
        #: Set by :meth:`remove`: the spec is gone for good, nothing writes it again.
        self._removed = False

    def names(self, device_ids: Iterable[str]) -> tuple[CDIDevice, ...]:
        """The fully qualified CDI names of ``device_ids``."""
        return tuple(CDIDevice(f"{self.kind}={self._name(i)}") for i in device_ids)

    def _described(self) -> dict[str, ContainerAllocation]:
        return {d.id: d.allocation for d in self.table.reported_devices() if d.allocation is not None}

    async def sync(self) -> None:
        """Write (or remove) the spec file if the devices' descriptions changed since it was written.

        Raises ``OSError`` when the folder or file cannot be written, :class:`CdiNameCollisionError` (writing
        nothing) when two devices would get one CDI name.
        """
        async with self._lock:
            described = self._described()
            if described == self._written:
                return
            if self._removed or self.held:
                return
            spec = build_spec(self.kind, described.items(), self._name)  # CdiNameCollisionError: file kept
            data = None if spec is None else (json.dumps(spec, indent=2) + "\n").encode()
            await self._write(data)
            self._written = described
            log.debug("[%s] CDI spec %s: %d device(s)", self.resource_name, self.path, len(described))

    async def _write(self, data: bytes | None) -> None:
        """Write ``data`` (None: remove the file) in a thread; :meth:`remove` waits for it even if this caller is
        cancelled meanwhile."""
        writing = asyncio.ensure_future(self._run(functools.partial(_write_spec, self.path, data)))
        self._writing = writing
        await asyncio.shield(writing)

    async def remove(self) -> None:
        """Delete the spec file for good (the resource was torn down and no other resource has its kind): after
        any write still running, and no write after it. Raises ``OSError`` when it cannot be deleted."""
        self._removed = True
        writing = self._writing
        if writing is not None and not writing.done():
            await asyncio.wait((writing,))
        await self._run(functools.partial(_write_spec, self.path, None))
        self._written = None
        log.info("[%s] removed the CDI spec %s (the resource is gone)", self.resource_name, self.path)

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
        except CdiNameCollisionError as exc:
            raise DriverError(
                f"{self.resource_name}: refusing to write the CDI spec {self.path}: {exc}; nothing was allocated"
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
                except CdiNameCollisionError as exc:  # tried again at the next change of the devices
                    log.error(
                        "[%s] refusing to write the CDI spec %s (it keeps what it held): %s",
                        self.resource_name,
                        self.path,
                        exc,
                    )
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
        claim: Claim | None = None,
    ) -> ContainerAllocation:
        """The answer for one container's (or DRA claim's) advertised ``device_ids`` (raises :class:`DriverError`).

        ``shared``, when they are replicas of shared devices: the physical
        devices and the :class:`Replicas` the driver's ``allocate`` gets, and
        what the core adds to the answer (the shared devices' env and annotation).
        ``claim``: the DRA claim it is for, handed to the driver's ``allocate``.
        """
        parts: list[ContainerAllocation] = []
        if self.driver.capabilities.allocate:
            if shared is None:
                parts.append(await self.driver.allocate(device_ids, None, claim))
            else:
                parts.append(await self.driver.allocate(shared[0], shared[1], claim))
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
