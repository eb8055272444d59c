"""The Allocate answer encoded by hand (:func:`encode_allocate_response`) is the message protobuf makes.

Map entries may come in another order than protobuf's deterministic serialization puts them (upb's order of
keys is its own; no reader depends on it), so answers with maps are compared once decoded and serialized again.
"""

from __future__ import annotations

import os
import random

import pytest

from devplug.api.convert import allocation_from_pb, allocation_to_pb, encode_allocate_response
from devplug.api.gen.deviceplugin.v1beta1 import api_pb2 as dp
from devplug.types import CDIDevice, ContainerAllocation, DeviceSpec, Mount

SEED = int(os.environ.get("DEVPLUG_TEST_SEED", random.randrange(2**32)))
CASES = 150


def _protobuf_bytes(allocations: list[ContainerAllocation]) -> bytes:
    response = dp.AllocateResponse(container_responses=[allocation_to_pb(a) for a in allocations])
    return response.SerializeToString(deterministic=True)


def _same_message(encoded: bytes, allocations: list[ContainerAllocation]) -> bool:
    """``encoded`` decodes to the message protobuf makes from ``allocations``, with nothing else in it."""
    return dp.AllocateResponse.FromString(encoded).SerializeToString(deterministic=True) == _protobuf_bytes(allocations)


def _text(rng: random.Random) -> str:
    """Short, long (lengths needing two and three varint bytes) and non-ASCII text."""
    length = rng.choice([1, 5, 60, 127, 128, 300, 16384])
    return "".join(rng.choices("abz09-_/.é雪", k=length))


def _path(rng: random.Random) -> str:
    return "/" + _text(rng)


def _allocation(rng: random.Random) -> ContainerAllocation:
    paths = list(dict.fromkeys(_path(rng) for _ in range(rng.randrange(6))))
    split = rng.randrange(len(paths) + 1)
    return ContainerAllocation(
        envs={_text(rng): rng.choice(["", _text(rng)]) for _ in range(rng.randrange(4))},
        mounts=tuple(Mount(p, _path(rng), rng.random() < 0.5) for p in paths[:split]),
        devices=tuple(DeviceSpec(p, _path(rng), rng.choice(["r", "rw", "rwm", "mw"])) for p in paths[split:]),
        annotations={_text(rng): _text(rng) for _ in range(rng.randrange(3))},
        cdi_devices=tuple(CDIDevice(f"vendor.com/class=dev{i}") for i in range(rng.randrange(3))),
    )


def test_random_answers_encode_as_protobuf_does() -> None:
    print(f"seed {SEED} (DEVPLUG_TEST_SEED={SEED} repeats it)")
    rng = random.Random(SEED)
    for case in range(CASES):
        allocations = [_allocation(rng) for _ in range(rng.randrange(1, 4))]
        encoded = encode_allocate_response(allocations)
        assert _same_message(encoded, allocations), f"case {case} of seed {SEED}"
        decoded = dp.AllocateResponse.FromString(encoded)
        assert [allocation_from_pb(c) for c in decoded.container_responses] == allocations


@pytest.mark.parametrize(
    "allocation",
    [
        ContainerAllocation(),
        ContainerAllocation(envs={"EMPTY": ""}),
        ContainerAllocation(mounts=(Mount("/c", "/h", read_only=False),)),
        ContainerAllocation(mounts=(Mount("/c", "/h", read_only=True),)),
        ContainerAllocation(envs={"b": "2", "a": "1", "c": "3"}, annotations={"z": "", "y": "x"}),
    ],
    ids=["empty", "empty-env-value", "read-write-mount", "read-only-mount", "map-key-order"],
)
def test_edge_cases_encode_as_protobuf_does(allocation: ContainerAllocation) -> None:
    assert _same_message(encode_allocate_response([allocation]), [allocation])
    assert _same_message(encode_allocate_response([allocation, allocation]), [allocation, allocation])


def test_without_maps_the_bytes_are_protobufs() -> None:
    """Field order, tags, lengths of several bytes, defaults left out: byte for byte what protobuf writes."""
    allocation = ContainerAllocation(
        mounts=(Mount("/c" * 100, "/h", read_only=False), Mount("/r", "/h" * 9000, read_only=True)),
        devices=(DeviceSpec("/dev/x", "/dev/y", "rwm"),),
        cdi_devices=(CDIDevice("vendor.com/class=a"),),
    )
    assert encode_allocate_response([allocation, ContainerAllocation()]) == _protobuf_bytes(
        [allocation, ContainerAllocation()]
    )


def test_no_containers_is_the_empty_message() -> None:
    assert encode_allocate_response([]) == b""
