"""The image holds what every config of ``deploy/`` needs, checked without building it.

``tools/image/contents.py`` says what the image of ``make image`` and of the ``Dockerfile`` installs (the core with
every extra for users, every driver) and which config features need which extra. Here: every config an overlay
ships, alone and with each component's config fragment appended as that component does, asks only for drivers the
image installs and features whose extras it installs; the build script and the Dockerfile install exactly the list
``contents.py`` gives; and that list is right for a folder of wheels."""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _load_contents() -> ModuleType:
    spec = importlib.util.spec_from_file_location("devplug_image_contents", ROOT / "tools" / "image" / "contents.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


contents = _load_contents()


def _shipped_configs() -> dict[str, str]:
    """Every config an overlay can run, by a label: each config.toml, and each with each component fragment."""
    configs = {str(p.relative_to(ROOT)): p.read_text() for p in sorted(DEPLOY.glob("**/config.toml"))}
    fragments = sorted(DEPLOY.glob("components/*/*.toml"))
    assert fragments, "components/cdi/cdi.toml is a config fragment"
    for label, text in list(configs.items()):
        for fragment in fragments:
            configs[f"{label} + {fragment.relative_to(ROOT)}"] = text + fragment.read_text()
    return configs


def _lacking(config: dict[str, Any], extras: frozenset[str], drivers: frozenset[str]) -> list[str]:
    """What ``config`` needs that an image with ``extras`` and ``drivers`` lacks."""
    missing = [f"extra {e!r}" for e in sorted(contents.needed_extras(config) - extras)]
    missing += [f"driver {d!r}" for d in sorted(contents.used_drivers(config) - drivers)]
    return missing


@pytest.mark.parametrize(("label", "text"), sorted(_shipped_configs().items()))
def test_every_deploy_config_needs_only_what_the_image_installs(label: str, text: str) -> None:
    config = tomllib.loads(text)
    lacking = _lacking(config, contents.core_extras(), contents.shipped_drivers())
    assert not lacking, f"{label} turns on what the image lacks: {', '.join(lacking)}"


def test_the_check_catches_a_config_the_image_cannot_run() -> None:
    """The check above can fail: [metrics] on, in an image without the metrics extra; a driver not installed."""
    config = tomllib.loads((DEPLOY / "base" / "config.toml").read_text())
    assert config["metrics"]["enabled"] is True
    assert _lacking(config, frozenset(), contents.shipped_drivers()) == ["extra 'metrics'"]
    assert _lacking(config, frozenset({"metrics"}), frozenset({"vfio"})) == ["driver 'mock'"]
    config["metrics"]["enabled"] = False
    assert _lacking(config, frozenset(), contents.shipped_drivers()) == []


def test_every_extra_for_users_is_tied_to_the_config_feature_that_needs_it() -> None:
    """A new extra in pyproject.toml must say which config key turns it on, or the check above cannot see it."""
    assert contents.core_extras() == frozenset(contents.FEATURE_EXTRAS.values()) | frozenset(
        contents.RESOURCE_FEATURE_EXTRAS.values()
    ) | frozenset(contents.TABLE_EXTRAS.values())
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    # The image's extras and the dev extra agree on what they bring (the tests run with the same packages).
    for extra in contents.core_extras():
        assert set(pyproject[extra]) <= set(pyproject["dev"]), extra


def test_the_metrics_feature_is_the_one_the_config_checks() -> None:
    """FEATURE_EXTRAS follows devplug's own check: [metrics] enabled needs prometheus_client (devplug.config)."""
    source = (ROOT / "core" / "devplug" / "config" / "__init__.py").read_text()
    assert 'importlib.util.find_spec("prometheus_client")' in source
    assert contents.FEATURE_EXTRAS == {("metrics", "enabled"): "metrics"}
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("prometheus-client") for req in pyproject["metrics"])


def test_a_resource_served_through_dra_needs_the_kubernetes_extra() -> None:
    """The DRA front end talks to the API server through lightkube, the kubernetes extra's only dependency."""
    config = tomllib.loads((DEPLOY / "base" / "config.toml").read_text())
    (name, resource), *_ = config["resources"].items()
    assert _lacking(config, frozenset({"metrics"}), contents.shipped_drivers()) == []
    resource["api"] = "dra"
    assert _lacking(config, frozenset({"metrics"}), contents.shipped_drivers()) == ["extra 'kubernetes'"]
    assert "kubernetes" in contents.core_extras(), f"the image would not run {name} through DRA"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert [req.split(">")[0] for req in pyproject["kubernetes"]] == ["lightkube"]


def test_per_node_profiles_need_the_kubernetes_extra() -> None:
    """[profiles] make the daemon read and watch its Node through lightkube (devplug.kube.client)."""
    config = tomllib.loads((DEPLOY / "base" / "config.toml").read_text())
    config["profiles"] = {"fpga-regions": {"remove": []}}
    assert _lacking(config, frozenset({"metrics"}), contents.shipped_drivers()) == ["extra 'kubernetes'"]
    assert "from devplug.kube.client import" in (ROOT / "core" / "devplug" / "profiles" / "nodeprofiles.py").read_text()
    assert "from lightkube import" in (ROOT / "core" / "devplug" / "kube" / "client.py").read_text()


