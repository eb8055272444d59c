"""Per-node profiles under a running ``devplug run`` (issue 29): the daemon reads its Node from the API server
stand-in (real HTTP), starts on the profiles the node's labels choose, and applies a label change through the live
reload (added, changed, removed resources, with the drain rules) while pods hold devices through the dev kubelet;
a label naming an unknown profile, or profiles that conflict, is refused and the running config keeps serving.
Observed from outside: the dev kubelet's registrations and device lists, the mock's calls, the status file,
``devplug status`` and the metrics endpoint."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devplug.testing.apiserver import ApiServer
from devplug.testing.configs import write_toml

if TYPE_CHECKING:
    from tests.lifecycle.conftest import Lab

RESOURCE = "example.com/mock"
RESOURCE_B = "example.com/other"
RESOURCE_C = "example.com/third"
NODE = "node-a"
CHANGED = f"node {NODE}'s labels changed"


def _kubeconfig(api: ApiServer, path: Path) -> Path:
    """A kubeconfig naming the stand-in, without credentials (JSON is YAML)."""
    cluster = {"name": "standin", "cluster": {"server": api.url}}
    context = {"name": "standin", "context": {"cluster": "standin", "user": "anonymous"}}
    config = {"clusters": [cluster], "users": [{"name": "anonymous", "user": {}}], "contexts": [context]}
    path.write_text(json.dumps({**config, "current-context": "standin"}))
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return str(answer.read().decode())


def _set_labels(api: ApiServer, labels: dict[str, str]) -> None:
    """Replace the node's labels (an update, as kubectl label --overwrite makes)."""
    current = api.get("nodes", NODE)
    current["metadata"]["labels"] = labels
    api.update("nodes", current)


def _profiles(lab: Lab) -> dict[str, Any]:
    found: dict[str, Any] = lab.status()["profiles"]
    return found


def _reload_number(lab: Lab, attempts: int) -> dict[str, Any]:
    def handled() -> dict[str, Any] | None:
        entry: dict[str, Any] = lab.status().get("reload") or {}
        return entry if entry.get("attempts", 0) >= attempts else None

    found: dict[str, Any] = lab.wait(handled, what=f"the daemon to report reload number {attempts}")
    assert found["attempts"] == attempts, f"one reload per label change, got {found}"
    return found


def _start(lab: Lab, api: ApiServer, profiles: dict[str, Any], **options: Any) -> None:
    lab.dirs[RESOURCE_C] = lab.root / "mock-c"
    base = {RESOURCE: lab.resource_table(), RESOURCE_B: lab.resource_table(RESOURCE_B, count=2)}
    lab.daemon = lab.factory(
        base,
        wait=False,
        node={"name": NODE},
        kubernetes={"kubeconfig": str(_kubeconfig(api, lab.root / "kubeconfig"))},
        profiles=profiles,
        release_interval=0.1,
        grace_period=1.0,
        **options,
    )


