"""The daemon builds a DRA front end only for a resource with ``api = "dra"``, and imports the DRA modules and
lightkube only then; without lightkube such a config is refused naming the resources and the package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from devplug.config import load_config
from devplug.daemon.process import Daemon
from devplug.errors import ConfigError
from tests.support.daemonprobe import after_building_daemon, one_mock_config


def test_without_lightkube_a_dra_resource_is_refused_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_config(one_mock_config(tmp_path, "dra"))
    real = importlib.util.find_spec

    def hidden(name: str, *args: object) -> object:
        return None if name == "lightkube" else real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", hidden)
    with pytest.raises(
        ConfigError, match=r"example.com/mock are served through DRA .*pip install 'devplug\[kubernetes\]'"
    ):
        Daemon(config)


def test_a_device_plugin_daemon_never_imports_the_dra_front_end(tmp_path: Path) -> None:
    printed = after_building_daemon(
        one_mock_config(tmp_path, "device-plugin"),
        "sorted(m for m in sys.modules if m.startswith(('lightkube', 'devplug.frontends.dra')))",
    )
    assert printed == "[]"


def test_a_dra_daemon_builds_the_dra_front_end(tmp_path: Path) -> None:
    daemon = Daemon(load_config(one_mock_config(tmp_path, "dra")))
    [resource] = daemon.resources
    assert resource.endpoint.startswith("/var/lib/kubelet/plugins/mock.example.com/dra-")  # the default plugins_dir


def test_a_socket_path_too_long_is_refused_naming_it(tmp_path: Path) -> None:
    path = one_mock_config(tmp_path, "dra")
    text = path.read_text().replace("[kubelet]", f'[kubelet]\nplugins_dir = "{tmp_path / ("x" * 80)}"', 1)
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"example.com/mock: the DRA socket path .* more than a unix socket's 107"):
        Daemon(load_config(path))