def _wheel(folder: Path, name: str, version: str, extras: tuple[str, ...] = ()) -> Path:
    distribution = name.replace("-", "_")
    path = folder / f"{distribution}-{version}-py3-none-any.whl"
    metadata = ["Metadata-Version: 2.4", f"Name: {name}", f"Version: {version}"]
    metadata += [f"Provides-Extra: {e}" for e in extras]
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{distribution}-{version}.dist-info/METADATA", "\n".join(metadata) + "\n")
    return path


def test_requirements_name_the_core_with_its_extras_for_users_and_every_driver(tmp_path: Path) -> None:
    _wheel(tmp_path, "devplug", "0.1.0", ("metrics", "dev"))
    _wheel(tmp_path, "devplug-mock", "0.1.0")
    _wheel(tmp_path, "devplug-vfio", "0.1.0")
    assert contents.requirements(tmp_path, "/wheels") == [
        "/wheels/devplug-0.1.0-py3-none-any.whl[metrics]",
        "/wheels/devplug_mock-0.1.0-py3-none-any.whl",
        "/wheels/devplug_vfio-0.1.0-py3-none-any.whl",
    ]
    assert contents.requirements(tmp_path)[0] == f"{tmp_path}/devplug-0.1.0-py3-none-any.whl[metrics]"
    assert contents.main(["requirements", str(tmp_path), "--prefix", "/w/"]) == 0


def test_requirements_refuse_a_folder_without_the_core_or_with_two_of_a_wheel(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _wheel(tmp_path, "devplug-mock", "0.1.0")
    with pytest.raises(ValueError, match="no wheel of the core"):
        contents.requirements(tmp_path)
    assert contents.main(["requirements", str(tmp_path)]) == 2
    assert "no wheel of the core" in capsys.readouterr().err
    _wheel(tmp_path, "devplug", "0.1.0")
    _wheel(tmp_path, "devplug-mock", "0.2.0")
    with pytest.raises(ValueError, match="two wheels of devplug_mock"):
        contents.requirements(tmp_path)


def test_make_image_installs_the_list_contents_py_gives() -> None:
    script = re.sub(r"\\\n", " ", (ROOT / "tools" / "image" / "build.sh").read_text())
    lines = [line.strip() for line in script.splitlines() if not line.lstrip().startswith("#")]
    (listing,) = [line for line in lines if "contents.py" in line]
    assert shlex.split(listing.split("=", 1)[1].strip("$()"))[1:4] == [
        "$here/contents.py",
        "requirements",
        "$dist",
    ], listing
    (install,) = [line for line in lines if " install " in line and "pip" in line]
    assert install.endswith('"${requirements[@]}"') and "--no-index" in install, install
    assert 'mapfile -t requirements <<<"$listed"' in lines


def test_the_dockerfile_installs_the_list_contents_py_gives() -> None:
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    runs = [line for line in text.splitlines() if line.startswith("RUN ")]
    listing = "python tools/image/contents.py requirements /dist --prefix /wheels > /dist/requirements.txt"
    assert any(listing in r for r in runs)
    assert any("--requirement /wheels/requirements.txt" in r for r in runs)


def test_requirements_never_name_the_test_kit(tmp_path: Path) -> None:
    """Issue 39: make dist builds devplug-testing beside the core; the image's list leaves it out."""
    _wheel(tmp_path, "devplug", "0.1.0", ("metrics",))
    _wheel(tmp_path, contents.TEST_KIT, "0.1.0")
    _wheel(tmp_path, "devplug-mock", "0.1.0")
    assert contents.requirements(tmp_path, "/wheels") == [
        "/wheels/devplug-0.1.0-py3-none-any.whl[metrics]",
        "/wheels/devplug_mock-0.1.0-py3-none-any.whl",
    ]


def test_the_core_brings_the_test_kit_only_until_1_0_and_both_builds_remove_it() -> None:
    """Until devplug 1.0 the core depends on devplug-testing (drivers' tests that do not list it keep working):
    pip installs it with the core, from the wheels built beside it, and make image and the Dockerfile uninstall it
    right after; the list of what they remove is contents.py's."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    version = project["version"]
    assert f"{contents.TEST_KIT}=={version}" in project["dependencies"]
    assert contents.TEST_KIT in contents.REMOVED_AFTER_INSTALL
    script = re.sub(r"\\\n", " ", (ROOT / "tools" / "image" / "build.sh").read_text())
    lines = [line.strip() for line in script.splitlines() if not line.lstrip().startswith("#")]
    install = next(i for i, line in enumerate(lines) if " install " in line and "pip" in line)
    for name in contents.REMOVED_AFTER_INSTALL:
        (uninstall,) = [i for i, line in enumerate(lines) if " uninstall " in line and line.endswith(f" {name}")]
        assert uninstall > install
    dockerfile = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    runs = [line for line in dockerfile.splitlines() if line.startswith("RUN ")]
    (run,) = [line for line in runs if "/wheels/requirements.txt" in line]
    assert "--find-links /wheels " in run, run  # the kit's wheel from stage 1, never an index's
    for name in contents.REMOVED_AFTER_INSTALL:
        assert run.index(" install ") < run.index(f" uninstall --yes {name}"), run
    (build,) = [line for line in runs if "python -m build" in line]
    assert "python -m build --outdir /dist testkit" in build, build
