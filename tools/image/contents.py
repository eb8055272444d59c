"""What the image and the wheelhouse hold, in one place: the distributions, and the extras installed with them.

The image (``make image``, the ``Dockerfile``) installs the core with every extra meant for users (every extra of
``pyproject.toml`` but ``dev``) and every driver, so that any config whose drivers are installed can turn on any
feature; ``make dist`` downloads those extras' dependencies into ``dist/wheelhouse`` too. A feature of the config
that needs an extra is listed in :data:`FEATURE_EXTRAS`; ``tests/deploy/test_image_contents.py`` checks, without
building anything, that every config under ``deploy/`` needs only what the image holds.

The image never holds the test kit (the ``devplug-testing`` distribution, :data:`TEST_KIT`: the dev kubelet, the
models, the demos). Until devplug 1.0 the core depends on it, so pip installs it with the core (from the folder of
wheels: ``--find-links``) and the image's build removes it at once (:data:`REMOVED_AFTER_INSTALL`: both
``tools/image/build.sh`` and the ``Dockerfile`` uninstall each); nothing the image runs imports it.

Run as a script, it prints the pip requirements that install the image's contents from a folder of wheels::

    python tools/image/contents.py requirements DIST [--prefix PREFIX]

one per line: the core's wheel with its extras (``PREFIX/devplug-0.1.0-py3-none-any.whl[metrics]``), then every
driver's wheel (never the test kit's). ``PREFIX`` (default: ``DIST`` itself) is where the wheels are when pip
runs (``/wheels`` in the Dockerfile, a folder of the chroot in ``make image``).
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]

#: Extras of the core that are for developing devplug, never installed in the image or downloaded for users.
DEVELOPMENT_EXTRAS = frozenset({"dev"})

#: The test kit's distribution: built by ``make dist`` beside the core, never part of the image.
TEST_KIT = "devplug-testing"

#: Distributions pip installs as dependencies that the image removes after the install: the test kit, which the core
#: depends on until devplug 1.0 (CHANGELOG.md).
REMOVED_AFTER_INSTALL: tuple[str, ...] = (TEST_KIT,)

#: Each config key that makes the daemon import an optional dependency, and the extra of the core that brings it:
#: (table, key) -> extra. The feature is on when the key is true (``[metrics] enabled = true`` needs
#: prometheus-client; ``devplug check-config`` refuses it without).
FEATURE_EXTRAS: Mapping[tuple[str, str], str] = {("metrics", "enabled"): "metrics"}

#: The same for a key of a resource's table and the value that turns the feature on: (key, value) -> extra. A
#: resource served through DRA (``api = "dra"``) needs lightkube for its ResourceSlices and ResourceClaims.
RESOURCE_FEATURE_EXTRAS: Mapping[tuple[str, str], str] = {("api", "dra"): "kubernetes"}

#: Each top-level table whose presence (non-empty) makes the daemon import an optional dependency: per-node profiles
#: (``[profiles]``) read and watch the daemon's Node through lightkube, and may switch a resource to DRA.
TABLE_EXTRAS: Mapping[str, str] = {"profiles": "kubernetes"}


def core_extras(pyproject: Path = ROOT / "pyproject.toml") -> frozenset[str]:
    """The core's extras meant for users: what the image installs and the wheelhouse holds."""
    project = tomllib.loads(pyproject.read_text())["project"]
    return frozenset(project.get("optional-dependencies", {})) - DEVELOPMENT_EXTRAS


def needed_extras(config: Mapping[str, Any]) -> frozenset[str]:
    """The extras a parsed config needs: one for each feature of :data:`FEATURE_EXTRAS`,
    :data:`RESOURCE_FEATURE_EXTRAS` and :data:`TABLE_EXTRAS` it turns on."""
    needed = set()
    for (table, key), extra in FEATURE_EXTRAS.items():
        section = config.get(table)
        if isinstance(section, Mapping) and section.get(key) is True:
            needed.add(extra)
    needed.update(extra for table, extra in TABLE_EXTRAS.items() if config.get(table))
    resources = config.get("resources")
    for resource in resources.values() if isinstance(resources, Mapping) else ():
        for (key, value), extra in RESOURCE_FEATURE_EXTRAS.items():
            if isinstance(resource, Mapping) and resource.get(key) == value:
                needed.add(extra)
    return frozenset(needed)


def used_drivers(config: Mapping[str, Any]) -> frozenset[str]:
    """The driver names a parsed config's resources ask for."""
    resources = config.get("resources", {})
    return frozenset(str(table["driver"]) for table in resources.values() if "driver" in table)


def shipped_drivers(root: Path = ROOT) -> frozenset[str]:
    """The drivers every image installs: one wheel per folder under ``drivers/``."""
    return frozenset(p.parent.name for p in root.glob("drivers/*/pyproject.toml"))


def _wheel_name(wheel: Path) -> str:
    return wheel.name.split("-", 1)[0]


def wheel_extras(wheel: Path) -> frozenset[str]:
    """The extras meant for users that a wheel declares (its METADATA's ``Provides-Extra``, less ``dev``)."""
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        lines = archive.read(metadata).decode().splitlines()
    declared = {line.split(":", 1)[1].strip() for line in lines if line.startswith("Provides-Extra:")}
    return frozenset(declared) - DEVELOPMENT_EXTRAS


def requirements(dist: Path, prefix: str | None = None, extras: Iterable[str] | None = None) -> list[str]:
    """The pip requirements (wheel paths) that install the image's contents from the wheels in ``dist``: the core
    with ``extras`` (default: every extra for users its wheel declares), and every other wheel there but the test
    kit's (:data:`TEST_KIT`).

    Raises ``ValueError`` naming what is wrong when ``dist`` holds no core wheel or two wheels of one name.
    """
    wheels = sorted(dist.glob("*.whl"))
    by_name: dict[str, Path] = {}
    for wheel in wheels:
        name = _wheel_name(wheel)
        if name in by_name:
            raise ValueError(f"{dist}: two wheels of {name}: {by_name[name].name} and {wheel.name}")
        by_name[name] = wheel
    if "devplug" not in by_name:
        raise ValueError(f"{dist}: no wheel of the core (devplug-VERSION-py3-none-any.whl): run make dist")
    where = str(dist) if prefix is None else prefix.rstrip("/")
    core_wheel = by_name.pop("devplug")
    by_name.pop(TEST_KIT.replace("-", "_"), None)
    chosen = sorted(wheel_extras(core_wheel) if extras is None else extras)
    core = f"{where}/{core_wheel.name}"
    lines = [f"{core}[{','.join(chosen)}]" if chosen else core]
    lines += [f"{where}/{wheel.name}" for _, wheel in sorted(by_name.items())]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("requirements", help="the image's pip requirements, one per line")
    listing.add_argument("dist", type=Path, help="the folder of wheels (make dist's output)")
    listing.add_argument("--prefix", help="where the wheels are when pip runs (default: DIST)")
    args = parser.parse_args(argv)
    try:
        lines = requirements(args.dist, args.prefix)
    except ValueError as exc:
        print(f"contents.py: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
