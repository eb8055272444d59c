"""The wheels of ``make dist``, installed as a user installs them: a fresh virtual environment, no editable
installs, no source tree on the path, nothing from the network (``--no-index`` from ``dist/`` and the wheelhouse
``make dist`` filled with the third-party dependencies). What is installed is what the image installs
(``tools/image/contents.py``: the core with every extra for users, every driver), so the wheelhouse must hold every
extra's dependencies. Then ``devplug`` runs from there, in a folder outside the repository: its version, every
driver with its version and contract, the demo's whole lifecycle, and ``check-config`` on the deploy configs."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devplug import HOOK_CONTRACT
from tests.core.test_contract import SHIPPED_CONTRACTS

ROOT = Path(__file__).resolve().parents[2]


def _image_requirements(dist: Path) -> list[str]:
    """What the image installs from ``dist`` (tools/image/contents.py)."""
    return list(_image_contents().requirements(dist))


@dataclass(frozen=True)
class InstalledVenv:
    """A fresh venv with the wheels installed, and a folder outside the repository to run its commands in."""

    prefix: Path
    cwd: Path
    versions: dict[str, str]

    def run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` with the venv's bin first on PATH, no PYTHONPATH and no pip configuration."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV"))}
        env["PATH"] = f"{self.prefix / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=self.cwd, env=env)

    def python(self, source: str) -> str:
        result = self.run(str(self.prefix / "bin" / "python"), "-c", source)
        assert result.returncode == 0, result.stderr
        return result.stdout


def _image_contents() -> Any:
    spec = importlib.util.spec_from_file_location("devplug_image_contents", ROOT / "tools" / "image" / "contents.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def installed(dist: Any, tmp_path_factory: pytest.TempPathFactory) -> InstalledVenv:
    return _install(dist, tmp_path_factory.mktemp("wheels"))


@pytest.fixture(scope="module")
def image_venv(dist: Any, tmp_path_factory: pytest.TempPathFactory) -> InstalledVenv:
    """Installed as the image is (tools/image/build.sh, the Dockerfile): the same list, then what the image removes
    (the test kit, which the core depends on until devplug 1.0) uninstalled."""
    venv = _install(dist, tmp_path_factory.mktemp("image"))
    removed = _image_contents().REMOVED_AFTER_INSTALL
    python = str(venv.prefix / "bin" / "python")
    uninstall = venv.run(python, "-m", "pip", "--isolated", "uninstall", "--yes", *removed, timeout=120)
    assert uninstall.returncode == 0, uninstall.stdout + uninstall.stderr
    return venv


def _install(dist: Any, base: Path) -> InstalledVenv:
    prefix, cwd = base / "venv", base / "cwd"
    cwd.mkdir()
    # The interpreter under the test's own venv, so the new venv inherits nothing from .venv.
    interpreter = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([interpreter, "-m", "venv", str(prefix)], check=True, timeout=120)
    venv = InstalledVenv(prefix, cwd, dist.versions)
    install = venv.run(
        str(prefix / "bin" / "python"),
        "-m",
        "pip",
        "--isolated",  # no pip.conf, no PIP_* variables: only what is named here
        "--disable-pip-version-check",
        "install",
        "--no-index",
        "--no-cache-dir",
        "--find-links",
        str(dist.folder),
        "--find-links",
        str(dist.wheelhouse),
        *_image_requirements(dist.folder),
        timeout=300,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    return venv


def test_the_wheels_are_installed_as_wheels_not_from_the_source_tree(installed: InstalledVenv) -> None:
    modules = ["devplug", *(name.replace("-", "_") for name in installed.versions if name != "devplug")]
    files = json.loads(
        installed.python(
            f"import json, {', '.join(modules)}; print(json.dumps([{', '.join(f'{m}.__file__' for m in modules)}]))"
        )
    )
    site = installed.prefix.resolve()
    for module, file in zip(modules, files, strict=True):
        assert Path(file).resolve().is_relative_to(site), f"{module} imported from {file}, not from the new venv"
    assert str(ROOT) not in installed.python("import sys; print(sys.path)")
    site_packages = next((installed.prefix / "lib").glob("python3*/site-packages"))
    for pth in site_packages.glob("*.pth"):  # an editable install leaves a .pth (or a finder) pointing at the tree
        assert str(ROOT) not in pth.read_text(), f"{pth.name} points into the source tree"
    for name in installed.versions:
        (info,) = site_packages.glob(f"{name.replace('-', '_')}-*.dist-info")
        direct_url = info / "direct_url.json"
        if direct_url.is_file():  # pip records where a wheel file came from; never an editable project
            assert not json.loads(direct_url.read_text()).get("dir_info", {}).get("editable"), info.name
    check = installed.run(str(installed.prefix / "bin" / "python"), "-m", "pip", "--isolated", "check")
    assert check.returncode == 0, check.stdout + check.stderr  # every declared dependency (devplug's range) is met


def test_devplug_version_from_the_installed_wheels(installed: InstalledVenv) -> None:
    result = installed.run("devplug", "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"devplug {installed.versions['devplug']} (hook contract {HOOK_CONTRACT})"


def test_devplug_drivers_lists_every_driver_with_its_version(installed: InstalledVenv) -> None:
    result = installed.run("devplug", "drivers", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["distribution"]: row for row in json.loads(result.stdout)}
    drivers = {name: version for name, version in installed.versions.items() if name != "devplug"}
    assert sorted(rows) == sorted(drivers)
    for distribution, version in drivers.items():
        row = rows[distribution]
        assert row["name"] == distribution.removeprefix("devplug-"), row
        declared = SHIPPED_CONTRACTS[row["name"]]  # the mock keeps 1.0: tests/core/test_contract.py says why
        assert row["version"] == version and row["hook_contract"] == declared, row
        assert "error" not in row and "list_devices" in row["hooks"], row
    text = installed.run("devplug", "drivers").stdout
    for distribution, version in drivers.items():
        declared = SHIPPED_CONTRACTS[distribution.removeprefix("devplug-")]
        assert f"{distribution} {version} (hook contract {declared})" in text


def test_the_demo_runs_from_the_installed_wheels(installed: InstalledVenv) -> None:
    result = installed.run("devplug", "demo", timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.rstrip().endswith("lifecycle checks passed")
    assert "FAILED" not in result.stdout


def test_each_driver_wheel_declares_the_compatible_core_range(dist: Any) -> None:
    for name, version in dist.versions.items():
        if name == "devplug":
            continue
        wheel = dist.folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel) as archive:
            metadata = archive.read(f"{name.replace('-', '_')}-{version}.dist-info/METADATA").decode()
        requires = [
            line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")
        ]
        assert "devplug<0.2,>=0.1" in requires, (wheel.name, requires)


def test_every_extra_for_users_is_installed_from_the_wheelhouse(installed: InstalledVenv) -> None:
    """The core's extras (metrics: prometheus-client) came from the wheelhouse, offline, as in the image."""
    imported = installed.python("import prometheus_client; print(prometheus_client.__name__)")
    assert imported.strip() == "prometheus_client"


