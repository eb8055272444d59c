"""The daemon's watch of its Node (per-node profiles, issue 29) against the stand-in, over real HTTP through
lightkube's async client: the first read, label changes, 410 Gone and the read again, failures retried with
backoff until the API answers again, the server ending streams, and a client from a kubeconfig file."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from devplug.kube.client import make_client
from devplug.profiles import nodewatch
from devplug.profiles.nodeprofiles import FIELD_MANAGER, node_client
from devplug.profiles.nodewatch import NodeWatch
from devplug.testing.apiserver import ApiServer

from .conftest import node

NODE = "node-a"


def kubeconfig_for(api: ApiServer, path: Path) -> Path:
    """A kubeconfig file naming the stand-in (JSON is YAML), without credentials."""
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "standin", "cluster": {"server": api.url}}],
                "users": [{"name": "anonymous", "user": {}}],
                "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "anonymous"}}],
                "current-context": "standin",
            }
        )
    )
    return path


async def _until(predicate: Callable[[], Any], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def _label(api: ApiServer, value: str) -> None:
    current = api.get("nodes", NODE)
    current["metadata"]["labels"] = {**current["metadata"].get("labels", {}), "devplug.io/profile": value}
    api.update("nodes", current)


@pytest.fixture
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodewatch, "BACKOFF_START_S", 0.05)


def test_the_watch_follows_labels_through_410_failures_and_stream_ends(
    api: ApiServer, tmp_path: Path, fast_backoff: None
) -> None:
    api.create("nodes", node(NODE, {"devplug.io/profile": "a"}))
    api.create("nodes", node("node-b"))
    seen: list[Mapping[str, str]] = []

    async def scenario() -> None:
        client = make_client(kubeconfig_for(api, tmp_path / "kubeconfig"), field_manager=FIELD_MANAGER)
        watch = NodeWatch(client, NODE, seen.append)
        assert await watch.read() == {"devplug.io/profile": "a"}
        first_rv = watch.resource_version
        assert first_rv == api.get("nodes", NODE)["metadata"]["resourceVersion"]
        task = asyncio.ensure_future(watch.run())
        try:
            await _until(lambda: api.count("watch", "nodes") == 1, "the watch to start")
            assert api.count("get", "nodes") == 1, "run() watches from the read's resourceVersion, no second read"
            watch_request = next(r for r in api.requests if r.verb == "watch")
            assert watch_request.query["resourceVersion"] == first_rv
            assert watch_request.query["fieldSelector"] == "metadata.name=node-a"

            _label(api, "b")
            await _until(lambda: seen[-1] == {"devplug.io/profile": "b"}, "the label change")
            assert watch.state == "watching"
            api.update("nodes", {**api.get("nodes", "node-b"), "metadata": {"name": "node-b", "labels": {"x": "y"}}})

            # the server ends the stream (its timeout): watched again from the last version, no read
            api.close_watches()
            _label(api, "c")
            await _until(lambda: seen[-1] == {"devplug.io/profile": "c"}, "the change after the stream ended")
            assert api.count("get", "nodes") == 1
            assert all(labels != {"x": "y"} for labels in seen), "another node's change is not this node's"

            # an outage: the stream is cut, then the next watch fails with 500; each failure is retried with backoff
            # by reading the Node again, so a change made meanwhile (even compacted away) is not lost
            _label(api, "d")
            await _until(lambda: seen[-1] == {"devplug.io/profile": "d"}, "the change before the compaction")
            api.faults.fail(500, verb="watch", resource="nodes")  # the next watch fails once...
            api.close_watches(abrupt=True)  # ...after the connection is cut
            await _until(lambda: watch.failures >= 1, "the failed watch to be counted")
            _label(api, "e")
            api.compact()
            await _until(lambda: seen[-1] == {"devplug.io/profile": "e"}, "the change after the outage")
            # the cut stream and the 500 are each retried (a read of the Node, then a watch again)
            await _until(lambda: watch.failures >= 2, "both failures to be retried")
            assert api.count("watch", "nodes", code=500) == 1
            await _until(lambda: api.count("get", "nodes") >= 3, "the Node read again after each failure")
            _label(api, "f")
            await _until(lambda: seen[-1] == {"devplug.io/profile": "f"}, "a change once watching again")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.close()

    asyncio.run(scenario())


def test_an_expired_watch_reads_the_node_again(api: ApiServer, tmp_path: Path, fast_backoff: None) -> None:
    api.create("nodes", node(NODE, {"devplug.io/profile": "a"}))
    seen: list[Mapping[str, str]] = []

    async def scenario() -> None:
        client = make_client(kubeconfig_for(api, tmp_path / "kubeconfig"), field_manager=FIELD_MANAGER)
        watch = NodeWatch(client, NODE, seen.append)
        await watch.read()
        old = watch.resource_version
        _label(api, "b")
        api.compact()  # the version read is now out of the window: the watch from it gets 410 Gone
        task = asyncio.ensure_future(watch.run())
        try:
            await _until(lambda: watch.expired == 1, "the 410 Gone")
            await _until(lambda: seen[-1] == {"devplug.io/profile": "b"}, "the read after the 410")
            assert watch.resource_version != old
            assert api.count("get", "nodes") == 2 and watch.failures == 0, "a 410 is no failure: read at once"
            assert api.count("watch", "nodes", code=200) >= 1
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.close()

    asyncio.run(scenario())


def test_a_missing_node_or_an_unreachable_server_is_retried_with_backoff(
    api: ApiServer, tmp_path: Path, fast_backoff: None
) -> None:
    seen: list[Mapping[str, str]] = []

    async def scenario() -> None:
        client = make_client(kubeconfig_for(api, tmp_path / "kubeconfig"), field_manager=FIELD_MANAGER)
        watch = NodeWatch(client, NODE, seen.append)
        task = asyncio.ensure_future(watch.run())
        try:
            await _until(lambda: watch.failures >= 4, "four failed reads")
            assert watch.state == "retrying"
            assert watch.detail == 'the API server answered 404: nodes "node-a" not found'
            gets = [r for r in api.requests if r.verb == "get"]
            gaps = [b.time - a.time for a, b in itertools.pairwise(gets)]
            # 0.05 s, then 0.1, then 0.2 (each +-20 % jitter): the third wait is well over the first
            assert gaps[2] > gaps[0] * 1.5, f"the waits grow: {gaps}"
            api.create("nodes", node(NODE, {"devplug.io/profile": "a"}))
            await _until(lambda: seen == [{"devplug.io/profile": "a"}], "the node once it exists")
            await _until(lambda: watch.state == "watching", "the watch")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.close()
        assert task.cancelled(), "only cancelling ends the loop"

    asyncio.run(scenario())


def test_no_credentials_is_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    client, why = node_client(tmp_path / "nope")
    assert client is None
    assert why == f"no API server credentials: kubeconfig {tmp_path / 'nope'}: no such file"
    client, why = node_client(None)  # in-cluster, but not in a pod
    assert client is None and why is not None
    assert why.startswith("no API server credentials: no kubeconfig is configured and this is not a pod: ")
