"""Drivers from the field keep working (issue 38): the compatibility corpus, ``../shared/compat-drivers``.

Each driver there was written by an outside author from devplug's documentation alone, in a wheel of its own with
its own tests (the corpus's README). On every change of the core, ``make test`` installs each one, unchanged, into
one fresh virtual environment (no system or parent site-packages) beside the current core, installed as a vendor
installs it: the wheels of ``make dist`` (offline, from ``dist/`` and its wheelhouse) when they were built from this
very tree (``dist/SOURCE-DIGEST``), the tree itself otherwise (its distribution's files copied out, then ``pip
install``). Each driver's folder is copied to a temporary folder first (nothing is written under ``shared/``) and
installed there as its README says (``pip install -e '.[test]'``), and its own tests run as its author runs them
(``python -m pytest`` in that folder), both drivers' suites at once. A failure names the driver and its failing
tests. Without the corpus the test skips loudly; ``DEVPLUG_REQUIRE_COMPAT=1`` (CI) or ``DEVPLUG_REQUIRE_DIST=1``
makes that a failure. The corpus's files are never edited to make them pass: fix the core, or make the change
opt-in with a deprecation warning (``docs/driver/compatibility.md``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "compat-drivers"
DIST = ROOT / "dist"
REQUIRE_ENVS = ("DEVPLUG_REQUIRE_COMPAT", "DEVPLUG_REQUIRE_DIST")
#: How long one driver's whole suite may take (they run side by side).
SUITE_TIMEOUT = 900
#: What a copy of a driver leaves out: what a previous run or an editor left beside it.
_LITTER = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", "*.egg-info", "build", "dist")
#: The core's distribution is built from these (MANIFEST.in, pyproject.toml), the test kit's from testkit/.
_CORE_FILES = ("pyproject.toml", "MANIFEST.in", "README.md", "LICENSE", "config.example.toml")
_CORE_TREES = ("core", "proto", "testkit")


def _corpus() -> list[str]:
    return sorted(p.parent.name for p in CORPUS.glob("*/pyproject.toml")) if CORPUS.is_dir() else []


@dataclass(frozen=True)
class SuiteRun:
    """One corpus driver's own suite, as it ran: exit code, output, seconds."""

    driver: str
    returncode: int
    output: str
    seconds: float

    def failing_tests(self) -> list[str]:
        return re.findall(r"^(?:FAILED|ERROR) (\S+)", self.output, re.MULTILINE)


def _env() -> dict[str, str]:
    """This process's environment without what would point a child at this venv or this tree."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def _run(argv: list[str], cwd: Path, timeout: float = 600, isolated_pip: bool = False) -> str:
    env = _env()
    if isolated_pip:  # no pip.conf, no PIP_* variables: only what is named here
        env = {k: v for k, v in env.items() if not k.startswith("PIP_")}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _dist_wheel() -> Path | None:
    """The core's wheel of ``make dist`` when it was built from this tree, else None."""
    digest = DIST / "SOURCE-DIGEST"
    if not digest.is_file():
        return None
    spec = importlib.util.spec_from_file_location("devplug_dist_digest", ROOT / "tools" / "dist_digest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if digest.read_text().strip() != module.source_digest():
        return None
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    wheel = DIST / f"devplug-{version}-py3-none-any.whl"
    return wheel if wheel.is_file() else None


def _install_core(pip: list[str], work: Path) -> str:
    """The current core into the venv of ``pip``: the wheel of ``make dist``, or the tree; says which."""
    wheel = _dist_wheel()
    if wheel is not None:
        offline = ["--isolated", "install", "--no-index", "--find-links", str(DIST), "--find-links"]
        _run([*pip, *offline, str(DIST / "wheelhouse"), str(wheel)], work, isolated_pip=True)
        return f"the wheel of make dist, {wheel.name}"
    source = work / "devplug-core"
    source.mkdir()
    for name in _CORE_FILES:
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, source / name)
    for tree in _CORE_TREES:
        shutil.copytree(ROOT / tree, source / tree, ignore=_LITTER)
    # devplug depends on devplug-testing until 1.0: both from this tree, in one install (never an index's).
    _run([*pip, "install", "--no-build-isolation", str(source), str(source / "testkit")], work)
    return "this tree (no dist/ built from it)"


@pytest.fixture(scope="session")
def corpus_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SuiteRun]:
    """Every corpus driver installed beside the current core in one fresh venv, its own suite run; by driver."""
    work = tmp_path_factory.mktemp("field")
    interpreter = getattr(sys, "_base_executable", sys.executable)  # not this venv's: it inherits nothing from it
    _run([interpreter, "-m", "venv", str(work / "venv")], work, timeout=300)
    python = str(work / "venv" / "bin" / "python")
    pip = [python, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    # What a driver author's `pip install -e '.[test]'` fetches besides the core: setuptools to build, pytest.
    _run([*pip, "install", "setuptools>=68", "pytest>=8"], work)
    core = _install_core(pip, work)
    copies = {}
    for driver in _corpus():
        copy = work / driver
        shutil.copytree(CORPUS / driver, copy, ignore=_LITTER)
        copy.chmod(0o755)  # shared/ may come without write bits
        for path in copy.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        _run([*pip, "install", "--no-build-isolation", "-e", f"{copy}[test]"], work)
        copies[driver] = copy
    installed = _run([python, "-c", "import devplug, sys; print(devplug.__file__)"], work).strip()
    assert installed.startswith(str(work / "venv")), f"devplug imported from {installed}, not the fresh venv"
    started = time.monotonic()
    children = {
        driver: subprocess.Popen(
            [python, "-m", "pytest"],
            cwd=copy,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for driver, copy in copies.items()
    }
    runs = {}
    for driver, child in children.items():
        try:
            output, _ = child.communicate(timeout=max(1.0, SUITE_TIMEOUT - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, 9)
            output, _ = child.communicate()
            output += f"\n(killed after {SUITE_TIMEOUT} s)"
        runs[driver] = SuiteRun(driver, child.returncode, f"core: {core}\n{output}", time.monotonic() - started)
    return runs


def _required() -> str:
    return next((name for name in REQUIRE_ENVS if os.environ.get(name) == "1"), "")


@pytest.mark.parametrize("driver", _corpus() or ["(no corpus)"])
def test_a_driver_from_the_field_passes_its_own_tests_unchanged(driver: str, request: pytest.FixtureRequest) -> None:
    if not CORPUS.is_dir():
        reason = f"the compatibility corpus was NOT run: {CORPUS} is absent (CI has it at ../shared)"
        if _required():
            pytest.fail(f"{reason} [{_required()}=1]", pytrace=False)
        pytest.skip(reason)
    run: SuiteRun = request.getfixturevalue("corpus_runs")[driver]
    failing = run.failing_tests()
    assert run.returncode == 0, (
        f"{driver} from ../shared/compat-drivers fails its own tests against this core "
        f"(exit {run.returncode}; failing: {', '.join(failing) or 'see the output'}). Never edit the driver: fix the "
        f"core, or make the change opt-in with a DeprecationWarning (docs/driver/compatibility.md).\n"
        f"{run.output[-6000:]}"
    )
    assert re.search(r"\d+ passed", run.output), run.output[-3000:]  # the suite ran (its own skips are its own)
