"""A daemon built (not run) in a fresh interpreter, and what it imported: for the tests that a daemon loads only the
front ends its resources use (tests/test_arch_built_whole.py, tests/frontends/dra/test_assembly.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from devplug.testing.configs import dev_config, write_toml


def one_mock_config(root: Path, api: str) -> Path:
    """A config file in ``root`` with one mock resource served through ``api`` ("device-plugin" or "dra")."""
    table = {"driver": "mock", "options": {"directory": str(root / "mock")}, "api": api}
    config = dev_config(root, {"example.com/mock": table})
    config["node"] = {"name": "node-a"}
    config["kubernetes"] = {"kubeconfig": str(root / "kubeconfig")}
    path = root / "devplug.toml"
    write_toml(path, config)
    return path


def after_building_daemon(config: Path, printed: str) -> str:
    """What ``print(<printed>)`` shows in a new interpreter that built ``daemon = Daemon(load_config(config))``
    (``sys`` imported); fails with the interpreter's stderr if it did not get that far."""
    probe = (
        "import sys\n"
        "from devplug.config import load_config\n"
        "from devplug.daemon.process import Daemon\n"
        f"daemon = Daemon(load_config({str(config)!r}))\n"
        f"print({printed})\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()
