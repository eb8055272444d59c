"""What the image says about itself (issue 40, item 8): OCI labels and a CycloneDX SBOM of its Python environment.

``make image`` needs root and a Debian mirror, so it is not part of ``make test``; its smoke test checks the built
image's labels and the SBOM inside it (``tools/image/smoke.py``). Here, without building: the labels
``tools/image/metadata.py`` computes (from ``pyproject.toml`` and git), the SBOM it writes with cyclonedx-py for an
environment laid out as the image's is (read under the root filesystem, not through this machine's paths), offline,
and that ``build.sh`` and the Dockerfile use them."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "org.opencontainers.image."


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("devplug_image_metadata", ROOT / "tools" / "image" / "metadata.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


metadata = _load()


def _git(folder: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def _checkout(tmp_path: Path) -> Path:
    """A git checkout with devplug's pyproject.toml, one commit made at a known time."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    _git(repo, "init", "-q")
    _git(repo, "add", "pyproject.toml")
    who = ["-c", "user.name=t", "-c", "user.email=t@example.com"]
    date = "GIT_COMMITTER_DATE=2026-01-02T03:04:05Z"
    subprocess.run(["env", date, "git", "-C", str(repo), *who, "commit", "-qm", "x"], check=True, timeout=60)
    return repo


def test_the_labels_say_what_the_image_is_and_which_commit_it_was_built_from(tmp_path: Path) -> None:
    repo = _checkout(tmp_path)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    labels = metadata.labels(repo, "0.1.0", environ={})
    commit = _git(repo, "rev-parse", "HEAD")
    assert labels == {
        PREFIX + "title": "devplug",
        PREFIX + "description": project["description"],
        PREFIX + "version": "0.1.0",
        PREFIX + "licenses": project["license"] == "Apache-2.0" and "Apache-2.0",
        PREFIX + "revision": commit,
        PREFIX + "created": "2026-01-02T03:04:05Z",
    }, "no source: nothing says where it is"
    (repo / "pyproject.toml").write_text((repo / "pyproject.toml").read_text() + "\n")
    assert metadata.labels(repo, "0.1.0", environ={})[PREFIX + "revision"] == f"{commit}-dirty"


def test_the_source_label_comes_from_the_environment_or_the_origin_remote(tmp_path: Path) -> None:
    repo = _checkout(tmp_path)
    given = {"DEVPLUG_IMAGE_SOURCE": "https://git.example.com/devplug"}
    assert metadata.labels(repo, "0.1.0", environ=given)[PREFIX + "source"] == "https://git.example.com/devplug"
    _git(repo, "remote", "add", "origin", "git@git.example.com:team/devplug.git")
    assert metadata.labels(repo, "0.1.0", environ={})[PREFIX + "source"] == "https://git.example.com/team/devplug"


@pytest.mark.parametrize(
    ("remote", "url"),
    [
        ("git@git.example.com:team/devplug.git", "https://git.example.com/team/devplug"),
        ("ssh://git@git.example.com:2222/team/devplug.git", "https://git.example.com/team/devplug"),
        ("https://user:token@git.example.com/team/devplug.git", "https://git.example.com/team/devplug"),
        ("https://git.example.com/team/devplug/", "https://git.example.com/team/devplug"),
        ("/srv/git/devplug.git", ""),  # a local path is nowhere to get the source from
    ],
)
def test_a_remote_becomes_a_url_without_credentials(remote: str, url: str) -> None:
    assert metadata.https_url(remote) == url


def test_the_labels_command_prints_one_label_a_line_and_warns_without_a_source(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "image" / "metadata.py"), "labels", "9.9.9"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    lines = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert lines[PREFIX + "version"] == "9.9.9" and lines[PREFIX + "title"] == "devplug"
    if PREFIX + "source" not in lines:
        assert "DEVPLUG_IMAGE_SOURCE" in done.stderr


def _environment(site_packages: Path, distributions: dict[str, str]) -> None:
    """An environment's site-packages as pip leaves it: a dist-info folder with METADATA for each distribution."""
    for name, version in distributions.items():
        info = site_packages / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\nLicense-Expression: Apache-2.0\n"
        )
        (info / "RECORD").write_text("")


