"""What the deployment tests need from outside the venv, and how loudly they say it is missing.

* ``tests/deploy/test_wheels.py`` installs the wheels of ``make dist`` (``dist/``) into a fresh virtual
  environment. Without them, or when they were built from other sources than this tree, its tests skip loudly;
  with ``DEVPLUG_REQUIRE_DIST=1`` (CI, whose ``.ci/run`` runs ``make dist`` first) they fail instead.
* ``tests/deploy/test_manifests.py`` renders ``deploy/`` with ``kubectl kustomize`` (kubectl is on the machine image
  of this project's machines). Without kubectl its tests skip loudly; with ``DEVPLUG_REQUIRE_KUBECTL=1`` (CI) they
  fail instead.
* ``tests/deploy/test_monitoring.py`` runs ``promtool`` (Debian's prometheus package; ``.ci/setup-promtool``
  installs it) on the alerts of ``components/prometheusrule``. Without it those tests skip loudly; with
  ``DEVPLUG_REQUIRE_PROMTOOL=1`` (CI) they fail instead.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from devplug.testing.loudlines import LoudLine, loud_source

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DIST = ROOT / "dist"

REQUIRE_DIST = os.environ.get("DEVPLUG_REQUIRE_DIST") == "1"
REQUIRE_KUBECTL = os.environ.get("DEVPLUG_REQUIRE_KUBECTL") == "1"
REQUIRE_PROMTOOL = os.environ.get("DEVPLUG_REQUIRE_PROMTOOL") == "1"

_skipped: dict[str, str] = {}


def _skip_or_fail(what: str, reason: str, required: bool, switch: str) -> None:
    """Skip the test, remembered for the loud summary; fail it instead when ``switch`` made it mandatory."""
    _skipped[what] = reason
    if required:
        pytest.fail(f"{what}: {reason} [{switch}=1]", pytrace=False)
    pytest.skip(f"{what}: {reason}")


@loud_source
def _skipped_said() -> list[LoudLine]:
    """Say loudly at the run's end which deployment checks did not run."""
    return [(f"WARNING: {what} not run: {reason}", "red") for what, reason in _skipped.items()]


@dataclass(frozen=True)
class Dist:
    """The output of ``make dist``: the distributions by name (version, wheel, sdist) and the wheelhouse."""

    folder: Path
    wheelhouse: Path
    versions: dict[str, str]


def _project(pyproject: Path) -> tuple[str, str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    return str(project["name"]), str(project["version"])


def _source_digest() -> str:
    spec = importlib.util.spec_from_file_location("devplug_dist_digest", ROOT / "tools" / "dist_digest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.source_digest())


@pytest.fixture(scope="session")
def dist() -> Dist:
    """``dist/`` as ``make dist`` left it for this very tree; a loud skip (or failure in CI) otherwise."""
    what = "installed-wheels tests (tests/deploy/test_wheels.py)"
    projects = [_project(ROOT / "pyproject.toml")]
    projects += [_project(p) for p in sorted(ROOT.glob("drivers/*/pyproject.toml"))]
    versions = dict(projects)
    digest_file = DIST / "SOURCE-DIGEST"
    if not digest_file.is_file():
        _skip_or_fail(
            what, f"no {digest_file.relative_to(ROOT)}: run `make dist`", REQUIRE_DIST, "DEVPLUG_REQUIRE_DIST"
        )
    if digest_file.read_text().strip() != _source_digest():
        _skip_or_fail(
            what,
            "dist/ was built from other sources than this tree: run `make dist`",
            REQUIRE_DIST,
            "DEVPLUG_REQUIRE_DIST",
        )
    built = {**versions, **dict([_project(ROOT / "testkit" / "pyproject.toml")])}  # the test kit's too (issue 39)
    missing = [
        f"{name.replace('-', '_')}-{version}{suffix}"
        for name, version in built.items()
        for suffix in ("-py3-none-any.whl", ".tar.gz")
        if not (DIST / f"{name.replace('-', '_')}-{version}{suffix}").is_file()
    ]
    if missing:
        _skip_or_fail(what, f"dist/ lacks {', '.join(missing)}: run `make dist`", REQUIRE_DIST, "DEVPLUG_REQUIRE_DIST")
    return Dist(DIST, DIST / "wheelhouse", versions)


@pytest.fixture(scope="session")
def kubectl() -> str:
    """The path of kubectl; a loud skip (or failure in CI) without it."""
    found = shutil.which("kubectl")
    if found is None:
        _skip_or_fail(
            "manifest tests (tests/deploy/test_manifests.py)",
            "kubectl is not on PATH (it renders deploy/ with `kubectl kustomize`)",
            REQUIRE_KUBECTL,
            "DEVPLUG_REQUIRE_KUBECTL",
        )
    assert found is not None
    return found


@pytest.fixture(scope="session")
def promtool() -> str:
    """The path of promtool; a loud skip (or failure in CI) without it."""
    found = shutil.which("promtool")
    if found is None:
        _skip_or_fail(
            "alert tests (tests/deploy/test_monitoring.py)",
            "promtool is not on PATH (bash .ci/setup-promtool installs Debian's prometheus package, which has it)",
            REQUIRE_PROMTOOL,
            "DEVPLUG_REQUIRE_PROMTOOL",
        )
    assert found is not None
    return found
