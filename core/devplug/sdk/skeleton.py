"""``devplug new-driver NAME``: write a driver distribution's skeleton that installs, loads and passes its tests.

The skeleton (``devplug-NAME/``) holds a pyproject declaring the
``devplug.drivers`` entry point ``NAME``, a dependency on the core and a test
extra on the test kit (``devplug-testing``), the
package ``devplug_NAME`` with a driver class (an ``Options`` dataclass and
every hook of :mod:`devplug.hookspecs`, with the spec's signature and
docstring), a README, and tests: unit tests of the hooks through the kit's
``driver_harness`` and :mod:`devplug.testing.recording`, and a subclass of
:class:`devplug.testing.conformance.DriverConformance`. The minimal driver is
a working one on the driver kit (:class:`devplug.kit.DriverRuntime` holds its
context and what the engine was told): its devices are ``NAME0`` .. from its
``count`` option. It has no code for tests: the tests record its hook calls
through the kit's recording stand-in (``records_itself = False``).
"""

from __future__ import annotations

import keyword
import re
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

import devplug
from devplug.contract import HOOK_CONTRACT
from devplug.errors import DevplugError
from devplug.sdk.hookstubs import hook_first_lines, hook_signature, render_hooks, required_imports

__all__ = ["SkeletonError", "SkeletonNames", "new_driver", "skeleton_names"]

#: A driver name: lowercase, starting with a letter; it becomes the entry-point name, part of the distribution
#: name (``devplug-NAME``) and of the package name (``devplug_NAME``).
NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,39}")

#: The skeleton's files: (template under ``templates/``, path in the project; ``$package`` is replaced).
FILES: tuple[tuple[str, str], ...] = (
    ("pyproject.toml.tmpl", "pyproject.toml"),
    ("README.md.tmpl", "README.md"),
    ("package_init.py.tmpl", "$package/__init__.py"),
    ("driver.py.tmpl", "$package/driver.py"),
    ("py.typed.tmpl", "$package/py.typed"),
    ("test_driver.py.tmpl", "tests/test_driver.py"),
    ("test_conformance.py.tmpl", "tests/test_conformance.py"),
)

#: The body of each generated hook (``$env`` is the allocation's environment variable).
HOOK_BODIES: dict[str, str] = {
    "start": (
        "        self.runtime.start(ctx)  # the context, its logger and state folder, until stop\n"
        "        self.runtime.start_rescans()  # scan() again every rescan_interval seconds (none set here)"
    ),
    "stop": "        self.runtime.stop()",
    "list_devices": "        return self.runtime.refresh(push=False)  # the engine takes the answer",
    "check_health": (
        "        # a HealthReport(Health.UNHEALTHY, reason) says why a device is out of service\n"
        "        return {device.id: HealthReport(Health.HEALTHY) for device in devices}"
    ),
    "preferred_allocation": "        return None  # the core's default: as few NUMA nodes as possible",
    "allocate": '        return ContainerAllocation(envs={"$env": ",".join(device_ids)})',
    "pre_start": "        pass  # ready the devices here",
    "post_stop": "        pass  # clean the devices up here (scrub, reset); cope with finding it done when retry",
    "deallocate": "        pass  # take the devices back here; they are free once this returns",
}


class SkeletonError(DevplugError):
    """``devplug new-driver`` cannot write the skeleton (a bad name, a folder already there); nothing was written."""


@dataclass(frozen=True)
class SkeletonNames:
    """The names a driver ``NAME`` gets."""

    name: str  # the entry-point name: driver = "NAME"
    distribution: str  # devplug-NAME
    package: str  # devplug_NAME
    class_name: str  # NameDriver
    env: str  # NAME_DEVICES, the environment variable the minimal allocate sets