def test_the_sbom_lists_every_distribution_of_the_images_environment_read_under_its_root(tmp_path: Path) -> None:
    """As build.sh runs it: the image's Python (here a stand-in) gives its sys.path as the image sees it; the SBOM is
    read from those paths under the root filesystem, validated against CycloneDX's schema, offline."""
    rootfs = tmp_path / "rootfs"
    site = "/opt/devplug/lib/python3.11/site-packages"
    wanted = {"devplug": "0.1.0", "devplug-mock": "0.1.0", "grpcio": "1.85.1", "prometheus-client": "0.21.0"}
    _environment(rootfs / site.lstrip("/"), wanted)
    # The image's interpreter, as cyclonedx-py calls it (python -c 'print sys.path'): its own paths, not this machine's.
    image_python = tmp_path / "image-python"
    image_python.write_text(f"#!/bin/sh\nprintf '%s' '{json.dumps(['/usr/lib/python3.11', site])}'\n")
    image_python.chmod(0o755)
    out = tmp_path / "sbom.cdx.json"
    document = metadata.sbom(out, [str(image_python)], str(rootfs))
    assert json.loads(out.read_text()) == document
    assert document["bomFormat"] == "CycloneDX" and document["specVersion"] == "1.6"
    root = document["metadata"]["component"]  # pyproject.toml's project, which stands for the installed devplug
    assert (root["name"], root["version"], root["type"]) == ("devplug", "0.1.0", "application")
    listed = {c["name"]: c["version"] for c in [*document["components"], root]}
    assert {name.replace("_", "-").lower(): v for name, v in listed.items()} == wanted
    purls = {c["purl"] for c in document["components"]}
    assert "pkg:pypi/grpcio@1.85.1" in purls


def test_the_sbom_of_a_missing_environment_fails_the_build(tmp_path: Path) -> None:
    """A wrong root (nothing at the image's paths) is an error, not an empty SBOM."""
    image_python = tmp_path / "image-python"
    image_python.write_text("#!/bin/sh\nprintf '%s' '[\"/opt/devplug/lib/python3.11/site-packages\"]'\n")
    image_python.chmod(0o755)
    with pytest.raises(RuntimeError, match="lacks devplug"):
        metadata.sbom(tmp_path / "sbom.json", [str(image_python)], str(tmp_path / "nowhere"))


def _script() -> list[str]:
    text = re.sub(r"\\\n", " ", (ROOT / "tools" / "image" / "build.sh").read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_make_image_labels_the_image_and_puts_the_sbom_in_it_before_packing() -> None:
    lines = _script()
    (config,) = [line for line in lines if line.startswith("umoci config ")]
    assert '"${label_args[@]}"' in config and '--architecture "$arch"' in config
    assert 'mapfile -t found_labels < <("$python" "$here/metadata.py" labels "$version")' in lines
    (sbom,) = [i for i, line in enumerate(lines) if '"$here/metadata.py" sbom' in line]
    words = shlex.split(lines[sbom])
    assert words[words.index("--") + 1 :] == ["chroot", "$rootfs", "/opt/devplug/bin/python"], "the image's Python"
    assert words[words.index("--root") + 1] == "$rootfs"
    copy = lines.index('cp "$sbom" "$rootfs/opt/devplug/sbom.cdx.json"')
    uninstall = next(i for i, line in enumerate(lines) if "uninstall --quiet --yes pip" in line)
    repack = next(i for i, line in enumerate(lines) if line.startswith("umoci repack"))
    assert uninstall < sbom < copy < repack, "the SBOM of the environment as shipped (pip gone), inside the layer"
    assert any('smoke.py" "$archive" "$name:$version" --sbom "$sbom"' in line for line in lines)


def test_make_image_refuses_another_architecture_saying_why(tmp_path: Path) -> None:
    """make image builds for this machine's architecture; asked for another, it says why not and how, before
    anything is installed or built (no root needed to hear it)."""
    if subprocess.run(["id", "-u"], capture_output=True, text=True, check=True).stdout.strip() != "0":
        pytest.skip("build.sh checks for root first")
    machine = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout
    other = "arm64" if machine.strip() != "arm64" else "amd64"
    done = subprocess.run(
        ["bash", str(ROOT / "tools" / "image" / "build.sh"), str(tmp_path / "dist"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEVPLUG_IMAGE_ARCH": other},
    )
    assert done.returncode == 1
    assert f"builds for this machine's architecture ({machine.strip()}), not {other}" in done.stderr
    assert f"docker buildx build --platform linux/{other}" in done.stderr
    assert not (tmp_path / "out").exists()


def test_the_dockerfile_sets_the_same_labels() -> None:
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    (label,) = [line for line in text.splitlines() if line.startswith("LABEL ")]
    keys = set(re.findall(r"(org\.opencontainers\.image\.[a-z]+)=", label))
    computed = set(metadata.labels(ROOT, "0.1.0", environ={"DEVPLUG_IMAGE_SOURCE": "https://x.example/devplug"}))
    assert keys == computed
