"""CDI spec files on the node: each resource's own file, written as its devices describe them, and the clean-up
of files no resource serves any more. The daemon gives each resource its :class:`CdiSpecs` (the core's
:class:`~devplug.engine.cdi.CdiSpecFile`); what a spec holds and how devices are named is the core's
(:mod:`devplug.engine.cdi`).

Each file is ``<spec_dir>/devplug-<vendor>_<class>.json``, written atomically
(a temporary file renamed over it) in a thread, rewritten when the devices'
descriptions change, and removed when none is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path

from devplug.atomic import write_atomic
from devplug.engine import (
    SPEC_FILE_MODE,
    SPEC_FILE_PREFIX,
    CdiNameCollisionError,
    DeviceTable,
    build_spec,
    cdi_device_name,
    spec_file_name,
)
from devplug.errors import DriverError
from devplug.types import CDIDevice, ContainerAllocation

__all__ = ["CdiSpecs", "remove_stale_specs"]

log = logging.getLogger("devplug.engine")

#: How long a burst of device changes may run before the spec is rewritten (an Allocate never waits for this).
FOLLOW_DEBOUNCE_S = 0.1
#: How soon a failed spec write is tried again.
RETRY_S = 1.0
#: A temporary file of a spec being written (``write_atomic``): ``.devplug-<kind>.json.<pid>.<n>.tmp``.
_TEMPORARY = re.compile(r"^\." + re.escape(SPEC_FILE_PREFIX) + r".*\.json\.([0-9]+)\.[0-9]+\.tmp\Z")


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
