"""Hardening, the DRA socket (issue 36 item 1): claim identifiers from the wire and the API server never name a path.

Through the real thing: ``devplug run`` serving the mock driver through DRA, the
dev kubelet's DRA side, the API server stand-in, and a raw gRPC client on the
daemon's DRA service socket (anything that reaches it can call). A claim UID
that is a path (``/tmp/.../victim``, ``../ledger``) deleted the file it named
(``<uid>.json``) from the resource's state folder on ``NodeUnprepareResources``,
the ledger among them, and a restart then loaded no records: the prepared
claim's unprepare called no hook and its device went to the next claim dirty.
Now a UID, namespace or name not of the form the API server gives is that
claim's error naming the field, and nothing is read, written or removed; a CDI
spec is removed only when a record (or its kept copy) says this daemon wrote it;
and a ledger file vanishing under the daemon is a WARNING and refuses new
prepares, naming the file.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import grpc.aio
import pytest

from devplug.api.gen.dra.v1 import api_pb2 as v1
from devplug.api.gen.dra.v1 import api_pb2_grpc as v1_grpc
from devplug.api.gen.dra.v1beta1 import api_pb2 as v1beta1
from devplug.api.gen.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from devplug.kube.ids import dns1123_label_problem, dns1123_subdomain_problem, is_uid, uid_problem
from devplug.testing.apiserver import ApiServer
from tests.frontends.dra.conftest import run
from tests.frontends.dra.dranode import DRIVER, NS, DraNode, dra_node, eventually

RELEASE_HOOKS = ("allocate", "post_stop", "deallocate")


def _ledger(lab: DraNode) -> Path:
    return lab.state_dir / "ledger.json"


def _kept(lab: DraNode, uid: str) -> Path:
    return lab.state_dir / "dra-claims" / f"{uid}.json"


def _spec(lab: DraNode, uid: str) -> Path:
    return lab.root / "cdi" / f"dra-{DRIVER}-{uid}.json"


def _hooks(lab: DraNode) -> list[tuple[str, list[str]]]:
    return [(c["hook"], c["device_ids"]) for c in lab.calls() if c["hook"] in RELEASE_HOOKS]


async def _prepared(lab: DraNode, pod: str = "p1", claim: str = "c1") -> tuple[str, str]:
    """A pod's claim prepared through the dev kubelet, the ledger's snapshot on disk; the claim's UID, its device."""
    lab.make_claim(claim)
    spec, [stored] = lab.schedule_pod(pod, [claim])
    await lab.kubelet.admit_pod(spec)
    await eventually(_ledger(lab).exists, "the ledger's snapshot written (compaction)", details=lab.log)
    [device] = lab.allocated_devices(stored)
    return str(stored["metadata"]["uid"]), device


def _hostile(lab: DraNode, real_uid: str) -> dict[str, tuple[str, str, str, str]]:
    """Claims named so their identifiers would reach outside the folders: uid -> (namespace, name, uid, field)."""
    victim = lab.root / "victim"
    fresh = str(uuid.uuid4())
    other = str(uuid.uuid4())
    return {
        str(victim): (NS, "c1", str(victim), "uid"),
        "../ledger": (NS, "c1", "../ledger", "uid"),
        f"../dra-claims/{real_uid}": (NS, "c1", f"../dra-claims/{real_uid}", "uid"),
        f"{real_uid}\n": (NS, "c1", f"{real_uid}\n", "uid"),
        fresh: ("../../x", "c1", fresh, "namespace"),
        other: (NS, "../c1", other, "name"),
    }


async def _unprepare(lab: DraNode, claims: list[tuple[str, str, str]], beta: bool = False) -> dict[str, str]:
    async with grpc.aio.insecure_channel(lab.service_target()) as channel:
        if beta:
            answer: Any = await v1beta1_grpc.DRAPluginStub(channel).NodeUnprepareResources(
                v1beta1.NodeUnprepareResourcesRequest(
                    claims=[v1beta1.Claim(namespace=n, name=m, uid=u) for n, m, u in claims]
                )
            )
        else:
            answer = await v1_grpc.DRAPluginStub(channel).NodeUnprepareResources(
                v1.NodeUnprepareResourcesRequest(claims=[v1.Claim(namespace=n, name=m, uid=u) for n, m, u in claims])
            )
    return {uid: entry.error for uid, entry in answer.claims.items()}


async def _prepare(lab: DraNode, claims: list[tuple[str, str, str]], beta: bool = False) -> Any:
    async with grpc.aio.insecure_channel(lab.service_target()) as channel:
        if beta:
            return await v1beta1_grpc.DRAPluginStub(channel).NodePrepareResources(
                v1beta1.NodePrepareResourcesRequest(
                    claims=[v1beta1.Claim(namespace=n, name=m, uid=u) for n, m, u in claims]
                )
            )
        return await v1_grpc.DRAPluginStub(channel).NodePrepareResources(
            v1.NodePrepareResourcesRequest(claims=[v1.Claim(namespace=n, name=m, uid=u) for n, m, u in claims])
        )