def test_labels_choose_profiles_and_a_change_is_applied_drained_or_refused(lab: Lab) -> None:
    port = _free_port()
    lab.dirs[RESOURCE_C] = lab.root / "mock-c"
    profiles = {
        "big": {"resources": {RESOURCE: {"options": {"directory": str(lab.mock_dir()), "count": 6}}}},
        "no-b": {"description": "without the other resource", "remove": [RESOURCE_B]},
        "b-shared": {"resources": {RESOURCE_B: {"replicas": 2}}},  # conflicts with no-b
        "extra": {
            "match_labels": {"example.com/extra": "yes"},
            "resources": {RESOURCE_C: lab.resource_table(RESOURCE_C, count=3)},
        },
    }
    with ApiServer() as api:
        api.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {}}})
        _set_labels(api, {"devplug.io/profile": "big"})
        _start(lab, api, profiles, metrics={"enabled": True, "port": port})
        lab.wait_advertised(RESOURCE)
        lab.wait_advertised(RESOURCE_B)
        # started on the profile: 6 devices from the first registration on, never the base's 4
        assert lab.view(RESOURCE).capacity == 6
        assert lab.kubelet.registrations(RESOURCE) == 1
        assert [e.kind for e in lab.events("register")] == ["register"]
        lab.wait(lambda: _profiles(lab)["api"] == "watching", what="the node watch")
        shown = _profiles(lab)
        assert (shown["node"], shown["node_source"], shown["label"]) == (NODE, "config", "big")
        assert (shown["active"], shown["reasons"], shown["refused"]) == (
            ["big"],
            {"big": "node label devplug.io/profile=big"},
            None,
        )
        assert shown["defined"] == ["big", "no-b", "b-shared", "extra"]
        scraped = _metrics(port)
        assert 'devplug_profile_active{profile="big"} 1.0' in scraped
        assert "devplug_profiles_refused 0.0" in scraped and "devplug_node_watch_up 1.0" in scraped
        assert api.count("watch", "nodes") >= 1
        watch = next(r for r in api.requests if r.verb == "watch")
        assert watch.query["fieldSelector"] == f"metadata.name={NODE}", "only this node is watched"

        # a pod holds a device of the resource the next profile removes
        (held,) = lab.admit("holder", 1, RESOURCE_B)
        lab.wait_seen(held, "holder", RESOURCE_B)

        # the label adds no-b: the resource is removed by the reload path, draining while the pod holds its device
        _set_labels(api, {"devplug.io/profile": "big.no-b"})
        entry = _reload_number(lab, 1)
        assert (entry["last_result"], entry["trigger"]) == ("ok", CHANGED), entry
        assert (entry["added"], entry["changed"], entry["removed"], entry["unchanged"]) == (
            [],
            [],
            [RESOURCE_B],
            [RESOURCE],
        )
        lab.wait(lambda: lab.view(RESOURCE_B).capacity == 0, what=f"{RESOURCE_B} advertising nothing")
        lab.wait(lambda: lab.resource_status(RESOURCE_B)["state"] == "draining", what=f"{RESOURCE_B} draining")
        assert _profiles(lab)["active"] == ["big", "no-b"]
        assert lab.count("deallocate", held, RESOURCE_B) == 0, "the pod keeps its device"
        assert lab.kubelet.registrations(RESOURCE) == 1 and lab.view(RESOURCE).capacity == 6, "big untouched"

        # an unknown profile: refused like a bad reload, reported, nothing changes
        _set_labels(api, {"devplug.io/profile": "big.nope"})
        entry = _reload_number(lab, 2)
        assert entry["last_result"] == "refused"
        unknown = (
            "the node label devplug.io/profile=big.nope names profile 'nope', which "
            f"{lab.daemon.config_path if lab.daemon else ''} does not define; it defines: big, no-b, b-shared, extra"
        )
        assert entry["last_error"] == unknown
        shown = _profiles(lab)
        assert (shown["active"], shown["refused"], shown["label"]) == (["big", "no-b"], unknown, "big.nope")
        assert "devplug_profiles_refused 1.0" in _metrics(port)
        # profiles that conflict: refused, naming both and the resource
        _set_labels(api, {"devplug.io/profile": "no-b.b-shared"})
        entry = _reload_number(lab, 3)
        assert entry["last_result"] == "refused"
        assert 'profiles "no-b" and "b-shared" conflict: both change "example.com/other"' in entry["last_error"]
        assert lab.resource_status(RESOURCE_B)["state"] == "draining" and lab.view(RESOURCE).capacity == 6
        assert lab.count("deallocate", held, RESOURCE_B) == 0
        assert lab.kubelet.registrations(RESOURCE) == 1

        # the operator's fix: big again (no-b dropped) and an NFD-like label matching extra's selector
        _set_labels(api, {"devplug.io/profile": "big", "example.com/extra": "yes"})
        entry = _reload_number(lab, 4)
        assert entry["last_result"] == "ok", entry
        assert (entry["added"], entry["removed"], entry["unchanged"]) == ([RESOURCE_B, RESOURCE_C], [], [RESOURCE])
        lab.kubelet.wait_registered(RESOURCE_C, timeout=15.0)
        lab.wait(lambda: lab.view(RESOURCE_C).capacity == 3, what=f"{RESOURCE_C} advertising 3 devices")
        lab.wait(lambda: lab.view(RESOURCE_B).capacity == 2, what=f"{RESOURCE_B} back, advertising 2 devices")
        shown = _profiles(lab)
        assert (shown["active"], shown["refused"]) == (["big", "extra"], None)
        assert shown["reasons"]["extra"] == "match_labels example.com/extra=yes"
        assert lab.count("deallocate", held, RESOURCE_B) == 0, "the restarted resource kept the pod's allocation"
        scraped = _metrics(port)
        assert 'devplug_profile_active{profile="extra"} 1.0' in scraped and "devplug_profiles_refused 0.0" in scraped

        # an unrelated label change chooses the same profiles: no reload
        _set_labels(api, {"devplug.io/profile": "big", "example.com/extra": "yes", "unrelated": "x"})
        lab.wait(
            lambda: _profiles(lab)["resource_version"] == api.get("nodes", NODE)["metadata"]["resourceVersion"],
            what="the daemon to see the unrelated change",
        )
        assert lab.status()["reload"]["attempts"] == 4

        # the pod ends: its device is released through the resource that came back
        lab.kubelet.remove_pod("holder")
        lab.wait_released(held, resource=RESOURCE_B)

        shown_text = subprocess.run(
            [sys.executable, "-m", "devplug", "status", "--state-dir", str(lab.state_dir())],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        assert f"node {NODE} (from config): labels watching" in shown_text
        assert (
            "  profiles: big (node label devplug.io/profile=big), extra (match_labels example.com/extra=yes)"
            in shown_text
        )


def test_without_api_access_the_base_config_runs_and_says_so(lab: Lab) -> None:
    lab.dirs[RESOURCE_C] = lab.root / "mock-c"
    base = {RESOURCE: lab.resource_table()}
    profiles = {"big": {"resources": {RESOURCE: {"options": {"directory": str(lab.mock_dir()), "count": 6}}}}}
    # no [kubernetes] kubeconfig and no service account here: no credentials
    lab.daemon = lab.factory(base, node={"name": NODE}, profiles=profiles)
    assert lab.view(RESOURCE).capacity == 4
    shown = _profiles(lab)
    assert shown["api"] == "unavailable" and shown["labels_read"] is False and shown["active"] == []
    assert shown["api_detail"].startswith("no API server credentials: no kubeconfig is configured and this is not")
    assert "profiles: no access to the node's labels (no API server credentials: no kubeconfig" in lab.log()
    assert "serving the base config" in lab.log()


def test_an_unreachable_api_server_starts_the_base_config_then_applies_the_labels(lab: Lab) -> None:
    profiles = {"big": {"resources": {RESOURCE: {"options": {"directory": str(lab.mock_dir()), "count": 6}}}}}
    with ApiServer() as api:
        api.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {}}})
        _set_labels(api, {"devplug.io/profile": "big"})
        api.faults.fail(503, count=2, verb="get", resource="nodes")  # the first reads fail: base config at start
        _start(lab, api, profiles)
        lab.wait_advertised(RESOURCE)
        entry = _reload_number(lab, 1)  # once a read succeeds, the labels are applied through the reload path
        assert (entry["last_result"], entry["trigger"], entry["changed"]) == ("ok", CHANGED, [RESOURCE]), entry
        lab.wait(lambda: lab.view(RESOURCE).capacity == 6, what="the profile's 6 devices")
        assert lab.kubelet.registrations(RESOURCE) == 2, "base first, then the profile"
        assert "cannot read node node-a" in lab.log() and "serving the base config until it can be read" in lab.log()
        assert api.count("get", "nodes", code=503) == 2


