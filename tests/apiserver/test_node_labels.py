"""Node labels through the real client, as per-node profiles read them: a label value is what
``content.IsLabelValue`` allows (so a list of profiles cannot be comma-separated), a key what ``IsLabelKey`` allows,
and a watch on one node by ``metadata.name`` sees its label changes as MODIFIED events."""

from __future__ import annotations

from typing import Any

import pytest
from lightkube import ApiError
from lightkube.resources.core_v1 import Node

from devplug.testing.apiserver import ApiServer

from .conftest import node, status_of


def test_label_values_and_keys_are_validated_as_the_api_server_does(api: ApiServer, client: Any) -> None:
    created = client.create(Node.from_dict(node("node-a", {"devplug.io/profile": "fpga-regions.vf32"})))
    assert created.metadata.labels == {"devplug.io/profile": "fpga-regions.vf32"}
    with pytest.raises(ApiError) as comma:
        client.patch(Node, "node-a", {"metadata": {"labels": {"devplug.io/profile": "a,b"}}})
    status = status_of(comma)
    assert (status["code"], status["reason"]) == (422, "Invalid")
    assert status["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "a,b": a valid label must be an empty string or consist of alphanumeric '
            "characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  "
            "or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
            "field": "metadata.labels",
        }
    ]
    with pytest.raises(ApiError) as long_value:
        client.patch(Node, "node-a", {"metadata": {"labels": {"devplug.io/profile": "a" * 64}}})
    assert "must be no more than 63 characters" in status_of(long_value)["message"]
    for key, problem in (
        ("a/b/c", "a valid label key must consist of"),
        ("/profile", "prefix part must be non-empty"),
        ("Example.com/profile", "prefix part a lowercase RFC 1123 subdomain"),
        ("devplug.io/", "name part must be non-empty"),
        ("devplug.io/-x", "name part must consist of alphanumeric characters"),
    ):
        with pytest.raises(ApiError) as bad_key:
            client.patch(Node, "node-a", {"metadata": {"labels": {key: "x"}}})
        assert status_of(bad_key)["code"] == 422 and problem in status_of(bad_key)["message"], (key, bad_key)
    assert api.get("nodes", "node-a")["metadata"]["labels"] == {"devplug.io/profile": "fpga-regions.vf32"}, (
        "a refused write changed nothing"
    )


def test_a_watch_of_one_node_by_name_sees_its_label_changes(api: ApiServer, client: Any, watch_thread: Any) -> None:
    api.create("nodes", node("node-a", {"x": "1"}))
    api.create("nodes", node("node-b"))
    got = client.get(Node, "node-a")
    watch = watch_thread(
        lambda: client.watch(Node, fields={"metadata.name": "node-a"}, resource_version=got.metadata.resourceVersion)
    )
    client.patch(Node, "node-b", {"metadata": {"labels": {"x": "2"}}})
    client.patch(Node, "node-a", {"metadata": {"labels": {"devplug.io/profile": "big"}}})
    kind, name, rv = watch.next()
    assert (kind, name) == ("MODIFIED", "node-a"), "node-b's change is not in a watch of node-a"
    assert rv == api.get("nodes", "node-a")["metadata"]["resourceVersion"]
    api.close()