def test_unprepare_with_uids_that_are_paths_removes_nothing_and_names_the_field(api: ApiServer) -> None:
    async def scenario() -> None:
        async with dra_node(api) as lab:
            await lab.published(3)
            uid, device = await _prepared(lab)
            victim = lab.root / "victim.json"
            victim.write_text("precious\n")
            ledger = _ledger(lab).read_bytes()
            hostile = _hostile(lab, uid)
            for beta in (False, True):
                errors = await _unprepare(lab, [(n, m, u) for n, m, u, _ in hostile.values()], beta=beta)
                assert set(errors) == set(hostile)
                for key, (_, _, _, field) in hostile.items():
                    assert f"its {field} " in errors[key] and "nothing was unprepared" in errors[key], errors[key]
                    assert "resource claim" in errors[key]
                assert "is not a Kubernetes UID" in errors["../ledger"] and "'../ledger'" in errors["../ledger"]
                assert "is not a DNS-1123 label" in errors[next(k for k, v in hostile.items() if v[3] == "namespace")]
                assert "\n" not in errors[f"{uid}\n"]  # shown escaped
            assert victim.read_text() == "precious\n"
            assert _ledger(lab).exists()
            assert _ledger(lab).read_bytes() == ledger
            assert _kept(lab, uid).exists() and _spec(lab, uid).exists()
            assert _hooks(lab) == [("allocate", [device])]
            assert "refused to unprepare" in lab.log()

            # the claim itself is still prepared, and its unprepare releases it and removes its spec, logged
            await lab.kubelet.finish_pod("p1")
            assert _hooks(lab) == [("allocate", [device]), ("post_stop", [device]), ("deallocate", [device])]
            assert lab.records() == []
            assert not _kept(lab, uid).exists() and not _spec(lab, uid).exists()
            assert f"removed the CDI spec of resource claim {NS}/c1 (uid {uid})" in lab.log()
            assert victim.read_text() == "precious\n"

    run(scenario, 120)


def test_a_hostile_unprepare_then_a_restart_keeps_the_claim_and_its_release(api: ApiServer) -> None:
    """The issue's sequence: ``../ledger`` unprepared, the daemon restarted, the kubelet unprepares the real claim
    and a new claim gets the device: the release runs in between (no dirty hand-over)."""

    async def scenario() -> None:
        async with dra_node(api, {"mock0": ""}) as lab:
            await lab.published(1)
            uid, device = await _prepared(lab)
            errors = await _unprepare(lab, [(NS, "c1", "../ledger")])
            assert lab.daemon is not None and await asyncio.to_thread(lab.daemon.stop) == 0
            lab.start_daemon()
            await lab.registered()
            await lab.kubelet.finish_pod("p1")
            lab.scheduler.deallocate(NS, "c1")  # the resourceclaim controller, once no pod uses the claim
            lab.make_claim("c2")
            pod, _ = await lab.schedule_pod_eventually("p2", ["c2"])
            await lab.kubelet.admit_pod(pod)
            assert _hooks(lab) == [
                ("allocate", [device]),
                ("post_stop", [device]),
                ("deallocate", [device]),
                ("allocate", [device]),
            ]
            assert not _spec(lab, uid).exists() and not _kept(lab, uid).exists()
            assert "is not a Kubernetes UID" in errors["../ledger"]

    run(scenario, 150)


def test_prepare_of_claims_named_so_reads_nothing_and_prepares_nothing(api: ApiServer) -> None:
    async def scenario() -> None:
        async with dra_node(api) as lab:
            await lab.published(3)
            good = str(lab.make_claim("good")["metadata"]["uid"])
            reads = api.count(verb="get", resource="resourceclaims")
            hostile = {
                "../ledger": (NS, "good", "../ledger", "uid"),
                good: ("../../x", "good", good, "namespace"),
                "": (NS, "good", "", "uid"),
            }
            long_uid = str(uuid.uuid4())
            hostile[long_uid] = (NS, "a" * 254, long_uid, "name")
            for beta in (False, True):
                answer = await _prepare(lab, [(n, m, u) for n, m, u, _ in hostile.values()], beta=beta)
                assert set(answer.claims) == set(hostile)
                for key, (_, _, _, field) in hostile.items():
                    entry = answer.claims[key]
                    assert f"its {field} " in entry.error and "nothing was prepared" in entry.error, entry.error
                    assert not entry.devices
            assert api.count(verb="get", resource="resourceclaims") == reads  # no URL made of them
            assert lab.calls("allocate") == [] and lab.records() == []
            assert not list((lab.root / "cdi").glob(f"dra-{DRIVER}-*"))

    run(scenario, 90)


