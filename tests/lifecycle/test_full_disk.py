"""A full disk under the state dir during Allocate (issue 9, item 4): a clear RESOURCE_EXHAUSTED naming the
ledger, the ledger exactly as before, no driver hook, and the condition in ``devplug status``.

The state dir is put on a real, tiny tmpfs and filled up, so the daemon meets
the kernel's own ENOSPC. Mounting needs root (CI runs as root).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest

if TYPE_CHECKING:
    from tests.lifecycle.conftest import Lab

RESOURCE = "example.com/mock"


def _mount_tmpfs(where: Path, size: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs to fill up needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)], check=False)
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")


def _write_until_full(path: Path) -> int | None:
    """Append zeros to ``path`` until a write fails; returns that failure's errno."""
    with path.open("wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * 4096)
        except OSError as exc:
            return exc.errno


def _fill(folder: Path) -> Path:
    """Write a file in ``folder`` until the filesystem is full; returns it."""
    filler = folder / "filler"
    assert _write_until_full(filler) == errno.ENOSPC
    return filler


def _ledger_files(lab: Lab) -> dict[str, bytes]:
    folder = lab.ledger_path().parent
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name.startswith("ledger.")}


@pytest.fixture
def small_state(lab: Lab, tmp_path: Path) -> Iterator[Path]:
    """Run the lab's daemon with its state dir on a 512 KiB tmpfs; unmounted after the daemon stopped."""
    lab.start({RESOURCE: lab.resource_table(count=16)})
    state = lab.state_dir()
    lab.daemon.process.stop()  # type: ignore[union-attr]
    backup = tmp_path / "state-backup"
    shutil.copytree(state, backup, symlinks=True)
    _mount_tmpfs(state, "512k")
    try:
        shutil.copytree(backup, state, symlinks=True, dirs_exist_ok=True)
        lab.restart_process()
        yield state
    finally:
        if lab.daemon is not None and lab.daemon.process.running():
            lab.daemon.process.stop()
        subprocess.run(["umount", "-l", str(state)], check=False)


def test_allocate_on_a_full_disk_is_refused_cleanly_and_changes_nothing(lab: Lab, small_state: Path) -> None:
    lab.allocate("mock0")
    filler = _fill(small_state)
    # Below 64 KiB free (devplug.engine.ledger.MIN_FREE_BYTES) an Allocate is refused before anything is written,
    # whatever room the journal's last page still has; an append that failed anyway would also refuse it.
    for n in range(1, 16):
        before, records = _ledger_files(lab), lab.ledger()
        try:
            lab.allocate(f"mock{n}")
        except grpc.RpcError as exc:
            refused, device = exc, f"mock{n}"
            break
    else:
        pytest.fail("every Allocate succeeded on a full filesystem")
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    details = refused.details() or ""
    assert str(lab.ledger_path().parent) in details and "No space left on device" in details
    assert "nothing was allocated" in details and "Traceback" not in details
    assert _ledger_files(lab) == before  # snapshot and journal, byte for byte
    assert lab.ledger() == records
    assert lab.calls("allocate", device, ok=None) == []
    assert "Traceback" not in lab.log()
    filler.unlink()  # the status, written again as soon as there is room, says what happened
    lab.wait(
        lambda: "No space left on device" in (lab.resource_status().get("state_error") or ""),
        what="the status to show the failed ledger write",
    )
    lab.allocate(device)
    lab.wait(lambda: lab.resource_status().get("state_error") is None, what="the state error to clear")
    assert device in {d for r in lab.ledger() for d in r["devices"]}
