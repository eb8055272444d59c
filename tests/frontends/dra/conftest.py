"""Fixtures of the DRA front end's tests: the API server stand-in on loopback, a kubeconfig of it, waiting helpers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from devplug.testing.apiserver import ApiServer

NODE = "node-a"
DRIVER = "fpga.example.com"
NS = "default"
#: How long a test waits for something the code under test does on its own.
WAIT = 15.0

T = TypeVar("T")


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer() as server:
        yield server


def write_kubeconfig(api: ApiServer, path: Path, *, user: bool = False) -> Path:
    """A kubeconfig of the stand-in (no credentials: the stand-in checks none), with or without a user entry."""
    import yaml  # type: ignore[import-untyped]

    context: dict[str, Any] = {"cluster": "standin"}
    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "standin", "cluster": {"server": api.url}}],
        "contexts": [{"name": "standin", "context": context}],
        "current-context": "standin",
    }
    if user:
        context["user"] = "nobody"
        config["users"] = [{"name": "nobody", "user": {}}]
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def kubeconfig(api: ApiServer, tmp_path: Path) -> Path:
    return write_kubeconfig(api, tmp_path / "kubeconfig")


def node(name: str = NODE) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def run(scenario: Callable[[], Coroutine[Any, Any, T]], timeout: float = 60.0) -> T:
    """Run an async test scenario in a fresh event loop, bounded in time."""

    async def bounded() -> T:
        return await asyncio.wait_for(scenario(), timeout)

    return asyncio.run(bounded())


async def eventually(predicate: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    """Poll ``predicate`` on the event loop (the code under test runs between polls) until it is truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}", pytrace=False)
        await asyncio.sleep(0.02)
