"""What ``make image`` says about the image it builds (issue 40, item 8): its OCI labels and its SBOM.

    python tools/image/metadata.py labels VERSION             one ``key=value`` a line, for ``umoci config``
    python tools/image/metadata.py sbom OUT --root ROOTFS -- CMD...

``labels``: the annotations of the OCI image spec (``annotations.md``, "Pre-Defined Annotation Keys") that
``docker inspect`` and registries show: ``title``, ``description`` and ``licenses`` from ``pyproject.toml``,
``version`` (the wheels' version), ``revision`` (the commit built, ``-dirty`` when tracked files differ from it),
``created`` (that commit's time, so two builds of one commit agree) and ``source`` (``DEVPLUG_IMAGE_SOURCE``, else
the ``origin`` remote's URL, else ``pyproject.toml``'s ``[project.urls] Source``; left out, with a warning on
stderr, when none says where the source is: a wrong URL would be worse than none).

``sbom``: a CycloneDX SBOM (JSON, spec 1.6) of the image's Python environment, by ``cyclonedx-py environment``
(cyclonedx-bom, the dev extra's) with devplug's ``pyproject.toml`` as its root component. ``CMD...`` runs the
image's interpreter (``chroot ROOTFS /opt/devplug/bin/python``): cyclonedx-py asks it for its ``sys.path``, which
is given back as this machine sees it, under ``ROOTFS``, so the image's own packages are read, whatever Python
runs the build. The SBOM is reproducible (``SOURCE_DATE_EPOCH``: the commit's time) and validated against
CycloneDX's schema (bundled with cyclonedx-python-lib: no network); it must list devplug and every distribution
the environment holds, or the build fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from datetime import datetime, timezone
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "org.opencontainers.image."
#: The environment variable naming the source's URL when the checkout has no ``origin`` remote.
SOURCE_ENV = "DEVPLUG_IMAGE_SOURCE"


def _git(root: Path, *args: str) -> str | None:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60, check=False)
    return done.stdout.strip() if done.returncode == 0 else None


def https_url(remote: str) -> str:
    """A remote as a URL a browser opens: ``git@host:owner/repo.git`` and ``ssh://git@host/owner/repo`` become
    ``https://host/owner/repo``; an ``http(s)`` URL loses its credentials and ``.git``."""
    url = remote.strip()
    if url.startswith("git@") and ":" in url:
        host, _, path = url[len("git@") :].partition(":")
        url = f"https://{host}/{path}"
    elif url.startswith("ssh://"):
        rest = url[len("ssh://") :].split("@", 1)[-1]
        host, _, path = rest.partition("/")
        url = f"https://{host.split(':')[0]}/{path}"
    elif url.startswith(("http://", "https://")):
        scheme, _, rest = url.partition("://")
        url = f"{scheme}://{rest.split('@', 1)[-1]}" if "@" in rest.split("/", 1)[0] else url
    else:
        return ""  # a local path or another transport: not a place to get the source from
    return url.removesuffix("/").removesuffix(".git")


def _project(root: Path) -> dict[str, object]:
    return dict(tomllib.loads((root / "pyproject.toml").read_text())["project"])


def source_url(root: Path, environ: dict[str, str] | None = None) -> str:
    """Where the image's source can be had, or "" when nothing says."""
    environ = dict(os.environ) if environ is None else environ
    if environ.get(SOURCE_ENV):
        return environ[SOURCE_ENV]
    remote = _git(root, "remote", "get-url", "origin")
    if remote and https_url(remote):
        return https_url(remote)
    urls = _project(root).get("urls")
    if isinstance(urls, dict):
        for key in ("Source", "source", "Repository", "repository"):
            if isinstance(urls.get(key), str):
                return str(urls[key])
    return ""


def revision(root: Path) -> str:
    """The commit built, ``-dirty`` when tracked files differ from it; "" outside a git checkout."""
    commit = _git(root, "rev-parse", "HEAD")
    if not commit:
        return ""
    changed = _git(root, "status", "--porcelain", "--untracked-files=no")
    return f"{commit}-dirty" if changed else commit


def commit_time(root: Path) -> int | None:
    """The commit's time (Unix seconds), the image's ``created`` and the SBOM's timestamp."""
    stamp = _git(root, "log", "-1", "--format=%ct")
    return int(stamp) if stamp else None


