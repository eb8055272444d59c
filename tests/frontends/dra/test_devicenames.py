"""Device IDs as ResourceSlice device names: always a DNS label, the same on every run, never two IDs on one name."""

from __future__ import annotations

import os
import random
import re
import string
import subprocess
import sys

import pytest

from devplug.frontends.dra.devicenames import (
    DeviceNameCollisionError,
    DeviceNameMap,
    device_name,
    is_dns_label,
)
from devplug.types import MAX_DEVICE_ID_BYTES, device_id_problem

#: ``IsDNS1123Label``, as the API server checks a device name (k8s.io/apimachinery/pkg/util/validation).
LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

TRICKY = [
    "gpu0",
    "GPU0",
    "Gpu0",
    "0000:3b:00.1",
    "0000:3b:00.2",
    "0000-3b-00-1",
    "mock0::3",
    "mock0::30",
    "mock0-3",
    "a/b",
    "a.b",
    "a_b",
    "-leading",
    "trailing-",
    "::",
    "x" * 63,
    "x" * 64,
    "y" * MAX_DEVICE_ID_BYTES,
    "y" * (MAX_DEVICE_ID_BYTES - 1) + "z",
    "é",
    "e",
    "设备0",
    "nvme0n1@ns/1",
]


def _valid(name: str) -> bool:
    return len(name) <= 63 and LABEL.match(name) is not None


def test_every_tricky_id_gets_a_valid_distinct_name() -> None:
    names = {device_id: device_name(device_id) for device_id in TRICKY}
    for device_id, name in names.items():
        assert device_id_problem(device_id) is None, device_id
        assert _valid(name) and is_dns_label(name), (device_id, name)
    assert len(set(names.values())) == len(TRICKY), "two IDs share a name"
    mapped = DeviceNameMap(TRICKY)
    for device_id in TRICKY:
        assert mapped.device_id(mapped[device_id]) == device_id


def test_a_valid_label_is_its_own_name_and_others_are_readable() -> None:
    assert device_name("gpu0") == "gpu0"
    assert device_name("mock-3") == "mock-3"
    assert device_name("x" * 63) == "x" * 63
    assert device_name("GPU0").startswith("gpu0-") and device_name("GPU0") != device_name("gpu0")
    assert device_name("0000:3b:00.1").startswith("0000-3b-00-1-")
    assert device_name("0000:3b:00.1") != device_name("0000-3b-00-1")
    assert device_name("mock0::3").startswith("mock0-3-")
    assert device_name("y" * MAX_DEVICE_ID_BYTES).startswith("y" * 40)
    assert len(device_name("y" * MAX_DEVICE_ID_BYTES)) == 63
    assert re.fullmatch(r"[a-z2-7]{13}", device_name("::")), "no stem: the hash alone"


def test_a_label_that_looks_hashed_is_hashed_too() -> None:
    """Otherwise an ID could be exactly another ID's hashed name and take it."""
    other = device_name("GPU0")
    assert device_name(other) != other
    assert DeviceNameMap(["GPU0", other]).device_id(other) == "GPU0"
    assert device_name("abcdefghijklm") != "abcdefghijklm"  # 13 base32 letters: looks like a bare hash


def test_names_are_the_same_in_another_process() -> None:
    """No per-process salt (Python's str hash is salted): the name depends on the ID alone."""
    code = (
        "import json, sys\n"
        "from devplug.frontends.dra.devicenames import device_name\n"
        "print(json.dumps([device_name(i) for i in json.loads(sys.argv[1])]))\n"
    )
    import json

    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(TRICKY)], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [device_name(i) for i in TRICKY]


def test_random_ids_map_to_valid_distinct_names() -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + ":./_-@+~"
    ids: set[str] = set()
    while len(ids) < 3000:
        ids.add("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))))
    # Case variants of one another: the kind of IDs most likely to meet on one stem.
    ids |= {i.upper() for i in list(ids)[:500]} | {i.lower() for i in list(ids)[:500]}
    mapped = DeviceNameMap(sorted(ids))
    assert len(set(mapped.names())) == len(ids)
    assert all(_valid(n) for n in mapped.names()), f"seed {seed}"


def test_a_collision_is_refused_naming_both_ids() -> None:
    """A 65-bit hash makes a collision unlikely, not impossible: forced here, it is an error naming both IDs."""
    from devplug.frontends.dra import devicenames

    device_name.cache_clear()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(devicenames, "_hash", lambda device_id: "aaaaaaaaaaaaa")
            with pytest.raises(DeviceNameCollisionError) as refused:
                DeviceNameMap(["GPU0", "Gpu0"])
        message = str(refused.value)
        assert "'GPU0' and 'Gpu0' both map to the ResourceSlice device name 'gpu0-aaaaaaaaaaaaa'" in message
    finally:
        device_name.cache_clear()
    assert len(DeviceNameMap(["GPU0", "Gpu0"])) == 2


def test_the_map_goes_both_ways_and_knows_what_it_lacks() -> None:
    mapped = DeviceNameMap(["0000:3b:00.1", "gpu0", "gpu0"])
    assert list(mapped) == ["0000:3b:00.1", "gpu0"] and len(mapped) == 2
    assert mapped.device_id("gpu0") == "gpu0"
    assert mapped.device_id(mapped["0000:3b:00.1"]) == "0000:3b:00.1"
    assert mapped.device_id("gpu1") is None
    with pytest.raises(ValueError, match="empty device ID"):
        device_name("")
