"""``devplug demo --api dra`` runs as a user runs it, and every one of its checks passes."""

from __future__ import annotations

import subprocess
import sys


def test_the_dra_demo_passes_every_check() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "devplug", "demo", "--api", "dra"], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "12/12 checks passed" in done.stdout
    for step in ("dra-prepare", "allocate", "restart", "post_stop", "deallocate", "dra-unprepare"):
        assert step in done.stdout, step
    assert "with the driver's reason" in done.stdout