def test_an_unprepare_of_a_claim_never_prepared_here_removes_no_spec_file(api: ApiServer) -> None:
    """A spec file under this driver's name that no record or kept copy says this daemon wrote is not its own."""

    async def scenario() -> None:
        async with dra_node(api) as lab:
            await lab.published(3)
            stranger = str(uuid.uuid4())
            spec = _spec(lab, stranger)
            spec.parent.mkdir(parents=True, exist_ok=True)
            spec.write_text('{"cdiVersion": "0.6.0"}\n')
            errors = await _unprepare(lab, [(NS, "someone", stranger)])
            assert errors == {stranger: ""}  # never prepared here: a success, as the kubelet expects
            await asyncio.sleep(1.0)  # a reconciliation pass too
            assert spec.read_text() == '{"cdiVersion": "0.6.0"}\n'

    run(scenario, 90)


def test_a_ledger_deleted_under_the_daemon_is_a_warning_and_refuses_new_prepares_naming_it(api: ApiServer) -> None:
    async def scenario() -> None:
        async with dra_node(api) as lab:
            await lab.published(3)
            uid, device = await _prepared(lab)
            ledger = _ledger(lab)
            ledger.unlink()
            lab.make_claim("c2")
            _, [claim] = lab.schedule_pod("p2", ["c2"])
            answer = await _prepare(lab, [(NS, "c2", str(claim["metadata"]["uid"]))])
            error = answer.claims[str(claim["metadata"]["uid"])].error
            assert str(ledger) in error and "vanished" in error and "nothing was allocated" in error, error
            assert [c["device_ids"] for c in lab.calls("allocate")] == [[device]]
            assert "WARNING" in lab.log() and f"the allocation ledger's file {ledger} vanished" in lab.log()
            # the records held are written back, so a restart finds the prepared claim
            await eventually(ledger.exists, "the ledger written back", details=lab.log)
            assert [r["claim_uid"] for r in lab.records()] == [uid]
            # the prepared claim is still released when the kubelet unprepares it
            await lab.kubelet.finish_pod("p1")
            assert [c["device_ids"] for c in lab.calls("deallocate")] == [[device]]
            assert lab.records() == []
            # and after a restart the resource serves again
            assert lab.daemon is not None and await asyncio.to_thread(lab.daemon.stop) == 0
            lab.start_daemon()
            await lab.registered()
            answer = await _prepare(lab, [(NS, "c2", str(claim["metadata"]["uid"]))])
            assert answer.claims[str(claim["metadata"]["uid"])].error == ""

    run(scenario, 150)


def test_a_ledger_lost_while_the_daemon_was_down_is_a_warning_at_start(api: ApiServer) -> None:
    async def scenario() -> None:
        async with dra_node(api) as lab:
            await lab.published(3)
            uid, _ = await _prepared(lab)
            assert lab.daemon is not None and await asyncio.to_thread(lab.daemon.stop) == 0
            _ledger(lab).unlink()
            for segment in lab.state_dir.glob("ledger.journal.*"):
                segment.unlink()
            lab.start_daemon()
            await lab.registered()
            log = lab.log()
            assert f"the allocation ledger {_ledger(lab)} is missing" in log
            assert uid in log and "WARNING" in log

    run(scenario, 120)


# --- the forms themselves (devplug.kube.ids), at their edges


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("0b5e3f9c-6d7a-4c1e-9f3b-2a8d4e6c1b0a", True),
        ("0B5E3F9C-6D7A-4C1E-9F3B-2A8D4E6C1B0A", True),  # RFC 4122 reads either case
        ("0b5e3f9c-6d7a-4c1e-9f3b-2a8d4e6c1b0a\n", False),
        ("0b5e3f9c6d7a4c1e9f3b2a8d4e6c1b0a", False),
        ("../0b5e3f9c-6d7a-4c1e-9f3b-2a8d4e6c1b0a", False),
        ("", False),
        ("..", False),
    ],
)
def test_a_uid_is_a_uuid_in_its_canonical_form(value: str, ok: bool) -> None:
    assert is_uid(value) is ok
    assert (uid_problem(value) is None) is ok


@pytest.mark.parametrize(
    ("value", "label", "subdomain"),
    [
        ("default", True, True),
        ("a" * 63, True, True),
        ("a" * 64, False, True),
        ("a" * 253, False, True),
        ("a" * 254, False, False),
        ("gpu.example.com", False, True),
        ("a..b", False, False),
        ("-a", False, False),
        ("A", False, False),
        (".", False, False),
        ("..", False, False),
        ("../../x", False, False),
        ("a/b", False, False),
        ("", False, False),
        ("a\n", False, False),
    ],
)
def test_namespaces_are_dns_labels_and_names_dns_subdomains(value: str, label: bool, subdomain: bool) -> None:
    assert (dns1123_label_problem(value) is None) is label
    assert (dns1123_subdomain_problem(value) is None) is subdomain
