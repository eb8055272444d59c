"""CDI spec files (issue 15): what the engine writes from the devices' descriptions, checked against a JSON
schema of the CDI specification (``tests/cdi_schema.json``), written atomically into a real folder, rewritten
when the descriptions change and removed when stale."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import random
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from devplug.daemon.cdispecs import CdiSpecs, remove_stale_specs
from devplug.engine.cdi import (
    CdiNameCollisionError,
    build_spec,
    cdi_device_name,
    device_id_of_name,
    minimum_version,
    spec_file_name,
)
from devplug.engine.devicetable import DeviceTable
from devplug.errors import DriverError
from devplug.types import CDIDevice, ContainerAllocation, Device, DeviceSpec, Mount

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "cdi_schema.json").read_text())
VERSIONS = ["0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0"]


def check_spec(spec: Any) -> None:
    """Valid against the schema, and its cdiVersion covers what it uses (SPEC.md's version table)."""
    jsonschema.validate(spec, SCHEMA)
    version = VERSIONS.index(spec["cdiVersion"])
    uses_host_path = any("hostPath" in n for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", ()))
    digit_name = any(d["name"][0].isdigit() for d in spec["devices"])
    if uses_host_path or digit_name:
        assert version >= VERSIONS.index("0.5.0"), spec["cdiVersion"]
    if "." in spec["kind"].split("/", 1)[1]:
        assert version >= VERSIONS.index("0.6.0"), spec["cdiVersion"]
    names = [d["name"] for d in spec["devices"]]
    assert len(names) == len(set(names)), "device names must be unique within a spec"


def _described(device_id: str, folder: str = "/var/run/mock") -> ContainerAllocation:
    return ContainerAllocation(
        envs={"MOCK_DEVICE": device_id},
        devices=(DeviceSpec(f"/dev/mock/{device_id}", f"{folder}/{device_id}", "rw"),),
        mounts=(Mount(f"/var/run/mock/{device_id}", f"{folder}/{device_id}", read_only=True),),
    )


def test_spec_from_descriptions_follows_the_cdi_schema() -> None:
    spec = build_spec("example.com/mock", [("mock1", _described("mock1")), ("mock0", _described("mock0"))])
    assert spec is not None
    check_spec(spec)
    assert spec["cdiVersion"] == "0.5.0"  # hostPath on device nodes
    assert spec["kind"] == "example.com/mock"
    assert spec["devices"][0] == {
        "name": "mock0",
        "containerEdits": {
            "env": ["MOCK_DEVICE=mock0"],
            "deviceNodes": [{"path": "/dev/mock/mock0", "hostPath": "/var/run/mock/mock0", "permissions": "rw"}],
            "mounts": [
                {"hostPath": "/var/run/mock/mock0", "containerPath": "/var/run/mock/mock0", "options": ["bind", "ro"]}
            ],
        },
    }
    assert [d["name"] for d in spec["devices"]] == ["mock0", "mock1"]


def test_schema_refuses_what_cdi_refuses() -> None:
    good = build_spec("example.com/mock", [("mock0", _described("mock0"))])
    assert good is not None
    for bad in (
        {**good, "devices": []},
        {**good, "kind": "example.com"},
        {**good, "cdiVersion": "0.9.0"},
        {**good, "devices": [{**good["devices"][0], "name": "-mock0"}]},
        {**good, "devices": [{**good["devices"][0], "extra": 1}]},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, SCHEMA)


def test_minimum_version_follows_the_fields_used() -> None:
    same_path = ContainerAllocation(devices=(DeviceSpec("/dev/gpu0", "/dev/gpu0"),))
    spec = build_spec("example.com/gpu", [("gpu0", same_path)])
    assert spec is not None and spec["cdiVersion"] == "0.3.0"
    assert "hostPath" not in spec["devices"][0]["containerEdits"]["deviceNodes"][0]
    check_spec(spec)
    spec = build_spec("example.com/fpga", [("0000:3b:00.0", same_path)])
    assert spec is not None and spec["cdiVersion"] == "0.5.0"  # a device name starting with a digit
    check_spec(spec)
    spec = build_spec("example.com/gpu.v2", [("gpu0", same_path)])
    assert spec is not None and spec["cdiVersion"] == "0.6.0"  # a dot in the kind's class
    check_spec(spec)
    assert minimum_version({"kind": "example.com/x", "devices": []}) == "0.3.0"


def test_device_names_cdi_accepts_and_distinct_names_for_the_others() -> None:
    assert cdi_device_name("mock0") == "mock0"
    assert cdi_device_name("0000:3b:00.0") == "0000:3b:00.0"
    odd = ["a/b", "a@b", "a_b", "_a", "é", "a/b/"]
    names = [cdi_device_name(i) for i in odd]
    assert names[2] == "a_b"
    assert len(set(names)) == len(names), names
    for device_id, name in zip(odd, names, strict=True):
        CDIDevice(f"example.com/mock={name}")  # a name devplug's own type (and CDI) accepts
        assert name == cdi_device_name(device_id)  # stable
    spec = build_spec("example.com/mock", [(i, _described("x")) for i in odd])
    assert spec is not None
    check_spec(spec)


def test_no_described_device_means_no_spec() -> None:
    assert build_spec("example.com/mock", []) is None


def test_stale_specs_are_removed_and_others_left_alone(tmp_path: Path) -> None:
    keep = spec_file_name("example.com/mock")
    assert keep == "devplug-example.com_mock.json"
    for name in (keep, "devplug-example.com_gone.json", "vendor.json", "devplug-notes.yaml"):
        (tmp_path / name).write_text("{}")
    removed = remove_stale_specs(tmp_path, {keep})
    assert removed == [tmp_path / "devplug-example.com_gone.json"]
    assert sorted(os.listdir(tmp_path)) == ["devplug-example.com_mock.json", "devplug-notes.yaml", "vendor.json"]
    assert remove_stale_specs(tmp_path / "missing", {keep}) == []


def test_spec_file_follows_the_device_table(tmp_path: Path) -> None:
    async def scenario() -> None:
        table = DeviceTable()
        spec_dir = tmp_path / "run" / "cdi"
        specs = CdiSpecs("example.com/mock", "example.com/mock", spec_dir, table)
        path = spec_dir / "devplug-example.com_mock.json"
        table.replace([Device("mock0", allocation=_described("mock0")), Device("mock1"), Device("mock2")])
        await specs.sync()
        written = json.loads(path.read_text())
        check_spec(written)
        assert [d["name"] for d in written["devices"]] == ["mock0"]  # only described devices
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        before = path.stat().st_ino
        await specs.sync()  # nothing changed: not rewritten
        assert path.stat().st_ino == before

        table.update([Device("mock2", allocation=_described("mock2"))])
        await specs.ensure([("mock2", _described("mock2"))])
        assert [d["name"] for d in json.loads(path.read_text())["devices"]] == ["mock0", "mock2"]
        assert path.stat().st_ino != before  # replaced by rename, never rewritten in place

        table.update(removed=["mock0"])
        await specs.sync()
        assert [d["name"] for d in json.loads(path.read_text())["devices"]] == ["mock2"]
        table.update([Device("mock2")])
        await specs.sync()
        assert not path.exists()  # a spec without devices is invalid: removed
        assert os.listdir(spec_dir) == []  # no temporary file left behind
        assert specs.names(["mock0", "a/b"]) == (
            CDIDevice("example.com/mock=mock0"),
            CDIDevice(f"example.com/mock={cdi_device_name('a/b')}"),
        )

    asyncio.run(scenario())


# --- issue 24 item 4: one name per ID, for every set of IDs


def _legacy_name(device_id: str) -> str:
    """The mapping before issue 24: a valid ID passed through, another became ``<stem>-<8 hex of its SHA-256>``,
    so an ID already in that form collided with the ID it was made from."""
    if re.match(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$", device_id):
        return device_id
    digest = hashlib.sha256(device_id.encode()).hexdigest()[:8]
    stem = re.sub(r"[^A-Za-z0-9_.:-]", "_", device_id).strip("_.:-")
    return f"{stem}-{digest}" if stem and stem[0].isalnum() else f"d-{digest}"


def test_an_id_in_the_encoded_form_never_takes_another_ids_name() -> None:
    assert _legacy_name("a@b") == _legacy_name("a_b-7508d8b5") == "a_b-7508d8b5"  # the reported collision
    ids = ["a@b", "a_b-7508d8b5", "a_b-x614062", "d-x40", "@", "_", "a-x", "a-x6", "a-x6g", "-x40", "x40"]
    names = [cdi_device_name(i) for i in ids]
    assert cdi_device_name("a@b") == "a_b-x614062"
    assert cdi_device_name("a_b-7508d8b5") == "a_b-7508d8b5", "an ID CDI accepts and not in the encoded form"
    assert cdi_device_name("a_b-x614062") == "a_b-x614062-x615f622d78363134303632"
    assert len(set(names)) == len(ids), dict(zip(ids, names, strict=True))
    for device_id, name in zip(ids, names, strict=True):
        CDIDevice(f"example.com/mock={name}")
        assert device_id_of_name(name) == device_id


def test_ids_cdi_accepts_keep_their_names() -> None:
    for device_id in ("mock0", "0000:3b:00.0", "a_b", "GPU-3a0b8a6e-1f7d-4bd2-9b1d-4b4b4b4b4b4b", "eth0-x", "v.1:2"):
        assert cdi_device_name(device_id) == device_id


def test_random_id_sets_map_to_distinct_names_and_back() -> None:
    seed = int(os.environ.get("DEVPLUG_CDI_SEED") or random.randrange(2**32))
    print(f"CDI names: seed {seed} (replay with DEVPLUG_CDI_SEED={seed})")
    rng = random.Random(seed)
    alphabet = "ab01_-.:x@/é " + "0123456789abcdef"
    for _ in range(200):
        ids = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))) for _ in range(50)}
        ids |= {cdi_device_name(i) for i in list(ids)[:10]}  # names of IDs, used as IDs in turn
        names = {cdi_device_name(i): i for i in ids}
        assert len(names) == len(ids), f"seed {seed}: {sorted(ids)}"
        for name, device_id in names.items():
            assert re.match(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$", name), (seed, device_id, name)
            assert device_id_of_name(name) == device_id, (seed, device_id, name)


def test_a_spec_whose_names_would_collide_is_refused_naming_the_devices() -> None:
    described = [(i, _described("x")) for i in ("a@b", "a_b-7508d8b5", "mock0")]
    with pytest.raises(CdiNameCollisionError) as info:
        build_spec("example.com/mock", described, name=_legacy_name)
    assert str(info.value) == (
        "devices that would share one CDI name in the spec of example.com/mock: a@b, a_b-7508d8b5 -> a_b-7508d8b5"
    )
    spec = build_spec("example.com/mock", described)
    assert spec is not None
    check_spec(spec)


def test_a_refused_spec_leaves_the_file_as_it_was_and_refuses_the_allocate(tmp_path: Path) -> None:
    async def scenario() -> None:
        table = DeviceTable()
        specs = CdiSpecs("example.com/mock", "example.com/mock", tmp_path, table, name=_legacy_name)
        table.replace([Device("mock0", allocation=_described("mock0"))])
        await specs.sync()
        before = specs.path.read_bytes()
        table.update([Device("a@b", allocation=_described("x")), Device("a_b-7508d8b5", allocation=_described("x"))])
        with pytest.raises(DriverError) as info:
            await specs.ensure([("a@b", _described("x"))])
        assert "refusing to write the CDI spec" in str(info.value) and "a@b, a_b-7508d8b5" in str(info.value)
        assert specs.path.read_bytes() == before

    asyncio.run(scenario())


def test_the_temporary_files_of_gone_writers_are_removed_and_others_kept(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    litter = tmp_path / f".devplug-example.com_mock.json.{dead_pid}.0.tmp"
    ours = tmp_path / f".devplug-example.com_mock.json.{os.getpid()}.3.tmp"  # a write of this process, in flight
    foreign = tmp_path / f".vendor.json.{dead_pid}.0.tmp"
    for path in (litter, ours, foreign):
        path.write_text("{")
    with contextlib.suppress(ProcessLookupError):
        os.kill(dead_pid, 0)
        pytest.skip(f"pid {dead_pid} was taken again at once")
    assert remove_stale_specs(tmp_path, {"devplug-example.com_mock.json"}) == [litter]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([ours.name, foreign.name])