def skeleton_names(name: str) -> SkeletonNames:
    """The names for driver ``name``; :class:`SkeletonError` if it cannot be an entry-point and package name."""
    if not NAME_PATTERN.fullmatch(name) or name.endswith("_") or "__" in name:
        raise SkeletonError(
            f"new-driver: {name!r} is not a driver name: use 1 to 40 lowercase letters, digits and single "
            "underscores, starting with a letter (it becomes the entry-point name, devplug-NAME and devplug_NAME)"
        )
    if keyword.iskeyword(name):
        raise SkeletonError(f"new-driver: {name!r} is a Python keyword; choose another name")
    return SkeletonNames(
        name=name,
        distribution=f"devplug-{name.replace('_', '-')}",
        package=f"devplug_{name}",
        class_name="".join(part.capitalize() for part in name.split("_")) + "Driver",
        env=f"{name.upper()}_DEVICES",
    )


def _imports() -> str:
    """The driver module's imports: what the hook signatures need, plus what the skeleton's code uses."""
    needed = required_imports()
    stdlib = {module: names for module, names in needed.items() if module != "devplug"}
    stdlib.update({"dataclasses": ["dataclass"]})
    lines = [f"from {module} import {', '.join(names)}" for module, names in sorted(stdlib.items())]
    lines.append("")
    lines.append(f"from devplug import {', '.join(sorted({*needed.get('devplug', []), 'hookimpl'}))}")
    lines.append("from devplug.kit import DriverRuntime")
    return "\n".join(lines)


def _hook_table() -> str:
    rows = ["| hook | what it does |", "| --- | --- |"]
    for name, summary in hook_first_lines().items():
        signature = hook_signature(name).replace("|", "\\|")
        rows.append(f"| `{signature}` | {summary} |")
    return "\n".join(rows)


def core_requirement(version: str) -> str:
    """The skeleton's pin on the core: the minor series of ``version`` (``0.1.0`` -> ``devplug>=0.1,<0.2``).

    A hook contract's major change comes with a new minor release of ``devplug`` (the compatibility promise), so a
    driver accepts the core releases of the series it was generated from, as devplug's own drivers do.
    """
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise SkeletonError(f"new-driver: cannot read a major.minor version from devplug's version {version!r}")
    major, minor = int(match.group(1)), int(match.group(2))
    return f"devplug>={major}.{minor},<{major}.{minor + 1}"


def testing_requirement(version: str) -> str:
    """The skeleton's test dependency on the test kit (the ``devplug-testing`` distribution): the same minor series
    as :func:`core_requirement` (``0.1.0`` -> ``devplug-testing>=0.1,<0.2``)."""
    return core_requirement(version).replace("devplug", "devplug-testing", 1)


def render(names: SkeletonNames) -> dict[str, str]:
    """The skeleton's files, by path relative to the project folder."""
    values = {
        "name": names.name,
        "distribution": names.distribution,
        "package": names.package,
        "class_name": names.class_name,
        "env": names.env,
        "core_requirement": core_requirement(devplug.__version__),
        "testing_requirement": testing_requirement(devplug.__version__),
        "hook_contract": HOOK_CONTRACT,
    }
    bodies = {hook: Template(body).substitute(values) for hook, body in HOOK_BODIES.items()}
    values["imports"] = _imports()
    values["hooks"] = render_hooks(bodies)
    values["hook_table"] = _hook_table()
    templates = resources.files("devplug.sdk").joinpath("templates")
    files = {}
    for template, target in FILES:
        text = templates.joinpath(template).read_text(encoding="utf-8")
        files[Template(target).substitute(values)] = Template(text).substitute(values)
    return files


def new_driver(name: str, parent: Path) -> Path:
    """Write driver ``name``'s skeleton into ``parent/devplug-NAME`` (which must not exist); returns that folder."""
    names = skeleton_names(name)
    if not parent.is_dir():
        raise SkeletonError(f"new-driver: {parent} is not a folder")
    target = parent / names.distribution
    if target.exists() or target.is_symlink():
        raise SkeletonError(f"new-driver: {target} already exists; remove it or choose another name or folder")
    files = render(names)
    try:
        target.mkdir()
    except OSError as exc:
        raise SkeletonError(f"new-driver: cannot create {target}: {exc.strerror or exc}") from exc
    try:
        for path, text in files.items():
            out = target / path
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text, encoding="utf-8")
    except OSError as exc:
        shutil.rmtree(target, ignore_errors=True)  # nothing half-written stays behind
        raise SkeletonError(f"new-driver: cannot write {target}: {exc.strerror or exc}") from exc
    return target
