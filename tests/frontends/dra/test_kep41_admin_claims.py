"""Issue 41, KEP-5018: the file of admin-access claims a resource prepared (adminaccess.AdminClaims): what a restarted
daemon reads back, and a file it cannot read set aside, not trusted."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from devplug.frontends.dra.adminaccess import AdminClaim, AdminClaims
from devplug.frontends.dra.claims import ClaimRef

UID = "0e4f0d7c-0000-4000-8000-000000000001"
OTHER = "0e4f0d7c-0000-4000-8000-000000000002"


def test_claims_kept_are_read_back_by_the_next_run_and_forgotten_ones_stay_gone(tmp_path: Path) -> None:
    path = tmp_path / "state" / "dra-admin-claims.json"

    async def body() -> None:
        claims = AdminClaims(path)
        assert len(claims) == 0 and claims.get(UID) is None
        await claims.put(UID, "default/watch", ["mock0", "mock1"])
        await claims.put(OTHER, "monitoring/all", ["mock2"])
        await claims.forget(OTHER)
        await claims.forget(OTHER)  # nothing kept: nothing done

    asyncio.run(body())
    again = AdminClaims(path)
    assert list(again) == [UID] and UID in again and OTHER not in again
    kept = again.get(UID)
    assert kept == AdminClaim("default/watch", ("mock0", "mock1"))
    assert kept.ref(UID) == ClaimRef("default", "watch", UID)
    assert json.loads(path.read_text())["version"] == 1


def test_a_file_that_cannot_be_read_is_set_aside_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "dra-admin-claims.json"
    path.write_text('{"version": 1, "claims": {"x": {"claim": "default/c"}}}')  # no devices
    claims = AdminClaims(path)
    assert len(claims) == 0
    assert not path.exists() and (tmp_path / "dra-admin-claims.json.corrupt").exists()
    assert "cannot be read" in caplog.text
