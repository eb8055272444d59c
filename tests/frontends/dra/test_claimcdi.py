"""A prepared claim's CDI spec and its kept copy: written together, the spec made again from the copy when the spec
dir lost it or holds anything else (a power loss may tear a spec written without a sync), removed together."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path

from devplug.frontends.dra.claimcdi import ClaimCdiSpecs
from devplug.types import ContainerAllocation

DRIVER = "mock.example.com"


def _specs(tmp_path: Path) -> ClaimCdiSpecs:
    return ClaimCdiSpecs(tmp_path / "cdi", DRIVER, tmp_path / "state" / "dra-claims")


def _written(specs: ClaimCdiSpecs) -> tuple[str, dict[str, str]]:
    uid = str(uuid.uuid4())
    ids = asyncio.run(specs.write(uid, {"dev": ContainerAllocation(envs={"MOCK_DEVICES": "mock0"})}))
    return uid, ids


def test_the_spec_and_its_kept_copy_hold_the_same_bytes(tmp_path: Path) -> None:
    specs = _specs(tmp_path)
    uid, ids = _written(specs)
    assert ids == {"dev": f"{DRIVER}/claim={uid}-dev"}
    kept = specs.keep_dir / f"{uid}.json"
    assert specs.path(uid).read_bytes() == kept.read_bytes()
    assert json.loads(kept.read_bytes())["devices"][0]["name"] == f"{uid}-dev"
    assert not [p for p in [*specs.spec_dir.iterdir(), *specs.keep_dir.iterdir()] if p.name.endswith(".tmp")]


def test_restore_leaves_a_whole_spec_alone_and_makes_a_lost_or_torn_one_again(tmp_path: Path) -> None:
    specs = _specs(tmp_path)
    uid, ids = _written(specs)
    spec, kept = specs.path(uid), specs.keep_dir / f"{uid}.json"
    whole = os.stat(spec)
    assert asyncio.run(specs.restore(uid)) == ids
    assert os.stat(spec).st_ino == whole.st_ino  # not written again
    for damage in ("lost", "empty", "torn", "same length, other bytes", "a fifo"):
        if damage == "lost":
            spec.unlink()
        elif damage == "empty":
            spec.write_bytes(b"")
        elif damage == "torn":
            spec.write_bytes(kept.read_bytes()[:20])
        elif damage == "same length, other bytes":
            spec.write_bytes(bytes(len(kept.read_bytes())))
        else:
            spec.unlink()
            os.mkfifo(spec)  # read without O_NONBLOCK it would block the restore for ever
        assert asyncio.run(specs.restore(uid)) == ids, damage
        assert spec.read_bytes() == kept.read_bytes(), damage


def test_remove_takes_both_files(tmp_path: Path) -> None:
    specs = _specs(tmp_path)
    uid, _ = _written(specs)
    asyncio.run(specs.remove(uid, recorded=True))
    assert not specs.path(uid).exists() and not (specs.keep_dir / f"{uid}.json").exists()
    assert asyncio.run(specs.restore(uid)) == {}
