"""resourceVersion semantics through lightkube and raw HTTP: watches that resume, 410 Gone and the relist, chunked
lists, exact lists, bookmarks, injected faults (the API concepts page's rules, as the model cites them)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any

import pytest
from lightkube import ApiError
from lightkube.resources.resource_v1 import ResourceSlice
from lightkube.types import on_error_retry

from devplug.testing.apiserver import ApiServer

from .conftest import slice_of, status_of


def _get(api: ApiServer, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(api.url + path, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _publish(api: ApiServer, name: str, devices: list[str]) -> dict[str, Any]:
    return api.apply("resourceslices", slice_of(name, None, devices), "fpga.example.com", force=True)


def test_a_watch_resumes_from_its_last_resource_version_after_the_stream_ends(
    api: ApiServer, client: Any, watch_thread: Any
) -> None:
    _publish(api, "s0", ["a"])
    listed = client.list(ResourceSlice)
    assert [s.metadata.name for s in listed] == ["s0"]
    # on_error_retry: a cut connection (below) is an httpx error, which lightkube's default raises
    watch = watch_thread(
        lambda: client.watch(ResourceSlice, resource_version=listed.resourceVersion, on_error=on_error_retry)
    )
    _publish(api, "s1", ["a"])
    assert watch.next()[:2] == ("ADDED", "s1")
    api.close_watches()  # the server ends the stream (a timeout, a restart): lightkube watches again from s1's rv
    _publish(api, "s0", ["b"])
    assert watch.next()[:2] == ("MODIFIED", "s0")
    api.close_watches(abrupt=True)  # the connection cut mid-stream
    api.delete("resourceslices", "s1")
    kind, name, rv = watch.next()
    assert (kind, name, rv) == ("DELETED", "s1", str(api.storage.revision))
    watches = [r for r in api.requests if r.verb == "watch"]
    assert len(watches) >= 2, "each end of stream was followed by a new watch"
    assert api.count("list", "resourceslices") == 1, "no relist: the history covered each resume"
    api.close()


def test_a_resource_version_older_than_the_window_is_410_and_lightkube_relists(
    api: ApiServer, client: Any, watch_thread: Any
) -> None:
    _publish(api, "s0", ["a"])
    listed = client.list(ResourceSlice)
    assert len(list(listed)) == 1
    old = listed.resourceVersion
    _publish(api, "s1", ["a"])
    api.compact()
    with pytest.raises(ApiError) as gone:
        next(iter(client.watch(ResourceSlice, resource_version=old)))
    assert (gone.value.status.code, gone.value.status.reason) == (410, "Expired")
    assert status_of(gone)["message"] == f"too old resource version: {old} ({api.storage.compacted})"
    watch = watch_thread(lambda: client.watch(ResourceSlice, resource_version=old, on_error=on_error_retry))
    first = {watch.next()[:2], watch.next()[:2]}
    assert first == {("ADDED", "s0"), ("ADDED", "s1")}, "after the 410 the watch starts over from the current state"
    _publish(api, "s2", ["a"])
    assert watch.next()[:2] == ("ADDED", "s2")
    api.close()


def test_raw_watch_stream_synthetic_adds_bookmarks_and_the_410_error_event(api: ApiServer) -> None:
    _publish(api, "s0", ["a"])
    with socket.create_connection(("127.0.0.1", int(api.url.rsplit(":", 1)[1])), timeout=10) as sock:
        path = "/apis/resource.k8s.io/v1/resourceslices?watch=true&allowWatchBookmarks=true"
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        stream = sock.makefile("rb")
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += stream.readline()
        assert b"200 OK" in head and b"Transfer-Encoding: chunked" in head

        def event() -> dict[str, Any]:
            size = int(stream.readline().strip(), 16)
            data = stream.read(size)
            stream.readline()
            decoded: dict[str, Any] = json.loads(data)
            return decoded

        added = event()
        assert (added["type"], added["object"]["metadata"]["name"]) == ("ADDED", "s0")
        api.bookmark()
        mark = event()
        assert mark == {
            "type": "BOOKMARK",
            "object": {
                "kind": "ResourceSlice",
                "apiVersion": "resource.k8s.io/v1",
                "metadata": {"resourceVersion": str(api.storage.revision)},
            },
        }
    api.compact()
    code, body = _get(api, "/apis/resource.k8s.io/v1/resourceslices?watch=true&resourceVersion=1")
    assert code == 200 and body == {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"too old resource version: 1 ({api.storage.compacted})",
            "reason": "Expired",
            "code": 410,
        },
    }


def test_list_resource_version_semantics_chunks_and_expired_continue(api: ApiServer, client: Any) -> None:
    for i in range(5):
        _publish(api, f"s{i}", ["a"])
    assert [s.metadata.name for s in client.list(ResourceSlice, chunk_size=2)] == [f"s{i}" for i in range(5)]
    assert api.count("list", "resourceslices") == 3, "three chunks of at most two"
    code, page = _get(api, "/apis/resource.k8s.io/v1/resourceslices?limit=2")
    assert code == 200 and page["metadata"]["remainingItemCount"] == 3 and len(page["items"]) == 2
    snapshot = page["metadata"]["resourceVersion"]
    api.delete("resourceslices", "s4")
    code, rest = _get(api, f"/apis/resource.k8s.io/v1/resourceslices?limit=10&continue={page['metadata']['continue']}")
    assert [i["metadata"]["name"] for i in rest["items"]] == ["s2", "s3", "s4"], "the chunks show one snapshot"
    assert rest["metadata"]["resourceVersion"] == snapshot
    code, exact = _get(
        api, f"/apis/resource.k8s.io/v1/resourceslices?resourceVersion={snapshot}&resourceVersionMatch=Exact"
    )
    assert code == 200 and len(exact["items"]) == 5
    api.compact()
    code, status = _get(
        api, f"/apis/resource.k8s.io/v1/resourceslices?limit=10&continue={page['metadata']['continue']}"
    )
    assert (code, status["reason"]) == (410, "Expired") and status["metadata"]["continue"]
    code, status = _get(
        api, f"/apis/resource.k8s.io/v1/resourceslices?resourceVersion={snapshot}&resourceVersionMatch=Exact"
    )
    assert (code, status["message"]) == (410, "The resourceVersion for the provided list is too old.")
    code, newer = _get(
        api, f"/apis/resource.k8s.io/v1/resourceslices?resourceVersion={snapshot}&resourceVersionMatch=NotOlderThan"
    )
    assert (
        code == 200 and len(newer["items"]) == 4 and newer["metadata"]["resourceVersion"] == str(api.storage.revision)
    )
    code, status = _get(api, "/apis/resource.k8s.io/v1/resourceslices?resourceVersionMatch=Exact")
    assert (code, status["reason"]) == (422, "Invalid")
    assert "resourceVersionMatch is forbidden unless resourceVersion is provided" in status["message"]


def test_injected_faults_fail_requests_and_are_counted(api: ApiServer, client: Any) -> None:
    _publish(api, "s0", ["a"])
    api.faults.fail(500, verb="list", resource="resourceslices")
    with pytest.raises(ApiError) as failed:
        list(client.list(ResourceSlice))
    assert (failed.value.status.code, failed.value.status.reason) == (500, "InternalError")
    assert [s.metadata.name for s in client.list(ResourceSlice)] == ["s0"], "only the next one failed"
    api.faults.fail(429, verb="patch", retry_after=3)
    with pytest.raises(ApiError) as throttled:
        client.apply(ResourceSlice.from_dict(slice_of("s1", None, ["a"])), field_manager="d")
    assert throttled.value.response.headers["Retry-After"] == "3"
    assert status_of(throttled)["details"]["retryAfterSeconds"] == 3
    assert api.count("list", "resourceslices", 500) == 1 and api.count("patch", "resourceslices", 429) == 1
    assert not [s for s in api.objects("resourceslices") if s["metadata"]["name"] == "s1"], (
        "a failed request wrote nothing"
    )