def labels(root: Path, version: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    project = _project(root)
    found = {
        "title": str(project["name"]),
        "description": str(project["description"]),
        "version": version,
        "licenses": str(project["license"]),
        "revision": revision(root),
        "source": source_url(root, environ),
    }
    when = commit_time(root)
    if when is not None:
        found["created"] = datetime.fromtimestamp(when, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {PREFIX + key: value for key, value in found.items() if value}


def _path_wrapper(folder: Path, command: Sequence[str], root: str) -> Path:
    """An executable cyclonedx-py runs as "the interpreter": ``command`` with its arguments, whose printed
    ``sys.path`` comes back with ``root`` before every absolute entry."""
    remap = (
        "import json, sys; root = sys.argv[1]; "
        "print(json.dumps([root + p if p.startswith('/') else p for p in json.load(sys.stdin)]))"
    )
    script = folder / "image-python"
    script.write_text(
        "#!/bin/sh\nset -e\n"
        f'{shlex.join(command)} "$@" | {shlex.quote(sys.executable)} -c {shlex.quote(remap)} {shlex.quote(root)}\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def installed(site_packages: Sequence[Path]) -> dict[str, str]:
    """The distributions of an environment, by normalised name: their versions."""
    found: dict[str, str] = {}
    for dist in importlib_metadata.distributions(path=[str(p) for p in site_packages]):
        name = dist.metadata["Name"]
        if name:
            found[name.lower().replace("_", "-")] = dist.version
    return found


def sbom(out: Path, command: Sequence[str], root: str, project_root: Path = ROOT) -> dict[str, Any]:
    """Write the CycloneDX SBOM of the environment ``command`` runs, checked whole; returns it."""
    generator = shutil.which("cyclonedx-py", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    if generator is None:
        raise RuntimeError("cyclonedx-py is not installed: pip install -e '.[dev]' (cyclonedx-bom)")
    env = dict(os.environ)
    when = commit_time(project_root)
    if when is not None:
        env["SOURCE_DATE_EPOCH"] = str(when)
    with tempfile.TemporaryDirectory() as folder:
        wrapper = _path_wrapper(Path(folder), command, root)
        done = subprocess.run(
            [
                generator,
                "environment",
                "--pyproject",
                str(project_root / "pyproject.toml"),
                "--mc-type",
                "application",
                "--spec-version",
                "1.6",
                "--output-reproducible",
                "--validate",
                "--output-format",
                "JSON",
                "--output-file",
                str(out),
                str(wrapper),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"cyclonedx-py failed ({done.returncode}): {done.stderr.strip()}")
        paths = subprocess.run(
            [str(wrapper), "-c", "import json,sys;json.dump(sys.path,sys.stdout)"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
    document = json.loads(out.read_text())
    listed = {
        c["name"].lower().replace("_", "-"): c.get("version")
        # the root component (devplug, from pyproject.toml) stands for the environment's devplug
        for c in [*document.get("components", []), document.get("metadata", {}).get("component", {})]
        if c.get("name")
    }
    site = [Path(p) for p in json.loads(paths.stdout) if p.endswith("site-packages")]
    expected = installed(site)
    missing = sorted(f"{n} {v}" for n, v in expected.items() if listed.get(n) != v)
    if not expected or "devplug" not in expected or missing:
        raise RuntimeError(f"the SBOM {out} lacks {', '.join(missing) or 'devplug'} of {', '.join(map(str, site))}")
    return dict(document)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="metadata.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    label_parser = sub.add_parser("labels", help="the image's OCI labels, key=value a line")
    label_parser.add_argument("version")
    sbom_parser = sub.add_parser("sbom", help="the CycloneDX SBOM of the image's Python environment")
    sbom_parser.add_argument("out", type=Path)
    sbom_parser.add_argument("--root", default="", help="where the image's root filesystem is on this machine")
    sbom_parser.add_argument("command", nargs="+", help="runs the image's Python (after --)")
    args = parser.parse_args(argv)
    if args.what == "labels":
        found = labels(ROOT, args.version)
        if PREFIX + "source" not in found:
            print(
                f"metadata.py: no {PREFIX}source label: set {SOURCE_ENV} to the source's URL (the checkout has no "
                "origin remote, pyproject.toml no [project.urls] Source)",
                file=sys.stderr,
            )
        for key, value in found.items():
            print(f"{key}={value}")
        return 0
    try:
        document = sbom(args.out, args.command, args.root)
    except RuntimeError as exc:
        print(f"metadata.py: {exc}", file=sys.stderr)
        return 1
    components = document.get("components", [])
    print(
        f"metadata.py: {args.out}: CycloneDX {document.get('specVersion')}, {len(components)} components",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
