"""Whether a driver project whose tests use the test kit declares the kit's distribution, ``devplug-testing``.

The test kit (:mod:`devplug.testing`, :mod:`devplug.devkubelet`) left the ``devplug`` distribution for one of its
own. Until devplug 1.0 ``devplug`` still depends on ``devplug-testing``, so a driver that lists only ``devplug``
keeps finding the kit; from 1.0 it will not. The pytest plugin (:mod:`devplug.testing.plugin`) warns such a
driver's test run with :class:`UndeclaredTestKitWarning`, a ``DeprecationWarning`` (CHANGELOG.md says what changes
in 1.0).

A project is a driver when its ``pyproject.toml`` publishes an entry point in ``devplug.drivers``; it declares the
kit when ``devplug-testing`` is among its dependencies, any optional dependencies (the usual ``test`` extra) or any
dependency group. A project whose requirements are dynamic, or that has no ``pyproject.toml``, is not judged.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["TEST_KIT_DISTRIBUTION", "UndeclaredTestKitWarning", "undeclared_test_kit", "undeclared_test_kit_message"]

#: The test kit's distribution, as a driver's requirements name it.
TEST_KIT_DISTRIBUTION = "devplug-testing"
#: The entry-point group that makes a project a driver.
DRIVER_ENTRY_POINTS = "devplug.drivers"

_NAME = re.compile(r"^\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)")


class UndeclaredTestKitWarning(DeprecationWarning):
    """A driver's tests use the test kit, but the driver does not list ``devplug-testing`` among its requirements:
    they will not find it from devplug 1.0."""


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(requirements: Iterable[Any]) -> set[str]:
    found = set()
    for requirement in requirements:
        match = _NAME.match(requirement) if isinstance(requirement, str) else None
        if match is not None:
            found.add(_normalized(match.group(1)))
    return found


def _declared(project: Mapping[str, Any], document: Mapping[str, Any]) -> set[str]:
    names = _names(project.get("dependencies", []))
    for requirements in dict(project.get("optional-dependencies", {})).values():
        names |= _names(requirements)
    for requirements in dict(document.get("dependency-groups", {})).values():
        names |= _names(requirements)
    return names


def undeclared_test_kit(folder: Path) -> str | None:
    """The distribution name of the driver project in ``folder`` when it does not declare ``devplug-testing``;
    None when it does, when ``folder`` holds no driver project, or when its requirements cannot be read."""
    pyproject = folder / "pyproject.toml"
    try:
        document = tomllib.loads(pyproject.read_text())
    except (OSError, ValueError):
        return None
    project = document.get("project")
    if not isinstance(project, dict) or not isinstance(project.get("name"), str):
        return None
    if DRIVER_ENTRY_POINTS not in dict(project.get("entry-points", {})):
        return None
    dynamic = set(project.get("dynamic", []))
    if dynamic & {"dependencies", "optional-dependencies"}:
        return None
    if _normalized(TEST_KIT_DISTRIBUTION) in _declared(project, document):
        return None
    return str(project["name"])


def undeclared_test_kit_message(distribution: str) -> str:
    """What the warning says to the author of ``distribution``."""
    return (
        f"{distribution}'s tests use devplug's test kit (devplug.testing, devplug.devkubelet), which is the "
        f"{TEST_KIT_DISTRIBUTION} distribution now; {distribution} does not list it among its requirements and finds "
        f"it only because devplug depends on it until devplug 1.0. Add it to the test extra: "
        f'test = ["pytest>=8", "{TEST_KIT_DISTRIBUTION}>=0.1,<0.2"]'
    )
