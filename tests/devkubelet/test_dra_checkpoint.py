"""``dra_manager_state`` as the kubelet writes and reads it, and how pods reference claims."""

from __future__ import annotations

import asyncio
import json
import zlib
from dataclasses import replace
from pathlib import Path

import pytest

from devplug.devkubelet import ContainerClaim, ContainerSpec, DevKubelet, PodClaim, PodSpec, ResourceClaimRef
from devplug.devkubelet.dra import ClaimState, PreparedDevice
from devplug.devkubelet.dra.checkpoint import load_claims, serialize_claims, store_claims
from devplug.errors import KubeletError
from tests.devkubelet.draplugin import FAST


def _claim() -> ClaimState:
    return ClaimState(
        namespace="ns",
        name="claim-1",
        uid="u1",
        pod_uids=frozenset({"p2", "p1"}),
        devices={
            "b.example.com": (PreparedDevice("pool", "dev", ("r",), ("vendor.com/class=a&b",), None),),
            "a.example.com": (),
        },
    )


def test_the_file_is_gos_json_of_the_kubelets_checkpoint() -> None:
    data = (
        '{"kind":"DRACheckpoint","apiVersion":"checkpoint.dra.kubelet.k8s.io/v1","Entries":[{"ClaimUID":"u1",'
        '"ClaimName":"claim-1","Namespace":"ns","PodUIDs":{"p1":{},"p2":{}},"DriverState":{"a.example.com":'
        '{"Devices":null},"b.example.com":{"Devices":[{"PoolName":"pool","DeviceName":"dev","ShareID":null,'
        '"RequestNames":["r"],"CDIDeviceIDs":["vendor.com/class=a\\u0026b"]}]}}}]}'
    )
    checksum = zlib.crc32(data.encode())
    expected = '{"Data":' + json.dumps(data).replace("&", "\\u0026") + f',"Checksum":{checksum}}}'
    assert serialize_claims([_claim()]) == expected.encode()


def test_an_empty_cache_and_a_share_id() -> None:
    empty = json.loads(serialize_claims([]))
    assert json.loads(empty["Data"]) == {
        "kind": "DRACheckpoint",
        "apiVersion": "checkpoint.dra.kubelet.k8s.io/v1",
        "Entries": [],
    }
    shared = ClaimState("ns", "c", "u", frozenset(), {"d": (PreparedDevice("p", "x", share_id="s-1"),)})
    inner = json.loads(json.loads(serialize_claims([shared]))["Data"])
    assert inner["Entries"][0]["DriverState"]["d"]["Devices"][0]["ShareID"] == "s-1"
    assert inner["Entries"][0]["PodUIDs"] == {}


def test_what_is_stored_reads_back_unprepared(tmp_path: Path) -> None:
    path = tmp_path / "dra_manager_state"
    prepared = replace(_claim(), prepared=True)
    store_claims(path, [prepared])
    assert load_claims(path) == [_claim()]  # newClaimInfoFromState: not prepared
    assert load_claims(tmp_path / "missing") == []


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"{not json", "Expecting property name"),
        (b'{"Data": 3, "Checksum": 1}', '"Data" must be a string'),
        (b'{"Data": "{}", "Checksum": 1}', "checksum 1 in the file"),
    ],
)
def test_a_corrupt_checkpoint_stops_the_kubelets_start(plugin_dir: Path, content: bytes, reason: str) -> None:
    async def body() -> None:
        plugin_dir.parent.mkdir(parents=True, exist_ok=True)
        state = plugin_dir.parent / "dra_manager_state"
        state.write_bytes(content)
        kubelet = DevKubelet(plugin_dir, dra=FAST)
        with pytest.raises(KubeletError) as info:
            await kubelet.start()
        assert str(state) in str(info.value)
        assert reason in str(info.value)
        assert "please drain node and remove dra state file" in str(info.value)
        assert not kubelet.running
        assert state.read_bytes() == content  # changed nothing
        await kubelet.close()

    asyncio.run(body())


def test_pods_reference_claims_of_their_namespace_by_name() -> None:
    ref = ResourceClaimRef("default", "c", "u", ("a.example.com", "a.example.com"))
    assert ref.drivers == ("a.example.com",)
    with pytest.raises(ValueError, match=r"resource claim 'gpu' refers to other/c, outside the pod's namespace"):
        PodSpec("p", [ContainerSpec("app")], resource_claims=[PodClaim("gpu", ResourceClaimRef("other", "c", "u"))])
    with pytest.raises(ValueError, match="container 'app' uses claim 'nic', which is not in the pod's resource_claims"):
        PodSpec("p", [ContainerSpec("app", claims=["nic"])], resource_claims=[PodClaim("gpu", ref)])
    with pytest.raises(ValueError, match="resource claim name 'gpu' is used twice"):
        PodSpec("p", [ContainerSpec("app")], resource_claims=[PodClaim("gpu", ref), PodClaim("gpu", ref)])
    with pytest.raises(ValueError, match="uid must be a non-empty string"):
        ResourceClaimRef("default", "c", "")
    spec = ContainerSpec("app", claims=["gpu", ContainerClaim("gpu", "r1")])
    assert spec.container_claims == (ContainerClaim("gpu"), ContainerClaim("gpu", "r1"))
    assert [c.resource_name for c in spec.container_claims] == ["claim:gpu", "claim:gpu/r1"]