@pytest.mark.parametrize("config", ["base", "shared"])
def test_check_config_accepts_the_deploy_configs_from_the_installed_wheels(
    installed: InstalledVenv, config: str, tmp_path: Path
) -> None:
    """A config of deploy/ with [metrics] on passes where only the wheels and the wheelhouse were installed."""
    source = ROOT / "deploy" / ("base" if config == "base" else "overlays/shared") / "config.toml"
    path = tmp_path / "config.toml"
    path.write_text(source.read_text())
    result = installed.run("devplug", "check-config", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{path}: ok" in result.stdout


def test_the_image_carries_no_test_kit_and_says_what_its_commands_need(image_venv: InstalledVenv) -> None:
    """Issue 39: without devplug-testing, the runtime imports and runs (drivers, check-config); the test kit's
    modules are absent and its commands say they need it."""
    absent = image_venv.python(
        "import importlib.util as u; "
        "print([u.find_spec(m) is None for m in ('devplug.testing', 'devplug.devkubelet', 'devplug.demo')])"
    )
    assert absent.strip() == "[True, True, True]", absent
    drivers = image_venv.run("devplug", "drivers", "--json")
    assert drivers.returncode == 0, drivers.stderr
    assert {row["distribution"] for row in json.loads(drivers.stdout)} == {
        name for name in image_venv.versions if name != "devplug"
    }
    for command in ("demo", "kubelet"):
        result = image_venv.run("devplug", command)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "pip install devplug-testing" in result.stderr, result.stderr
