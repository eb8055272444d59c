"""Container Device Interface (CDI) specs and the Allocate answers that name their devices: what the core
computes, without touching a file. The spec file itself is written by what the daemon gives the core
(:class:`CdiSpecFile`; :class:`devplug.daemon.cdispecs.CdiSpecs`).

A driver describes what a container gets for each device once, as the
device's :attr:`~devplug.types.Device.allocation` (device nodes, mounts, envs,
annotations). From that

* the daemon writes one CDI spec file per resource, ``<spec_dir>/devplug-<vendor>_<class>.json``
  (atomically: a temporary file renamed over it), with one CDI device per
  described device and its device nodes, mounts and envs as ``containerEdits``;
  rewritten when the descriptions change, removed when none is left; and
* the core answers Allocate with the CDI names (``cdi_devices``, ``<kind>=<name>``) of
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

import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from devplug.engine.devicetable import DeviceTable
from devplug.engine.driver import AsyncDriver
from devplug.errors import AllocationConflictError, DriverError
from devplug.text.logsafe import id_list
from devplug.types import CDIDevice, Claim, ContainerAllocation, Replicas, merge_allocations

__all__ = [
    "AllocationAnswers",
    "CdiNameCollisionError",
    "CdiSpecFile",
    "SPEC_FILE_MODE",
    "SPEC_FILE_PREFIX",
    "build_spec",
    "cdi_device_name",
    "device_id_of_name",
    "minimum_version",
    "spec_file_name",
]

#: Every spec file devplug writes is named ``devplug-<vendor>_<class>.json``; others in the folder are left alone.
SPEC_FILE_PREFIX = "devplug-"
#: Spec files are read by the container runtime (root), and name only host paths: world-readable like /etc files.
SPEC_FILE_MODE = 0o644

# CDI's pkg/parser ValidateDeviceName: letters, digits, '_', '-', '.', ':', starting and ending alphanumeric.
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
_NOT_NAME_CHAR = re.compile(r"[^A-Za-z0-9_.:-]")
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


class CdiSpecFile(Protocol):
    """One resource's CDI spec file as the core uses it, kept in step with what the devices describe, and made to
    hold a device's description before an Allocate names it (the daemon gives it:
    :class:`devplug.daemon.cdispecs.CdiSpecs`)."""

    #: Where the file is (for messages).
    path: Path
    #: While True nothing is written: a handover is under way and the file may be the successor's already.
    held: bool
    #: Whether an Allocate answer also carries the descriptions as plain fields (``[cdi] fallback``).
    fallback: bool

    def names(self, device_ids: Iterable[str]) -> tuple[CDIDevice, ...]:
        """The fully qualified CDI names of ``device_ids``."""
        ...

    async def ensure(self, described: Sequence[tuple[str, ContainerAllocation]]) -> None:
        """Before an Allocate answers with these devices' CDI names: the file must hold them as described now
        (raises :class:`~devplug.errors.DriverError` saying why it cannot)."""

    async def sync(self) -> None:
        """Write (or remove) the file if the devices' descriptions changed since it was written (``OSError``,
        :class:`CdiNameCollisionError`)."""

    async def follow(self) -> None:
        """Rewrite the file after device changes, until cancelled."""

    async def remove(self) -> None:
        """Delete the file for good (``OSError``)."""


class AllocationAnswers:
    """What one container gets: the driver's ``allocate`` answer merged with what its devices describe.

    Without CDI, the descriptions are merged in as they are. With CDI, the
    answer names the described devices' CDI devices (their spec written first)
    and, with ``fallback``, carries the descriptions too.
    """

    def __init__(self, resource_name: str, table: DeviceTable, driver: AsyncDriver, cdi: CdiSpecFile | None) -> None:
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
