"""Which drivers a daemon under test can load, and test-only drivers it can load without being installed.

The daemon under test is a child process running ``devplug run``: it finds
drivers the way a production daemon does, through entry points in the group
``devplug.drivers``. So a driver must be installed (``pip install -e .`` in
its project) before a test can start a daemon on it.

A test double of a driver (a subclass built on a fake kernel, say) need not be
installed: :func:`entry_point_env` writes a ``.dist-info`` folder that declares
its entry point and returns the ``PYTHONPATH`` that makes the child process
see it, and the module that defines it. Importing this module is cheap (no
gRPC, no daemon code).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["ENTRY_POINT_GROUP", "installed_driver_names", "missing_driver_message", "entry_point_env"]

#: The entry-point group drivers are published in.
ENTRY_POINT_GROUP = "devplug.drivers"
_DISABLE_ENV = "DEVPLUG_DISABLE_DRIVERS"
_DIST_NAME = "devplug_test_drivers"


def installed_driver_names(extra_path: Sequence[Path] = ()) -> list[str]:
    """The driver names a ``devplug run`` child would find: entry points of this Python's installed
    distributions and of those under ``extra_path``, without the ones ``DEVPLUG_DISABLE_DRIVERS`` hides."""
    from devplug.drivers import driver_names  # what the daemon's own discovery finds

    return driver_names([str(p) for p in extra_path])


def missing_driver_message(resource: str, driver: str, installed: Sequence[str]) -> str:
    """What to tell a test author whose config names a driver the daemon would not find."""
    return (
        f"resource {resource!r} asks for driver {driver!r}, which is not installed in this Python "
        f"(installed: {', '.join(installed) or 'none'}). The daemon under test is a child process that finds "
        f"drivers through their entry points (group {ENTRY_POINT_GROUP!r}): install the driver first, "
        f"e.g. `pip install -e .` in its project folder, or pass a test double as test_drivers=."
    )


def entry_point_env(folder: Path, drivers: Mapping[str, str], python_path: Sequence[Path] = ()) -> dict[str, str]:
    """Declare ``drivers`` (entry-point name -> ``"module:Class"``) in ``folder`` for a child process.

    Writes ``folder/devplug_test_drivers-0.dist-info`` and returns the
    environment to add for the child: a ``PYTHONPATH`` of ``folder``, then
    ``python_path`` (where the drivers' modules are), then this process's
    ``PYTHONPATH``. Called before the daemon starts; returns ``{}`` when
    ``drivers`` is empty.
    """
    if not drivers:
        return {}
    info = Path(folder) / f"{_DIST_NAME}-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {_DIST_NAME}\nVersion: 0\n")
    lines = [f"[{ENTRY_POINT_GROUP}]", *(f"{name} = {target}" for name, target in drivers.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    parts = [str(folder), *(str(Path(p).resolve()) for p in python_path)]
    inherited = os.environ.get("PYTHONPATH")
    if inherited:
        parts.append(inherited)
    return {"PYTHONPATH": os.pathsep.join(parts)}