def test_profiles_added_by_a_sighup_start_the_node_watch_and_apply_the_labels(lab: Lab) -> None:
    with ApiServer() as api:
        api.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {}}})
        _set_labels(api, {"devplug.io/profile": "big"})
        _start(lab, api, {})
        assert lab.daemon is not None
        config = dict(lab.daemon.config)
        del config["profiles"]  # a config without profiles: the daemon never reads its Node
        write_toml(lab.daemon.config_path, config)
        lab.daemon.process.stop()
        lab.daemon.process.start()
        lab.wait(lambda: lab.status().get("profiles", "absent") is None, what="a status without profiles")
        lab.wait_advertised(RESOURCE)
        assert api.count("get", "nodes") == 0, "no profiles: no API access tried"

        config["profiles"] = {"big": {"resources": {RESOURCE: {"options": {"directory": str(lab.root / "big")}}}}}
        config["profiles"]["big"]["resources"][RESOURCE]["options"]["count"] = 6
        write_toml(lab.daemon.config_path, config)
        os.kill(lab.daemon.process.pid, signal.SIGHUP)
        entry = _reload_number(lab, 1)
        assert (entry["last_result"], entry["trigger"], entry["changed"]) == ("ok", "SIGHUP", [RESOURCE]), entry
        lab.wait(lambda: lab.view(RESOURCE).capacity == 6, what="the profile's 6 devices")
        lab.wait(lambda: _profiles(lab)["api"] == "watching", what="the node watch started by the reload")
        assert _profiles(lab)["active"] == ["big"]
        # and from now on label changes apply: back to the base
        _set_labels(api, {})
        entry = _reload_number(lab, 2)
        assert (entry["last_result"], entry["trigger"], entry["changed"]) == ("ok", CHANGED, [RESOURCE]), entry
        assert _profiles(lab)["active"] == []
