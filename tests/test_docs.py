"""The README keeps step with the code: every hook with its signature, every config key, both commands."""

from __future__ import annotations

import inspect
from pathlib import Path

from devplug import hookspecs
from devplug.config import _KUBELET, _RELEASE, _RESOURCE, _SHUTDOWN, _STATE
from devplug.drivers import HOOK_NAMES

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_every_hook_is_documented_with_its_signature() -> None:
    for name in HOOK_NAMES:
        signature = name + str(inspect.signature(getattr(hookspecs, name))).replace("'", "")
        assert f"`{signature.replace('|', chr(92) + '|')}`" in README or f"`{signature}`" in README, signature


def test_every_hookspec_is_in_the_hook_list() -> None:
    specs = {n for n, f in vars(hookspecs).items() if hasattr(f, f"{hookspecs.PROJECT_NAME}_spec")}
    assert specs == set(HOOK_NAMES)


def test_every_config_key_is_documented() -> None:
    for table, keys in (("kubelet", _KUBELET), ("state", _STATE), ("release", _RELEASE), ("shutdown", _SHUTDOWN)):
        for key in keys:
            assert f"`[{table}] {key}`" in README, f"[{table}] {key}"
    for key in _RESOURCE:
        assert f"{key}`" in README, key


def test_readme_starts_with_the_two_commands() -> None:
    head = README[:400]
    assert "make demo" in head and "make test" in head
